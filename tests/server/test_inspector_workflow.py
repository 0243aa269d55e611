"""The inspector's workflow changes (cancel, replay from an entry) and `pagekv ui`'s read-only
store view, over HTTP on real loopback servers: a change runs at the actor's owner and changes
nothing when refused; the store view shows owners from the lease entries, refuses every change,
and never writes to the store nor creates a namespace in it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import httpx
import pytest
from server_helpers import Served, serving, serving_store

from pagekv.kv import ActorKv, MemoryStore

pytestmark = pytest.mark.anyio
Eventually = Callable[..., Awaitable[None]]
_WRITES = ("write", "put", "delete", "delete_range", "takeover", "drop")


async def _workflow(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    response = await http.get("/inspect/actors/flow/workflow", params={"key": key})
    return response.json()["workflow"] if response.status_code == 200 else {}


def _shape(workflow: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["name"], e["status"]) for e in workflow.get("entries", [])]


WAITING = [("load", "completed"), ("approval", "pending")]


async def _started(served: Served, key: str, eventually: Eventually) -> None:
    """The `flow` actor `key` created, its workflow past its step and waiting for approval."""
    async with served.client() as client, served.http() as http:
        await client.get_or_create("flow", key).loads()

        async def waiting() -> bool:
            return _shape(await _workflow(http, key)) == WAITING

        await eventually(waiting, what="the workflow to wait for its approval")


async def test_cancel_then_replay_from_the_step(served: Served, eventually: Eventually) -> None:
    await _started(served, "o1", eventually)
    async with served.http() as http, served.client() as client:
        handle = client.get("flow", "o1")
        cancelled = await http.post("/inspect/actors/flow/workflow/cancel", params={"key": "o1"})
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json() == {"state": "cancelled"}
        await handle.send("approve", "ada")  # a cancelled workflow never takes it
        assert (await _workflow(http, "o1"))["state"] == "cancelled"
        assert await handle.loads() == 1

        replayed = await http.post(
            "/inspect/actors/flow/workflow/replay", params={"key": "o1"}, json={"from": "load"}
        )
        assert replayed.status_code == 200, replayed.text
        assert replayed.json()["state"] in ("pending", "running", "sleeping")

        async def ran_again() -> bool:
            return (await _workflow(http, "o1")).get("state") == "completed"

        await eventually(ran_again, what="the replayed workflow to take the waiting approval")
        workflow = await _workflow(http, "o1")
        assert await handle.loads() == 2  # the step ran once more, and only once
    assert workflow["output"] == {"loaded": 2, "by": "ada"}


async def test_refused_changes_change_nothing(served: Served, eventually: Eventually) -> None:
    await _started(served, "o2", eventually)
    async with served.client() as client:
        await client.get_or_create("ledger", "plain").bump()
    async with served.http() as http:
        before = await _workflow(http, "o2")
        path = "/inspect/actors/flow/workflow"
        answers = {
            "unknown entry": await http.post(
                f"{path}/replay", params={"key": "o2"}, json={"from": "nope"}
            ),
            "from a number": await http.post(
                f"{path}/replay", params={"key": "o2"}, json={"from": 3}
            ),
            "unknown field": await http.post(
                f"{path}/cancel", params={"key": "o2"}, json={"why": "x"}
            ),
            "no key": await http.post(f"{path}/cancel"),
            "no workflow": await http.post(
                "/inspect/actors/ledger/workflow/cancel", params={"key": "plain"}
            ),
            "no such actor": await http.post(f"{path}/cancel", params={"key": "never"}),
            "a GET": await http.get(f"{path}/cancel", params={"key": "o2"}),
        }
        after = await _workflow(http, "o2")
        never = await http.get("/inspect/actors/flow", params={"key": "never"})
    codes = {what: (r.status_code, r.json()["error"]["code"]) for what, r in answers.items()}
    assert codes == {
        "unknown entry": (409, "workflow_change_refused"),
        "from a number": (400, "invalid_body"),
        "unknown field": (400, "invalid_body"),
        "no key": (400, "invalid_parameter"),
        "no workflow": (404, "no_workflow"),
        "no such actor": (404, "actor_not_found"),
        "a GET": (405, "method_not_allowed"),
    }
    assert "'nope'" in answers["unknown entry"].json()["error"]["message"]
    assert after == before and _shape(after) == WAITING
    assert never.status_code == 404  # the refused cancel created no actor


async def test_a_change_sent_to_another_server_runs_at_the_owner(eventually: Eventually) -> None:
    store = MemoryStore()
    async with (
        serving(kv=store, advertise=True, forward_keepalive_s=0.1) as owner,
        serving(kv=store, advertise=True, forward_keepalive_s=0.1) as other,
    ):
        await _started(owner, "o3", eventually)
        async with other.http() as http:
            listed = (await http.get("/inspect/actors", params={"owners": "1"})).json()
            cancelled = await http.post(
                "/inspect/actors/flow/workflow/cancel", params={"key": "o3"}
            )
            state = (await _workflow(http, "o3"))["state"]
        counters = [s.app.state.registry.metrics() for s in (owner, other)]
    assert cancelled.status_code == 200 and state == "cancelled", cancelled.text
    assert [c.get("wakes", 0) for c in counters] == [1, 0]  # never woken (taken over) at the other
    assert counters[1].get("forwarded", 0) >= 1
    flow = next(a for a in listed["actors"] if a["key"] == "o3")
    assert flow["owner"]["address"] == owner.url and flow["owner"]["here"] is False


class _WriteSpy:
    """A store whose namespaces record every mutating call, and every namespace asked for
    that did not exist yet: what a read-only view must never do."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.writes: list[tuple[str, str]] = []
        self.created: list[str] = []
        self.reads = 0

    def actor_ids(self) -> list[str]:
        return self._store.actor_ids()

    def namespace(self, actor_id: str) -> ActorKv:
        if actor_id not in self._store.actor_ids():
            self.created.append(actor_id)
        return _SpiedNamespace(self, actor_id, self._store.namespace(actor_id))

    def close(self) -> None:
        self._store.close()


