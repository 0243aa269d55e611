"""A second process running a registry of `ledger` on a shared store, driven over stdin/stdout.

Usage: `python actor_worker.py STORE_URL [FRESHNESS_S]` (the second sets how long an instance
trusts that it still owns its actor, see `pagekv.actor.lifecycle.owner_check`). Each input line
is a JSON list `[action, key, *args]`; each output line is `{"ok": result}` or
`{"error": "ExceptionType"}`.
It prints `{"ready": true}` once serving and exits on EOF (sleeping its actors) or when killed.
"""

from __future__ import annotations

import json
import sys

import anyio
from actor_defs import ledger

import pagekv.actor.lifecycle.owner_check
from pagekv.actor import Registry


def _send(message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def main(url: str) -> None:
    async with Registry([ledger], kv=url).run() as client:
        _send({"ready": True})
        while line := await anyio.to_thread.run_sync(sys.stdin.readline):
            action, key, *args = json.loads(line)
            try:
                result = await client.get_or_create("ledger", key).call(action, *args)
            except Exception as e:
                _send({"error": type(e).__name__, "message": str(e)})
            else:
                _send({"ok": result})


if __name__ == "__main__":
    if len(sys.argv) > 2:
        pagekv.actor.lifecycle.owner_check.FRESHNESS_S = float(sys.argv[2])
    anyio.run(main, sys.argv[1])
