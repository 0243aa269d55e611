"""Raw HTTP through a server that does not own the actor (`pagekv serve` processes on one `file:`
store, loopback): the handler sees the client's headers and the client gets the handler's, as
from the owner; a streamed answer flows through as it is produced, in bounded memory; and an
answer the handler produces is relayed once, however much it looks like a refusal."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from raw_http_defs import registry as raw_registry
from server_helpers import TOKEN, serving
from test_cli import ServeProcess

from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio
APP = str(Path(__file__).with_name("raw_http_defs.py"))
AUTH = {"authorization": f"Bearer {TOKEN}"}
ROUTE = "/actors/relay/request"
KEY = {"key": "r"}
MIB = 1 << 20


@asynccontextmanager
async def owner_and_other(tmp_path: Path) -> AsyncIterator[tuple[ServeProcess, ServeProcess]]:
    """Two servers on one store; the actor is woken at the first, which owns it from then on."""
    store = f"file:{tmp_path}/store"
    servers = [ServeProcess("--kv", store, app=APP) for _ in range(2)]
    try:
        for server in servers:
            await server.started()
        runs = await _get(servers[0], "/runs")
        assert runs.json() == {"runs": 0}, runs.text
        yield servers[0], servers[1]
        assert await _forwarded(servers[1]) > 0, "the other server forwarded the calls"
    finally:
        for server in servers:
            server.proc.kill()
            server.proc.wait()


async def _get(server: ServeProcess, path: str, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url or "", headers=AUTH) as http:
        return await http.get(ROUTE + path, params={**KEY, **params})


async def _forwarded(server: ServeProcess) -> int:
    async with httpx.AsyncClient(base_url=server.url or "", headers=AUTH) as http:
        text = (await http.get("/metrics")).text
    line = next(line for line in text.splitlines() if line.startswith("pagekv_forwarded_total "))
    return int(float(line.split()[1]))


def _without(items: list[tuple[str, str]] | list[list[str]], *names: str) -> list[tuple[str, str]]:
    return sorted((k.lower(), v) for k, v in items if k.lower() not in names)


async def test_headers_pass_both_ways_as_with_the_owner(tmp_path: Path) -> None:
    """Cookies and a webhook's signature reach the handler, and its cookies, redirect, cache
    policy and repeated custom headers reach the client, exactly as when it calls the owner
    (the `Host` each server was addressed by and the `Date` each answered at aside), for a
    GET, a HEAD and a POST with a body; a header the client named hop-by-hop stays on its hop."""
    sent = [
        ("cookie", "session=s1; theme=dark"),
        ("x-hub-signature-256", "sha256=" + "ab" * 32),
        ("user-agent", "hook-sender/1.0"),
        ("accept-language", "fr"),
        ("x-repeated", "a"),
        ("x-repeated", "b"),
    ]
    hop = [("connection", "keep-alive, x-hop"), ("x-hop", "this connection only")]
    async with owner_and_other(tmp_path) as (owner, other):
        answers: dict[tuple[str, ServeProcess], httpx.Response] = {}
        for server in (owner, other):
            async with httpx.AsyncClient(base_url=server.url or "", headers=AUTH) as http:
                url, headers = ROUTE + "/headers", [*sent, *hop]
                answers["GET", server] = await http.get(url, params=KEY, headers=headers)
                answers["HEAD", server] = await http.head(url, params=KEY, headers=headers)
                answers["POST", server] = await http.post(
                    url,
                    params=KEY,
                    headers=[*headers, ("content-type", "text/plain")],
                    content="hi",
                )
        for answer in answers.values():
            assert answer.status_code == 201, answer.text
        for method in ("GET", "POST"):
            seen = {
                s: _without(answers[method, s].json()["headers"], "host") for s in (owner, other)
            }
            assert seen[other] == seen[owner], method
            for header in sent:
                assert seen[other].count(header) == 1, (method, header)
            assert "authorization" not in dict(seen[other]), "the server's token is its own"
            assert [k for k, _ in seen[other] if k in ("x-hop", "connection")] == []
            assert answers[method, other].json()["body"] == ("hi" if method == "POST" else "")
        got = {(m, s): _without(answers[m, s].headers.multi_items(), "date") for m, s in answers}
        for method in ("GET", "HEAD", "POST"):
            assert got[method, other] == got[method, owner], method
        assert got["HEAD", other] == got["GET", other]
        relayed = got["GET", other]
        cookies = [v for k, v in relayed if k == "set-cookie"]
        assert [c.split(";")[0] for c in cookies] == ["session=s1", "theme=dark"]
        assert ("location", "/actors/relay/request/created") in relayed
        assert ("cache-control", "private, max-age=5") in relayed
        assert [v for k, v in relayed if k == "x-custom"] == ["one", "two"]
        assert ("vary", "Cookie") in relayed


def _memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status)
    return {name: int(fields[name].split()[0]) * 1024 for name in ("VmRSS", "VmHWM")}


async def _timed_stream(url: str, mib: int) -> tuple[float, float, int]:
    """(seconds to the first byte, seconds to the last, bytes) of `/stream?mib=`."""
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as http:
        started = time.perf_counter()
        first, size = None, 0
        async with http.stream("GET", ROUTE + "/stream", params={**KEY, "mib": str(mib)}) as s:
            assert s.status_code == 200
            async for chunk in s.aiter_raw():
                if first is None:
                    first = time.perf_counter() - started
                size += len(chunk)
        assert first is not None
        return first, time.perf_counter() - started, size


async def test_a_streamed_answer_flows_through_in_bounded_memory(tmp_path: Path) -> None:
    """150 MiB streamed by the handler: through the other server its first byte comes long
    before its last, and that server's peak RSS grows by far less than the answer (it relayed
    it piece by piece, as the client read it). An answer of known length comes through whole."""
    mib = 150
    async with owner_and_other(tmp_path) as (owner, other):
        assert other.url is not None and owner.url is not None
        direct = await _timed_stream(owner.url, mib)
        Path(f"/proc/{other.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _memory(other.proc.pid)
        first, total, size = await _timed_stream(other.url, mib)
        growth = _memory(other.proc.pid)["VmHWM"] - before["VmRSS"]
        print(
            json.dumps(
                {
                    "owner_first_byte_s": round(direct[0], 4),
                    "owner_total_s": round(direct[1], 3),
                    "other_first_byte_s": round(first, 4),
                    "other_total_s": round(total, 3),
                    "other_peak_rss_growth_mib": round(growth / MIB, 1),
                }
            )
        )
        assert size == direct[2] == mib * MIB
        blob = await _get(other, "/blob")
        assert (blob.headers["content-length"], blob.content) == (str(MIB), b"x" * MIB)
        assert first < 1.0 and first < total / 4, (first, total)
        assert growth < 50 * MIB, f"the forwarder's peak RSS grew by {growth / MIB:.0f} MiB"


async def test_a_stream_the_owner_broke_off_is_not_passed_on_as_whole(tmp_path: Path) -> None:
    """The owner dies while its answer streams: the client's answer through the other server
    breaks off too, instead of ending as if it were complete."""
    async with owner_and_other(tmp_path) as (owner, other):
        size = 0
        with pytest.raises(httpx.RemoteProtocolError):
            async with (
                httpx.AsyncClient(base_url=other.url or "", headers=AUTH, timeout=30) as http,
                http.stream("GET", ROUTE + "/stream", params={**KEY, "mib": "1000"}) as s,
            ):
                async for chunk in s.aiter_raw():
                    size += len(chunk)
                    if owner.proc.poll() is None and size >= MIB:
                        owner.proc.kill()
        assert MIB <= size < 1000 * MIB


async def _events(url: str, count: int, every: float) -> list[str]:
    """The first `count` events of an endless `/events` stream, then hang up."""
    events: list[str] = []
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as http:
        params = {**KEY, "every": str(every)}
        async with http.stream("GET", ROUTE + "/events", params=params) as s:
            assert s.status_code == 200
            assert s.headers["content-type"].startswith("text/event-stream")
            async for line in s.aiter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    if len(events) == count:
                        break
    return events


async def test_an_endless_event_stream_flows_through_and_ends_with_its_client(
    tmp_path: Path,
) -> None:
    async with owner_and_other(tmp_path) as (owner, other):
        assert other.url is not None
        with anyio.fail_after(20):
            events = await _events(other.url, 5, 0.05)
        assert events == [f"event {n}" for n in range(5)]
        with anyio.fail_after(20):  # the client hung up: the owner stops producing the stream
            while (await _get(owner, "/open")).json()["open"] != 0:
                await anyio.sleep(0.05)


async def test_a_quiet_stream_outlives_the_forward_timeout() -> None:
    """`forward_timeout_s` bounds the wait for an owner's answer to begin; a stream's pauses
    are the handler's business, as with the owner itself."""
    store = MemoryStore()
    async with AsyncExitStack() as stack:
        owner, other = [
            await stack.enter_async_context(
                serving(
                    raw_registry.definitions.values(),
                    kv=store,
                    advertise=True,
                    forward_timeout_s=0.2,
                    forward_keepalive_s=0.1,
                )
            )
            for _ in range(2)
        ]
        async with owner.http() as http:
            assert (await http.get(ROUTE + "/runs", params=KEY)).status_code == 200
        with anyio.fail_after(20):
            events = await _events(other.url, 3, 0.5)
        assert events == ["event 0", "event 1", "event 2"]


async def test_a_handler_answering_like_a_refusal_runs_once_and_is_relayed(
    tmp_path: Path,
) -> None:
    """A 503 `not_owner` body, even with the refusal's own header, is the handler's answer: only
    the owner's runtime marks a refusal, so the forwarder passes this on and does not retry."""
    async with owner_and_other(tmp_path) as (owner, other):
        for runs, claim in ((1, {}), (2, {"claim": "1"})):
            direct = await _get(owner, "/lookalike", **claim)
            relayed = await _get(other, "/lookalike", **claim)
            assert relayed.status_code == direct.status_code == 503, relayed.text
            assert relayed.json() == direct.json()
            assert relayed.json()["error"]["message"] == "not the owner"
            assert "x-pagekv-refused" not in relayed.headers
            assert "x-pagekv-refused" not in direct.headers
            assert (await _get(owner, "/runs")).json() == {"runs": 2 * runs}
