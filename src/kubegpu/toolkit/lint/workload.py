"""`kubegpu lint`'s rule for the workload object around the pod spec: the number of pods it asks for.

`replicas` (Deployments, ReplicaSets, StatefulSets, ReplicationControllers), `parallelism` and `completions`
(Jobs, CronJobs' job templates) are int32 fields the API server requires to be 0 or more. What it cannot
decode as an int32 never reaches validation: it answers with the JSON decoder's error instead.
"""

from __future__ import annotations

from typing import Any

from kubegpu.toolkit.lint import apierrors
from kubegpu.toolkit.lint.rules import LintContext
from kubegpu.toolkit.manifests import path_text

_INT32 = range(-(2**31), 2**31)


def _json_type(value: Any) -> str | None:
    """How encoding/json names `value` when it cannot go into an int32; None when it can."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return None if value in _INT32 else f"number {value}"
    if isinstance(value, float):
        # YAML's 2.0 reaches the API server as the JSON number 2, which an int32 takes.
        return None if value.is_integer() and int(value) in _INT32 else f"number {value!r}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def check_counts(ctx: LintContext) -> None:
    w = ctx.workload
    for path, struct, value in w.counts:
        field = path_text(path)
        name = str(path[-1])
        json_type = _json_type(value)
        if json_type is not None:
            error = apierrors.cannot_decode(
                w.kind, w.api_version, apierrors.json_type_error(json_type, struct, field, "int32")
            )
            hint = f"write {name}: 2, without quotes" if isinstance(value, str) else f"write {name}: 2"
            ctx.add(
                "KG016",
                path,
                f"{name} is {value!r}, not a whole number; the API server refuses the object: {error}",
                f"{hint} (a whole number, 0 or more)",
                from_object=True,
            )
        elif int(value) < 0:
            ctx.add(
                "KG016",
                path,
                f"{name} is {value!r}; the API server refuses it: "
                + apierrors.invalid(field, int(value), apierrors.IS_NEGATIVE),
                f"set {name} to 0 or more (0 runs no pods)",
                from_object=True,
            )
