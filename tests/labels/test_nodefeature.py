"""The NodeFeature output (GFD's default, --use-node-feature-api) against the simulated API server.

What GFD (k8s-device-plugin v0.20, internal/lm/output.go) writes, written out here: the object
`nvidia-features-for-<node>` (nfd.k8s-sigs.io/v1alpha1 NodeFeature) in --namespace, labelled
`nfd.node.kubernetes.io/node-name: <node>`, spec `{features: {flags: {}, attributes: {}, instances: {}},
labels: <labels>}`, owned by the pod's DaemonSet (controller) and the pod; read every pass, written only
when it differs.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubegpu.apisim import ApiServerSim
from kubegpu.common.backoff import Backoff
from kubegpu.labels.kubeapi import RateLimiter
from kubegpu.labels.loop import ONESHOT_ATTEMPTS, open_output, serve
from kubegpu.labels.nodefeature import NodeFeatureOutput, open_node_feature_output, owner_references
from kubegpu.labels.output import OutputError
from kubegpu.labels.settings import ApiSettings, LabelSettings
from kubegpu.node.nvml.backend import NvmlBackend

NODE = "gpu-node-7"
NAMESPACE = "gpu-operator"
OBJECT = "nvidia-features-for-gpu-node-7"
MS = 1_000_000
LABELS = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
EMPTY_FEATURES = {"flags": {}, "attributes": {}, "instances": {}}


@pytest.fixture
def api() -> Iterator[ApiServerSim]:
    with ApiServerSim() as server:
        yield server


@pytest.fixture
def kubeconfig(api: ApiServerSim, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


def api_settings(kubeconfig: Path, **kw: Any) -> ApiSettings:
    return ApiSettings(**{"node_name": NODE, "namespace": NAMESPACE, "kubeconfig": str(kubeconfig), **kw})


def output(kubeconfig: Path, **kw: Any) -> NodeFeatureOutput:
    return open_node_feature_output(api_settings(kubeconfig, **kw))


def stored(api: ApiServerSim) -> dict[str, Any]:
    return api.get("nodefeatures", OBJECT, namespace=NAMESPACE)


def node_feature_calls(api: ApiServerSim) -> list[str]:
    return [call.method for call in api.calls if "/nodefeatures" in call.path]


# ------------------------------------------------------------------------------ what is written


def test_the_first_pass_creates_gfds_object(api: ApiServerSim, kubeconfig: Path) -> None:
    output(kubeconfig).write(LABELS)
    obj = stored(api)
    assert obj["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1" and obj["kind"] == "NodeFeature"
    assert obj["metadata"]["name"] == "nvidia-features-for-gpu-node-7"
    assert obj["metadata"]["namespace"] == "gpu-operator"
    assert obj["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "gpu-node-7"}
    assert "ownerReferences" not in obj["metadata"]  # no --pod-name
    assert obj["spec"] == {
        "features": {"flags": {}, "attributes": {}, "instances": {}},
        "labels": {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
    }
    assert node_feature_calls(api) == ["GET", "POST"]


def test_unchanged_labels_are_read_not_written(api: ApiServerSim, kubeconfig: Path) -> None:
    out = output(kubeconfig)
    out.write(LABELS)
    version = stored(api)["metadata"]["resourceVersion"]
    out.write(dict(LABELS))
    out.write(dict(LABELS))
    assert node_feature_calls(api) == ["GET", "POST", "GET", "GET"]
    assert stored(api)["metadata"]["resourceVersion"] == version


def test_changed_labels_replace_the_spec_once(api: ApiServerSim, kubeconfig: Path) -> None:
    out = output(kubeconfig)
    out.write(LABELS)
    # Someone else labelled and annotated the object: GFD owns the labels, not the annotations.
    api.patch(
        "nodefeatures",
        OBJECT,
        {"metadata": {"labels": {"team": "ml"}, "annotations": {"note": "kept"}}},
        namespace=NAMESPACE,
    )
    out.write({"nvidia.com/gpu.count": "7"})
    obj = stored(api)
    assert obj["spec"] == {"features": EMPTY_FEATURES, "labels": {"nvidia.com/gpu.count": "7"}}
    assert obj["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "gpu-node-7"}
    assert obj["metadata"]["annotations"] == {"note": "kept"}
    assert node_feature_calls(api) == ["GET", "POST", "GET", "PUT"]  # (the patch came from Python)


def test_a_deleted_object_is_created_again(api: ApiServerSim, kubeconfig: Path) -> None:
    out = output(kubeconfig)
    out.write(LABELS)
    api.delete("nodefeatures", OBJECT, namespace=NAMESPACE)
    out.write(LABELS)
    assert stored(api)["spec"]["labels"] == LABELS


def test_an_object_written_by_gfd_is_taken_over_without_a_write(api: ApiServerSim, kubeconfig: Path) -> None:
    """Moving from NVIDIA's GFD: the same name, labels and spec, so nothing to write."""
    api.create(
        "nodefeatures",
        {
            "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
            "kind": "NodeFeature",
            "metadata": {"name": OBJECT, "labels": {"nfd.node.kubernetes.io/node-name": NODE}},
            "spec": {"features": {"flags": None, "attributes": None, "instances": None}, "labels": LABELS},
        },
        namespace=NAMESPACE,
    )
    output(kubeconfig).write(LABELS)
    assert node_feature_calls(api) == ["GET"]


