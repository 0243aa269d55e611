"""The documentation site: every page's code blocks run as its reader would run them
(tests/docs_reader.py; the guide and the README have tests of their own), the site builds with
MkDocs in strict mode (a broken link or anchor, or a page left out of the navigation, fails
it), and the configuration reference lists every flag of every command."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.docs_reader import ROOT, Reader, blocks, free_port

DOCS = ROOT / "docs"
OWN_TESTS = {"guide.md"}
"""Pages run by a test of their own."""
NOT_RUN = {"ARCHITECTURE.md", "FORMAT.md"}
"""Pages of the code's internals: their blocks are layouts and record formats (`text`)."""
ENV = re.compile(r"\bPAGEKV_[A-Z_]+[A-Z]\b")
READ = re.compile(r"(?<=[\"'{$])PAGEKV_[A-Z_]+[A-Z]\b")
"""A variable as code reads it: a string, or `$NAME`/`${NAME}` in a shell script (not a Python
constant that happens to start so)."""
INTERNAL = {"PAGEKV_SETUP_NOTICE_SHOWN"}
"""Set by the set-up script for its own child, never by a user."""
PAGES = sorted(p.name for p in DOCS.glob("*.md") if p.name not in OWN_TESTS | NOT_RUN)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs(page: str, tmp_path: Path) -> None:
    reader = Reader(tmp_path)
    try:
        reader.read((DOCS / page).read_text())
    finally:
        reader.stop()
    assert reader.ran or not any(b.lang != "text" for b in blocks((DOCS / page).read_text()))


def test_internal_pages_show_only_text() -> None:
    for page in NOT_RUN:
        assert all(b.lang == "text" for b in blocks((DOCS / page).read_text())), page


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict`: a warning (`mkdocs.yml`'s `validation` makes one of a link to a
    page or anchor that is not there, and of a page not in `nav`) fails it."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_configuration_reference_is_up_to_date() -> None:
    """docs/configuration.md is generated from the commands' parsers; an added or changed flag
    without the page regenerated fails here."""
    done = subprocess.run(
        [sys.executable, "scripts/cli_reference.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_every_environment_variable_is_in_the_reference() -> None:
    """Every `PAGEKV_*` variable the code, the set-up scripts and the test fixtures read."""
    sources = [
        *ROOT.glob("pagekv/**/*.py"),
        *(p for p in ROOT.glob("scripts/*") if p.name != "cli_reference.py"),
        *(ROOT / name for name in ("run", "test", "setup.py", "tests/conftest.py")),
    ]
    used = {v for path in sources if path.is_file() for v in READ.findall(path.read_text())}
    listed = set(ENV.findall((DOCS / "configuration.md").read_text()))
    assert used - INTERNAL <= listed, sorted(used - INTERNAL - listed)


def test_the_backend_factory_to_start_from_is_five_lines_and_writes_nowhere(
    tmp_path: Path,
) -> None:
    """The factory `Writing a backend` starts from, saved as the `mykv.py` it names: five lines,
    and checked as the page says without a file landing where the check runs."""
    factory = next(
        b.code for b in blocks((DOCS / "backends.md").read_text()) if b.code.startswith("# mykv.py")
    )
    assert len(factory.strip().splitlines()[1:]) <= 5, factory
    (tmp_path / "mykv.py").write_text(factory)
    done = subprocess.run(
        [sys.executable, "-m", "pagekv", "check-backend", "mykv:make_store", "--seconds", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("ok: mykv:make_store conforms"), done.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["mykv.py"]


def test_run_docs_serves_the_site(tmp_path: Path) -> None:
    """`./run docs`, as the README says: MkDocs' live server, answering the home page."""
    port = free_port()
    server = subprocess.Popen(
        ["bash", str(ROOT / "run"), "docs", "--dev-addr", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, "./run docs exited"
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "./run docs did not come up"
                time.sleep(0.2)
        assert page.status_code == 200 and "Getting started" in page.text
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) in (0, -signal.SIGINT, 130)
