"""Where `kubegpu top` reads the plugins' metrics: through the API server's pod proxy, or from Prometheus.

Pod proxy (the default, no Prometheus needed): the device-plugin pods (by label selector, in every
namespace the user may list), each one's `/metrics` at its `health` container port through
`/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics`, with the user's kubeconfig: the same RBAC as
`kubectl get --raw` (pods/proxy get). A pod that cannot be read is reported, not fatal.

Prometheus (`--prometheus URL`): one instant query for the series `top` shows, grouped by the scraped
target (`instance`); the node is dcgm-exporter's `Hostname` label, else the PodMonitor's `node`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kubegpu.toolkit.live import LiveError
from kubegpu.toolkit.top.model import WANTED, NodeMetrics, PendingPod, Sample

PLUGIN_SELECTOR = "app.kubernetes.io/component=device-plugin"
METRICS_PORT_NAME = "health"  # the chart's name for the plugin's HTTP port
GPU_RESOURCE = "nvidia.com/gpu"
PROMETHEUS_TIMEOUT_S = 15.0


def parse_exposition(text: str) -> tuple[Sample, ...]:
    """The samples `top` uses from a /metrics body (text format)."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WANTED:
                out.append(Sample(sample.name, dict(sample.labels), float(sample.value)))
    return tuple(out)


def _plugin_port(pod: Any) -> int | None:
    for container in pod.spec.containers or ():
        for port in container.ports or ():
            if port.name == METRICS_PORT_NAME:
                return int(port.container_port)
    return None


def from_pod_proxy(api: Any, selector: str = PLUGIN_SELECTOR) -> list[NodeMetrics]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    try:
        pods: list[Any] = core.list_pod_for_all_namespaces(label_selector=selector).items
    except ApiException as err:
        raise LiveError(
            f"cannot list the device-plugin pods ({selector}): {err.status} {err.reason}"
        ) from err
    except OSError as err:
        raise LiveError(f"cannot reach the API server: {err}") from err
    out = []
    for pod in pods:
        node = pod.spec.node_name or pod.metadata.name
        where = f"pod {pod.metadata.namespace}/{pod.metadata.name}"
        port = _plugin_port(pod)
        if port is None:
            why = f"{where} serves no /metrics: set the chart's health.port"
            out.append(NodeMetrics(node, error=why))
            continue
        try:
            # Unparsed: the client would otherwise try to read the exposition text as a Python literal.
            body: Any = core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod.metadata.name}:{port}", pod.metadata.namespace, "metrics", _preload_content=False
            )
            text = body.data.decode()
        except ApiException as err:
            why = f"cannot read /metrics of {where}: {err.status} {err.reason}"
            out.append(NodeMetrics(node, error=why))
            continue
        out.append(NodeMetrics(node, parse_exposition(text)))
    return out


def pending_gpu_pods(api: Any) -> list[PendingPod]:
    """Pending pods that ask for whole GPUs (nvidia.com/gpu limits summed over their containers)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        core = client.CoreV1Api(api)
        pods: list[Any] = core.list_pod_for_all_namespaces(field_selector="status.phase=Pending").items
    except ApiException as err:
        raise LiveError(f"cannot list the pending pods: {err.status} {err.reason}") from err
    out = []
    for pod in pods:
        gpus = sum(
            int((c.resources.limits or {}).get(GPU_RESOURCE, 0)) for c in pod.spec.containers if c.resources
        )
        if gpus:
            out.append(PendingPod(pod.metadata.namespace, pod.metadata.name, gpus))
    return out


def from_prometheus(url: str) -> list[NodeMetrics]:
    query = '{__name__=~"' + "|".join(WANTED) + '"}'
    target = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(target, timeout=PROMETHEUS_TIMEOUT_S) as answer:
            body = json.loads(answer.read())
    except urllib.error.HTTPError as err:
        raise LiveError(f"Prometheus at {url} answered {err.code} {err.reason}") from err
    except (OSError, ValueError) as err:
        raise LiveError(f"cannot query Prometheus at {url}: {err}; check --prometheus") from err
    if body.get("status") != "success":
        raise LiveError(f"Prometheus at {url} refused the query: {body.get('error', body)}")
    by_target: dict[str, list[Sample]] = {}
    for result in body["data"]["result"]:
        labels = dict(result["metric"])
        name = labels.pop("__name__")
        by_target.setdefault(labels.get("instance", ""), []).append(
            Sample(name, labels, float(result["value"][1]))
        )
    return [
        NodeMetrics(_node_of(samples, instance), tuple(samples))
        for instance, samples in sorted(by_target.items())
    ]


def _node_of(samples: Iterable[Sample], instance: str) -> str:
    for s in samples:
        if s.labels.get("Hostname"):
            return s.labels["Hostname"]
    return next((s.labels["node"] for s in samples if s.labels.get("node")), instance)