# ------------------------------------------------------------------------------ owner references

POD = {
    "metadata": {
        "name": "kubegpu-labels-x7k2p",
        "uid": "5a1c6c2e-pod",
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": "kubegpu-labels",
                "uid": "0d4b-ds",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
}


def test_owner_references_are_the_daemonset_then_the_pod() -> None:
    assert owner_references(POD) == [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "kubegpu-labels",
            "uid": "0d4b-ds",
            "controller": True,
        },
        {"apiVersion": "v1", "kind": "Pod", "name": "kubegpu-labels-x7k2p", "uid": "5a1c6c2e-pod"},
    ]
    assert owner_references({"metadata": {"name": "by-hand", "uid": "u"}}) == []


def pod_object() -> client.V1Pod:
    """POD as the client returns it."""
    (ref,) = POD["metadata"]["ownerReferences"]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=POD["metadata"]["name"],
            uid=POD["metadata"]["uid"],
            owner_references=[
                client.V1OwnerReference(
                    api_version=ref["apiVersion"],
                    kind=ref["kind"],
                    name=ref["name"],
                    uid=ref["uid"],
                    controller=True,
                    block_owner_deletion=True,
                )
            ],
        )
    )


class PodReader:
    """CoreV1Api's read_namespaced_pod, answering with POD (or an error), counting calls."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str]] = []
        self.api_client = client.ApiClient()

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Any:
        self.calls.append((namespace, name))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def with_core(out: NodeFeatureOutput, core: PodReader) -> NodeFeatureOutput:
    out.core = core
    return out


def test_the_object_is_owned_by_the_pods_daemonset(api: ApiServerSim, kubeconfig: Path) -> None:
    reader = PodReader(pod_object())
    out = with_core(output(kubeconfig, pod_name="kubegpu-labels-x7k2p"), reader)
    out.write(LABELS)
    out.write(LABELS)
    assert [r["kind"] for r in stored(api)["metadata"]["ownerReferences"]] == ["DaemonSet", "Pod"]
    assert stored(api)["metadata"]["ownerReferences"][0]["controller"] is True
    assert reader.calls == [(NAMESPACE, "kubegpu-labels-x7k2p")]  # read once
    assert node_feature_calls(api) == ["GET", "POST", "GET"]


def test_a_pod_that_cannot_be_read_leaves_the_object_without_owners(
    api: ApiServerSim, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The simulated API server serves no pods: a 404, as for a pod name that does not exist.
    output(kubeconfig, pod_name="kubegpu-labels-x7k2p").write(LABELS)
    assert "ownerReferences" not in stored(api)["metadata"]
    assert (
        "Failed to resolve owner references: failed to get pod gpu-operator/kubegpu-labels-x7k2p: "
        "404 Not Found" in caplog.text
    )


def test_an_api_server_error_on_the_pod_is_retried(api: ApiServerSim, kubeconfig: Path) -> None:
    reader = PodReader(ApiException(status=503, reason="Service Unavailable"))
    out = with_core(output(kubeconfig, pod_name="p"), reader)
    with pytest.raises(OutputError) as caught:
        out.write(LABELS)
    assert caught.value.transient and not caught.value.fatal
    reader.answer = pod_object()
    out.write(LABELS)
    assert len(stored(api)["metadata"]["ownerReferences"]) == 2


# ------------------------------------------------------------------------------ failures


def test_no_crd_is_a_fatal_one_line_error(tmp_path: Path) -> None:
    with ApiServerSim(node_feature_crd=False) as api:
        out = output(api.write_kubeconfig(tmp_path / "kubeconfig"))
        with pytest.raises(OutputError) as caught:
            out.write(LABELS)
    err = caught.value
    assert err.fatal and "\n" not in str(err)
    assert str(err) == (
        f"cannot publish the labels to NodeFeature gpu-operator/nvidia-features-for-gpu-node-7: the API "
        f"server at {api.url} does not serve nodefeatures.nfd.k8s-sigs.io/v1alpha1 (404 Not Found: the "
        "server could not find the requested resource): NFD's NodeFeature CRD is not installed; install "
        "Node Feature Discovery v0.14 or later (its CRDs), or set --use-node-feature-api=false "
        "(USE_NODE_FEATURE_API=false) to write NFD's features.d file"
    )


def test_an_unreachable_api_server_is_transient(api: ApiServerSim, kubeconfig: Path) -> None:
    out = output(kubeconfig)
    api.stop()
    with pytest.raises(OutputError) as caught:
        out.write(LABELS)
    assert caught.value.transient and not caught.value.fatal
    assert str(caught.value) == (
        "cannot publish the labels to NodeFeature gpu-operator/nvidia-features-for-gpu-node-7: the API "
        f"server at {api.url} did not answer ([Errno 111] Connection refused); check that it is up and "
        "reachable from this node"
    )
    api.start()  # the same port
    out.write(LABELS)
    assert stored(api)["spec"]["labels"] == LABELS


class Refusing:
    """CustomObjectsApi whose every call fails with the API server's answer."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        self.error = ApiException(status=status, reason=reason)
        self.error.body = body

    def __getattr__(self, name: str) -> Any:
        def call(*_: Any, **__: Any) -> Any:
            raise self.error

        return call


