"""Forwarding between servers of one store, in-process on loopback: a call reaching a server
that does not own its actor is answered by the owner, exactly as if sent there (auth, body
limits, error codes, media types), and never forwarded twice."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import cbor2
import httpx
import pytest
from server_helpers import TOKEN, serving

from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.kv import KvStore, MemoryStore
from pagekv.kv.wrappers import KvWrapper
from pagekv.server.cluster.forward import FORWARDED_HEADER
from pagekv.server.cluster.peer_auth import PROOF_HEADER, ClusterKey

pytestmark = pytest.mark.anyio
AUTH = {"authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def _server(store: KvStore, **config: Any) -> AsyncIterator[tuple[str, KvStore]]:
    """A server advertising its loopback address; yields (url, store). Its forwarder keeps
    connections 0.1 s, so that its stop drains that long (plus a margin), not 2 s."""
    config.setdefault("forward_keepalive_s", 0.1)
    async with serving(kv=store, advertise=True, **config) as served:
        yield served.url, served.store


@asynccontextmanager
async def cluster(count: int = 2, **config: Any) -> AsyncIterator[list[str]]:
    store = MemoryStore()
    async with AsyncExitStack() as stack:
        urls = [
            (await stack.enter_async_context(_server(store, **config)))[0] for _ in range(count)
        ]
        yield urls


def _body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


async def _forwarding(
    url: str, value: str, body: dict[str, Any], query: str = "key=k"
) -> dict[str, str]:
    """`X-Pagekv-Forwarded: value` on a call of `add` with `body` to the server at `url`, with
    the proof a server of this process would send it (its servers share the process's own
    secret; a proof names the registry it is for and covers the body)."""
    async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        to = (await http.get("/cluster/member")).json()["registry"]
    target = f"/actors/ledger/actions/add?{query}"
    proof, _ = ClusterKey(None).sign_request(to, value, "POST", target, _body(body))
    return {FORWARDED_HEADER: value, PROOF_HEADER: proof}


async def _metric(url: str, name: str) -> int:
    async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        text = (await http.get("/metrics")).text
    line = next(line for line in text.splitlines() if line.startswith(f"pagekv_{name}_total "))
    return int(float(line.split()[1]))


async def _call(url: str, action: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers=kwargs.pop("headers", AUTH)) as http:
        return await http.post(
            f"/actors/ledger/actions/{action}",
            params={"key": "k", **kwargs},
            content=_body(body),
            headers={"content-type": "application/json"},
        )


async def test_a_call_at_a_server_that_does_not_own_the_actor_is_answered_by_its_owner() -> None:
    async with cluster(3) as (owner, *others):
        assert (await _call(owner, "add", {"args": [1]})).json()["result"]["count"] == 1
        for n, url in enumerate(others * 2, start=2):
            answer = await _call(url, "add", {"args": [n]})
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"]["rows"] == list(range(1, n + 1))
        assert [await _metric(url, "wakes") for url in (owner, *others)] == [1, 0, 0]
        assert [await _metric(url, "forwarded") for url in others] == [2, 2]
        assert sum([await _metric(url, "takeovers") for url in (owner, *others)]) == 0


async def test_forwarding_keeps_error_codes_written_and_media_types() -> None:
    async with cluster() as (owner, other):
        await _call(owner, "add", {"args": [1]})
        failed = await _call(other, "fail", {"args": ["boom"]})
        assert failed.status_code == 500, failed.text
        assert failed.json()["error"]["code"] == "action_error"
        assert failed.json()["error"]["written"] is False
        unbound = await _call(other, "add", {"args": [1, 2]})
        assert unbound.status_code == 400 and unbound.json()["error"]["code"] == "invalid_arguments"
        missing = await _call(other, "add", {"args": [1]}, key="nobody", mode="get")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "actor_not_found"
        async with httpx.AsyncClient(base_url=other, headers=AUTH) as http:
            answer = await http.post(
                "/actors/ledger/actions/blob",
                params={"key": "k"},
                content=cbor2.dumps({"args": [b"\x00\xffab"]}),
                headers={"content-type": "application/cbor", "accept": "application/cbor"},
            )
            assert answer.headers["content-type"] == "application/cbor"
            assert cbor2.loads(answer.content) == {"result": b"ba\xff\x00"}
            as_json = await http.post(
                "/actors/ledger/actions/echo", params={"key": "k"}, json={"args": [1.5, "é"]}
            )
            created = await http.post("/actors/ledger", params={"key": "k"}, json={})
            queued = await http.post(
                "/actors/ledger/queues/inbox", params={"key": "k"}, json={"body": 1}
            )
        assert as_json.headers["content-type"] == "application/json"
        assert as_json.json()["result"]["args"] == [1.5, "é"]
        assert created.status_code == 409 and created.json()["error"]["code"] == "actor_exists"
        assert queued.status_code == 200 and isinstance(queued.json()["id"], int)
        # refused where they arrived, before routing: the unbound call; local: the missing actor
        assert await _metric(other, "forwarded") == 5
        assert await _metric(other, "wakes") == 0


async def test_the_owner_checks_the_proof_and_the_body_limit_itself() -> None:
    """A forwarded call is authenticated and bounded by each server it reaches: the forwarding
    header opens nothing without a proof of the cluster secret, and a server with another
    secret cannot forward to the owner."""
    store = MemoryStore()
    async with (
        _server(store, max_body_bytes=4096) as (owner, _),
        _server(store) as (other, _),
        _server(store, cluster_secret="another-cluster-secret-0123") as (third, _),
    ):
        await _call(owner, "add", {"args": [1]})
        refused = await _call(third, "add", {"args": [2]})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "owner_unreachable"
        assert refused.json()["error"]["written"] is False
        assert await _metric(third, "forwarded") == 0
        for headers in ({FORWARDED_HEADER: "a b 1e12"}, {**AUTH, FORWARDED_HEADER: "a b 1e12"}):
            sneaked = await _call(owner, "add", {"args": [2]}, headers=headers)
            assert sneaked.status_code == 403, sneaked.text
        big = await _call(other, "echo", {"args": ["x" * 8000]})
        assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
        assert big.json()["error"]["limit"] == "max_body_bytes"
        assert (await _call(owner, "read", {})).json()["result"]["count"] == 1
        assert await _metric(other, "forwarded") == 1, "the owner's 413 is the answer"


async def test_a_forwarded_call_is_never_forwarded_again() -> None:
    async with cluster() as (owner, other):
        await _call(owner, "add", {"args": [1]})
        value = f"sender-id owner-id {time.time() + 60}"
        headers = {**AUTH, **await _forwarding(other, value, {"args": [2]})}
        refused = await _call(other, "add", {"args": [2]}, headers=headers)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] | {"message": ""} == {
            "code": "not_owner",
            "message": "",
            "written": False,
        }
        forged = await _forwarding(other, "x", {"args": [2]})
        malformed = await _call(other, "add", {"args": [2]}, headers={**AUTH, **forged})
        assert malformed.status_code == 400
        assert await _metric(other, "forwarded") == 0
        assert (await _call(owner, "read", {})).json()["result"]["count"] == 1


async def test_a_forwarded_call_arriving_after_the_lease_its_sender_saw_is_refused() -> None:
    """Its sender gave up on it when that lease ran out (an owner stopped with SIGSTOP, then
    resumed, reads it from its socket late): run now, it could apply a call the client already
    retried. Refused with nothing written, even by the owner holding the actor."""
    async with cluster() as (owner, _):
        await _call(owner, "add", {"args": [1]})
        for until in (time.time() - 0.01, time.time() - 3600):
            forged = await _forwarding(owner, f"s o {until}", {"args": [2]})
            late = await _call(owner, "add", {"args": [2]}, headers={**AUTH, **forged})
            assert late.status_code == 503, late.text
            assert (late.json()["error"]["code"], late.json()["error"]["written"]) == (
                "not_owner",
                False,
            )
        for malformed in ("s o", "s o nan", "s o inf", "s  o 1", "s o 1 x"):
            forged = await _forwarding(owner, malformed, {"args": [2]})
            bad = await _call(owner, "add", {"args": [2]}, headers={**AUTH, **forged})
            assert bad.status_code == 400, malformed
        forged = await _forwarding(owner, f"s o {time.time() + 5}", {"args": [3]})
        in_time = await _call(owner, "add", {"args": [3]}, headers={**AUTH, **forged})
        assert in_time.json()["result"]["rows"] == [1, 3]


async def test_an_actor_that_sleeps_is_woken_where_the_next_call_arrives() -> None:
    async with cluster() as (one, two):
        async with httpx.AsyncClient(base_url=one, headers=AUTH) as http:
            answer = await http.post("/actors/napper/actions/bump", params={"key": "n"}, json={})
            assert answer.json()["result"] == 1
        await anyio.sleep(0.6)  # napper sleeps after 0.2 s idle: its lease is released
        async with httpx.AsyncClient(base_url=two, headers=AUTH) as http:
            answer = await http.post("/actors/napper/actions/bump", params={"key": "n"}, json={})
            assert answer.json()["result"] == 2
        assert (await _metric(one, "wakes"), await _metric(two, "wakes")) == (1, 1)
        assert await _metric(two, "forwarded") == 0


async def test_the_inspector_answers_for_an_actor_with_its_owners_view() -> None:
    """Data reads are the same anywhere, but whether the actor is awake, and its runtime facts,
    only its owner knows: per-actor inspector reads are forwarded to it."""
    async with cluster() as (owner, other):
        await _call(owner, "add", {"args": [1]})
        async with (
            httpx.AsyncClient(base_url=other, headers=AUTH) as http,
            httpx.AsyncClient(base_url=owner, headers=AUTH) as direct,
        ):
            summary = (await http.get("/inspect/actors/ledger", params={"key": "k"})).json()
            state = (await http.get("/inspect/actors/ledger/state", params={"key": "k"})).json()
            bad = await http.get("/inspect/actors/ledger/state", params={"key": "k", "x": "1"})
            listing = (await http.get("/inspect/actors")).json()
            head_there = await direct.head("/inspect/actors/ledger/state", params={"key": "k"})
            head_here = await http.head("/inspect/actors/ledger/state", params={"key": "k"})
        assert head_here.status_code == head_there.status_code == 200
        assert head_here.headers["content-length"] == head_there.headers["content-length"] != "0"
        assert summary["live"] is True and summary["instance"]["phase"] == "running"
        assert state["state"]["count"] == 1
        assert bad.status_code == 400, "the owner checks the parameters as it would its own"
        assert [a["live"] for a in listing["actors"]] == [False], "listings are local"
        assert await _metric(other, "forwarded") == 4


class _SlowTakeover(KvWrapper):
    """A namespace whose takeover waits first: the server using it decides to wake the actor
    (nobody owns it), and only takes it over once another server has created it."""

    def _call(self, op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if op == "takeover":
            time.sleep(0.3)
        return fn(*args, **kwargs)


class _SlowTakeovers:
    def __init__(self, inner: KvStore) -> None:
        self.inner = inner

    def namespace(self, actor_id: str) -> Any:
        kv = self.inner.namespace(actor_id)
        return kv if actor_id == REGISTRY_NAMESPACE else _SlowTakeover(kv)

    def close(self) -> None:
        self.inner.close()


async def test_a_create_that_finds_the_actor_created_elsewhere_is_409() -> None:
    """Two creates of one key at two servers at once; the slow one takes the actor over only
    after the other created it (a slow store): it must answer 409, not 201, and the actor keeps
    the input of the create that made it."""
    store = MemoryStore()
    answers: dict[str, int] = {}

    async def create(name: str, url: str) -> None:
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
            answer = await http.post("/actors/ledger", params={"key": "k"}, json={"input": name})
        answers[name] = answer.status_code

    async with (
        _server(_SlowTakeovers(store)) as (slow, _),  # type: ignore[arg-type]
        _server(store) as (fast, _),
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(create, "slow", slow)
            await anyio.sleep(0.05)
            tg.start_soon(create, "fast", fast)
        echoed = await _call(fast, "echo", {}, mode="get")
    assert answers == {"fast": 201, "slow": 409}, answers
    assert echoed.json()["result"]["input"] == "fast"


async def test_a_draining_server_sends_the_calls_that_would_wake_an_actor_elsewhere() -> None:
    """A server that begins to stop lets its actors go and, while it still takes connections,
    sends a call that would wake one there to a server that is not stopping; its health says
    draining and its answers close their connections."""
    store = MemoryStore()
    async with (
        serving(kv=store, advertise=True, forward_keepalive_s=0.1) as leaving,
        serving(kv=store, advertise=True, forward_keepalive_s=0.1) as staying,
    ):
        await _call(leaving.url, "add", {"args": [1]})
        await leaving.app.state.drain()
        async with httpx.AsyncClient(base_url=leaving.url, headers=AUTH) as http:
            health = await http.get("/health")
            answer = await http.post(
                "/actors/ledger/actions/add", params={"key": "k"}, json={"args": [2]}
            )
            forged = await _forwarding(leaving.url, f"s o {time.time() + 5}", {"args": [3]})
            forwarded = await http.post(
                "/actors/ledger/actions/add",
                params={"key": "k"},
                content=_body({"args": [3]}),
                headers={**forged, "content-type": "application/json"},
            )
        assert (health.status_code, health.json()) == (503, {"status": "draining"})
        assert answer.json()["result"]["rows"] == [1, 2], answer.text
        assert answer.headers.get("connection") != "close", "a direct client keeps its own"
        assert forwarded.json()["error"]["code"] == "not_owner"
        assert forwarded.headers["connection"] == "close", "a forwarder does not pool it"
        assert await _metric(leaving.url, "forwarded") == 1
        assert await _metric(staying.url, "wakes") == 1, "woken where it was sent"


async def test_a_draining_server_still_forwards_to_an_actors_live_owner() -> None:
    """Only the calls that would wake an actor at the stopping server go to another server:
    one for an actor a third server owns goes to that owner, as before."""
    store = MemoryStore()
    async with (
        serving(kv=store, advertise=True, forward_keepalive_s=0.1) as leaving,
        serving(kv=store, advertise=True, forward_keepalive_s=0.1) as bystander,
        serving(kv=store, advertise=True, forward_keepalive_s=0.1) as owner,
    ):
        keys = [f"k{n}" for n in range(8)]
        for key in keys:
            await _call(owner.url, "add", {"args": [1]}, key=key)
        await leaving.app.state.drain()
        for key in keys:  # sent by actor id to one of the two others: never to the bystander
            answer = await _call(leaving.url, "add", {"args": [2]}, key=key)
            assert answer.json()["result"]["rows"] == [1, 2], answer.text
        assert [await _metric(s.url, "wakes") for s in (leaving, bystander, owner)] == [0, 0, 8]
