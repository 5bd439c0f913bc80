"""Every manifest we ship or the chart renders is valid for the Kubernetes API, checked offline against
the OpenAPI schemas that kubernetes-validate bundles (strict: unknown fields are errors), plus the
cross-field rules of the API server that a schema cannot express (names that must match, be unique)."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from .conftest import (
    CONFIG_FILES,
    EXAMPLES,
    STATIC,
    example_values_files,
    load_docs,
    render_each,
)

# kubernetes-validate re-reads its schema files (the definitions are megabytes) on every call; they never
# change, so read each once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents
)

# The oldest release the chart claims (Chart.yaml kubeVersion) and the one the kubelet simulator follows.
KUBERNETES_VERSIONS = ("1.25.0", "1.32.0")
# Objects of APIs younger than that, checked against the first release that serves them (and the next
# one we name): DRA's resource.k8s.io/v1 (1.34) and the ResourceSlice policy (admissionregistration v1, 1.30).
NEWER_APIS = {
    ("resource.k8s.io/v1", "DeviceClass"): ("1.34.0",),
    ("resource.k8s.io/v1", "ResourceClaim"): ("1.34.0",),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): ("1.34.0",),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): ("1.30.0", "1.34.0"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): ("1.30.0", "1.34.0"),
}


def versions_for(obj: dict[str, Any]) -> tuple[str, ...]:
    return NEWER_APIS.get((obj["apiVersion"], obj["kind"]), KUBERNETES_VERSIONS)


def shipped() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(STATIC.glob("*.yml")) + sorted(EXAMPLES.glob("*.yml")):
        out += [(f"{path.parent.name}/{path.name}", doc) for doc in load_docs(path)]
    return out


def rendered() -> list[tuple[str, dict[str, Any]]]:
    cases: list[tuple[str, list[Path], dict[str, Any]]] = [("defaults", [], {})]
    cases += [(p.name, [p], {}) for p in example_values_files()]
    everything = {"gfd": {"enabled": True}, "runtimeClass": {"create": True}, "health": {"port": 8080}}
    cases += [("everything on", [], everything)]
    dra = {"enabled": True, "gpus": "0,1", "extendedResourceName": "nvidia.com/gpu"}
    cases += [("everything and DRA on", [], {**everything, "dra": dra})]
    names, calls = [], []
    for name, files, values in cases:
        for set_files in (None, CONFIG_FILES):
            names.append(name + (" + configs" if set_files else ""))
            calls.append({"values": values, "files": files, "set_files": set_files})
    return [(name, o) for name, objs in zip(names, render_each(calls), strict=True) for o in objs]


def api_server_rules(obj: dict[str, Any]) -> list[str]:
    """Checks the API server makes on pod templates that the OpenAPI schema cannot."""
    template = obj.get("spec", {}).get("template")
    if obj["kind"] == "Pod":
        template = {"metadata": obj["metadata"], "spec": obj["spec"]}
    if template is None:
        return []
    spec, errors = template["spec"], []
    all_containers = (spec.get("initContainers") or []) + spec["containers"]
    volumes = [v["name"] for v in spec.get("volumes") or []]
    for what, names in (("container", [c["name"] for c in all_containers]), ("volume", volumes)):
        errors += [f"duplicate {what} {n}" for n, k in Counter(names).items() if k > 1]
    for c in all_containers:
        errors += [
            f"{c['name']}: volumeMount {m['name']} has no volume"
            for m in c.get("volumeMounts") or []
            if m["name"] not in volumes
        ]
        env = [e["name"] for e in c.get("env") or []]
        errors += [f"{c['name']}: env {n} set twice" for n, k in Counter(env).items() if k > 1]
        ports = {p.get("name") for p in c.get("ports") or []}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            port = (c.get(probe) or {}).get("httpGet", {}).get("port")
            if isinstance(port, str) and port not in ports:
                errors.append(f"{c['name']}: {probe} names port {port}, which the container lacks")
    if spec.get("hostPID") and spec.get("shareProcessNamespace"):
        errors.append("hostPID and shareProcessNamespace cannot both be set")
    selector = obj.get("spec", {}).get("selector", {}).get("matchLabels")
    if selector and not selector.items() <= template["metadata"].get("labels", {}).items():
        errors.append("selector does not match template labels")
    return errors


def check(objects: list[tuple[str, dict[str, Any]]]) -> list[str]:
    errors = []
    for source, obj in objects:
        where = f"{source}: {obj['kind']}/{obj['metadata']['name']}"
        for version in versions_for(obj):
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                errors.append(
                    f"{where} (Kubernetes {version}): {'.'.join(map(str, err.path))}: {err.message}"
                )
        errors += [f"{where}: {e}" for e in api_server_rules(obj)]
    return errors


def test_shipped_manifests_and_examples_are_valid_kubernetes_objects() -> None:
    objects = shipped()
    assert len(objects) >= 14
    assert check(objects) == []


def test_everything_the_chart_renders_is_valid() -> None:
    assert check(rendered()) == []


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (lambda ds: ds["spec"]["template"]["spec"].update(nodeSelectr={"a": "b"}), "nodeSelectr"),
        (
            lambda ds: ds["spec"]["template"]["spec"]["containers"][0].update(
                ports=[{"containerPort": "80"}]
            ),
            "80",
        ),
        (lambda ds: ds["spec"]["template"]["spec"]["volumes"].clear(), "has no volume"),
        (lambda ds: ds["spec"]["selector"]["matchLabels"].update(extra="x"), "selector does not match"),
    ],
)
def test_the_checks_catch_mistakes(mutate: Any, complaint: str) -> None:
    ds = next(load_docs(STATIC / "kubegpu-device-plugin.yml"))
    mutate(ds)
    errors = check([("mutated", ds)])
    assert errors and all(complaint in e for e in errors), errors
