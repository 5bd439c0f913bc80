"""The official `kubernetes` client's configuration, built one way for the tools that call the API server."""

from __future__ import annotations

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException


class KubeconfigError(Exception):
    """No client configuration could be built; the message is the client library's reason."""


def load_configuration(kubeconfig: str) -> client.Configuration:
    """The configuration of the kubeconfig at this path, or the in-cluster one (the pod's service account)
    when it is empty.

    Its own Configuration object, not the client's process-wide default, so that several clients (tests)
    can coexist; and no urllib3 retries underneath: callers retry with back-off and log each failure once.
    """
    configuration = client.Configuration()
    try:
        if kubeconfig:
            # (the client library ships no type hints)
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError, TypeError) as err:
        raise KubeconfigError(str(err)) from err
    configuration.retries = 0
    return configuration
