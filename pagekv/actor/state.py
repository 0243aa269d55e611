"""The actor's durable state: a CBOR-serialisable value kept in memory and in `_pagekv_state`."""

from __future__ import annotations

import copy
from typing import Any

import apsw

from pagekv.actor.tables.sql import encode_state, save_state


class StateCell:
    """Holds `value` and the bytes last made durable, so a save writes only when it changed."""

    def __init__(self, value: Any, saved: bytes | None) -> None:
        self.value = value
        self._saved = saved

    def snapshot(self) -> tuple[Any, bytes | None]:
        return copy.deepcopy(self.value), self._saved

    def restore(self, snapshot: tuple[Any, bytes | None]) -> None:
        self.value, self._saved = copy.deepcopy(snapshot[0]), snapshot[1]

    def changed(self) -> bytes | None:
        """The encoded value if it differs from what was last saved, else None."""
        data = encode_state(self.value)
        return None if data == self._saved else data

    def write_if_changed(self, connection: apsw.Connection) -> bytes | None:
        """Write the state row if the value changed; return the bytes written (None: unchanged).

        Call `mark_saved` with them once the surrounding transaction committed.
        """
        data = self.changed()
        if data is not None:
            save_state(connection, data)
        return data

    def mark_saved(self, data: bytes | None) -> None:
        if data is not None:
            self._saved = data
