"""`kubegpu doctor --cluster --preflight FILE`: would the device-plugin DaemonSet in FILE strand a GPU node?

Run before moving from NVIDIA's device plugin (or any change of the DaemonSet), on the output of
`helm template` or a static manifest. Two ways a migration leaves GPU nodes without a plugin:

- The DaemonSet matches no node, or misses GPU nodes. NVIDIA's chart with `gfd.enabled=true` installs
  Node Feature Discovery as a subchart, and uninstalling that release prunes every label NFD set,
  `feature.node.kubernetes.io/pci-10de.present` and GFD's `nvidia.com/gpu.present` included: the labels
  the DaemonSet's affinity selects GPU nodes by. The check judges the nodes by the labels they will keep.
- The image cannot be pulled: an old values file pins NVIDIA's `image.tag`, so `--set image.repository=`
  alone asks for `REGISTRY/kubegpu:v0.17.1`, which does not exist (ImagePullBackOff on every node), or the
  repository is still NVIDIA's, whose image has no `kubegpu` command.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import yaml

from kubegpu import __version__
from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.cluster_facts import is_plugin_daemonset, promises_gpus
from kubegpu.toolkit.doctor.findings import FAIL, OK, WARN, Finding, listed, ordered
from kubegpu.toolkit.doctor.plugin import DAEMONSET_DEFAULT_TOLERATIONS
from kubegpu.toolkit.model import Container, DaemonSet, Node, Taint
from kubegpu.toolkit.scheduling import selector_matches, untolerated
from kubegpu.toolkit.snapshot import Snapshot

NFD_LABEL_PREFIX = "feature.node.kubernetes.io/"
# nfd-master lists the labels it owns on each node (names in its default namespace without the prefix).
NFD_LABELS_ANNOTATION = "nfd.node.kubernetes.io/feature-labels"
NFD_NAME = "node-feature-discovery"
NVIDIA_IMAGES = ("k8s-device-plugin", "nvidia-device-plugin")
INSTANCE = "app.kubernetes.io/instance"
VERSION = "app.kubernetes.io/version"
# A release tag (v0.17.1, 0.17.1, v0.17.1-ubi9, v0.14.5-ubuntu20.04): someone's version, maybe not ours.
RELEASE_TAG = re.compile(r"^v?\d+\.\d+\.\d+(-[\w.]+)?$")


class PreflightError(ValueError):
    """The planned manifests cannot be read, or hold no device-plugin DaemonSet."""


@dataclass(frozen=True)
class Departure:
    """NFD that leaves with NVIDIA's release, and NFD that stays to label the nodes again."""

    leaving: list[DaemonSet]
    staying: list[DaemonSet]

    def describe(self) -> str:
        names = [f"{ds.metadata.namespace}/{ds.metadata.name}" for ds in self.leaving]
        return f"NFD of NVIDIA's release ({listed(names)})"


def _ref(ds: DaemonSet) -> str:
    return (
        f"daemonset/{ds.metadata.namespace}/{ds.metadata.name}"
        if ds.metadata.namespace
        else (f"daemonset/{ds.metadata.name}")
    )


def _images(ds: DaemonSet) -> list[str]:
    spec = ds.spec.template.spec
    return [c.image for c in (*(spec.init_containers or []), *(spec.containers or []))]


def _is_nvidia_plugin(ds: DaemonSet) -> bool:
    return any(any(mark in image for mark in NVIDIA_IMAGES) for image in _images(ds))


def _is_nfd(ds: DaemonSet) -> bool:
    return NFD_NAME in ds.metadata.name or any(NFD_NAME in image for image in _images(ds))


def nfd_departure(snap: Snapshot) -> Departure | None:
    """NFD DaemonSets installed by the release of NVIDIA's plugin (same Helm instance, or the same namespace
    when unlabelled): uninstalling that release removes them and prunes their labels."""
    releases = {
        ((ds.metadata.labels or {}).get(INSTANCE), ds.metadata.namespace)
        for ds in snap.daemonsets
        if _is_nvidia_plugin(ds)
    }
    if not releases:
        return None
    leaving: list[DaemonSet] = []
    staying: list[DaemonSet] = []
    for ds in snap.daemonsets:
        if not _is_nfd(ds):
            continue
        instance = (ds.metadata.labels or {}).get(INSTANCE)
        same = any(
            (instance is not None and instance == rel) or (instance is None and ds.metadata.namespace == ns)
            for rel, ns in releases
        )
        (leaving if same else staying).append(ds)
    return Departure(leaving, staying) if leaving else None


