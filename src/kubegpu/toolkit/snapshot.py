"""A cluster snapshot: the nodes, pods, DaemonSets, RuntimeClasses (and, when present, events) the
cluster tools reason about, whether read from a file or from the live API (see `live.py`).

The file is what `kubectl get nodes,pods,daemonsets,runtimeclasses -A -o json` prints: a `v1 List`
whose items carry their own `kind`. Typed lists (`PodList`, `NodeList`, ...) and single objects are
accepted too, and so is the same content as YAML.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from kubegpu.common.files import MIB, FileProblem, read_bytes
from kubegpu.toolkit.dra_facts import DRA_KINDS
from kubegpu.toolkit.model import DaemonSet, Event, Node, Pod, PodLite, RuntimeClass

Item = Node | PodLite | DaemonSet | RuntimeClass | Event
KINDS: dict[str, type] = {
    "Node": Node,
    "Pod": Pod,
    "DaemonSet": DaemonSet,
    "RuntimeClass": RuntimeClass,
    "Event": Event,
}
LIST_KINDS = {f"{kind}List": cls for kind, cls in KINDS.items()}


# resource.k8s.io (DRA) objects, kept as the API's JSON: the resourceapi package parses them (v1, v1beta2
# or v1beta1 shapes) for explain and lint. Add them to the kubectl command for pods with resourceClaims:
# kubectl get nodes,pods,daemonsets,runtimeclasses,resourceslices,resourceclaims,resourceclaimtemplates,
# deviceclasses -A -o json
_DRA_LIST_KINDS = {f"{kind}List": kind for kind in DRA_KINDS}


class SnapshotError(ValueError):
    """The snapshot cannot be read; the message names the cause and how to produce a good one."""


HOW_TO = "create one with: kubectl get nodes,pods,daemonsets,runtimeclasses -A -o json > snapshot.json"

# Snapshots are large by nature (kubectl's JSON is a few KB per pod: 100,000 pods are several hundred MB),
# so they get their own limit, far above a config file's: it stops a wrong file (a disk image, /dev/zero)
# from being read until memory runs out, not a real cluster.
SNAPSHOT_LIMIT = 2048 * MIB


class _NoAliasLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """kubectl never writes anchors: an alias in a snapshot is refused, so no alias bomb expands."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> object:
        if node in self.constructed_objects or node in self.recursive_objects:
            raise yaml.constructor.ConstructorError(
                None, None, "anchors and aliases are not allowed in a snapshot", node.start_mark
            )
        return super().construct_object(node, deep)


