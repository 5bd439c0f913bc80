"""The node's config label as a stream of values, read through the official `kubernetes` client.

What NVIDIA's config-manager gets from a client-go informer, done by hand: list the one Node (field
selector `metadata.name=<node>`, so the API server sends nothing about other nodes), then watch from the
list's resourceVersion; a watch that ends is resumed from the last resourceVersion seen; `410 Gone`
(history compacted) means events were lost, so list again; any other failure (API server down, 5xx,
dropped connection) is retried with capped exponential back-off, starting with a fresh list.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Generator, Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kubegpu.common.backoff import Backoff
from kubegpu.configmanager.errors import ConfigManagerError
from kubegpu.settings.kubeconfig import KubeconfigError, load_configuration

log = logging.getLogger("kubegpu.configmanager")

HTTP_GONE = 410


def connect(kubeconfig: str) -> Any:
    """A CoreV1Api for `kubeconfig` (a path, or colon-separated paths), or the in-cluster config when empty.

    Its own Configuration object, not the client's process-wide default, so that several clients (tests)
    can coexist.
    """
    try:
        configuration = load_configuration(kubeconfig)
    except KubeconfigError as err:
        raise ConfigManagerError(f"error building kubernetes clientcmd config: {err}") from err
    return client.CoreV1Api(client.ApiClient(configuration))


def watch_backoff() -> Backoff:
    """client-go's reflector back-off: 800 ms doubling to 30 s, up to 25% longer for jitter, starting over
    after 2 minutes without a failure (a list that works followed by a watch that fails at once, e.g. RBAC
    allowing list but not watch, must not retry in a tight loop)."""
    return Backoff(initial=0.8, maximum=30.0, jitter=(1.0, 1.25), reset_after=120.0)


class LabelTracker:
    """Turns observations of the Node into label values to act on, like NVIDIA's informer handlers.

    The first sighting of the node always counts (so a start-up without the label still selects the
    default); afterwards only changes do. A deleted node counts as the label's removal.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.last: str | None = None  # None: no value reported yet

    def seen(self, labels: Mapping[str, str] | None) -> str | None:
        """The node with these labels was listed or watched; the value to report, or None."""
        value = (labels or {}).get(self.label, "")
        if value == self.last:
            return None
        self.last = value
        return value

    def gone(self) -> str | None:
        """The node was deleted (or is missing from a list); reports "" when it had the label."""
        if not self.last:
            return None
        self.last = ""
        return ""


class NodeLabelWatcher:
    """Yields the node's label value on start and on every change, until `stop()`."""

    def __init__(
        self,
        core: Any,
        node_name: str,
        label: str,
        *,
        backoff: Backoff | None = None,
        watch_timeout: tuple[float, float] = (300.0, 600.0),
        connect_timeout: float = 10.0,
    ) -> None:
        self.core = core
        self.node_name = node_name
        self.tracker = LabelTracker(label)
        self.backoff = backoff or watch_backoff()
        # The API server ends each watch after timeoutSeconds; a random one in client-go's 5-10 minute
        # range spreads the reconnects of many nodes. The client-side read timeout (a little longer)
        # catches a connection that died without a FIN.
        self.watch_timeout = watch_timeout
        self.connect_timeout = connect_timeout
        self._stop = threading.Event()

    @property
    def field_selector(self) -> str:
        return f"metadata.name={self.node_name}"

    def stop(self) -> None:
        """Ends `labels()` at its next event, stream end or back-off."""
        self._stop.set()

    def labels(self) -> Iterator[str]:
        while not self._stop.is_set():
            try:
                resource_version = yield from self._list()
                while not self._stop.is_set():
                    resource_version = yield from self._watch(resource_version)
            except ApiException as err:
                if err.status == HTTP_GONE:
                    log.info("Watch of Node %s expired (%s); listing it again", self.node_name, err.reason)
                    continue
                self._wait_after(f"the API server answered {err.status} {err.reason}")
            except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError) as err:
                # ValueError, KeyError: a garbled response (JSON, chunk sizes, an ERROR event without a
                # code) from a proxy or a dying connection; retrying is all a watcher can do about it.
                self._wait_after(f"{type(err).__name__}: {err}")

    def _wait_after(self, reason: str) -> None:
        delay = self.backoff.next_delay()
        log.warning("Cannot watch Node %s: %s; retrying in %.1fs", self.node_name, reason, delay)
        self._stop.wait(delay)

    def _list(self) -> Generator[str, None, str]:
        """Yields the label's value when it is new; returns the resourceVersion to watch from."""
        node_list = self.core.list_node(
            field_selector=self.field_selector, _request_timeout=(self.connect_timeout, 60)
        )
        nodes = [n for n in node_list.items or [] if n.metadata and n.metadata.name == self.node_name]
        if nodes:
            value = self.tracker.seen(nodes[0].metadata.labels)
        else:
            log.warning("Node %s not found; waiting for it to appear", self.node_name)
            value = self.tracker.gone()
        if value is not None:
            yield value
        return str(node_list.metadata.resource_version or "")  # "": watch from now

    def _watch(self, resource_version: str) -> Generator[str, None, str]:
        """One watch request, until the API server ends it; the resourceVersion to resume from."""
        timeout = round(random.uniform(*self.watch_timeout)) or 1
        w = watch.Watch()
        stream = w.stream(
            self.core.list_node,
            field_selector=self.field_selector,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            # Passing timeout_seconds also makes the client raise 410 to us instead of retrying once
            # from the same (expired) resourceVersion on its own.
            timeout_seconds=timeout,
            _request_timeout=(self.connect_timeout, timeout + 30),
        )
        for event in stream:
            if self._stop.is_set():
                w.stop()
                break
            value = self._handle(event)
            if value is not None:
                yield value
        return str(w.resource_version or resource_version)

    def _handle(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        if kind == "BOOKMARK":  # only carries a resourceVersion, which Watch has recorded
            return None
        node = event.get("object")
        metadata = getattr(node, "metadata", None)
        if metadata is None or metadata.name != self.node_name:
            return None
        if kind == "DELETED":
            return self.tracker.gone()
        return self.tracker.seen(metadata.labels)
