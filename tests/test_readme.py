"""The README, run as a newcomer would (tests/docs_reader.py): its blocks in order, in a fresh
directory holding a copy of the checkout's `examples/`, writing nothing but `.pagekv`; and short
enough to read in a few minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_reader import ROOT, Reader, blocks

README = ROOT / "README.md"


@pytest.mark.slow
def test_the_readme_runs_top_to_bottom_in_a_fresh_directory(tmp_path: Path) -> None:
    cwd, logs = tmp_path / "newcomer", tmp_path / "logs"
    cwd.mkdir()
    logs.mkdir()
    reader = Reader(cwd, logs=logs)
    try:
        reader.read(README.read_text())
    finally:
        reader.stop()
    # the snippets run from the checkout: all they write must go to the git-ignored .pagekv
    assert sorted(p.name for p in cwd.iterdir()) == [".pagekv", "examples"]
    assert reader.ran == {"serve": 1, "sh": 3, "python": 2}, reader.ran


def test_the_example_is_the_file_it_names() -> None:
    """The README shows `examples/quickstart.py` as it is (but its docstring), so the example in
    the checkout and the one read are one."""
    shown = next(b.code for b in blocks(README.read_text()) if b.code.startswith("# examples/"))
    name, _, body = shown.partition("\n")
    source = (ROOT / name.removeprefix("# ")).read_text()
    assert source.endswith(body) and source[: -len(body)].rstrip().endswith('"""'), name


def test_the_readme_fits_on_a_few_screens() -> None:
    assert len(README.read_text().splitlines()) <= 200