def nfd_labels(node: Node) -> set[str]:
    """The labels NFD owns on the node: from its annotation, or (without one) every label in its namespace
    and every nvidia.com label but the ones people set (GFD's reach nodes through NFD)."""
    labels = node.metadata.labels or {}
    listed_names = (node.metadata.annotations or {}).get(NFD_LABELS_ANNOTATION)
    if listed_names is not None:
        names = {n.strip() for n in listed_names.split(",") if n.strip()}
        return {n if "/" in n else NFD_LABEL_PREFIX + n for n in names}
    return {
        k
        for k in labels
        if k.startswith(NFD_LABEL_PREFIX)
        or (k.startswith("nvidia.com/") and k != "nvidia.com/device-plugin.config")
    }


def labels_after(node: Node, departure: Departure | None) -> Node:
    """The node as it will be once NVIDIA's release and its NFD are gone."""
    if departure is None:
        return node
    pruned = nfd_labels(node)
    kept = {k: v for k, v in (node.metadata.labels or {}).items() if k not in pruned}
    return msgspec.structs.replace(node, metadata=msgspec.structs.replace(node.metadata, labels=kept))


def gpu_nodes(snap: Snapshot) -> list[Node]:
    """Nodes that have GPUs now, by their labels (before any pruning) or the GPU resources they advertise."""
    return [
        n
        for n in snap.nodes
        if promises_gpus(n)
        or any(res.is_gpu(r) and v > 0 for r, v in res.node_amounts(n.status.capacity or {}).items())
    ]


def _blocking_taint(ds: DaemonSet, node: Node) -> Taint | None:
    tolerations = [*(ds.spec.template.spec.tolerations or []), *DAEMONSET_DEFAULT_TOLERATIONS]
    return untolerated(node.spec.taints or [], tolerations)


def _lands_on(ds: DaemonSet, node: Node) -> bool:
    return selector_matches(ds.spec.template.spec, node) and _blocking_taint(ds, node) is None


FIX_LABELS = (
    "keep the labels: install NFD as its own release before uninstalling NVIDIA's (then wait for its labels "
    "to come back), or after the uninstall label the GPU nodes yourself: kubectl label node NODE "
    "nvidia.com/gpu.present=true (docs/install.md, section 7)"
)


@dataclass(frozen=True)
class _Move:
    """What the nodes look like now and after the uninstall, for one planned DaemonSet."""

    planned: DaemonSet
    departure: Departure | None
    now: list[str]  # nodes the DaemonSet lands on today
    later: list[str]  # ... and once NVIDIA's release and its NFD are gone
    pruned: list[str]  # the labels its selector needs that NFD takes away

    @property
    def restored(self) -> bool:
        """Another NFD stays and will set the pruned labels again."""
        return self.departure is not None and bool(self.departure.staying)


def check_nodes(planned: DaemonSet, snap: Snapshot) -> Iterator[Finding]:
    """The planned plugin DaemonSet lands on every GPU node, judged by the labels the nodes will keep."""
    departure = nfd_departure(snap)
    gpus = gpu_nodes(snap)
    move = _Move(
        planned,
        departure,
        now=[n.metadata.name for n in snap.nodes if _lands_on(planned, n)],
        later=[n.metadata.name for n in snap.nodes if _lands_on(planned, labels_after(n, departure))],
        pruned=sorted({k for n in gpus for k in nfd_labels(n)} & _selector_keys(planned))
        if departure
        else [],
    )
    if not move.later and not move.restored:
        yield _matches_nothing(move, len(gpus))
    missed = [n for n in gpus if n.metadata.name not in move.later]
    for node in missed:
        yield _missed(move, node)
    if move.later and not missed:
        yield Finding(
            "preflight-nodes",
            OK,
            _ref(planned),
            f"would run on {len(move.later)} node(s), every one of the {len(gpus)} GPU node(s)"
            + (" with the labels they keep after NVIDIA's release is uninstalled" if departure else ""),
            None,
            "",
        )


