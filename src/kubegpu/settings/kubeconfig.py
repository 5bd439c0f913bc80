"""A kubeconfig checked before the Kubernetes client reads it, and the client configuration built from it
(the official client's, for the tools; the DRA driver reads the same files through `kubeaccess`).

The Python client reads a kubeconfig whole and parses it with PyYAML, which expands aliases as it builds
objects: a wrong path (/dev/zero) or an alias bomb would exhaust the process before any error. kubectl and
client-go parse kubeconfigs with go-yaml v2 (through sigs.k8s.io/yaml), so the same limits apply here: the
file is read up to KUBECONFIG_LIMIT, decoded as UTF-8, and parsed by `goyaml` (go-yaml's alias rules) before
the client sees it.
"""

from __future__ import annotations

import codecs
import os
from typing import TYPE_CHECKING, Any

from kubegpu.common.files import MIB, FileProblem, decode_text, read_bytes

if TYPE_CHECKING:
    from kubernetes import client

# Large kubeconfigs hold thousands of contexts with embedded certificates: a few MB.
KUBECONFIG_LIMIT = 16 * MIB
KUBECONFIG_NODES = 200_000

if TYPE_CHECKING:  # the client is imported only by who builds its configuration (not the DRA driver)
    from kubernetes import client


class KubeconfigError(ValueError):
    """A kubeconfig file that cannot be used; the message names the file, the problem and the fix."""


def check_kubeconfig(paths: str) -> None:
    """Check each file of `paths` (one path, or several joined by ':' as in KUBECONFIG) that exists."""
    for path in paths.split(os.pathsep):
        path = os.path.expanduser(path)
        if not path or not os.path.exists(path):
            continue  # the client reports a missing file in its own words
        read_kubeconfig(path)


def read_kubeconfig(path: str) -> Any:
    """The parsed kubeconfig at `path`; KubeconfigError naming the problem and the fix. Read within the
    limit, UTF-8 (the Python client reads no other encoding), one YAML document, and the shape the clients
    index into (lists of named clusters, contexts and users), so that no file makes a client fail with a
    TypeError deep inside it."""
    # The YAML reader (2.7 MB resident) only with a kubeconfig: a pod using its service account needs none.
    from kubegpu.settings.goyaml import GoYamlError
    from kubegpu.settings.goyaml import load as load_yaml

    try:
        data = read_bytes(path, limit=KUBECONFIG_LIMIT, what="kubeconfig")
        if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            raise KubeconfigError(
                f"invalid kubeconfig {path}: is UTF-16 or UTF-32 text, which the Kubernetes client "
                "cannot read; save it as UTF-8 (e.g. iconv -f utf-16 -t utf-8)"
            )
        text = decode_text(data, path, what="kubeconfig")
        document = load_yaml(text, max_nodes=KUBECONFIG_NODES)
    except FileProblem as err:
        raise KubeconfigError(f"invalid kubeconfig {err}") from err
    except GoYamlError as err:
        where = f" (line {err.line}, column {err.column})" if err.line else ""
        raise KubeconfigError(f"invalid kubeconfig {path}: {err}{where}; fix or regenerate it") from err
    if _documents(text) > 1:
        raise KubeconfigError(
            f"invalid kubeconfig {path}: holds more than one YAML document; a kubeconfig is one "
            "(remove the '---' line and what follows it)"
        )
    problem = shape_problem(document.value)
    if problem:
        raise KubeconfigError(f"invalid kubeconfig {path}: {problem}; fix or regenerate it")
    return document.value


def _documents(text: str) -> int:
    """How many YAML documents `text` holds, counted up to 2 (parser events only: no alias is expanded)."""
    import yaml  # PyYAML's event parser, with the kubeconfig reader only

    count = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.DocumentStartEvent):
                count += 1
                if count > 1:
                    break
    except yaml.YAMLError:
        return count  # a syntax error after the first document: go-yaml (and goyaml.load) never reads it
    return count


_LISTS = {"clusters": "cluster", "contexts": "context", "users": "user"}


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )


def shape_problem(value: Any) -> str | None:
    """What makes a decoded kubeconfig unreadable for the client, or None: the fields it indexes into."""
    if value is None:
        return None  # empty: the client says "no configuration found"
    if not isinstance(value, dict):
        return f"is {_kind(value)}, not a mapping of clusters, contexts and users"
    for field, item in _LISTS.items():
        entries = value.get(field)
        if entries is None:
            continue
        if not isinstance(entries, list):
            return f"{field} is {_kind(entries)}, not a list"
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"{field}[{i}] is {_kind(entry)}, not a mapping with a name and a {item}"
            if not isinstance(entry.get("name"), str):
                return f"{field}[{i}].name is {_kind(entry.get('name'))}, not a string"
            if not isinstance(entry.get(item), dict | None):
                return f"{field}[{i}].{item} is {_kind(entry.get(item))}, not a mapping"
    current = value.get("current-context")
    if not isinstance(current, str | None):
        return f"current-context is {_kind(current)}, not a string"
    if not isinstance(value.get("preferences"), dict | None):
        return f"preferences is {_kind(value.get('preferences'))}, not a mapping"
    return None


def load_configuration(kubeconfig: str) -> client.Configuration:
    """The client configuration of the kubeconfig at this path (checked first), or the in-cluster one (the
    pod's service account) when it is empty. Raises KubeconfigError with the reason.

    Its own Configuration object, not the client's process-wide default, so that several clients (tests)
    can coexist; and no urllib3 retries underneath: callers retry with back-off and log each failure once.
    """
    # The client library loads here, not with this module: 0.6 s that a command checking a kubeconfig, or
    # `lint` of a file, does not need.
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if kubeconfig:
            check_kubeconfig(kubeconfig)
            # (the client library ships no type hints)
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, TypeError) as err:
        raise KubeconfigError(str(err)) from err
    except ValueError as err:  # the client's own parse errors, and ours (KubeconfigError is a ValueError)
        raise err if isinstance(err, KubeconfigError) else KubeconfigError(str(err)) from err
    configuration.retries = 0
    return configuration
