"""Manifests for `lint`: files (or stdin) of multi-document YAML, JSON, or v1 Lists, reduced to the pod
specs inside them (Pods, Deployments, StatefulSets, DaemonSets, Jobs, CronJobs, ReplicaSets,
ReplicationControllers, PodTemplates), each with where it came from so findings can point at a line.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import yaml

from kubegpu.toolkit.dra_facts import DRA_KINDS
from kubegpu.toolkit.model import PodSpec

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


class _LOADER(_SAFE_LOADER):  # type: ignore[misc,valid-type]  # (a C class when libyaml is there)
    """The safe loader, with the per-node work of its resolver cut down for files of 60,000 pods: the safe
    loader has no path resolvers, so descending and ascending them does nothing, and a plain scalar's tag
    depends on its text alone, so it is looked up once per distinct text (manifests repeat theirs)."""

    _tags: dict[str, str] = {}

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        pass

    def ascend_resolver(self) -> None:
        pass

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        # What BaseResolver.resolve answers when there are no path resolvers, without its lookups.
        if kind is not yaml.ScalarNode:
            return _SEQ if kind is yaml.SequenceNode else _MAP
        if not implicit[0]:
            return _STR
        tag = self._tags.get(value)
        if tag is None:
            if len(self._tags) > 65_536:
                self._tags.clear()
            tag = self._tags[value] = super().resolve(kind, value, implicit)
        return tag


# Where each workload kind keeps its pod spec.
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "PodTemplate": ("template", "spec"),
}

# The counts of pods a workload asks for (int32 fields the API server requires to be >= 0), with the Go
# struct that holds each, for the API server's decoding errors.
COUNT_FIELDS: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "Deployment": ((("spec", "replicas"), "DeploymentSpec"),),
    "ReplicaSet": ((("spec", "replicas"), "ReplicaSetSpec"),),
    "StatefulSet": ((("spec", "replicas"), "StatefulSetSpec"),),
    "ReplicationController": ((("spec", "replicas"), "ReplicationControllerSpec"),),
    "Job": ((("spec", "parallelism"), "JobSpec"), (("spec", "completions"), "JobSpec")),
    "CronJob": (
        (("spec", "jobTemplate", "spec", "parallelism"), "JobSpec"),
        (("spec", "jobTemplate", "spec", "completions"), "JobSpec"),
    ),
}

Path = tuple[str | int, ...]


def path_text(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@dataclass(frozen=True, slots=True)
class Segment:
    """Where a YAML document's root node lies in its file's text: composed again only if a finding needs
    a line in it, so 60,000 documents do not keep 1.5 million nodes alive for the few that do."""

    text: str  # the whole file's text, shared by its documents
    start: int
    end: int
    line: int  # 0-based line of `start`
    whole_json: bool = False  # a JSON file: lines only if it composes as YAML too (it may not: `\/`)


@dataclass
class Source:
    """One document of one file, with its YAML node tree for line numbers (None for plain JSON), or where
    to compose it from when it is first asked for a line."""

    file: str
    doc: int  # 1-based
    node: yaml.Node | None = None
    segment: Segment | None = None
    _offset: int = 0  # lines before the composed node's text (a segment's line)

    def line(self, path: Path) -> int | None:
        """1-based line of the deepest node along `path` that exists."""
        if self.node is None and self.segment is not None:
            segment, self.segment = self.segment, None
            with contextlib.suppress(yaml.YAMLError):
                self.node = yaml.compose(segment.text[segment.start : segment.end], Loader=_LOADER)
            self._offset = segment.line
            if self.node is None:
                return None if segment.whole_json else segment.line + 1
        node = self.node
        if node is None:
            return None
        offset = self._offset
        best = node.start_mark.line + 1 + offset
        for part in path:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                match = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                match = node.value[part]
            else:
                match = None
            if match is None:
                break
            node, best = match, match.start_mark.line + 1 + offset
        return best


@dataclass
class Workload:
    """A pod spec found in a manifest, and the object that holds it."""

    source: Source
    kind: str
    name: str
    namespace: str
    spec_path: Path  # from the document root to the pod spec
    spec: PodSpec
    api_version: str = ""
    object_path: Path = ()  # from the document root to the object (inside a List: items[i])
    # COUNT_FIELDS present in the object: (path from the object, Go struct, value as written)
    counts: list[tuple[Path, str, Any]] = field(default_factory=list)

    @property
    def ref(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{ns}{self.name}"


@dataclass
class DraObject:
    """A resource.k8s.io object (ResourceClaim, ResourceClaimTemplate, DeviceClass, ResourceSlice) as
    written, for the DRA rules."""

    source: Source
    kind: str
    name: str
    namespace: str
    api_version: str
    object_path: Path
    obj: dict[str, Any]

    @property
    def ref(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{ns}{self.name}"


@dataclass
class Problem:
    """A document that could not be read as Kubernetes objects."""

    source: Source
    path: Path
    message: str
    object: str = ""
    line: int | None = None  # when known without a node tree (YAML syntax errors)


@dataclass
class Manifests:
    workloads: list[Workload] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    dra: list[DraObject] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # other kinds, counted
    documents: int = 0


def _walk(obj: Any, source: Source, prefix: Path, out: Manifests) -> None:
    if not isinstance(obj, dict):
        out.problems.append(
            Problem(source, prefix, f"expected a Kubernetes object, found a {type(obj).__name__}")
        )
        return
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        out.problems.append(
            Problem(source, prefix, "object has no `kind`; every manifest needs apiVersion and kind")
        )
        return
    if kind == "List" or (kind.endswith("List") and isinstance(obj.get("items"), list)):
        for index, item in enumerate(obj.get("items") or []):
            _walk(item, source, (*prefix, "items", index), out)
        return
    api_version = obj.get("apiVersion")
    if kind in DRA_KINDS and str(api_version or "").startswith("resource.k8s.io/"):
        raw_meta = obj.get("metadata")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        out.dra.append(
            DraObject(
                source,
                kind,
                str(meta.get("name") or meta.get("generateName") or "<unnamed>"),
                str(meta.get("namespace") or ""),
                str(api_version),
                prefix,
                obj,
            )
        )
        return
    spec_path = POD_SPEC_PATHS.get(kind)
    if spec_path is None:
        out.skipped[kind] = out.skipped.get(kind, 0) + 1
        return
    metadata = obj.get("metadata")
    meta = metadata if isinstance(metadata, dict) else {}
    name = str(meta.get("name") or meta.get("generateName") or "<unnamed>")
    namespace = str(meta.get("namespace") or "")
    raw: Any = obj
    for part in spec_path:
        raw = raw.get(part) if isinstance(raw, dict) else None
    full_path = (*prefix, *spec_path)
    if not isinstance(raw, dict):
        out.problems.append(
            Problem(
                source,
                full_path,
                f"{kind} {name} has no pod spec at {path_text(spec_path)}",
                f"{kind}/{name}",
            )
        )
        return
    try:
        spec = msgspec.convert(raw, PodSpec)
    except msgspec.ValidationError as exc:
        where = str(exc).replace("$", path_text(full_path), 1)
        out.problems.append(Problem(source, full_path, where, f"{kind}/{name}"))
        return
    workload = Workload(source, kind, name, namespace, full_path, spec, str(api_version or ""), prefix)
    for count_path, struct in COUNT_FIELDS.get(kind, ()):
        value: Any = obj
        for part in count_path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            workload.counts.append((count_path, struct, value))
    out.workloads.append(workload)


def _yaml_documents(text: str, file: str) -> Iterator[tuple[Source, Any]]:
    """Each document as it is composed (one at a time, its node tree kept for line numbers) and its data."""
    loader = _LOADER(text)
    try:
        doc = 0
        while loader.check_node():
            node = loader.get_node()
            doc += 1
            if node is None:
                continue
            start, end = node.start_mark, node.end_mark
            # The node tree is dropped: its segment composes it again if a finding asks for a line.
            segment = Segment(text, start.index, end.index, start.line) if start.index < end.index else None
            yield Source(file, doc, None if segment else node, segment), _construct(loader, node)
    finally:
        loader.dispose()


class _Unusual(Exception):
    """A document the fast path leaves to PyYAML's constructor (merge keys, sets, custom tags, deep)."""