def _matches_nothing(move: _Move, gpu_count: int) -> Finding:
    if move.departure is not None and move.now:
        evidence = (
            f"matches {len(move.now)} node(s) now, but none once NVIDIA's release is uninstalled: "
            f"{move.departure.describe()} prunes {', '.join(move.pruned) or 'the labels it set'}"
        )
        return Finding("preflight-nodes", FAIL, _ref(move.planned), evidence, 2, FIX_LABELS)
    labels = ", ".join(sorted(_selector_keys(move.planned))) or "none"
    return Finding(
        "preflight-nodes",
        FAIL,
        _ref(move.planned),
        f"matches no node: no node has the labels its affinity needs ({labels}) without a taint it does not "
        f"tolerate; {gpu_count} node(s) have GPUs",
        2,
        "label the GPU nodes (kubectl label node NODE nvidia.com/gpu.present=true), install NFD, or widen "
        "the DaemonSet's affinity",
    )


def _missed(move: _Move, node: Node) -> Finding:
    """Why the planned DaemonSet would leave this GPU node without a plugin."""
    name = node.metadata.name
    taint = _blocking_taint(move.planned, node)
    if taint is not None:
        return Finding(
            "preflight-nodes",
            FAIL,
            f"node/{name}",
            "GPU node the new DaemonSet would not run on: it does not tolerate the node's taint "
            f"{taint.key}={taint.value or ''}:{taint.effect}",
            2,
            f"add to tolerations {{key: {taint.key}, operator: Exists, effect: {taint.effect}}}",
        )
    if name in move.now and move.departure is not None:
        why = (
            f"its labels {', '.join(move.pruned)} are pruned when NVIDIA's release is uninstalled "
            f"({move.departure.describe()})"
        )
        if move.restored:
            keeper = listed([f"{d.metadata.namespace}/{d.metadata.name}" for d in move.departure.staying])
            why += f"; NFD {keeper} should set them again: install kubegpu once they are back"
        status = WARN if move.restored else FAIL
        return Finding(
            "preflight-nodes", status, f"node/{name}", f"GPU node left without a plugin: {why}", 2, FIX_LABELS
        )
    keys = ", ".join(sorted(_selector_keys(move.planned))) or "none"
    return Finding(
        "preflight-nodes",
        FAIL,
        f"node/{name}",
        f"GPU node the new DaemonSet would not run on: its labels do not match the DaemonSet's "
        f"nodeSelector/affinity ({keys})",
        2,
        "label the node (kubectl label node NODE nvidia.com/gpu.present=true) or widen the affinity",
    )


def _selector_keys(ds: DaemonSet) -> set[str]:
    spec = ds.spec.template.spec
    keys = set((spec.node_selector or {}).keys())
    affinity = spec.affinity.node_affinity.required if spec.affinity and spec.affinity.node_affinity else None
    for term in (affinity.node_selector_terms or []) if affinity else []:
        keys.update(req.key for req in term.match_expressions or [])
    return keys


def _split_image(image: str) -> tuple[str, str | None, bool]:
    """(repository, tag or None, pinned by digest)."""
    if "@" in image:
        return image.split("@", 1)[0], None, True
    name, _, last = image.rpartition("/")
    if ":" in last:
        repo_last, tag = last.split(":", 1)
        return f"{name}/{repo_last}" if name else repo_last, tag, False
    return image, None, False


def our_versions(ds: DaemonSet) -> list[str]:
    """The versions the manifest was made for (the chart's appVersion label) and this kubegpu's."""
    found = [
        labels.get(VERSION)
        for labels in (ds.metadata.labels or {}, ds.spec.template.metadata.labels or {})
        if labels.get(VERSION)
    ]
    return list(dict.fromkeys([*(v for v in found if v), __version__]))


