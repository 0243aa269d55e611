"""Peak memory of an export and an import of an actor with many `ctx.kv` entries.

    .venv/bin/python benchmarks/transfer_memory.py [--mib 600] [--reps 1] [--dir DIR]

An actor of the `file:` store is given `--mib` MiB of `ctx.kv` entries (32 KiB values, written
straight into its namespace) beside a small database. Each measurement is a fresh subprocess
that reports its own peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`): `export_actor` of
that actor to a file, `import_actor` of the file into a fresh `file:` store, and a baseline
process that only imports pagekv (what every process pays before it reads an entry). Peak RSS
of an export or an import should stay near the baseline whatever `--mib` is: the entries are
read, checked and written in bounded pages. Also printed: the imported namespace's stored bytes
against the export file's size (an imported database that kept the free pages of the dropped
`_pagekv_kv` table would store the entries twice).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_VALUE_BYTES = 32 * 1024
_NAME, _KEY = "memo", "big"


def _peak_mib() -> float:
    """This process's peak RSS (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _setup(store_dir: Path, mib: int) -> None:
    import anyio

    from pagekv.actor import ActorContext, Registry, actor
    from pagekv.actor.directory.records import actor_id
    from pagekv.actor.user_kv import USER_PREFIX
    from pagekv.kv import open_kv
    from pagekv.transfer.chunked_io import batches

    memo = actor(_NAME, state={"n": 0})

    @memo.action
    async def touch(ctx: ActorContext) -> None:
        await ctx.db.execute("CREATE TABLE IF NOT EXISTS t(v)")
        await ctx.db.execute("INSERT INTO t VALUES (randomblob(1000))")
        ctx.state["n"] += 1

    async def create(store: object) -> None:
        async with Registry([memo], kv=store).run() as client:
            await client.get_or_create(_NAME, _KEY).touch()

    with open_kv(store_dir.resolve().as_uri()) as store:
        anyio.run(create, store)
        kv = store.namespace(actor_id(_NAME, _KEY))
        count = mib * 2**20 // _VALUE_BYTES
        value = os.urandom(_VALUE_BYTES)
        entries = ((USER_PREFIX + b"entry-%08d" % n, value) for n in range(count))
        for batch in batches(entries, kv.limits):
            kv.write(put=batch)


def _child(what: str, paths: list[str]) -> dict[str, float]:
    import pagekv.actor  # what every measured process pays
    from pagekv.kv import open_kv

    if what == "baseline":
        return {"peak_mib": _peak_mib()}
    if what == "export":
        store, out = paths
        with open_kv(Path(store).resolve().as_uri(), create=False) as kv:
            exported = pagekv.actor.export_actor(kv, _NAME, _KEY, out)
        return {"peak_mib": _peak_mib(), "entries": exported.kv_entries, "bytes": exported.bytes}
    if what == "import":
        source, store = paths
        with open_kv(Path(store).resolve().as_uri()) as kv:
            imported = pagekv.actor.import_actor(kv, _NAME, _KEY, source)
            stored = kv.namespace(imported.actor.actor_id).used_bytes()
        return {"peak_mib": _peak_mib(), "entries": imported.kv_entries, "stored": stored}
    raise ValueError(f"unknown child {what!r}")


def _run(what: str, *paths: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", what, *map(str, paths)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the {what} child failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=600, help="MiB of ctx.kv entries")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "setup":
        _setup(Path(args.paths[0]), int(args.paths[1]))
        return
    if args.child is not None:
        print(json.dumps(_child(args.child, args.paths)))
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        subprocess.run(
            [sys.executable, __file__, "--child", "setup", str(root / "src"), str(args.mib)],
            check=True,
        )
        samples: dict[str, list[dict[str, float]]] = {"baseline": [], "export": [], "import": []}
        for rep in range(args.reps):
            samples["baseline"].append(_run("baseline"))
            out = root / f"export-{rep}.sqlite"
            samples["export"].append(_run("export", root / "src", out))
            samples["import"].append(_run("import", out, root / f"dst-{rep}"))
            samples["import"][-1]["file"] = out.stat().st_size
        print(
            f"{args.mib} MiB of ctx.kv ({_VALUE_BYTES // 1024} KiB values), medians of {args.reps}:"
        )
        for what, runs in samples.items():
            peak = statistics.median(r["peak_mib"] for r in runs)
            print(f"{what:>9}: peak RSS {peak:,.0f} MiB{_detail(what, runs[0])}")


def _detail(what: str, run: dict[str, float]) -> str:
    if what == "export":
        return f"  ({run['entries']:,.0f} entries, file {run['bytes'] / 2**20:,.0f} MiB)"
    if what == "import":
        stored, size = run["stored"] / 2**20, run["file"] / 2**20
        return f"  (its namespace stores {stored:,.0f} MiB, from a {size:,.0f} MiB file)"
    return ""


if __name__ == "__main__":
    main()
