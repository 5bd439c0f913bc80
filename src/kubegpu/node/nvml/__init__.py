"""NVML: which binding the node talks to (`backend`: real nvidia-ml-py or the fake), PCI and handle helpers
(`pci`), and the fake NVML driven by node profiles with cross-process fault injection (`fake*`).

May import `settings` and `common`. The real path never imports the fake: `backend` loads it only when
`KUBEGPU_FAKE_NVML` selects it.
"""