def status_body(message: str, reason: str, code: int, details: dict[str, str]) -> str:
    """A Status body as the API server sends it."""
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    return json.dumps({**status, "reason": reason, "details": details, "code": code})


FORBIDDEN = status_body(
    'nodefeatures.nfd.k8s-sigs.io "nvidia-features-for-gpu-node-7" is forbidden: User '
    '"system:serviceaccount:gpu-operator:kubegpu-labels" cannot get resource "nodefeatures" in API group '
    '"nfd.k8s-sigs.io" in the namespace "gpu-operator"',
    "Forbidden",
    403,
    {"name": "nvidia-features-for-gpu-node-7", "group": "nfd.k8s-sigs.io", "kind": "nodefeatures"},
)
NO_NAMESPACE = status_body(
    'namespaces "gpu-operator" not found', "NotFound", 404, {"name": "gpu-operator", "kind": "namespaces"}
)


@pytest.mark.parametrize(
    ("status", "reason", "body", "fatal", "says"),
    [
        (
            403,
            "Forbidden",
            FORBIDDEN,
            True,
            'forbidden (403 Forbidden: nodefeatures.nfd.k8s-sigs.io "nvidia-features-for-gpu-node-7" is '
            'forbidden: User "system:serviceaccount:gpu-operator:kubegpu-labels" cannot get resource '
            '"nodefeatures" in API group "nfd.k8s-sigs.io" in the namespace "gpu-operator"); grant the '
            "service account get, create and update on nodefeatures.nfd.k8s-sigs.io in namespace "
            "gpu-operator",
        ),
        (
            401,
            "Unauthorized",
            "",
            True,
            "refused the credentials (401 Unauthorized); check the service account",
        ),
        (404, "Not Found", NO_NAMESPACE, True, "namespace gpu-operator does not exist"),
        (429, "Too Many Requests", "", False, "the API server answered 429 Too Many Requests"),
        (500, "Internal Server Error", "", False, "the API server answered 500 Internal Server Error"),
        (422, "Unprocessable Entity", "", True, "the API server refused it (422 Unprocessable Entity)"),
    ],
)
def test_api_server_answers(
    kubeconfig: Path, status: int, reason: str, body: str, fatal: bool, says: str
) -> None:
    out = output(kubeconfig)
    out.custom = Refusing(status, reason, body)
    with pytest.raises(OutputError) as caught:
        out.write(LABELS)
    assert caught.value.fatal is fatal and caught.value.transient is not fatal
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_no_node_name_is_gfds_error_and_the_fix(kubeconfig: Path) -> None:
    with pytest.raises(OutputError) as caught:
        open_node_feature_output(api_settings(kubeconfig, node_name=""))
    assert caught.value.fatal
    assert str(caught.value).startswith("failed to create label outputer: required flag node-name not set; ")
    assert "set NODE_NAME from the downward API (spec.nodeName)" in str(caught.value)


