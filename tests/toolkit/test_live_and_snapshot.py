"""Snapshot files in their several shapes, and the live adapter over the real kubernetes client with a
recorded REST layer (no cluster)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client
from kubernetes.client.rest import RESTResponse

from kubegpu.toolkit.live import LiveError, LiveSource
from kubegpu.toolkit.snapshot import SnapshotError, load_snapshot, load_snapshot_bytes

from .paths import CLUSTER

RECORDED = json.loads(CLUSTER.read_text())["items"]


def _items(kind: str) -> list[dict[str, Any]]:
    # The API's typed lists carry no per-item kind/apiVersion; strip them as the server would.
    return [
        {k: v for k, v in item.items() if k not in ("kind", "apiVersion")}
        for item in RECORDED
        if item["kind"] == kind
    ]


class RawResponse:
    """What urllib3 hands the client's REST layer."""

    def __init__(self, body: Any, status: int = 200, reason: str = "OK") -> None:
        self.data = json.dumps(body).encode()
        self.status, self.reason = status, reason
        self.headers = {"content-type": "application/json"}


class RecordedApiServer:
    """Stands in for kubernetes-client's REST layer: answers list calls from the fixture, in pages."""

    PATHS = {
        "/api/v1/nodes": "Node",
        "/api/v1/pods": "Pod",
        "/apis/apps/v1/daemonsets": "DaemonSet",
        "/apis/node.k8s.io/v1/runtimeclasses": "RuntimeClass",
    }

    def __init__(self, deny: set[str] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, list[str]]]] = []
        self.deny = deny or set()

    def request(self, method: str, url: str, query_params: Any = None, headers: Any = None, **_: Any) -> Any:
        path = urlparse(url).path
        query = parse_qs(urlparse(url).query)
        for key, value in query_params or []:
            query.setdefault(key, []).append(str(value))
        self.calls.append((path, query))
        kind = self.PATHS[path]
        if kind in self.deny:
            return RESTResponse(RawResponse({"kind": "Status", "code": 403}, 403, "Forbidden"))
        items = _items(kind)
        limit = int(query["limit"][0])
        start = int(query.get("continue", ["0"])[0])
        page = items[start : start + limit]
        token = str(start + limit) if start + limit < len(items) else None
        return RESTResponse(
            RawResponse(
                {
                    "kind": f"{kind}List",
                    "apiVersion": "v1",
                    "items": page,
                    "metadata": {"resourceVersion": "42", **({"continue": token} if token else {})},
                }
            )
        )


def live_source(server: RecordedApiServer, page_size: int = 10) -> LiveSource:
    api = client.ApiClient(client.Configuration(host="https://k8s.example:6443"))
    api.rest_client = server
    return LiveSource(
        client.CoreV1Api(api), client.AppsV1Api(api), client.NodeV1Api(api), page_size=page_size
    )


def test_live_pages_through_every_list_and_matches_the_file() -> None:
    server = RecordedApiServer()
    live = live_source(server).snapshot()
    from_file = load_snapshot(CLUSTER)
    assert [n.metadata.name for n in live.nodes] == [n.metadata.name for n in from_file.nodes]
    assert live.pods == from_file.pods and live.daemonsets == from_file.daemonsets
    assert len(live.runtime_classes) == 1
    pod_calls = [q for path, q in server.calls if path == "/api/v1/pods"]
    assert len(pod_calls) == 6  # 51 pods in pages of 10
    assert pod_calls[1]["continue"] == ["10"] and pod_calls[0]["limit"] == ["10"]


def test_live_permission_errors_say_what_to_grant() -> None:
    with pytest.raises(LiveError, match=r"forbidden \(403\).*get/list on nodes, pods"):
        live_source(RecordedApiServer(deny={"Pod"})).snapshot()
    # RuntimeClasses are optional: RBAC often leaves them out.
    snap = live_source(RecordedApiServer(deny={"RuntimeClass"})).snapshot()
    assert snap.runtime_classes == [] and len(snap.pods) == 51


def test_typed_lists_single_objects_yaml_and_foreign_kinds() -> None:
    pods = {"kind": "PodList", "apiVersion": "v1", "items": _items("Pod")}
    assert len(load_snapshot_bytes(json.dumps(pods).encode()).pods) == 51
    node = next(i for i in RECORDED if i["kind"] == "Node")
    assert load_snapshot_bytes(json.dumps(node).encode()).nodes[0].metadata.name == "cpu-1"
    mixed = {"kind": "List", "items": [node, {"kind": "Service", "metadata": {"name": "s"}}]}
    snap = load_snapshot_bytes(json.dumps(mixed).encode())
    assert len(snap.nodes) == 1 and snap.skipped_kinds == {"Service": 1}
    yaml_text = (
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: y1\nstatus:\n  capacity: {nvidia.com/gpu: 8}\n"
    )
    assert load_snapshot_bytes(yaml_text.encode()).nodes[0].status.capacity == {"nvidia.com/gpu": 8}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"kind": "ConfigMap"}', "not a List of cluster objects"),
        (b'{"kind": "List", "items": [{"kind": "Pod", "spec": {"containers": "x"}}]}', r"item 0 \(Pod\)"),
        (b"- just\n- a list\n", "not a Kubernetes object"),
    ],
)
def test_bad_snapshots_name_the_problem_and_the_fix(tmp_path: Any, content: bytes, expected: str) -> None:
    path = tmp_path / "snap.json"
    path.write_bytes(content)
    with pytest.raises(SnapshotError, match=expected) as info:
        load_snapshot(path)
    assert "kubectl get nodes,pods,daemonsets,runtimeclasses -A -o json" in str(info.value)


def test_empty_and_missing_snapshot(tmp_path: Any) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text('{"kind": "List", "items": []}')
    with pytest.raises(SnapshotError, match="holds no nodes and no pods"):
        load_snapshot(empty)
    with pytest.raises(SnapshotError, match="cannot read snapshot"):
        load_snapshot(tmp_path / "missing.json")
