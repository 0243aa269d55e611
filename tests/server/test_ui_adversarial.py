"""The inspector's page API attacked: what it says about an actor's owner when another server
answered, and the bad requests it must refuse, over real loopback servers sharing one store."""

from __future__ import annotations

import pytest
from server_helpers import serving, serving_store

from pagekv.kv import MemoryStore

pytestmark = pytest.mark.anyio


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
