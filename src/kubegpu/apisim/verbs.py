"""The REST verbs on a resource, as the real API server answers them: GET, LIST (labelSelector;
fieldSelector on metadata.name and each kind's own labels), CREATE (generateName, 409 AlreadyExists), UPDATE
(409 Conflict on a stale resourceVersion), PATCH (merge and strategic merge; JSON patch and server-side
apply are a 415), DELETE (finalizers, preconditions, owner-reference garbage collection) and DELETE on a
collection (how the kubelet wipes a node's slices); `dryRun=All` on writes. Objects are stored once, in
the hub (v1) shape, and converted per request (convert.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .convert import from_hub, to_hub
from .errors import bad_request, method_not_allowed, unsupported_media_type
from .kinds import NODES, ResourceKind, field_value
from .patch import merge_patch, strategic_merge_patch
from .routes import ResourceRoute
from .selectors import matcher
from .store import DeleteOptions, Obj, Store

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def list_body(store: Store, route: ResourceRoute, query: Mapping[str, str]) -> dict[str, Any]:
    kind = route.kind
    wanted = route_matcher(route, query)
    items, rv = store.list(kind, route.namespace, wanted)
    shown = [from_hub(kind, route.version, o) for o in items]
    if not kind.custom:  # built-in lists leave kind/apiVersion out of their items
        for item in shown:
            item.pop("kind", None)
            item.pop("apiVersion", None)
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version(route.version),
        "metadata": {"resourceVersion": str(rv)},
        "items": shown,
    }


def route_matcher(route: ResourceRoute, query: Mapping[str, str]) -> Callable[[Obj], bool]:
    return matcher(
        query.get("labelSelector", ""),
        query.get("fieldSelector", ""),
        route.kind.supported_field_labels(),
        field_value,
    )


def handle(
    store: Store, method: str, route: ResourceRoute, query: Mapping[str, str], body: Any, content_type: str
) -> tuple[int, Any]:
    """Every non-watch resource request: (HTTP status, response body)."""
    kind, version, ns = route.kind, route.version, route.scope_namespace
    dry_run = query.get("dryRun") == "All" or (isinstance(body, dict) and "All" in (body.get("dryRun") or []))
    if method == "GET":
        if not route.name:
            return 200, list_body(store, route, query)
        return 200, from_hub(kind, version, store.get(kind, ns, route.name))
    if method == "POST":
        if route.name or (route.namespace is None and kind.namespaced):
            raise method_not_allowed()
        obj = _body_object(route, body)
        if kind.namespaced and obj.get("metadata", {}).get("namespace") not in (
            None,
            "",
            route.namespace,
        ):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        created = store.create(kind, ns, to_hub(kind, version, obj), dry_run=dry_run)
        return 201, from_hub(kind, version, created)
    if method == "PUT":
        if not route.name:
            raise method_not_allowed()
        obj = _body_object(route, body)
        name = (obj.get("metadata") or {}).get("name")
        if name != route.name:
            raise bad_request(
                f"the name of the object ({name}) does not match the name on the URL ({route.name})"
            )
        updated = store.update(
            kind,
            ns,
            route.name,
            to_hub(kind, version, obj),
            subresource=route.subresource,
            dry_run=dry_run,
        )
        return 200, from_hub(kind, version, updated)
    if method == "PATCH":
        if not route.name:
            raise method_not_allowed()
        apply = _patcher(kind, content_type)

        def change(current: Obj) -> Obj:
            return to_hub(kind, version, apply(from_hub(kind, version, current), body))

        return 200, from_hub(
            kind,
            version,
            store.mutate(kind, ns, route.name, change, subresource=route.subresource, dry_run=dry_run),
        )
    if method == "DELETE":
        options = _delete_options(query, body)
        if not route.name:
            if route.namespace is None and kind.namespaced:
                raise method_not_allowed()
            items, _ = store.list(kind, route.namespace, route_matcher(route, query))
            deleted = []
            for item in items:
                obj, _ = store.delete(kind, ns, item["metadata"]["name"], options, dry_run=dry_run)
                deleted.append(from_hub(kind, version, obj))
            list_rv = str(store.resource_version)
            return 200, {
                "kind": f"{kind.kind}List",
                "apiVersion": kind.api_version(version),
                "metadata": {"resourceVersion": list_rv},
                "items": deleted,
            }
        obj, gone_now = store.delete(kind, ns, route.name, options, dry_run=dry_run)
        code = 200 if gone_now else 202
        if kind is NODES:
            details = {"name": route.name, "kind": kind.plural, "uid": obj["metadata"]["uid"]}
            return code, {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            }
        return code, from_hub(kind, version, obj)
    raise method_not_allowed()


def _body_object(route: ResourceRoute, body: Any) -> Obj:
    if not isinstance(body, dict):
        raise bad_request("the body of the request must be a JSON object")
    expected = route.kind.api_version(route.version)
    given = body.get("apiVersion")
    if given and given != expected:
        raise bad_request(
            f"the API version in the data ({given}) does not match the expected API version ({expected})"
        )
    if body.get("kind") and body["kind"] != route.kind.kind:
        raise bad_request(
            f"the kind in the data ({body['kind']}) does not match the expected kind ({route.kind.kind})"
        )
    return body


def _patcher(kind: ResourceKind, content_type: str) -> Callable[[Obj, Any], Obj]:
    media = content_type.split(";")[0].strip()
    accepted = [MERGE_PATCH] if kind.custom else [MERGE_PATCH, STRATEGIC_MERGE_PATCH]
    if media == MERGE_PATCH:
        return merge_patch
    if media == STRATEGIC_MERGE_PATCH and not kind.custom:
        return strategic_merge_patch
    raise unsupported_media_type(media, accepted)


def _delete_options(query: Mapping[str, str], body: Any) -> DeleteOptions:
    body = body if isinstance(body, dict) else {}
    preconditions = body.get("preconditions") or {}
    return DeleteOptions(
        propagation_policy=query.get("propagationPolicy") or body.get("propagationPolicy") or "Background",
        precondition_uid=preconditions.get("uid"),
        precondition_resource_version=preconditions.get("resourceVersion"),
    )
