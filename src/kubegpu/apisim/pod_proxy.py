"""The pods/proxy subresource, as the real API server serves it: an HTTP request passed on to a pod.

    GET /api/v1/namespaces/<ns>/pods/<name>[:<port>]/proxy[/<path>][?query]

The server looks the pod up, dials `status.podIP` on the port (the name's `:<port>` suffix: a number or
a container port's name; without one the first container port) and answers with the pod's status code,
content type and body. As the real one: an unknown pod is a 404 Status, a pod without an IP a 503
("pod ... does not have a host assigned" / no IP), a port that refuses the connection a 503 Status
saying `error trying to reach service: ...`. Only GET is modelled (what `kubectl get --raw` and the
client's connect_get_namespaced_pod_proxy_with_path send).
"""

from __future__ import annotations

import http.client
import re
from typing import Any
from urllib.parse import unquote, urlencode

from .errors import ApiError
from .kinds import PODS
from .store import Store

_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/proxy(/.*)?$")
PROXY_TIMEOUT_S = 10.0


def is_proxy_path(path: str) -> bool:
    return _PATH.match(unquote(path)) is not None


def _unavailable(message: str) -> ApiError:
    return ApiError(503, "ServiceUnavailable", message)


def proxy_get(store: Store, path: str, query: dict[str, str]) -> tuple[int, str, bytes]:
    """(status, content type, body) of the pod's answer to GET `path`; ApiError when there is none."""
    match = _PATH.match(unquote(path))
    assert match is not None, path
    namespace, name_port, rest = match[1], match[2], match[3] or "/"
    name, _, port_text = name_port.partition(":")
    pod: dict[str, Any] = store.get(PODS, namespace, name)  # a 404 Status when there is none
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        raise _unavailable(f'pod "{name}" does not have an IP address assigned')
    port = _port(pod, port_text)
    if port is None:
        raise _unavailable(f'no container port named "{port_text}" in pod "{name}"')
    target = rest + (f"?{urlencode(query)}" if query else "")
    connection = http.client.HTTPConnection(ip, port, timeout=PROXY_TIMEOUT_S)
    try:
        connection.request("GET", target)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type") or "text/plain", answer.read()
    except OSError as err:
        raise _unavailable(f"error trying to reach service: dial tcp {ip}:{port}: {err}") from None
    finally:
        connection.close()


def _port(pod: dict[str, Any], text: str) -> int | None:
    ports = [p for c in pod.get("spec", {}).get("containers") or [] for p in c.get("ports") or []]
    if not text:
        return int(ports[0]["containerPort"]) if ports else 80
    if text.isdigit():
        return int(text)
    return next((int(p["containerPort"]) for p in ports if p.get("name") == text), None)
