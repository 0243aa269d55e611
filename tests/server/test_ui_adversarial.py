"""The inspector's page API attacked: what it says about an actor's owner when another server
answered, the bad requests it must refuse, and workflow changes of an actor that sleeps or
whose entries have odd names, over real loopback servers sharing one store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from server_helpers import Served, serving, serving_store

from pagekv.actor import ActorContext, actor
from pagekv.actor.workflow import StepContext, WorkflowContext
from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio
Eventually = Callable[..., Awaitable[None]]

dozy = actor("dozy", state={"runs": {}}, sleep_timeout=1.0)
"""A workflow that waits for a message once its steps ran; `nap` puts it to sleep at once."""


def _counted(name: str) -> Callable[[StepContext], Awaitable[None]]:
    async def step(ctx: StepContext) -> None:
        ctx.state["runs"] = {**ctx.state["runs"], name: ctx.state["runs"].get(name, 0) + 1}

    return step


@dozy.workflow
async def _dozy(wf: WorkflowContext) -> Any:
    await wf.step("~first", _counted("~first"))
    await wf.step("plain", _counted("plain"))
    await wf.step("plain/~0/z", _counted("plain/~0/z"))
    return await wf.queue.next("approval", names=["approve"], timeout=600)


@dozy.action
async def runs(ctx: ActorContext) -> dict[str, int]:
    return dict(ctx.state["runs"])


@dozy.action
async def nap(ctx: ActorContext) -> None:
    ctx.sleep()


async def _waiting(served: Served, key: str, eventually: Eventually) -> None:
    """The dozy `key` created, its workflow past its steps and waiting for a message."""
    async with served.client() as client, served.http() as http:
        await client.get_or_create("dozy", key).runs()

        async def waiting() -> bool:
            found = await http.get("/inspect/actors/dozy/workflow", params={"key": key})
            entries = found.json()["workflow"]["entries"] if found.status_code == 200 else []
            return [e["name"] for e in entries[-1:]] == ["approval"]

        await eventually(waiting, what="the workflow to wait for its message")


async def _post(http: httpx.AsyncClient, change: str, key: str, body: Any) -> httpx.Response:
    return await http.post(
        f"/inspect/actors/dozy/workflow/{change}", params={"key": key}, json=body
    )


async def test_the_summary_says_here_of_the_server_asked_not_of_the_owner() -> None:
    """A summary asked of one server is answered by the actor's owner (for its runtime facts):
    its `here` must still be about the server the client asked, as the list's is, or the page
    shows the owner as "this server" on another server."""
    store = MemoryStore()
    async with (
        serving(kv=store, advertise=True) as owner,
        serving(kv=store, advertise=True) as other,
    ):
        async with owner.client() as client:
            await client.get_or_create("ledger", "k").add(1)
        async with other.http() as http:
            summary = (await http.get("/inspect/actors/ledger", params={"key": "k"})).json()
            [listed] = (await http.get("/inspect/actors", params={"owners": "1"})).json()["actors"]
        async with owner.http() as http:
            at_owner = (await http.get("/inspect/actors/ledger", params={"key": "k"})).json()
        forwarded = other.app.state.registry.metrics().get("forwarded", 0)
    assert forwarded >= 1 and summary["live"] is True  # the owner answered it
    assert summary["owner"]["address"] == owner.url
    assert summary["owner"]["here"] is False and listed["owner"]["here"] is False
    assert at_owner["owner"]["here"] is True


async def test_what_answers_refuses_unknown_parameters_like_every_route() -> None:
    store = MemoryStore()
    async with serving(kv=store) as served, serving_store(store) as view:
        answers = []
        for target in (served, view):
            async with target.http() as http:
                answers.append(await http.get("/inspect", params={"mode": "serve"}))
    for response in answers:
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_parameter"
        assert "['mode']" in response.json()["error"]["message"]


async def test_a_change_of_an_asleep_actor_does_not_wait_for_its_idle_sleep(
    eventually: Eventually,
) -> None:
    async with serving([dozy]) as served:
        await _waiting(served, "s1", eventually)
        registry = served.app.state.registry
        async with served.client() as client:
            await client.get("dozy", "s1").nap()
        await eventually(lambda: _none_live(registry), what="the actor to sleep")
        before = registry.metrics()
        async with served.http() as http:
            with anyio.fail_after(10):
                cancelled = await _post(http, "cancel", "s1", {})
        after = registry.metrics()
    assert cancelled.status_code == 200, cancelled.text
    assert after["wakes"] == before["wakes"] + 1
    assert after.get("sleeps", 0) == before.get("sleeps", 0)  # it was not released by a sleep


async def _none_live(registry: Any) -> bool:
    return not registry.live()


async def test_a_replay_from_an_entry_with_an_odd_name_replays_from_that_entry(
    eventually: Eventually,
) -> None:
    async with serving([dozy]) as served:
        await _waiting(served, "o1", eventually)
        async with served.http() as http, served.client() as client:
            slashed = await _post(http, "replay", "o1", {"from": "plain/~0/z"})
            await _waiting(served, "o1", eventually)
            after_slashed = await client.get("dozy", "o1").runs()
            tilde = await _post(http, "replay", "o1", {"from": "~first"})
    assert slashed.status_code == 200, slashed.text
    assert after_slashed == {"~first": 1, "plain": 1, "plain/~0/z": 2}
    assert tilde.status_code == 200, tilde.text
