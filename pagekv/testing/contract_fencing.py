"""Contract clauses of fencing: `takeover()` moves the generation up by exactly one, a write
fenced with the current generation is applied, one fenced with any other raises `FenceMismatch`
(naming both) and writes nothing, whatever kind of write it is; unfenced writes are always
applied; and all of it holds across handles, stores at one location, and threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from pagekv.kv import FenceMismatch, InvalidArgument
from pagekv.testing.clauses import NotChecked, Trial, clause
from pagekv.testing.contract_data import fresh, takes_small
from pagekv.testing.subject import Probe
from pagekv.testing.violation import Violation, show


def _writes(kv: Probe, fence: object) -> list[tuple[str, Callable[[], object]]]:
    """Every kind of write, fenced with `fence`, on a namespace holding b'a', b'b' (and b'c')."""
    return [
        ("write(put, delete)", lambda: kv.write(put={b"d": b"4"}, delete=[b"a"], fence=fence)),
        ("put", lambda: kv.put({b"a": b"changed"}, fence=fence)),
        ("delete", lambda: kv.delete([b"a"], fence=fence)),
        ("write() of nothing", lambda: kv.write(fence=fence)),
        ("delete_range", lambda: kv.delete_range(b"a", b"z", fence=fence)),
        ("drop", lambda: kv.drop(fence=fence)),
    ]


@clause("takeover() returns the generation + 1 and makes it the generation; it starts at >= 0")
def takeover_increments_the_generation_by_exactly_one(t: Trial) -> None:
    kv = fresh(t)
    start = kv.generation()
    t.check(start >= 0, "generation() of a fresh namespace is an int >= 0", start)
    for n in range(1, 4):
        t.expect(kv.takeover(), start + n, f"takeover() number {n} returns {start} + {n}")
    t.expect(kv.generation(), start + 3, "generation() returns what the last takeover returned")


@clause("every kind of write fenced with the current generation is applied")
def current_fence_is_accepted_everywhere(t: Trial) -> None:
    kv = fresh(t)
    gen = kv.takeover()
    kv.write(put={b"a": b"1", b"b": b"2", b"c": b"3"}, fence=gen)
    kv.delete([b"a"], fence=gen)
    kv.delete_range(b"b", b"c", fence=gen)
    t.expect(
        kv.list(),
        [(b"c", b"3")],
        f"write, delete and delete_range fenced with the current generation {gen} are applied",
    )
    kv.drop(fence=gen)
    dropped = kv.last()
    t.expect(kv.list(), [], f"drop(fence={gen}) at generation {gen} drops", by=dropped)
    t.expect(kv.get([b"c"]), [None], f"get() after drop(fence={gen}) finds nothing", by=dropped)
    t.expect(kv.generation(), gen, "fenced writes do not move the generation")


@clause(
    "every kind of write (write, put, delete, an empty write, delete_range, drop) fenced with a "
    "generation other than the current one, older or newer, raises FenceMismatch with fence and "
    "current set, and writes nothing"
)
def stale_fence_fails_and_changes_nothing(t: Trial) -> None:
    kv = fresh(t)
    kv.takeover()
    gen = kv.takeover()
    kv.put({b"a": b"1", b"b": b"2", b"c": b"3"})
    before = t.snapshot(kv)
    for stale in (gen - 1, gen + 1):
        for what, attempt in _writes(kv, stale):
            requires = f"{what} fenced {stale} at generation {gen}"
            with t.raises(FenceMismatch, requires=f"{requires} raises FenceMismatch") as caught:
                attempt()
            t.expect(
                (getattr(caught[0], "fence", None), getattr(caught[0], "current", None)),
                (stale, gen),
                f"the FenceMismatch of {requires} has fence={stale}, current={gen}",
            )
            t.unchanged(kv, before, f"{requires} writes nothing")


@clause(
    "a fence that is not None or an int from 0 to 2**63 - 1 (a bool, a negative, 2**63, a "
    "float, a str) raises InvalidArgument naming the fence, for every kind of write"
)
def a_fence_that_is_not_a_generation_is_refused(t: Trial) -> None:
    kv = fresh(t)
    kv.takeover()
    kv.put({b"a": b"1", b"b": b"2"})
    before = t.snapshot(kv)
    for fence in (True, False, -1, 2**63, 1.0, "1"):
        for what, attempt in _writes(kv, fence):
            requires = f"{what} with fence={fence!r}"
            with t.raises(InvalidArgument, requires=f"{requires} raises InvalidArgument") as caught:
                attempt()
            t.check(
                "fence" in str(caught[0]),
                f"the InvalidArgument of {requires} names the fence",
                caught[0],
            )
            t.unchanged(kv, before, f"{requires} writes nothing")


@clause("unfenced writes of every kind are applied whatever the generation")
def unfenced_writes_are_allowed_after_takeover(t: Trial) -> None:
    kv = fresh(t)
    kv.takeover()
    kv.takeover()
    kv.put({b"a": b"1", b"b": b"2"})
    kv.delete([b"a"])
    kv.delete_range(b"a", b"c")
    kv.put({b"z": b"9"})
    t.expect(
        kv.list(), [(b"z", b"9")], "unfenced put, delete and delete_range after takeovers apply"
    )
    kv.drop()
    t.expect(kv.list(), [], "an unfenced drop after takeovers drops")


@clause(
    "a takeover through another handle of the namespace fences out the first: its writes fenced "
    "with the old generation raise FenceMismatch, the new owner's are applied"
)
def takeover_through_another_handle_fences_the_first(t: Trial) -> None:
    store = t.store()
    old_owner = takes_small(t, t.handle(store, "actor"))
    gen = old_owner.takeover()
    old_owner.put({b"a": b"1"}, fence=gen)
    new_owner = t.handle(store, "actor")
    t.expect(new_owner.takeover(), gen + 1, "a takeover through a second handle returns gen + 1")
    with t.raises(
        FenceMismatch, requires=f"the first handle's put fenced {gen} after the takeover raises"
    ):
        old_owner.put({b"a": b"stale"}, fence=gen)
    new_owner.put({b"a": b"fresh"}, fence=gen + 1)
    t.expect(old_owner.get([b"a"]), [b"fresh"], "the new owner's fenced put is applied")


def _second_handle(t: Trial, location: Path) -> Probe:
    """The namespace 'actor' of another store at `location` while the first is open, or
    `NotChecked`: the factory contract does not promise two stores open at one location at once,
    and a store may refuse the second when it opens or when it opens a namespace."""
    try:
        return t.handle(t.store(location), "actor")
    except (NotChecked, Violation):
        raise
    except Exception as e:
        raise NotChecked(
            f"the factory cannot open a second store at a location in use: {show(e)}"
        ) from e


@clause(
    "a takeover through a store opened at the same location fences out the first store's "
    "handle; each store sees the other's writes and generation"
)
def takeover_through_another_store_fences_the_first(t: Trial) -> None:
    location = t.location()
    first = takes_small(t, t.handle(t.store(location), "actor"))
    second = _second_handle(t, location)
    gen = first.takeover()
    first.put({b"a": b"1"}, fence=gen)
    t.expect(second.takeover(), gen + 1, "a takeover through the second store returns gen + 1")
    with t.raises(
        FenceMismatch, requires=f"the first store's put fenced {gen} after the takeover raises"
    ):
        first.put({b"a": b"stale"}, fence=gen)
    t.expect(second.get([b"a"]), [b"1"], "the second store reads what the first wrote")
    t.expect(first.generation(), gen + 1, "the first store sees the second's takeover")


def _race_takeovers(t: Trial, handles: list[Probe], each: int) -> list[int]:
    """Run `each` takeovers on each handle, one thread per handle at once; their results."""
    results: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(len(handles))

    def worker(kv: Probe) -> None:
        try:
            start.wait()
            mine = [kv.takeover() for _ in range(each)]
        except BaseException as e:
            with lock:
                errors.append(e)
            return
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=worker, args=(kv,)) for kv in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors and isinstance(errors[0], Violation | NotChecked):
        raise errors[0]
    if errors:
        failed = next((c for c in t.calls if c.raised is errors[0]), None)
        raise t.violation(
            "takeover() returns a generation while other threads take over at once",
            f"raised {show(errors[0])}",
            call=failed,
        )
    return results


@clause(
    "concurrent takeovers of one namespace each return a distinct generation: n takeovers "
    "from generation g return exactly g + 1 to g + n"
)
def concurrent_takeovers_each_get_a_distinct_generation(t: Trial) -> None:
    kv = fresh(t)
    start = kv.generation()
    got = _race_takeovers(t, [kv] * 4, 25)
    t.expect(
        sorted(got),
        list(range(start + 1, start + 101)),
        f"100 takeovers from 4 threads at once return each of {start + 1} to {start + 100} once",
    )
    t.expect(kv.generation(), start + 100, "generation() after them is the highest")


@clause("concurrent takeovers through two stores at one location each return a distinct generation")
def concurrent_takeovers_through_two_stores_are_distinct(t: Trial) -> None:
    location = t.location()
    first = t.handle(t.store(location), "actor")
    second = _second_handle(t, location)
    start = first.generation()
    got = _race_takeovers(t, [first, second, first, second], 20)
    t.expect(
        sorted(got),
        list(range(start + 1, start + 81)),
        f"80 takeovers from 4 threads over two stores return each of {start + 1} to "
        f"{start + 80} once",
    )
    t.expect(first.generation(), start + 80, "the first store's generation() is the highest")
    t.expect(second.generation(), start + 80, "the second store's generation() is the highest")
