"""The workflow history's payload codec (`pagekv.actor.workflow.payloads`): every map the engine
has written decodes to its kind's type and encodes back to the same map, so histories stored
before the types existed read, and are shown, unchanged."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from fixture_store import load_fixture

from pagekv.actor.workflow import WorkflowFormatError
from pagekv.actor.workflow.payloads import (
    Branch,
    BranchStatus,
    Join,
    Kind,
    LoopProgress,
    Messages,
    Race,
    ReceivedMessage,
    StepDone,
    StepFailed,
    StepPending,
    StepRetrying,
    decode,
    encode,
)
from pagekv.vfs import open_database

MAPS: list[tuple[Kind, dict[str, Any]]] = [
    (Kind.STEP, {}),
    (Kind.STEP, {"retry_at": 12.5}),
    (Kind.STEP, {"output": None}),
    (Kind.STEP, {"output": {"a": [1, 2]}, "rollback": True}),
    (Kind.STEP, {"failure": "timeout"}),
    (Kind.SLEEP, {"deadline": 99.0}),
    (Kind.LOOP, {"state": {"n": 1}, "iteration": 4, "pruned": 2}),
    (Kind.ITERATION, {"state": 3}),
    (Kind.MESSAGE, {"deadline": None, "messages": []}),
    (
        Kind.MESSAGE,
        {
            "deadline": 5.0,
            "messages": [
                {"id": 1, "name": "q", "body": "x", "created": 1.0, "completed": False},
                {
                    "id": 2,
                    "name": "q",
                    "body": None,
                    "created": 2.0,
                    "completed": True,
                    "returned": True,
                },
            ],
            "completable": True,
        },
    ),
    (Kind.ROLLBACK_CHECKPOINT, {}),
    (
        Kind.JOIN,
        {
            "branches": {
                "a": {"status": "pending"},
                "b": {"status": "completed", "output": None},
                "c": {"status": "failed", "error": "ValueError: no"},
            }
        },
    ),
    (
        Kind.RACE,
        {
            "winner": "a",
            "branches": {
                "a": {"status": "completed", "output": 1},
                "b": {"status": "cancelled", "kept": True},
                "c": {"status": "cancelled"},
            },
        },
    ),
    (Kind.RACE, {"winner": None, "branches": {"a": {"status": "pending"}}}),
    (Kind.REMOVED, {"original_kind": "sleep"}),
    (Kind.VERSION_CHECK, {"resolved": 1, "latest": 2}),
]


@pytest.mark.parametrize(
    ("kind", "data"), MAPS, ids=[f"{k.value}-{i}" for i, (k, _) in enumerate(MAPS)]
)
def test_every_written_map_decodes_and_encodes_back_unchanged(
    kind: Kind, data: dict[str, Any]
) -> None:
    assert encode(decode(kind, data)) == data


def test_decoded_payloads_have_their_kinds_fields() -> None:
    assert decode(Kind.STEP, {}) == StepPending()
    assert decode(Kind.STEP, {"retry_at": 1.0}) == StepRetrying(1.0)
    assert decode(Kind.STEP, {"output": 7, "rollback": True}) == StepDone(7, undoable=True)
    assert decode(Kind.STEP, {"failure": "critical"}) == StepFailed("critical")
    assert decode(Kind.LOOP, {"state": 0, "iteration": 1, "pruned": 0}) == LoopProgress(0, 1, 0)
    received = decode(Kind.MESSAGE, MAPS[9][1])
    assert isinstance(received, Messages) and received.completable is True
    assert received.messages[1] == ReceivedMessage(2, "q", None, 2.0, True, returned=True)
    assert decode(Kind.JOIN, MAPS[11][1]) == Join(
        {
            "a": Branch(BranchStatus.PENDING),
            "b": Branch(BranchStatus.COMPLETED),
            "c": Branch(BranchStatus.FAILED, error="ValueError: no"),
        }
    )
    race = decode(Kind.RACE, MAPS[12][1])
    assert isinstance(race, Race) and race.winner == "a" and race.branches["b"].kept


def test_a_map_of_the_wrong_shape_is_a_format_error() -> None:
    with pytest.raises(WorkflowFormatError, match="a sleep entry holds"):
        decode(Kind.SLEEP, {"until": 3})
    with pytest.raises(WorkflowFormatError, match="no step failure kind 'lost'"):
        decode(Kind.STEP, {"failure": "lost"})


def test_the_released_fixture_histories_read_unchanged() -> None:
    """Every entry of the workflow stored by `fixtures/make_internal_v2.py` (history format 1)
    decodes, and encodes back to the very bytes stored."""
    store = load_fixture(2)
    with open_database(store.namespace("orders/fixture")) as db:
        rows = db.execute("SELECT kind, data FROM _pagekv_workflow_history").fetchall()
    assert {kind for kind, _ in rows} >= {"step", "loop", "join"}
    for kind, data in rows:
        assert cbor2.dumps(encode(decode(Kind(kind), cbor2.loads(data)))) == data
