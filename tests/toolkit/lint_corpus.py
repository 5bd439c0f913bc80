"""A large manifest file for `lint` with every kind of document it reads and a finding in many of them,
generated the same way each time (a seeded generator): pods right and wrong, workloads, Lists, anchors and
merge keys, documents that are not objects, other kinds, DRA claims, and a JSON List of the same pods."""

from __future__ import annotations

import json
import random
import re
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z][\w./:-]*$")  # written plain; anything else quoted
GPU_AMOUNTS = ["1", "2", "0.5", "-1", "abc", "1500m", "8"]
NAMES = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-2g.20gb",
    "nvidia.com/gpus",
]


def _container(rng: random.Random, i: int) -> dict[str, Any]:
    name = rng.choice(NAMES)
    amount = rng.choice(GPU_AMOUNTS)
    resources: dict[str, Any] = {}
    shape = rng.randrange(4)
    if shape == 0:
        resources = {"limits": {name: amount}}
    elif shape == 1:
        resources = {"requests": {name: amount}}
    elif shape == 2:
        resources = {"limits": {name: amount, "cpu": "500m"}, "requests": {name: rng.choice(GPU_AMOUNTS)}}
    else:
        resources = {"limits": {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}}
    container: dict[str, Any] = {
        "name": f"c{i}",
        "image": "nvcr.io/nvidia/cuda:12.4.0-base",
        "resources": resources,
    }
    if rng.random() < 0.1:
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return container


def _pod_spec(rng: random.Random, i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [_container(rng, j) for j in range(rng.randrange(1, 3))]}
    if rng.random() < 0.1:
        spec["initContainers"] = [_container(rng, 9)]
    if rng.random() < 0.05:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"tmpl-{i % 3}"}]
    return spec


def _object(rng: random.Random, i: int) -> dict[str, Any]:
    kind = rng.choice(["Pod", "Pod", "Pod", "Deployment", "Job", "CronJob", "StatefulSet"])
    meta = {"name": f"w-{i}", "namespace": f"ns-{i % 7}"}
    spec = _pod_spec(rng, i)
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    template = {"metadata": {"labels": {"app": f"w-{i}"}}, "spec": spec}
    if kind == "CronJob":
        job = {"template": template, "parallelism": rng.choice([1, -2, 3])}
        body: dict[str, Any] = {"schedule": "* * * * *", "jobTemplate": {"spec": job}}
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta, "spec": body}
    body = {"template": template}
    if kind != "Job":
        body["replicas"] = rng.choice([1, 3, -1, "two"])
    group = "batch/v1" if kind == "Job" else "apps/v1"
    return {"apiVersion": group, "kind": kind, "metadata": meta, "spec": body}


SPECIALS = [
    "just a string\n",
    "metadata:\n  name: no-kind\n",
    "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc\n",
    # anchors, aliases and a merge key
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: anchored\nspec:\n  containers:\n  - &c\n    name: a\n"
    "    resources:\n      limits: {nvidia.com/gpu: 0.5}\n  - *c\n",
    "apiVersion: v1\nkind: Pod\nmetadata: {name: merged}\nspec:\n  containers:\n  - <<: {name: m}\n"
    "    resources: {limits: {nvidia.com/gpu: 1}, requests: {nvidia.com/gpu: 2}}\n",
    "apiVersion: v1\nkind: Pod\nmetadata: {name: no-spec}\n",
    "apiVersion: v1\nkind: Pod\nmetadata: {name: bad-types}\nspec: {containers: 5}\n",
    "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: tmpl-0, namespace: ns-0}\n"
    "spec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly:\n"
    "          deviceClassName: no-such-class\n          selectors:\n"
    "          - cel: {expression: 'device.attributes[\"gpu.nvidia.com\"].productName == '}\n",
    "# a comment only\n",
]


def corpus_yaml(documents: int, seed: int = 20) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(documents):
        if i % 50 == 7:
            out.append(SPECIALS[(i // 50) % len(SPECIALS)])
        elif i % 97 == 3:
            items = [_object(rng, i * 10 + k) for k in range(3)]
            out.append(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1) + "\n")
        else:
            out.append(_yaml(_object(rng, i)))
    return "---\n".join(out)


def corpus_json(objects: int, seed: int = 21) -> str:
    rng = random.Random(seed)
    items = [_object(rng, i) for i in range(objects)]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n"


def _yaml(value: Any, indent: int = 0) -> str:
    """Block YAML as people write it (not a library's layout), scalars quoted where YAML would retype them."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{key}:\n{_yaml(item, indent + 1)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}\n")
        return "".join(lines)
    lines = []
    for item in value:
        body = _yaml(item, indent + 1) if isinstance(item, dict | list) else f"{pad}  {_scalar(item)}\n"
        lines.append(f"{pad}- {body.lstrip()}")
    return "".join(lines)


def _scalar(value: Any) -> str:
    if isinstance(value, dict | list) or not isinstance(value, str):
        return json.dumps(value)
    return value if _PLAIN.match(value) and value not in ("abc", "two") else json.dumps(value)
