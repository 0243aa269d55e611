"""Inspector reads of a busy actor: how often `read_snapshot` gives up while a writer commits.

A writer thread updates one row per commit (in place, or as deltas; at `--rate` a second, or as
fast as it can) while the
main thread runs the inspector's `read_snapshot` with a query that reads every row, for
`--seconds`. Prints the snapshot reads that succeeded and those that gave up
(`SnapshotExpired` after `SNAPSHOT_ATTEMPTS` opens).

    .venv/bin/python benchmarks/snapshot_race.py --kv file:///work/bench-runs/sr --rows 2000
    .venv/bin/python benchmarks/snapshot_race.py --kv file:///work/bench-runs/sr --deltas
"""

from __future__ import annotations

import argparse
import threading
import time

from pagekv.actor.inspect_reads import ActorRecord, read_snapshot
from pagekv.kv import open_kv
from pagekv.vfs import Database, SnapshotExpired, open_database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv", default="memory://")
    parser.add_argument("--rows", type=int, default=2000, help="rows of 300 B (13 a page)")
    parser.add_argument("--deltas", action="store_true", help="in_place_commits=False")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, help="writer commits per second (default: flat out)")
    args = parser.parse_args()
    store = open_kv(args.kv)
    record = ActorRecord("busy", f"k{time.time_ns()}", 0.0)
    db = open_database(store.namespace(record.actor_id), in_place_commits=not args.deltas)
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    with db.connection:
        for i in range(args.rows):
            db.execute("INSERT INTO t VALUES (?, randomblob(300))", (i,))
    db.compact()
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            db.execute("UPDATE t SET v = randomblob(300) WHERE id = ?", (i % args.rows,))
            i += 7
            if args.rate:
                stop.wait(1 / args.rate)

    def query(snapshot: Database) -> object:
        return snapshot.execute("SELECT count(*), sum(length(v)) FROM t").fetchall()

    writer = threading.Thread(target=write)
    writer.start()
    ok = gave_up = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            try:
                read_snapshot(store, record, query)
                ok += 1
            except SnapshotExpired:
                gave_up += 1
    finally:
        stop.set()
        writer.join()
    metrics = db.metrics()
    db.close()
    store.close()
    print(
        f"{args.kv}, {metrics['size_bytes'] // 4096} pages, "
        f"{'deltas' if args.deltas else 'in place'}, writer at {args.rate or 'full speed'}/s: "
        f"snapshot reads ok {ok}, gave up {gave_up}; "
        f"writer commits {metrics['commits']}"
    )


if __name__ == "__main__":
    main()
