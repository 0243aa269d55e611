"""Editing a workflow's history back to a step, for `replay`: which entry a readable location
names, and forgetting it with everything created after it.

Functions of the history alone (no state of their own): the run handler holds itself off and
loads the history around them (`Runner.replay`), then settles what they changed.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from pagekv.actor.workflow.errors import WorkflowChangeRefused
from pagekv.actor.workflow.history import Entry, History, Status, child, readable, subtree_range
from pagekv.actor.workflow.payloads import PENDING_BRANCH, Join, Race


def rewind(history: History, location: str | None) -> None:
    """Forget the entry at `location` (as `describe` spells it; if inside a loop, the outermost
    loop holding it) and every entry created after it; None forgets the whole history."""
    if location is None:
        history.delete_from(0)
    else:
        target = _target(history, location)
        _reopen_branches(history, history.delete_from(target.seq))


def _reopen_branches(history: History, forgotten: list[str]) -> None:
    """Mark every join and race branch that lost entries (`forgotten`) as not run: a join or
    race that recorded its branch as settled would skip it on the replay (only the code after
    the join re-ran, and the branch's entries were gone for good), and a replay in one branch
    forgets what the other branches did after it too. A race forgets its winner: it is run
    again from that point, its losers from their start."""
    names = {idx: name for name, idx in history.names.items()}
    for entry in list(history.entries.values()):
        if not isinstance(entry.data, Join | Race):
            continue
        prefix = entry.location + "/"
        segments = {loc[len(prefix) :].split("/")[0] for loc in forgotten if loc.startswith(prefix)}
        branches = {names.get(int(s)) for s in segments if s.isdigit()}
        if not branches:
            continue
        data = copy.deepcopy(entry.data)
        for branch in set(data.branches) & branches:
            data.branches[branch] = PENDING_BRANCH
        if isinstance(data, Race):
            data.winner = None
            for loser, status in data.branches.items():
                if status.kept:
                    data.branches[loser] = replace(status, kept=False)
                    index = history.names[loser]
                    history.delete_range(*subtree_range(child(entry.location, index)))
        history.put(replace(entry, data=data, status=Status.PENDING, completed=None))


def _target(history: History, path: str) -> Entry:
    """The entry a replay from `path` (a readable location) forgets from: that entry, or if it
    is inside a loop, the outermost loop holding it. Matched whole and then walked on the
    stored location, whose segments are name indexes and `~` iterations: a name may itself
    hold `/` or start with `~`, so the readable path cannot be split."""
    names = {idx: name for name, idx in history.names.items()}
    found = [e for loc, e in history.entries.items() if readable(loc, names) == path]
    if not found:
        raise WorkflowChangeRefused(f"the workflow history has no entry {path!r}")
    if len(found) > 1:
        raise WorkflowChangeRefused(
            f"{path!r} names {len(found)} entries of the history (names holding '/' or "
            "starting with '~' spell alike); nothing was replayed"
        )
    segments = found[0].location.split("/")
    loops = [i for i, s in enumerate(segments) if s.startswith("~")]
    if loops:
        return history.entries["/".join(segments[: loops[0]])]
    return found[0]
