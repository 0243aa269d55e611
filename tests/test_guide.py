"""docs/guide.md, run as its reader would (tests/docs_reader.py), so that it cannot rot. The
PostgreSQL section's shell blocks run in a test of their own, against the session's PostgreSQL
server (`postgres_server`: skipped without one), its URL for the guide's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_reader import Block, Reader, blocks

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
DEPLOY = "\n## 6. Deploying on PostgreSQL\n"


def _blocks() -> list[tuple[Block, bool]]:
    """The guide's blocks, each with whether it is in the PostgreSQL section."""
    text = GUIDE.read_text()
    assert DEPLOY in text, f"the guide has no section {DEPLOY.strip()!r}"
    deploy_at = text.index(DEPLOY)
    return [(block, block.at > deploy_at) for block in blocks(text)]


@pytest.mark.slow
def test_the_guide_runs_top_to_bottom_in_a_fresh_directory(tmp_path: Path) -> None:
    reader = Reader(tmp_path)
    try:
        for block, deploy in _blocks():
            if block.lang == "python":
                reader.python(block.code)
            elif block.lang == "sh" and not deploy:
                reader.sh(block.code)
    finally:
        reader.stop()
    assert reader.ran["python"] >= 8 and reader.ran["serve"] == 1, reader.ran


@pytest.mark.slow
def test_the_deployment_runs_on_postgresql(tmp_path: Path, postgres_server) -> None:
    reader = Reader(tmp_path, pg_url=postgres_server.store_url("guide-deploy"))
    try:
        for block, deploy in _blocks():
            if block.lang == "python":
                reader.save(block.code)
            elif block.lang == "sh" and deploy:
                reader.sh(block.code)
            elif block.lang == "sh":  # the shell the reader deploys from: its variables
                reader.sh(block.code, only_exports=True)
    finally:
        reader.stop()
    assert reader.ran["serve"] == 2 and reader.ran["sh"] >= 6, reader.ran