def _one_line(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: the problem and where it is."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem or exc.context or 'invalid YAML'}{where}"
    return " ".join(str(exc).split())


@dataclass
class Snapshot:
    nodes: list[Node] = field(default_factory=list)
    pods: list[PodLite] = field(default_factory=list)  # Pod (full) where a tool needs more than requests
    daemonsets: list[DaemonSet] = field(default_factory=list)
    runtime_classes: list[RuntimeClass] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    source: str = ""
    skipped_kinds: dict[str, int] = field(default_factory=dict)  # kinds present but not used
    # DRA kind -> its objects as JSON; a kind is present (maybe empty) when its list was read
    dra: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def dra_objects(self, kind: str) -> list[dict[str, Any]]:
        return self.dra.get(kind, [])

    def add(self, items: Iterable[Item]) -> None:
        for item in items:
            if isinstance(item, PodLite):
                self.pods.append(item)
            elif isinstance(item, Node):
                self.nodes.append(item)
            elif isinstance(item, DaemonSet):
                self.daemonsets.append(item)
            elif isinstance(item, RuntimeClass):
                self.runtime_classes.append(item)
            elif isinstance(item, Event):
                self.events.append(item)

    def find_pod(self, namespace: str, name: str) -> PodLite | None:
        for pod in self.pods:
            if pod.metadata.name == name and pod.metadata.namespace == namespace:
                return pod
        return None


class _Probe(msgspec.Struct):
    kind: str = ""


class _RawList(msgspec.Struct):
    kind: str = ""
    items: list[msgspec.Raw] | None = None


def _wanted_whole(pod: PodLite, keep: set[tuple[str, str]]) -> bool:
    """Pods some tool reads beyond their requests: pending, rejected, DaemonSet-owned, or asked for."""
    meta = pod.metadata
    return (
        not pod.spec.node_name
        or pod.status.reason is not None
        or any(o.kind == "DaemonSet" for o in meta.owner_references or ())
        or (meta.namespace, meta.name) in keep
    )


_LITE_DECODERS = {
    "Pod": msgspec.json.Decoder(PodLite),
    **{kind: msgspec.json.Decoder(cls) for kind, cls in KINDS.items() if kind != "Pod"},
}
_ANY_DECODER = msgspec.json.Decoder(PodLite | Node | DaemonSet | RuntimeClass | Event)
_FULL_POD = msgspec.json.Decoder(Pod)
_PROBE = msgspec.json.Decoder(_Probe)


def decode_items(
    raw_items: list[msgspec.Raw], default_kind: str, snap: Snapshot, keep: Iterable[tuple[str, str]] = ()
) -> None:
    """Decode list items into `snap`. Most pods are decoded lite (bound and settled: only their requests
    matter); the rest, and every other kind, in full. `default_kind` is the item kind of a typed list,
    whose items carry no `kind` of their own."""
    wanted = set(keep)
    for index, raw in enumerate(raw_items):
        kind = default_kind
        try:
            item = _LITE_DECODERS[kind].decode(raw) if kind in _LITE_DECODERS else _ANY_DECODER.decode(raw)
        except msgspec.ValidationError as exc:
            kind = _PROBE.decode(raw).kind or default_kind
            if kind in DRA_KINDS:
                snap.dra.setdefault(kind, []).append(_decode_object(raw, index, kind))
                continue
            if kind not in _LITE_DECODERS:
                snap.skipped_kinds[kind or "<no kind>"] = snap.skipped_kinds.get(kind or "<no kind>", 0) + 1
                continue
            try:
                item = _LITE_DECODERS[kind].decode(raw)
            except msgspec.ValidationError as again:
                raise SnapshotError(
                    f"item {index} ({kind}) is not a valid {kind}: {again}; the file may be hand-edited or "
                    f"truncated, {HOW_TO}"
                ) from exc
        if isinstance(item, PodLite):
            if _wanted_whole(item, wanted):
                try:
                    item = _FULL_POD.decode(raw)
                except msgspec.ValidationError as exc:
                    raise SnapshotError(f"item {index} (Pod) is not a valid Pod: {exc}; {HOW_TO}") from exc
            snap.pods.append(item)
        else:
            snap.add([item])


def _decode_object(raw: msgspec.Raw, index: int, kind: str) -> dict[str, Any]:
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:  # pragma: no cover - the list around it decoded
        raise SnapshotError(f"item {index} ({kind}) is not valid JSON: {exc}; {HOW_TO}") from exc
    if not isinstance(obj, dict):
        raise SnapshotError(f"item {index} ({kind}) is not an object; {HOW_TO}")
    obj.setdefault("kind", kind)
    return obj


def _load_json(data: bytes, snap: Snapshot, keep: Iterable[tuple[str, str]]) -> None:
    try:
        top = msgspec.json.decode(data, type=_RawList)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"not valid JSON ({exc}); {HOW_TO}") from exc
    except msgspec.ValidationError as exc:
        raise SnapshotError(f"the top level must be a Kubernetes object or List ({exc}); {HOW_TO}") from exc
    kind = top.kind
    if kind == "List" or kind in LIST_KINDS or kind in _DRA_LIST_KINDS:
        if kind in _DRA_LIST_KINDS:
            snap.dra.setdefault(_DRA_LIST_KINDS[kind], [])
        decode_items(top.items or [], kind.removesuffix("List") if kind != "List" else "", snap, keep)
    elif kind in KINDS or kind in DRA_KINDS:
        decode_items([msgspec.Raw(data)], kind, snap, keep)
    else:
        raise SnapshotError(
            f"top-level kind {kind or '<missing>'!r} is not a List of cluster objects; {HOW_TO}"
        )


def _load_yaml(text: str, snap: Snapshot, keep: Iterable[tuple[str, str]]) -> None:
    try:
        docs = [d for d in yaml.load_all(text, Loader=_NoAliasLoader) if d]
    except yaml.YAMLError as exc:
        raise SnapshotError(f"neither JSON nor YAML ({_one_line(exc)}); {HOW_TO}") from exc
    for doc in docs:
        if not isinstance(doc, dict):
            raise SnapshotError(f"a document is a {type(doc).__name__}, not a Kubernetes object; {HOW_TO}")
        _load_json(msgspec.json.encode(doc), snap, keep)


def load_snapshot_bytes(
    data: bytes, source: str = "<bytes>", keep: Iterable[tuple[str, str]] = ()
) -> Snapshot:
    """Decode a snapshot. `keep` names (namespace, name) pods to hold in full even if bound and settled."""
    snap = Snapshot(source=source)
    # These trees hold no cycles; the collector only burns time re-scanning them while they grow.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if data.lstrip().startswith(b"{"):
            _load_json(data, snap, keep)
        else:
            _load_yaml(data.decode("utf-8", errors="replace"), snap, keep)
    finally:
        if was_enabled:
            gc.enable()
    return snap


def load_snapshot(path: str | Path, keep: Iterable[tuple[str, str]] = ()) -> Snapshot:
    """Read a snapshot file; every failure is a SnapshotError naming the file and the fix."""
    path = Path(path)
    try:
        data = read_bytes(path, limit=SNAPSHOT_LIMIT, what="snapshot")
    except FileProblem as exc:
        raise SnapshotError(f"cannot read snapshot {exc}; or {HOW_TO}") from exc
    try:
        snap = load_snapshot_bytes(data, source=str(path), keep=keep)
    except SnapshotError as exc:
        raise SnapshotError(f"snapshot {path}: {exc}") from exc
    if not snap.nodes and not snap.pods:
        raise SnapshotError(f"snapshot {path} holds no nodes and no pods; {HOW_TO}")
    return snap
