"""The advertise address of a `serve` process: its default, a worker's own, and the check that
it reaches the process, against a real server on loopback (peers stand in for the store's)."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import Any

import pytest
from server_helpers import Served

from pagekv.actor.directory.leases import Member
from pagekv.server.cluster.advertise import check_address, default_url, is_loopback, worker_url

pytestmark = pytest.mark.anyio
FIX = "pass --advertise-url"


@dataclass
class _Registry:
    """What the check reads of a registry: its id, and the other registries of its store."""

    id: str
    others: list[Member]

    async def peers(self) -> list[Member]:
        return self.others


def registry(registry_id: str, *peers: Member) -> Any:
    """A stand-in where the check wants a `pagekv.actor.Registry`."""
    return _Registry(registry_id, list(peers))


def member(host: str) -> Member:
    return Member("peer", "http://10.0.0.9:6420", host, 1234, 2e9)


def test_the_default_address_and_a_workers_own() -> None:
    assert default_url("127.0.0.1", 6420) == "http://127.0.0.1:6420"
    assert default_url("::1", 6420) == "http://[::1]:6420"
    assert default_url("0.0.0.0", 6420) == f"http://{socket.gethostname()}:6420"
    assert default_url("::", 80) == f"http://{socket.gethostname()}:80"
    assert worker_url("https://app.example", 41000) == "https://app.example:41000"
    assert worker_url("http://[::1]:6420", 41000) == "http://[::1]:41000"
    loopback = ["http://127.0.0.1:1", "http://127.9.9.9", "http://[::1]:1", "http://localhost"]
    assert all(is_loopback(url) for url in loopback)
    assert not any(is_loopback(url) for url in ["http://10.0.0.1", "http://app.example"])


async def answering(served: Served) -> str:
    async with served.http() as http:
        return (await http.get("/cluster/member")).json()["registry"]


async def test_an_address_that_reaches_its_process(served: Served) -> None:
    me = await answering(served)
    assert await check_address(registry(me), served.url, None, FIX) is None
    here = registry(me, member(socket.gethostname()))
    assert await check_address(here, served.url, None, FIX) is None
    elsewhere = registry(me, member("db-host-2"), member(socket.gethostname()))
    problem = await check_address(elsewhere, served.url, None, FIX)
    assert problem == (
        f"the advertise URL {served.url} is a loopback address, which the processes on "
        f"db-host-2 sharing the store cannot reach: {FIX}"
    )


async def test_an_address_that_misses_its_process(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    peer = member("db-host-2")
    other = registry("not-this-one", peer)
    problem = await check_address(other, served.url, None, FIX)
    me = await answering(served)
    assert problem == (
        f"the advertise URL {served.url} does not reach this process (another pagekv server "
        f"answers there (registry {me})), but 1 other process sharing the store would forward "
        f"calls to it there: {FIX}"
    )
    problem = await check_address(registry(me, peer), served.url, "another-cluster-secret", FIX)
    assert problem is not None and "no server of this store answered" in problem
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    problem = await check_address(registry(me, peer, peer), nowhere, None, FIX)
    assert problem is not None and "(ConnectError: " in problem and "2 other processes" in problem
    with caplog.at_level(logging.WARNING, logger="pagekv.server"):
        assert await check_address(registry(me), nowhere, None, FIX) is None
    assert "no other process shares the store yet" in caplog.text
