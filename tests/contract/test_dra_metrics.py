"""The DRA driver's metrics endpoint (NVIDIA's --http-endpoint / --metrics-path), scraped for real from
`kubegpu dra` as a process: values after a Prepare, an Unprepare and a failed Prepare, refused claims of
every reason, and a checkpoint lost and rebuilt.

Expected series names and values are written out here."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import urllib.error
import urllib.request

import grpc
import pytest

from kubegpu.demo.dranode import DRIVER, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from tests.contract.test_dra_driver import prepare_directly
from tests.contract.test_dra_faults import (
    allocate_on,
    assert_nothing_lost,
    call,
    damage,
    garbage_calls,
    started,
    uid_of,
    with_a_running_claim,
)
from tests.dra_objects import claim, request


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


REFUSALS = ("duplicate_uid", "device_in_use", "too_many_claims", "undecodable", "other")


async def endpoint(node: DraNode, nth: int = 1) -> str:
    """The URL the `nth` driver process of this node serves its metrics on."""
    await node.wait(lambda: node.log().count("serving metrics on http://") >= nth, "the metrics endpoint")
    found = re.findall(r"serving metrics on (http://\S+)", node.log())
    return str(found[nth - 1])


async def test_prepare_unprepare_and_a_failed_prepare_are_counted() -> None:
    async with DraNode("t4-pcie", env={"METRICS_PATH": "/driver-metrics"}) as node:
        node.start_driver("--http-endpoint", "127.0.0.1:0")
        url = await endpoint(node)
        assert url.endswith("/driver-metrics")
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None
        before = scrape(url)
        assert {
            k: v for k, v in before.items() if "claims_total" in k or k.startswith("kubegpu_dra_devices")
        } == {
            'kubegpu_dra_prepare_claims_total{result="success"}': 0.0,
            'kubegpu_dra_prepare_claims_total{result="error"}': 0.0,
            'kubegpu_dra_unprepare_claims_total{result="success"}': 0.0,
            'kubegpu_dra_unprepare_claims_total{result="error"}': 0.0,
            'kubegpu_dra_devices{health="Healthy"}': 4.0,
            'kubegpu_dra_devices{health="Unhealthy"}': 0.0,
            'kubegpu_dra_devices{health="Unknown"}': 0.0,
        }
        pod = claim_pod("train", "c1")
        node.allocate(claim("c1", [request("gpu")]), pod)
        await node.sim.admit(pod)
        during = scrape(url)
        assert during['kubegpu_dra_prepare_claims_total{result="success"}'] == 1.0
        assert during['kubegpu_dra_prepare_claim_duration_seconds_count{result="success"}'] == 1.0
        assert during["kubegpu_dra_prepared_claims"] == 1.0
        await node.sim.terminate_pod("train")
        failed = await prepare_directly(node, "0f6c1e0e-0000-4000-8000-000000000000", "missing")
        assert failed.claims["0f6c1e0e-0000-4000-8000-000000000000"].error != ""
        after = scrape(url)
        assert after['kubegpu_dra_prepare_claims_total{result="success"}'] == 1.0
        assert after['kubegpu_dra_prepare_claims_total{result="error"}'] == 1.0
        assert after['kubegpu_dra_prepare_claim_duration_seconds_count{result="error"}'] == 1.0
        assert after['kubegpu_dra_unprepare_claims_total{result="success"}'] == 1.0
        assert after['kubegpu_dra_unprepare_claims_total{result="error"}'] == 0.0
        assert after["kubegpu_dra_prepared_claims"] == 0.0
        assert after['kubegpu_dra_api_errors_total{kind="connection"}'] == 0.0
        assert after['kubegpu_dra_claims_refused_total{reason="duplicate_uid"}'] == 0.0
        with pytest.raises(urllib.error.HTTPError) as other:
            await asyncio.to_thread(
                urllib.request.urlopen, url.replace("/driver-metrics", "/metrics"), timeout=5
            )
        assert other.value.code == 404


async def test_off_by_default_and_a_bad_endpoint_is_one_clear_line() -> None:
    async with DraNode("t4-pcie") as node:
        node.start_driver()
        await node.wait_registered()
        assert "serving metrics" not in node.log()
        await node.stop_driver()
        node.start_driver("--http-endpoint", "8080")
        assert node.driver is not None
        assert node.driver.wait(30) == 1
        assert (
            "invalid --http-endpoint (HTTP_ENDPOINT) '8080': want [host]:port, e.g. :8080 or 127.0.0.1:8080"
            in node.log()
        )
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            node.start_driver("--http-endpoint", f"127.0.0.1:{port}")
            assert node.driver is not None
            assert node.driver.wait(30) == 1
        assert (
            f"cannot serve metrics on 127.0.0.1:{port}: Address already in use; set --http-endpoint "
            "(HTTP_ENDPOINT) to a free [host]:port, or leave it empty to serve none" in node.log()
        )
        assert "Traceback" not in node.log()


async def test_an_api_server_outage_is_counted_as_connection_errors() -> None:
    async with DraNode("t4-pcie") as node:
        node.start_driver("--http-endpoint", "127.0.0.1:0")
        url = await endpoint(node)
        await node.wait_published(4)
        assert scrape(url)['kubegpu_dra_api_errors_total{kind="connection"}'] == 0.0
        node.api.stop()  # the publisher's watch breaks and its re-list is refused
        await node.wait(
            lambda: scrape(url)['kubegpu_dra_api_errors_total{kind="connection"}'] >= 1.0,
            "a refused connection counted",
        )
        errors = scrape(url)
        assert errors['kubegpu_dra_api_errors_total{kind="server_error"}'] == 0.0
        assert errors['kubegpu_dra_api_errors_total{kind="other"}'] == 0.0


async def test_refused_claims_and_a_rebuilt_checkpoint_are_counted() -> None:
    async with DraNode("t4-pcie") as node:
        c1 = await with_a_running_claim(node, "--http-endpoint", "127.0.0.1:0")
        url = await endpoint(node)
        refused = 'kubegpu_dra_claims_refused_total{reason="%s"}'
        assert {r: scrape(url)[refused % r] for r in REFUSALS} == dict.fromkeys(REFUSALS, 0.0)
        twice = "5b0e7c1a-0000-4000-8000-000000000001"
        await call(node, "prepare", [("default", twice, "a"), ("default", twice, "b"), ("default", "", "c")])
        c2 = uid_of(allocate_on(node, "c2", "thief", "gpu-0"))
        busy = await call(node, "prepare", [("default", c2, "c2")])
        assert busy.claims[c2].error.startswith("claim default/c2: device gpu-0 is already prepared")
        with pytest.raises(grpc.aio.AioRpcError):
            await call(node, "prepare", [("default", f"u{i}", f"c{i}") for i in range(129)])
        socket_path, method, body = garbage_calls(node)[0]
        async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
            rpc = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.aio.AioRpcError):
                await rpc(body, timeout=5)
        counted = scrape(url)
        assert {r: counted[refused % r] for r in REFUSALS} == {
            "duplicate_uid": 1.0,  # one UID named twice: one refusal
            "device_in_use": 1.0,
            "too_many_claims": 129.0,  # every claim of the call refused whole
            "undecodable": 1.0,  # its claims cannot be read: the call counts once
            "other": 1.0,  # the claim without a UID
        }
        rebuilds = 'kubegpu_dra_checkpoint_rebuilds_total{reason="%s"}'
        assert [counted[rebuilds % r] for r in ("missing", "unreadable", "other")] == [0.0, 0.0, 0.0]

        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        for name in ("checkpoint.json", "checkpoint.json.copy"):
            damage(node.plugins / DRIVER / name, "corrupt")
        node.start_driver("--http-endpoint", "127.0.0.1:0")
        await started(node, 2)
        await node.wait(lambda: "rebuilt claim default/c1" in node.log(), "the claim rebuilt")
        url = await endpoint(node, 2)
        after = scrape(url)
        assert [after[rebuilds % r] for r in ("missing", "unreadable", "other")] == [0.0, 1.0, 0.0]
        assert after["kubegpu_dra_prepared_claims"] == 1.0
        assert_nothing_lost(node, {c1: ["gpu-0"]})
