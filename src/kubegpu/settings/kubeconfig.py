"""A kubeconfig checked before the Kubernetes client reads it, and the client configuration built from it
(the official client's, for the tools; the DRA driver reads the same files through `kubeaccess`).

The Python client reads a kubeconfig whole and parses it with PyYAML, which expands aliases as it builds
objects: a wrong path (/dev/zero) or an alias bomb would exhaust the process before any error. kubectl and
client-go parse kubeconfigs with go-yaml v2 (through sigs.k8s.io/yaml), so the same limits apply here: the
file is read up to KUBECONFIG_LIMIT, decoded as UTF-8, and parsed by `goyaml` (go-yaml's alias rules) before
the client sees it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kubegpu.common.files import MIB, FileProblem, read_text_file

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
    """The parsed kubeconfig at `path`, read within the limits above; KubeconfigError naming the problem."""
    # The YAML reader (2.7 MB resident) only with a kubeconfig: a pod using its service account needs none.
    from kubegpu.settings.goyaml import GoYamlError
    from kubegpu.settings.goyaml import load as load_yaml

    try:
        text = read_text_file(path, limit=KUBECONFIG_LIMIT, what="kubeconfig")
        return load_yaml(text, max_nodes=KUBECONFIG_NODES).value
    except FileProblem as err:
        raise KubeconfigError(f"invalid kubeconfig {err}") from err
    except GoYamlError as err:
        where = f" (line {err.line}, column {err.column})" if err.line else ""
        raise KubeconfigError(f"invalid kubeconfig {path}: {err}{where}; fix or regenerate it") from err


def load_configuration(kubeconfig: str) -> client.Configuration:
    """The client configuration of the kubeconfig at this path (checked first), or the in-cluster one (the
    pod's service account) when it is empty. Raises KubeconfigError with the reason.

    Its own Configuration object, not the client's process-wide default, so that several clients (tests)
    can coexist; and no urllib3 retries underneath: callers retry with back-off and log each failure once.
    """
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