def test_no_namespace_is_gfds_error(kubeconfig: Path) -> None:
    with pytest.raises(
        OutputError, match=r"^failed to create label outputer: required flag namespace not set; "
    ):
        open_node_feature_output(api_settings(kubeconfig, namespace=""))


def test_no_client_configuration_is_found_before_the_missing_node_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GFD creates its clientsets before its outputer checks --node-name: outside a pod, with neither a node
    # name nor a kubeconfig, GFD's first error is the client configuration.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(OutputError) as caught:
        open_node_feature_output(ApiSettings(node_name="", namespace=NAMESPACE, kubeconfig=""))
    assert str(caught.value).startswith(
        "failed to create clientsets: create client configuration: create in-cluster client configuration: "
        "Service host/port is not set.; "
    )


def test_no_in_cluster_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(OutputError) as caught:
        open_node_feature_output(ApiSettings(node_name=NODE, kubeconfig=""))
    assert str(caught.value).startswith(
        "failed to create clientsets: create client configuration: create in-cluster client configuration: "
        "Service host/port is not set.; "
        "run in a pod with a service account token, or set --kubeconfig (KUBECONFIG)"
    )


def test_a_bad_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="create out-of-cluster client configuration: Invalid kube-config"):
        open_node_feature_output(ApiSettings(node_name=NODE, kubeconfig=str(tmp_path / "missing")))


