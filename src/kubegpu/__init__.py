"""kubegpu: a Kubernetes GPU device plugin compatible with NVIDIA's k8s-device-plugin, and its SRE toolkit."""

__version__ = "0.1.0"