class _SpiedNamespace:
    def __init__(self, spy: _WriteSpy, actor_id: str, inner: ActorKv) -> None:
        self._spy, self._aid, self._inner = spy, actor_id, inner

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def called(*args: Any, **kwargs: Any) -> Any:
            if name in _WRITES:
                self._spy.writes.append((self._aid, name))
            else:
                self._spy.reads += 1
            return method(*args, **kwargs)

        return called


def _every_read(keys: Iterable[tuple[str, str]]) -> Sequence[str]:
    paths = ["/inspect", "/inspect/actors?usage=1&owners=1", "/", "/ui/app.js"]
    for name, key in keys:
        for suffix in ("", "/state", "/tables", "/queue", "/schedules", "/metrics"):
            paths.append(f"/inspect/actors/{name}{suffix}?key={key}")
    paths.append("/inspect/actors/flow/workflow?key=o4")
    paths.append("/inspect/actors/ledger/tables/entries?key=k")
    return paths


async def test_the_store_view_reads_beside_a_server_and_writes_nothing(
    eventually: Eventually,
) -> None:
    store = MemoryStore()
    spy = _WriteSpy(store)
    async with serving(kv=store, advertise=True) as live:
        await _started(live, "o4", eventually)
        async with live.client() as client:
            await client.get_or_create("ledger", "k").add(5)
        async with serving_store(spy) as view, view.http() as http:  # type: ignore[arg-type]
            about = (await http.get("/inspect")).json()
            answers = {p: await http.get(p) for p in _every_read([("ledger", "k")])}
            query = await http.post(
                "/inspect/actors/ledger/query", params={"key": "k"}, json={"sql": "SELECT 1"}
            )
            refused = {
                change: await http.post(
                    f"/inspect/actors/flow/workflow/{change}", params={"key": "o4"}, json={}
                )
                for change in ("cancel", "replay")
            }
            missing = {
                p: (await http.get(p)).status_code
                for p in ("/metrics", "/cluster/member", "/actors/ledger/actions/count?key=k")
            }
            unknown = await http.get("/inspect/actors/ledger/state", params={"key": "nobody"})
            listed = answers["/inspect/actors?usage=1&owners=1"].json()["actors"]
        async with live.http() as http:
            still = await _workflow(http, "o4")
        live_counters = live.app.state.registry.metrics()
    assert about == {"mode": "store", "read_only": True, "registry": None, "store": None}
    assert all(r.status_code == 200 for r in answers.values()), {
        p: r.text[:200] for p, r in answers.items() if r.status_code != 200
    }
    assert query.status_code == 200 and query.json()["rows"] == [[1]]
    assert {c: (r.status_code, r.json()["error"]["code"]) for c, r in refused.items()} == {
        "cancel": (403, "read_only"),
        "replay": (403, "read_only"),
    }
    assert set(missing.values()) == {404}  # no metrics, no registry, no gateway
    assert unknown.status_code == 404
    owners = {a["key"]: a["owner"] for a in listed}
    assert owners["k"]["address"] == live.url and owners["k"]["here"] is False
    assert all(a["live"] is False for a in listed)  # nothing runs in the view
    assert _shape(still) == WAITING and still["state"] != "cancelled"
    assert live_counters.get("takeovers", 0) == 0 and live_counters["wakes"] == 2
    assert spy.reads > 20  # the view did read through the spy
    assert spy.writes == [] and spy.created == []


async def test_a_store_no_registry_ran_on_has_no_actors_and_stays_empty() -> None:
    store = MemoryStore()
    spy = _WriteSpy(store)
    async with serving_store(spy) as view, view.http() as http:  # type: ignore[arg-type]
        listed = await http.get("/inspect/actors")
        one = await http.get("/inspect/actors/ledger", params={"key": "k"})
        no_token = await http.get("/inspect/actors", headers={"authorization": ""})
    assert listed.json() == {"actors": [], "next_after": None}
    assert (one.status_code, one.json()["error"]["code"]) == (404, "actor_not_found")
    assert no_token.status_code == 401
    assert store.actor_ids() == [] and spy.writes == [] and spy.created == []