# ------------------------------------------------------------------------------ rate limit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_rate_limiter_is_a_token_bucket() -> None:
    clock = Clock()
    limiter = RateLimiter(qps=2.0, burst=3, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        limiter.acquire()
    assert clock.slept == [0.5, 0.5]  # three at once, then one every 1/qps
    clock.now += 10  # refills up to the burst, not beyond
    for _ in range(4):
        limiter.acquire()
    assert clock.slept == [0.5, 0.5, 0.5]


def test_rate_limiter_defaults_and_off_as_client_go() -> None:
    clock = Clock()
    zero = RateLimiter(qps=0, burst=0, clock=clock, sleep=clock.sleep)
    assert (zero.qps, zero.burst) == (5.0, 10)
    off = RateLimiter(qps=-1, burst=1, clock=clock, sleep=clock.sleep)
    for _ in range(100):
        off.acquire()
    assert clock.slept == []


# ------------------------------------------------------------------------------ the loop


class Script:
    """A waiter that runs an action per wait (None: the interval passed) and records the timeouts."""

    def __init__(self, *actions: Any) -> None:
        self.actions = list(actions)
        self.timeouts: list[float | None] = []

    def wait(self, timeout_s: float | None) -> int | None:
        self.timeouts.append(timeout_s)
        action = self.actions.pop(0)
        return action() if callable(action) else action


class Labeller:
    """Labels that change on the passes listed in `changes`."""

    def __init__(self, *values: str) -> None:
        self.values = list(values)
        self.passes = 0

    def __call__(self, backend: Any, settings: LabelSettings, timestamp: int | None) -> dict[str, str]:
        value = self.values[min(self.passes, len(self.values) - 1)]
        self.passes += 1
        return {"nvidia.com/gfd.timestamp": str(timestamp), "nvidia.com/gpu.count": value}


def run(settings: LabelSettings, waiter: Script, labeller: Labeller) -> int:
    return serve(
        lambda: settings,
        waiter,
        load_backend=lambda: cast(NvmlBackend, None),
        labeller=labeller,
        now=lambda: 1_700_000_000.0,
        backoff_factory=lambda _: Backoff(initial=0.01, maximum=0.04),
    )


def loop_settings(kubeconfig: Path, **kw: Any) -> LabelSettings:
    return LabelSettings(api=api_settings(kubeconfig), **kw)


def test_oneshot_publishes_once_and_leaves_the_object(api: ApiServerSim, kubeconfig: Path) -> None:
    waiter = Script()
    assert run(loop_settings(kubeconfig, oneshot=True), waiter, Labeller("8")) == 0
    assert waiter.timeouts == []
    assert stored(api)["spec"]["labels"] == {
        "nvidia.com/gfd.timestamp": "1700000000",
        "nvidia.com/gpu.count": "8",
    }


def test_interval_passes_write_only_changes_and_leave_the_object_on_sigterm(
    api: ApiServerSim, kubeconfig: Path
) -> None:
    waiter = Script(None, None, None, signal.SIGTERM)
    settings = loop_settings(kubeconfig, sleep_interval=250 * MS)
    assert run(settings, waiter, Labeller("8", "8", "7", "7")) == 0
    assert waiter.timeouts == [0.25, 0.25, 0.25, 0.25]
    # pass 1 creates, pass 2 reads only, pass 3 replaces, pass 4 reads only
    assert node_feature_calls(api) == ["GET", "POST", "GET", "GET", "PUT", "GET"]
    assert stored(api)["spec"]["labels"]["nvidia.com/gpu.count"] == "7"  # GFD leaves it on exit


def test_the_api_server_going_away_and_coming_back(
    api: ApiServerSim, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    waiter = Script(api.stop, None, api.start, signal.SIGTERM)
    settings = loop_settings(kubeconfig, sleep_interval=250 * MS)
    assert run(settings, waiter, Labeller("8", "7")) == 0
    # published, the interval (the server goes); two failed passes back off 10 ms, then 20 ms (the server
    # comes back during that wait); published again, the interval, SIGTERM
    assert waiter.timeouts == [0.25, 0.01, 0.02, 0.25]
    assert stored(api)["spec"]["labels"]["nvidia.com/gpu.count"] == "7"
    assert caplog.text.count("did not answer ([Errno 111] Connection refused)") == 2
    assert "next attempt in 10ms" in caplog.text and "next attempt in 20ms" in caplog.text
    assert "Labels published after 2 failed attempts" in caplog.text


def test_no_crd_ends_the_loop_with_status_1(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with ApiServerSim(node_feature_crd=False) as api:
        settings = loop_settings(api.write_kubeconfig(tmp_path / "kubeconfig"), sleep_interval=250 * MS)
        waiter = Script()
        assert run(settings, waiter, Labeller("8")) == 1
    assert waiter.timeouts == []  # no retry: installing NFD is the fix
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "NFD's NodeFeature CRD is not installed" in errors[0].getMessage()


def test_oneshot_gives_up_after_a_few_attempts(
    api: ApiServerSim, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.stop()
    waiter = Script(*[None] * ONESHOT_ATTEMPTS)
    assert run(loop_settings(kubeconfig, oneshot=True), waiter, Labeller("8")) == 1
    assert waiter.timeouts == [0.01, 0.02, 0.04, 0.04]
    assert f"giving up after {ONESHOT_ATTEMPTS} attempts" in caplog.text


def test_a_stop_signal_during_the_back_off_ends_the_loop(api: ApiServerSim, kubeconfig: Path) -> None:
    api.stop()
    waiter = Script(signal.SIGTERM)
    assert run(loop_settings(kubeconfig, sleep_interval=250 * MS), waiter, Labeller("8")) == 0
    assert waiter.timeouts == [0.01]


def test_open_output_picks_the_node_feature_object_by_default(kubeconfig: Path, tmp_path: Path) -> None:
    assert isinstance(open_output(loop_settings(kubeconfig)), NodeFeatureOutput)
    file_settings = LabelSettings(use_node_feature_api=False, output_file=str(tmp_path / "gfd"))
    assert not isinstance(open_output(file_settings), NodeFeatureOutput)


def test_switching_to_the_api_on_sighup_removes_the_old_file(
    api: ApiServerSim, kubeconfig: Path, tmp_path: Path
) -> None:
    """A reload that moves the labels to the NodeFeature object leaves no stale features.d file."""
    out = tmp_path / "features.d" / "gfd"
    loads = [
        LabelSettings(use_node_feature_api=False, output_file=str(out), sleep_interval=250 * MS),
        loop_settings(kubeconfig, oneshot=True),
    ]
    seen: list[bool] = []

    def hup() -> int:
        seen.append(out.exists())
        return signal.SIGHUP

    code = serve(
        lambda: loads.pop(0),
        Script(hup),
        load_backend=lambda: cast(NvmlBackend, None),
        labeller=Labeller("8"),
        now=lambda: 1.0,
    )
    assert code == 0
    assert seen == [True] and not out.exists()
    assert stored(api)["spec"]["labels"]["nvidia.com/gpu.count"] == "8"
