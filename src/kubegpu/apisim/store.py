"""The simulated API server's storage: objects, one resourceVersion sequence, and the event history.

Semantics follow the kube-apiserver's generic registry over etcd:
- one cluster-wide resourceVersion, bumped by every write; objects carry the version of their last write;
- create assigns uid, creationTimestamp, resourceVersion (and generation 1), honours generateName, and
  fails with 409 AlreadyExists; update fails with 409 Conflict on a stale resourceVersion (an empty one is
  an unconditional update) and 404 on a missing object; generation counts spec changes;
- kinds with a /status subresource keep status out of main-resource writes and everything but status out
  of /status writes;
- delete removes the object at once unless it has finalizers (then it gets deletionTimestamp and goes when
  the last finalizer is removed); dependents whose every ownerReference points at deleted objects are
  deleted too (the garbage collector, run synchronously; `propagationPolicy=Orphan` strips the references
  instead; `Foreground` marks the owner with the `foregroundDeletion` finalizer, deletes its dependents,
  then the owner);
- the history of events can be compacted: a watch from an older resourceVersion gets 410 Gone.
Objects are stored in their v1 (hub) shape; conversion to other versions happens at the HTTP edge.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import STALE_OBJECT, ApiError, already_exists, conflict, invalid, not_found
from .kinds import ALL_KINDS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, ResourceKind
from .validation import CelChecker, validate

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds
FOREGROUND_DELETION = "foregroundDeletion"
Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Event:
    resource_version: int
    type: str  # ADDED, MODIFIED, DELETED
    kind: ResourceKind
    object: Obj
    previous: Obj | None  # the object before this change (None for ADDED)


@dataclass
class DeleteOptions:
    propagation_policy: str = "Background"
    precondition_uid: str | None = None
    precondition_resource_version: str | None = None


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Store:
    check_cel: CelChecker
    validation: bool = True
    garbage_collection: bool = True
    dropped_fields: Callable[[ResourceKind, Obj], None] = lambda kind, obj: None
    kinds: tuple[ResourceKind, ...] = ALL_KINDS
    resource_version: int = 100
    compacted: int = 0  # watches from a resourceVersion below this get 410 Gone
    history: list[Event] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    epoch: int = 0  # bumped to end every open watch stream
    _objects: dict[ResourceKind, dict[Key, Obj]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._objects = {kind: {} for kind in self.kinds}

    # ---- reads ----------------------------------------------------------------------------------

    def get(self, kind: ResourceKind, namespace: str, name: str) -> Obj:
        with self.cond:
            obj = self._objects[kind].get((namespace, name))
            if obj is None:
                raise not_found(kind.qualified, name)
            return copy.deepcopy(obj)

    def list(
        self, kind: ResourceKind, namespace: str | None, matches: Callable[[Obj], bool]
    ) -> tuple[list[Obj], int]:
        """Objects (of `namespace`, or all when None) that match, sorted like etcd keys; and the list's RV."""
        with self.cond:
            items = [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._objects[kind].items())
                if (namespace is None or ns == namespace) and matches(obj)
            ]
            return items, self.resource_version

    def all_objects(self, kind: ResourceKind) -> Iterator[Obj]:
        with self.cond:
            objects = [copy.deepcopy(o) for _, o in sorted(self._objects[kind].items())]
        yield from objects

    # ---- writes ---------------------------------------------------------------------------------

    def create(self, kind: ResourceKind, namespace: str, obj: Obj, *, dry_run: bool = False) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        with self.cond:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(kind, namespace, meta["generateName"])
            self.dropped_fields(kind, obj)
            _apply_defaults(kind, obj)
            self._validate(kind, obj, None)
            key = (namespace if kind.namespaced else "", meta["name"])
            if key in self._objects[kind]:
                raise already_exists(kind.qualified, meta["name"])
            for server_owned in ("uid", "creationTimestamp", "deletionTimestamp", "resourceVersion"):
                meta.pop(server_owned, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            if kind.has_generation:
                meta["generation"] = 1
            if kind.status and not kind.custom:
                obj.pop("status", None)
            if dry_run:
                meta["resourceVersion"] = ""
                return obj
            return self._commit(kind, key, "ADDED", obj, None)

    def update(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        obj: Obj,
        *,
        subresource: str = "",
        dry_run: bool = False,
    ) -> Obj:
        with self.cond:
            current = self._objects[kind].get((namespace if kind.namespaced else "", name))
            if current is None:
                raise not_found(kind.qualified, name)
            wanted = (obj.get("metadata") or {}).get("resourceVersion") or ""
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise conflict(kind.qualified, name, STALE_OBJECT)
            merged = self._prepare_update(kind, current, copy.deepcopy(obj), subresource)
            self.dropped_fields(kind, merged)
            _apply_defaults(kind, merged)
            self._validate(kind, merged, current)
            if dry_run:
                return merged
            return self._write(kind, current, merged)

    def mutate(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        change: Callable[[Obj], Obj],
        *,
        subresource: str = "",
        dry_run: bool = False,
    ) -> Obj:
        """Read-modify-write under the lock (PATCH): `change` gets a copy of the stored object."""
        with self.cond:
            current = self._objects[kind].get((namespace if kind.namespaced else "", name))
            if current is None:
                raise not_found(kind.qualified, name)
            changed = change(copy.deepcopy(current))  # a resourceVersion in the patch is checked by update
            return self.update(kind, namespace, name, changed, subresource=subresource, dry_run=dry_run)

    def delete(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        options: DeleteOptions | None = None,
        *,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """(the object, deleted now). With finalizers the object stays, marked for deletion."""
        options = options or DeleteOptions()
        with self.cond:
            key = (namespace if kind.namespaced else "", name)
            current = self._objects[kind].get(key)
            if current is None:
                raise not_found(kind.qualified, name)
            meta = current["metadata"]
            if options.precondition_uid and options.precondition_uid != meta["uid"]:
                raise conflict(
                    kind.qualified,
                    name,
                    f"Precondition failed: UID in precondition: {options.precondition_uid}, "
                    f"UID in object meta: {meta['uid']}",
                )
            if (
                options.precondition_resource_version
                and options.precondition_resource_version != meta["resourceVersion"]
            ):
                raise conflict(
                    kind.qualified,
                    name,
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{options.precondition_resource_version}, "
                    f"ResourceVersion in object meta: {meta['resourceVersion']}",
                )
            if dry_run:
                return copy.deepcopy(current), not meta.get("finalizers")
            if options.propagation_policy == "Foreground" and self.garbage_collection:
                return self._delete_in_foreground(kind, key, current), True
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return copy.deepcopy(current), False
                marked = copy.deepcopy(current)
                marked["metadata"]["deletionTimestamp"] = now_rfc3339()
                marked["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._commit(kind, key, "MODIFIED", marked, current), False
            deleted = self._remove(kind, key, current)
            self._collect_garbage(meta["uid"], options.propagation_policy)
            return deleted, True

    def _delete_in_foreground(self, kind: ResourceKind, key: Key, current: Obj) -> Obj:
        """`propagationPolicy=Foreground`: the object is marked (deletionTimestamp and the
        `foregroundDeletion` finalizer, a MODIFIED event), its dependents are deleted, then the garbage
        collector removes the finalizer and the object goes (DELETED) unless other finalizers keep it. The
        real collector does this asynchronously; here it is done before the answer, which is the marked
        object (200, as the real server answers)."""
        meta = current["metadata"]
        marked = copy.deepcopy(current)
        marked["metadata"].setdefault("deletionTimestamp", now_rfc3339())
        marked["metadata"].setdefault("deletionGracePeriodSeconds", 0)
        finalizers = list(meta.get("finalizers") or [])
        if FOREGROUND_DELETION not in finalizers:
            marked["metadata"]["finalizers"] = [*finalizers, FOREGROUND_DELETION]
        answer = self._commit(kind, key, "MODIFIED", marked, current)
        others = {o["metadata"]["uid"] for objs in self._objects.values() for o in objs.values()}
        others.discard(meta["uid"])
        for dep_kind, objects in self._objects.items():
            for dep_key, dep in list(objects.items()):
                refs = dep["metadata"].get("ownerReferences") or []
                ours = any(r.get("uid") == meta["uid"] for r in refs)
                if ours and dep_key in objects and not any(r.get("uid") in others for r in refs):
                    self.delete(dep_kind, dep_key[0], dep_key[1], DeleteOptions("Foreground"))
        now = self._objects[kind].get(key)
        if now is not None and now["metadata"]["uid"] == meta["uid"]:
            left = [f for f in now["metadata"].get("finalizers") or [] if f != FOREGROUND_DELETION]
            released = copy.deepcopy(now)
            if left:
                released["metadata"]["finalizers"] = left
                self._commit(kind, key, "MODIFIED", released, now)
            else:
                released["metadata"].pop("finalizers", None)
                self._remove(kind, key, released)
        return copy.deepcopy(answer)

    def _remove(self, kind: ResourceKind, key: Key, current: Obj) -> Obj:
        return self._commit(kind, key, "DELETED", copy.deepcopy(current), current)

    def _collect_garbage(self, owner_uid: str, policy: str) -> None:
        """Dependents of a deleted owner: orphaned (reference removed) or deleted when no owner is left."""
        if not self.garbage_collection:
            return
        live = {o["metadata"]["uid"] for objs in self._objects.values() for o in objs.values()}
        for kind, objects in self._objects.items():
            for key, obj in list(objects.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if not any(r.get("uid") == owner_uid for r in refs):
                    continue
                if policy == "Orphan":
                    kept = copy.deepcopy(obj)
                    kept["metadata"]["ownerReferences"] = [
                        r for r in refs if r.get("uid") != owner_uid
                    ] or None
                    if kept["metadata"]["ownerReferences"] is None:
                        del kept["metadata"]["ownerReferences"]
                    self._commit(kind, key, "MODIFIED", kept, obj)
                elif not any(r.get("uid") in live for r in refs):
                    self.delete(kind, key[0], key[1], DeleteOptions(propagation_policy=policy))

    # ---- helpers --------------------------------------------------------------------------------

    def _generate_name(self, kind: ResourceKind, namespace: str, prefix: str) -> str:
        # apiserver: prefix (cut to leave room) + 5 random lower-case alphanumerics.
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        for _ in range(100):
            suffix = "".join(alphabet[b % len(alphabet)] for b in uuid.uuid4().bytes[:5])
            name = prefix[: 63 - 5] + suffix
            if (namespace if kind.namespaced else "", name) not in self._objects[kind]:
                return name
        raise ApiError(500, "InternalError", "could not generate a unique name")

    def _validate(self, kind: ResourceKind, obj: Obj, old: Obj | None) -> None:
        if not self.validation:
            return
        errors = validate(kind, obj, old, self.check_cel)
        if errors:
            raise invalid(kind.group, kind.kind, (obj.get("metadata") or {}).get("name") or "", errors)

    def _prepare_update(self, kind: ResourceKind, current: Obj, new: Obj, subresource: str) -> Obj:
        meta = new.setdefault("metadata", {})
        old_meta = current["metadata"]
        for owned in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "name",
        ):
            if owned in old_meta:
                meta[owned] = old_meta[owned]
            else:
                meta.pop(owned, None)
        if kind.namespaced:
            meta["namespace"] = old_meta["namespace"]
        if subresource == "status":
            # ResetObjectMetaForStatus + the status strategy: only status changes.
            keep_status = new.get("status")
            new = copy.deepcopy(current)
            if keep_status is None:
                new.pop("status", None)
            else:
                new["status"] = keep_status
        elif kind.status and not kind.custom:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
        return new

    def _write(self, kind: ResourceKind, current: Obj, new: Obj) -> Obj:
        key = (
            (current["metadata"].get("namespace") or "") if kind.namespaced else "",
            current["metadata"]["name"],
        )
        if kind.has_generation and new.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if new == current:
            return copy.deepcopy(current)  # a no-op write bumps nothing, as in etcd3's GuaranteedUpdate
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            deleted = self._remove(kind, key, new)
            self._collect_garbage(new["metadata"]["uid"], "Background")
            return deleted
        return self._commit(kind, key, "MODIFIED", new, current)

    def _commit(
        self, kind: ResourceKind, key: Key, type_: str, obj: Obj, previous: Obj | None, *, record: bool = True
    ) -> Obj:
        self.resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        obj["apiVersion"], obj["kind"] = kind.api_version(kind.versions[0]), kind.kind
        if type_ == "DELETED":
            self._objects[kind].pop(key, None)
        else:
            self._objects[kind][key] = obj
        if record:
            self.history.append(
                Event(self.resource_version, type_, kind, copy.deepcopy(obj), copy.deepcopy(previous))
            )
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def put_unrecorded(self, kind: ResourceKind, obj: Obj) -> Obj:
        """Store a changed object without an event, as if the event had been compacted away unseen."""
        with self.cond:
            meta = obj["metadata"]
            key = ((meta.get("namespace") or "") if kind.namespaced else "", meta["name"])
            return self._commit(
                kind, key, "MODIFIED", copy.deepcopy(obj), self._objects[kind].get(key), record=False
            )

    def compact(self) -> None:
        with self.cond:
            self.history.clear()
            self.compacted = self.resource_version

    def close_streams(self) -> None:
        with self.cond:
            self.epoch += 1
            self.cond.notify_all()


def _apply_defaults(kind: ResourceKind, obj: Obj) -> None:
    """The API's defaulting for what the allocator reads: allocationMode ExactCount with count 1, and
    toleration operator Equal (pkg/apis/resource/v1/defaults.go)."""
    if kind is RESOURCE_CLAIMS:
        spec = obj.get("spec")
    elif kind is RESOURCE_CLAIM_TEMPLATES:
        spec = (obj.get("spec") or {}).get("spec")
    else:
        return
    for request in ((spec or {}).get("devices") or {}).get("requests") or []:
        exacts = [request["exactly"]] if isinstance(request.get("exactly"), dict) else []
        exacts += [s for s in request.get("firstAvailable") or [] if isinstance(s, dict)]
        for exact in exacts:
            exact.setdefault("allocationMode", "ExactCount")
            if exact["allocationMode"] == "ExactCount":
                exact.setdefault("count", 1)
            for toleration in exact.get("tolerations") or []:
                toleration.setdefault("operator", "Equal")