def _construct(loader: Any, node: yaml.Node) -> Any:
    """The document's data from its composed nodes, as PyYAML's safe constructor builds it, about 3x
    faster: plain maps, lists and strings (nearly all of a manifest) are built directly, every other scalar
    by PyYAML's own constructor for its tag; an aliased node is built once and shared, as PyYAML does. What
    this does not cover goes to `construct_document`, which says what is wrong in its words."""
    try:
        return _build(loader, node, {})
    except (_Unusual, RecursionError):
        return loader.construct_document(node)


def _build(loader: Any, node: yaml.Node, built: dict[int, Any]) -> Any:
    if type(node) is yaml.ScalarNode:  # an aliased scalar is built again: an equal, immutable value
        if node.tag == _STR:
            return node.value
        construct = loader.yaml_constructors.get(node.tag)
        if construct is None:
            raise _Unusual
        return construct(loader, node)
    known = built.get(id(node), built)
    if known is not built:
        return known
    value: Any
    if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
        value = built[id(node)] = []
        value.extend(_build(loader, item, built) for item in node.value)
    elif isinstance(node, yaml.MappingNode) and node.tag == _MAP:
        value = built[id(node)] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Unusual
            key = _build(loader, key_node, built)
            if isinstance(key, list | dict):
                raise _Unusual  # unhashable: PyYAML's error names it
            value[key] = _build(loader, value_node, built)
    else:
        raise _Unusual
    built[id(node)] = value
    return value


def parse_text(text: str, file: str, out: Manifests | None = None) -> Manifests:
    """Every pod spec in one file's text; unreadable documents become Problems, not exceptions."""
    out = out if out is not None else Manifests()
    if text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            out.problems.append(
                Problem(Source(file, 1), (), f"invalid JSON at line {exc.lineno}: {exc.msg}", line=exc.lineno)
            )
            return out
        # JSON is YAML: composed for line numbers only when a finding first asks for one (25 MB of
        # `kubectl get -o json` took 5 s to compose).
        source = Source(file, 1, segment=Segment(text, 0, len(text), 0, whole_json=True))
        out.documents += 1
        for index, item in enumerate(data if isinstance(data, list) else [data]):
            _walk(item, source, (index,) if isinstance(data, list) else (), out)
        return out
    try:
        for source, data in _yaml_documents(text, file):
            if data is None:
                continue
            out.documents += 1
            _walk(data, source, (), out)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        out.problems.append(
            Problem(
                Source(file, out.documents + 1),
                (),
                f"invalid YAML{where}: {problem}; documents after it were not read",
                line=mark.line + 1 if mark else None,
            )
        )
    return out
