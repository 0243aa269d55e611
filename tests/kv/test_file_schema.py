"""Schema versions of the `file://` store: a file from a newer pagekv is refused, not misread."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from pagekv.kv.file import FileStore


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    FileStore(tmp_path / "kv").close()
    db = apsw.Connection(str(tmp_path / "kv" / "kv.sqlite3"))
    db.execute("PRAGMA user_version = 2")
    db.close()
    with pytest.raises(RuntimeError, match="schema version 2; this pagekv reads up to 1"):
        FileStore(tmp_path / "kv")
