"""A destroy cut short by SIGKILL between the drop of the actor's data and the removal of its
registry entries: from outside, the actor must be gone, not half there (the inspector's
reads say not found too).

The child process destroys the `phoenix` actor (which has a schedule pending) and is killed by a
test hook at exactly that point. Afterwards a registry on the same store must answer `get` with
not-found, must not wake the actor for its old schedule nor run `on_create` by itself, and a
get-or-create must make a fresh actor.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from actor_defs import phoenix

from pagekv.actor import ActorNotFound, Registry
from pagekv.actor import inspect_reads as inspect
from pagekv.actor.directory.records import REGISTRY_NAMESPACE
from pagekv.actor.registry import actor_id
from pagekv.kv import open_kv
from pagekv.vfs import Database

pytestmark = pytest.mark.anyio

_DESTROY_AND_DIE = """
import os, signal, sys, anyio
from actor_defs import phoenix
from pagekv.actor import Registry
from pagekv.actor.registry import Registry as R

forget = R.forget

async def die(self, instance, *, how, destroyed):  # the hook: after the drop, before the index
    if destroyed:
        print("dropped", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    await forget(self, instance, how=how, destroyed=destroyed)

async def main():
    async with Registry([phoenix], kv=sys.argv[1]).run() as client:
        await client.get_or_create("phoenix", "k", input="first").arm()
        R.forget = die
        await client.destroy("phoenix", "k")
anyio.run(main)
"""


def inspect_state(database: Database) -> object:
    return inspect.read_state(database.connection)


def _index_entries(url: str) -> list[bytes]:
    store = open_kv(url)
    try:
        aid = actor_id("phoenix", "k").encode()
        return [k for k, _ in store.namespace(REGISTRY_NAMESPACE).list() if aid in k]
    finally:
        store.close()


async def test_a_destroy_killed_after_the_drop_leaves_the_actor_gone(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    log = tmp_path / "phoenix.log"
    env = {**os.environ, "PHOENIX_LOG": str(log)}
    child = subprocess.run(
        [sys.executable, "-c", _DESTROY_AND_DIE, url],
        cwd=Path(__file__).parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -9 and child.stdout == "dropped\n", child.stderr
    assert _index_entries(url), "the hook did not fire before the index was cleaned"
    with open_kv(url, create=False) as store:  # what the inspector and pagekv ui read
        index = inspect.open_index(store)
        assert index is not None
        record = inspect.find_actor(index, "phoenix", "k")  # still recorded
        with pytest.raises(ActorNotFound, match="it was destroyed"):
            inspect.read_snapshot(store, record, inspect_state)
    os.environ["PHOENIX_LOG"] = str(log)
    try:
        async with Registry([phoenix], kv=url).run() as client:
            await anyio.sleep(1.5)  # the old schedule was due at 0.5 s; the poll runs every 0.5
            with pytest.raises(ActorNotFound):
                await client.get("phoenix", "k").tick()
            assert log.read_text() == "create first\n", "the destroyed actor came back"
            assert _index_entries(url) == [], "the stale records and wake entries stay"
            assert await client.get_or_create("phoenix", "k", input="second").arm() == 1
    finally:
        del os.environ["PHOENIX_LOG"]
    assert log.read_text() == "create first\ncreate second\n"