def check_images(planned: DaemonSet, snap: Snapshot) -> Iterator[Finding]:
    """Every kubegpu container pulls a kubegpu image with one of our tags."""
    ds_ref = _ref(planned)
    versions = our_versions(planned)
    tags = {t for v in versions for t in (v, f"v{v}")}
    running_nvidia = {
        _split_image(image)[1] for ds in snap.daemonsets if _is_nvidia_plugin(ds) for image in _images(ds)
    }
    spec = planned.spec.template.spec
    containers: list[Container] = [*(spec.init_containers or []), *(spec.containers or [])]
    ours = [c for c in containers if (c.command or [""])[0] == "kubegpu"]
    images = sorted({c.image for c in ours})
    problems = 0
    for image in images:
        repo, tag, digest = _split_image(image)
        users = ", ".join(c.name for c in ours if c.image == image)
        if any(mark in repo.rpartition("/")[2] for mark in NVIDIA_IMAGES):
            problems += 1
            yield Finding(
                "preflight-image",
                FAIL,
                ds_ref,
                f"{users} run `kubegpu` from {image}, NVIDIA's image, which has no kubegpu command: every "
                "pod would fail to start (StartError)",
                4,
                "set the image to your build of kubegpu: --set image.repository=REGISTRY/kubegpu "
                f"--set image.tag={versions[0]}",
            )
        elif digest:
            continue
        elif tag is None:
            problems += 1
            yield Finding(
                "preflight-image",
                WARN,
                ds_ref,
                f"{image} has no tag, so every node pulls :latest",
                None,
                f"pin the tag: --set image.tag={versions[0]}",
            )
        elif tag not in tags and (RELEASE_TAG.match(tag) or tag in running_nvidia):
            problems += 1
            whose = "the tag NVIDIA's plugin runs now" if tag in running_nvidia else "a release tag"
            yield Finding(
                "preflight-image",
                FAIL,
                ds_ref,
                f"{users} would pull {image}: {whose}, not kubegpu's ({', '.join(sorted(tags))}); an old "
                "values file's image.tag keeps it when only image.repository is set, and the registry has "
                "no such kubegpu image (ImagePullBackOff on every node)",
                4,
                f"--set image.tag={versions[0]} (or remove image.tag from the values file, or "
                "helm upgrade --reset-values)",
            )
        elif tag not in tags:
            problems += 1
            yield Finding(
                "preflight-image",
                WARN,
                ds_ref,
                f"{image} is not tagged with this kubegpu's version ({', '.join(sorted(tags))})",
                None,
                f"make sure {image} exists in the registry and is a kubegpu build",
            )
    if not problems and images:
        yield Finding("preflight-image", OK, ds_ref, f"pulls {', '.join(images)}", None, "")


def read_planned(text: str, source: str) -> list[DaemonSet]:
    """The DaemonSets in a manifest file (multi-document YAML or JSON, Lists too); other kinds are ignored,
    as `helm template` prints ServiceAccounts, ConfigMaps and RBAC around them."""
    try:
        docs = list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except yaml.YAMLError as exc:
        raise PreflightError(f"{source} is not YAML or JSON: {exc}") from exc
    items: list[Any] = []
    for doc in docs:
        if isinstance(doc, dict) and isinstance(doc.get("items"), list):
            items.extend(doc["items"])
        else:
            items.append(doc)
    daemonsets = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or item.get("kind") != "DaemonSet":
            continue
        try:
            daemonsets.append(msgspec.convert(item, DaemonSet))
        except msgspec.ValidationError as exc:
            raise PreflightError(f"{source}: DaemonSet {index + 1} is not a valid DaemonSet: {exc}") from exc
    if not any(is_plugin_daemonset(ds) for ds in daemonsets):
        found = ", ".join(ds.metadata.name for ds in daemonsets) or "none"
        raise PreflightError(
            f"{source} holds no device-plugin DaemonSet (DaemonSets: {found}); give the output of `helm "
            "template` for the chart with your values, or the static manifest you will apply"
        )
    return daemonsets


def preflight(planned: list[DaemonSet], snap: Snapshot) -> list[Finding]:
    """The findings for the device-plugin DaemonSets in `planned` against the cluster in `snap`: nodes for
    the plugin, images for every DaemonSet."""
    findings: list[Finding] = []
    for ds in planned:
        if is_plugin_daemonset(ds):
            findings.extend(check_nodes(ds, snap))
    for ds in planned:
        findings.extend(check_images(ds, snap))
    return ordered(findings)
