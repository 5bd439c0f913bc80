from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from kubegpu.apisim import ApiServerSim


@pytest.fixture
def api() -> Iterator[ApiServerSim]:
    with ApiServerSim() as server:
        yield server


@pytest.fixture
def k8s(api: ApiServerSim) -> Iterator[client.ApiClient]:
    """The official client, configured as `kubectl` would be for this server."""
    with client.ApiClient(client.Configuration(host=api.url)) as api_client:
        yield api_client
