"""`SortedKeys` against a set: any mix of adds, removes and ranges lists exactly the set's keys."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pagekv.kv.sorted_keys import _INSERT_MAX, SortedKeys

_keys = st.binary(min_size=1, max_size=3)
_bound = st.none() | _keys
_ops = st.one_of(
    st.tuples(st.just("add"), st.lists(_keys, max_size=4)),
    st.tuples(st.just("add"), st.lists(_keys, min_size=_INSERT_MAX + 1, max_size=_INSERT_MAX + 8)),
    st.tuples(st.just("remove"), _keys),
    st.tuples(st.just("remove_range"), st.tuples(_bound, _bound)),
    st.tuples(st.just("bounds"), st.tuples(_bound, _bound)),
)


def _inside(key: bytes, start: bytes | None, end: bytes | None) -> bool:
    return (start is None or start <= key) and (end is None or key < end)


@given(st.lists(_ops, max_size=30))
def test_sorted_keys_match_a_set(ops: list[tuple[str, Any]]) -> None:
    keys, model = SortedKeys(), set[bytes]()
    for op, arg in ops:
        if op == "add":
            for key in arg:
                if key not in model:  # the owner adds only keys not present
                    keys.add(key)
                    model.add(key)
        elif op == "remove":
            if arg in model:  # and removes only keys present
                keys.remove(arg)
                model.discard(arg)
        elif op == "remove_range":
            gone = keys.remove_range(*arg)
            assert sorted(gone) == sorted(k for k in model if _inside(k, *arg))
            assert len(set(gone)) == len(gone)
            model -= set(gone)
        else:
            ordered, lo, hi = keys.bounds(*arg)
            assert ordered[lo:hi] == sorted(k for k in model if _inside(k, *arg))
    ordered, lo, hi = keys.bounds(None, None)
    assert ordered[lo:hi] == sorted(model)
    keys.clear()
    assert keys.bounds(None, None) == ([], 0, 0)
