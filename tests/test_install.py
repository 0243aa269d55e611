"""Installing pagekv compiled or interpreted: setup.py's choice (a C compiler and the Python
headers, or `PAGEKV_PURE_PYTHON`), the build record it leaves in the install's metadata, what
`pagekv --version` says of it, ./run and ./test keeping to the choice (scripts/env.sh), and
`pagekv.testing` without hypothesis."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

import pytest

import pagekv
from pagekv import BuildInfo, is_extension

ROOT = Path(__file__).resolve().parent.parent


def _load_setup() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pagekv_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)  # not `main()`: that runs only as a script
    return module


setup_py = _load_setup()
SOURCES: list[str] = setup_py.compiled_sources()
MODULES = [setup_py.module_name(s) for s in SOURCES]


# -- setup.py: can this machine compile? --------------------------------------------------------


def test_a_missing_compiler_is_named() -> None:
    seen: list[str] = []

    def which(program: str) -> str | None:
        seen.append(program)
        return None

    problem = setup_py.compiler_problem({"CC": "/nonexistent"}, which, lambda _: True)
    assert problem == "no C compiler (/nonexistent not found)"
    # a wrapper or flags in CC: the program is its first word
    assert setup_py.compiler_problem({"CC": "ccache gcc -O2"}, which, lambda _: True)
    assert seen[-1] == "ccache"


def test_without_cc_the_compiler_python_was_built_with_is_looked_for() -> None:
    seen: list[str] = []

    def which(program: str) -> str | None:
        seen.append(program)
        return f"/usr/bin/{program}"

    def probe(compiler: list[str], include: str) -> None:
        probed.append((compiler, include))

    probed: list[tuple[list[str], str]] = []
    assert setup_py.compiler_problem({}, which, lambda _: True, probe) is None
    built_with = sysconfig.get_config_var("CC") or "cc"
    assert seen == [built_with.split()[0]]
    # the one found is made to compile, with its flags, against this Python's headers
    assert probed == [(built_with.split(), sysconfig.get_paths()["include"])]


def test_missing_python_headers_are_named() -> None:
    looked: list[str] = []

    def exists(path: str) -> bool:
        looked.append(path)
        return False

    problem = setup_py.compiler_problem({"CC": "gcc"}, lambda p: f"/usr/bin/{p}", exists)
    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    assert looked == [header]
    assert problem == f"no Python headers ({header} not found)"


def _failing_gcc(tmp_path: Path) -> Path:
    """A `gcc` that is found and exits 1, as one without the Python headers or with a broken
    toolchain does."""
    bin_dir = tmp_path / "failing-cc"
    bin_dir.mkdir()
    gcc = bin_dir / "gcc"
    gcc.write_text("#!/bin/sh\necho 'gcc: fatal error: cannot execute cc1' >&2\nexit 1\n")
    gcc.chmod(0o755)
    return gcc


def test_a_compiler_that_is_found_but_fails_is_named(tmp_path: Path) -> None:
    gcc = _failing_gcc(tmp_path)
    problem = setup_py.compiler_problem({"CC": f"{gcc} -pthread"})
    assert problem == (
        f"a failing C compiler ({gcc} -pthread exited with 1 on a test file that includes "
        "Python.h: gcc: fatal error: cannot execute cc1)"
    )
    # the real compiler, shown a directory without Python.h, fails on the include
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    if shutil.which(cc[0]) is None:
        pytest.skip(f"no {cc[0]} on this machine")
    problem = setup_py.probe_problem(cc, str(tmp_path))
    assert problem is not None and "Python.h" in problem.partition("includes Python.h")[2]
    assert setup_py.probe_problem(["/nonexistent/cc"], str(tmp_path)) == (
        "a failing C compiler (/nonexistent/cc could not be run: No such file or directory)"
    )


def test_the_plan_follows_pagekv_pure_python_and_the_compiler() -> None:
    def missing() -> str:
        return "no C compiler (gcc not found)"

    def found() -> None:
        return None

    assert setup_py.plan({}, found) == setup_py.Plan("", True)
    assert setup_py.plan({"PAGEKV_PURE_PYTHON": "0"}, found) == setup_py.Plan("0", True)

    fallback = setup_py.plan({}, missing)  # goes on interpreted, and says how to compile
    assert (fallback.choice, fallback.compile) == ("", False)
    assert fallback.interpreted is not None
    assert fallback.interpreted.startswith("no C compiler (gcc not found) at install; ")
    assert "apt-get install -y gcc python3-dev" in fallback.interpreted

    def never() -> str:
        raise AssertionError("PAGEKV_PURE_PYTHON=1 needs no compiler check")

    pure = setup_py.plan({"PAGEKV_PURE_PYTHON": "1"}, never)
    assert (pure.choice, pure.compile) == ("1", False)
    assert pure.interpreted is not None and "PAGEKV_PURE_PYTHON=1 at install" in pure.interpreted

    with pytest.raises(SystemExit, match=r"PAGEKV_PURE_PYTHON=0 asks .* no C compiler"):
        setup_py.plan({"PAGEKV_PURE_PYTHON": "0"}, missing)
    with pytest.raises(SystemExit, match="1, 0 or unset, not 'yes'"):
        setup_py.plan({"PAGEKV_PURE_PYTHON": "yes"}, found)


def test_the_setup_line_says_what_the_build_will_do() -> None:
    assert setup_py.setup_notice({}, lambda: None) == (
        f"setting up .venv (compiling {len(SOURCES)} modules with mypyc, ~2 min; "
        "PAGEKV_PURE_PYTHON=1 skips it)"
    )
    line = setup_py.setup_notice({}, lambda: "no C compiler (gcc not found)")
    assert line.startswith("setting up .venv, interpreted: no C compiler (gcc not found) at ")
    line = setup_py.setup_notice({"PAGEKV_PURE_PYTHON": "1"})
    assert line.startswith("setting up .venv, interpreted: PAGEKV_PURE_PYTHON=1 at install")


def test_built_files_are_the_ones_this_python_would_import(tmp_path: Path) -> None:
    suffix = EXTENSION_SUFFIXES[0]
    (tmp_path / "pagekv/vfs").mkdir(parents=True)
    pages = tmp_path / f"pagekv/vfs/page_store{suffix}"
    shared = tmp_path / f"0123abcd__mypyc{suffix}"
    other = tmp_path / "pagekv/vfs/page_store.cpython-39-x86_64-linux-gnu.so"  # another Python's
    for path in (pages, shared, other, tmp_path / "pagekv/vfs/page_store.py"):
        path.write_bytes(b"")
    assert sorted(setup_py.built_files(["pagekv/vfs/page_store.py"], tmp_path)) == sorted(
        [pages, shared]
    )


def test_the_build_record_lands_in_the_metadata(tmp_path: Path) -> None:
    """`setup.py egg_info` (which becomes the install's dist-info) writes the build record; an
    interpreted one never imports mypyc."""
    pytest.importorskip("setuptools")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "pagekv", tmp_path / "pagekv", ignore=shutil.ignore_patterns("*.so"))
    env = {**os.environ, "PAGEKV_PURE_PYTHON": "1"}
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "pagekv.egg-info" / "pagekv-build.json").read_text())
    assert record["choice"] == "1" and record["compiled"] is False
    assert record["modules"] == MODULES
    assert record["interpreted"].startswith("PAGEKV_PURE_PYTHON=1 at install")


def test_pip_install_with_a_failing_compiler_installs_interpreted(tmp_path: Path) -> None:
    """A real `pip install` (offline: with this environment's setuptools and mypy) with a `gcc`
    on PATH that exits 1: it installs interpreted and says why in one line, where it failed
    after a minute inside setuptools before; `PAGEKV_PURE_PYTHON=0` fails naming it."""
    if (sysconfig.get_config_var("CC") or "cc").split()[0] != "gcc":
        pytest.skip("this Python was not built with gcc")
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    ignore = shutil.ignore_patterns("*.so", "__pycache__")
    shutil.copytree(ROOT / "pagekv", tree / "pagekv", ignore=ignore)
    base = {k: v for k, v in os.environ.items() if not k.startswith("PAGEKV_")}
    env = {**base, "PATH": f"{_failing_gcc(tmp_path).parent}:{os.environ['PATH']}"}
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--no-index"]
    pip.append("--no-build-isolation")
    target = tmp_path / "target"
    done = subprocess.run(
        [*pip, "--target", str(target), str(tree)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    why = (
        "a failing C compiler (gcc exited with 1 on a test file that includes Python.h: "
        "gcc: fatal error: cannot execute cc1) at install"
    )
    said = [line for line in (done.stdout + done.stderr).splitlines() if "interpreted" in line]
    assert len(said) == 1 and f"pagekv runs interpreted: {why}; " in said[0], said
    (dist,) = target.glob("pagekv-*.dist-info")
    record = json.loads((dist / "pagekv-build.json").read_text())
    assert (record["compiled"], record["interpreted"]) == (
        False,
        f"{why}; {setup_py.HOW_TO_COMPILE}",
    )
    assert not [p.name for p in target.rglob("*.so")]

    env["PAGEKV_PURE_PYTHON"] = "0"
    failed = subprocess.run(
        [*pip, "--target", str(tmp_path / "compiled"), str(tree)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert failed.returncode != 0
    assert "PAGEKV_PURE_PYTHON=0 asks for the compiled build, but a failing C compiler (gcc " in (
        failed.stdout + failed.stderr
    )
    assert not (tmp_path / "compiled").exists()


# -- pagekv: what runs compiled ------------------------------------------------------------------


def test_is_extension_goes_by_the_file_the_import_system_picks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / f"pagekv_fake_ext{EXTENSION_SUFFIXES[0]}").write_bytes(b"not loaded")
    (tmp_path / "pagekv_fake_src.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert is_extension("pagekv_fake_ext")
    assert not is_extension("pagekv_fake_src")
    assert not is_extension("pagekv.cli")  # never compiled
    assert not is_extension("pagekv_no_such_module")


def test_the_description_of_each_build() -> None:
    mods = ("pagekv.a", "pagekv.b")
    assert BuildInfo(mods, mods, None).describe() == "compiled: 2 modules"
    assert BuildInfo(mods, mods, None).is_compiled
    partly = BuildInfo(mods, mods[:1], None)
    assert not partly.is_compiled
    assert partly.describe() == "partly compiled: 1 of 2 modules, not pagekv.b; reinstall"
    why = "no C compiler (gcc not found) at install; for the compiled build, ..."
    assert BuildInfo(mods, (), why).describe() == f"interpreted: {why}"
    assert "not in use" in BuildInfo(mods, (), None).describe()  # compiled, then lost
    assert "no build record" in BuildInfo((), (), None, recorded=False).describe()
    assert BuildInfo(mods, mods, None, recorded=False).describe() == "compiled: 2 modules"


def test_build_info_reads_the_record_and_checks_each_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib import metadata

    class Dist:
        def read_text(self, name: str) -> str | None:
            assert name == "pagekv-build.json"
            record = {"choice": "", "modules": ["pagekv.cli"], "compiled": True}
            return json.dumps({**record, "interpreted": None})

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist())
    info = pagekv.build_info.__wrapped__()
    assert info == BuildInfo(("pagekv.cli",), (), None)  # pagekv.cli imports from source

    # an install from before the record: pyproject's list, checked the same way
    monkeypatch.setattr(Dist, "read_text", lambda self, name: None)
    info = pagekv.build_info.__wrapped__()
    assert (info.modules, info.recorded) == (tuple(MODULES), False)
    assert info.compiled == tuple(m for m in MODULES if is_extension(m))


def test_version_says_whether_the_compiled_modules_are_in_use() -> None:
    """The real `pagekv --version`, checked against what this process imports: the two agree,
    and the count is that of pyproject's list."""
    script = Path(sys.executable).with_name("pagekv")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "pagekv"]
    done = subprocess.run([*command, "--version"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    line = done.stdout
    assert re.fullmatch(r"pagekv \S+ \((compiled: \d+ modules|interpreted: .+)\)\n", line), line
    compiled = all(is_extension(m) for m in MODULES)
    assert pagekv.COMPILED is compiled
    if compiled:
        assert line == f"pagekv {pagekv.__version__} (compiled: {len(MODULES)} modules)\n"
    else:
        assert line.startswith(f"pagekv {pagekv.__version__} (interpreted: "), line


# -- ./run and ./test keep to the choice ---------------------------------------------------------


def _fake_tree(tmp_path: Path) -> Path:
    """The files env.sh reads, and a .venv whose pip only logs its calls (and leaves a build
    record with the choice it was given, as setup.py does)."""
    tree = tmp_path / "tree"
    for name in ("setup.py", "pyproject.toml", "scripts/env.sh", "scripts/setup_progress.py"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tree / name)
    for name in SOURCES:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tree / name)
    bin_dir = tree / ".venv/bin"
    bin_dir.mkdir(parents=True)
    record_dir = tree / ".venv/lib/python3.11/site-packages/pagekv-0.1.0.dist-info"
    pip = textwrap.dedent(
        f"""\
        #!/bin/sh
        echo "PAGEKV_PURE_PYTHON=${{PAGEKV_PURE_PYTHON-unset}} $*" >> "{tree}/pip.log"
        case "$*" in *" -e "*)
            mkdir -p "{record_dir}"
            echo '{{"choice": "'"$PAGEKV_PURE_PYTHON"'", "modules": []}}' \\
                > "{record_dir}/pagekv-build.json"
            if [ -f "{tree}/pip.out" ]; then cat "{tree}/pip.out"; exit "$(cat {tree}/pip.rc)"; fi;;
        esac
        """
    )
    for name, text in (("pip", pip), ("python", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return tree


def _source_env(tree: Path, **env: str) -> tuple[str, list[str]]:
    base = {k: v for k, v in os.environ.items() if k != "PAGEKV_PURE_PYTHON"}
    done = subprocess.run(
        ["bash", "-c", f"source {tree}/scripts/env.sh"],
        env={**base, **env},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    log = tree / "pip.log"
    return done.stderr, log.read_text().splitlines() if log.exists() else []


def test_run_and_test_keep_to_the_choice_made(tmp_path: Path) -> None:
    tree = _fake_tree(tmp_path)
    err, calls = _source_env(tree, PAGEKV_PURE_PYTHON="1")
    assert err.startswith("setting up .venv, interpreted: PAGEKV_PURE_PYTHON=1 at install"), err
    assert len(err.splitlines()) == 1, err
    assert calls[-1].startswith("PAGEKV_PURE_PYTHON=1 install -v -e "), calls

    # unset: nothing to redo, and after an edit to a compiled module it reinstalls interpreted
    assert _source_env(tree) == ("", calls)
    with open(tree / SOURCES[0], "a") as f:
        f.write("# edited\n")
    err, again = _source_env(tree)
    assert "interpreted: PAGEKV_PURE_PYTHON=1" in err
    assert again[len(calls) :][-1].startswith("PAGEKV_PURE_PYTHON=1 install -v -e "), again
    assert _source_env(tree) == ("", again)


def test_a_failing_compiler_sets_up_interpreted_or_fails_in_one_line(tmp_path: Path) -> None:
    """The `gcc` this Python was built with is found on PATH but exits 1: unset goes on
    interpreted with the same one line as a missing compiler, naming what failed; `0` stops with
    one line before anything is installed."""
    if (sysconfig.get_config_var("CC") or "cc").split()[0] != "gcc":
        pytest.skip("this Python was not built with gcc")
    tree = _fake_tree(tmp_path)
    path = f"{_failing_gcc(tmp_path).parent}:{os.environ['PATH']}"
    err, calls = _source_env(tree, PATH=path)
    assert err == (
        "setting up .venv, interpreted: a failing C compiler (gcc exited with 1 on a test file "
        "that includes Python.h: gcc: fatal error: cannot execute cc1) at install; "
        f"{setup_py.HOW_TO_COMPILE}\n"
    )
    assert calls[-1].startswith("PAGEKV_PURE_PYTHON= install -v -e "), calls

    base = {k: v for k, v in os.environ.items() if k != "PAGEKV_PURE_PYTHON"}
    tree = _fake_tree(tmp_path / "again")
    done = subprocess.run(
        ["bash", "-c", f"source {tree}/scripts/env.sh"],
        env={**base, "PATH": path, "PAGEKV_PURE_PYTHON": "0"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr == (
        "pagekv: PAGEKV_PURE_PYTHON=0 asks for the compiled build, but a failing C compiler "
        "(gcc exited with 1 on a test file that includes Python.h: gcc: fatal error: cannot "
        "execute cc1): apt-get install -y gcc python3-dev (Debian), or set PAGEKV_PURE_PYTHON=1\n"
    )
    assert not (tree / "pip.log").exists()


_COMPILED_BUILD = """\
Using pip 26.3 from /x/.venv/lib/python3.11/site-packages/pip (python 3.11)
Obtaining file:///x
  Installing build dependencies: started
  Running command installing build dependencies
  Collecting setuptools>=68
  Installing collected packages: setuptools, mypy
  Successfully installed mypy-2.4.1 setuptools-84.2.1
  Installing build dependencies: finished with status 'done'
  Checking if build backend supports build_editable: started
  Getting requirements to build editable: started
  Running command Getting requirements to build editable
  pagekv: mypyc: type-checking the compiled modules and generating their C
  pagekv/kv/wrappers.py:302: warning: Treating generator comprehension as list
  running egg_info
  Getting requirements to build editable: finished with status 'done'
  Preparing editable metadata (pyproject.toml): started
  Running command Preparing editable metadata (pyproject.toml)
  running dist_info
Collecting apsw>=3.45 (from pagekv==0.1.0)
Building wheels for collected packages: pagekv
  Building editable for pagekv (pyproject.toml): started
  Running command Building editable for pagekv (pyproject.toml)
  running editable_wheel
  running build_ext
  building '9f831d1ac9959bf24f0e__mypyc' extension
  gcc -Wsign-compare -DNDEBUG -g -fwrapv -O3 -Wall -fPIC -Ibuild -c build/__native.c
  gcc -shared build/temp/build/__native.o -o build/9f831d1ac9959bf24f0e__mypyc.so
  building 'pagekv.kv.fence' extension
  gcc -Wsign-compare -DNDEBUG -g -fwrapv -O3 -Wall -fPIC -c build/pagekv/kv/fence.c
  building 'pagekv.kv.memory' extension
  gcc -Wsign-compare -DNDEBUG -g -fwrapv -O3 -Wall -fPIC -c build/pagekv/kv/memory.c
  Building editable for pagekv (pyproject.toml): finished with status 'done'
Successfully built pagekv
Installing collected packages: apsw, pagekv
Successfully installed apsw-3.50.0 pagekv-0.1.0
"""


def _steps(err: str) -> list[str]:
    return [re.sub(r"^  \[ *\d+ s\] ", "", line) for line in err.splitlines()[1:]]


def test_the_first_set_up_shows_a_line_per_step_of_the_build(tmp_path: Path) -> None:
    """pip's verbose output of a compiled build becomes a line per step, in order, and none of
    its compiler command lines; an interpreted build's shows nothing beyond the first line."""
    tree = _fake_tree(tmp_path)
    (tree / "pip.out").write_text(_COMPILED_BUILD)
    (tree / "pip.rc").write_text("0")
    err, calls = _source_env(tree, PAGEKV_PURE_PYTHON="0")
    assert err.startswith("setting up .venv (compiling "), err
    n = len(SOURCES)
    assert _steps(err) == [
        f"mypy and mypyc: type-checking {n} modules and generating their C",
        f"gcc: compiling the C of the {n} modules (the longest step)",
        f"gcc: building the {n} modules' own files",
        "installing pagekv and its dependencies",
    ], err
    assert calls[-1].startswith("PAGEKV_PURE_PYTHON=0 install -v -e "), calls

    interpreted = _COMPILED_BUILD.split("  running build_ext")[0] + "Successfully built pagekv\n"
    (tree / "pip.out").write_text(interpreted.replace(setup_py.MYPYC_STEP, "running egg_info"))
    err, _ = _source_env(tree, PAGEKV_PURE_PYTHON="1")
    assert err.startswith("setting up .venv, interpreted: "), err
    assert len(err.splitlines()) == 1, err


def test_a_failing_set_up_shows_pips_output_of_the_failing_step(tmp_path: Path) -> None:
    tree = _fake_tree(tmp_path)
    failing = _COMPILED_BUILD.split("  building 'pagekv.kv.fence'")[0] + (
        "  build/__native.c:1:10: fatal error: out of memory\n"
        "  error: command '/usr/bin/gcc' failed with exit code 1\n"
        "error: subprocess-exited-with-error\n"
    )
    (tree / "pip.out").write_text(failing)
    (tree / "pip.rc").write_text("1")
    base = {k: v for k, v in os.environ.items() if k != "PAGEKV_PURE_PYTHON"}
    done = subprocess.run(
        ["bash", "-c", f"source {tree}/scripts/env.sh"],
        env={**base, "PAGEKV_PURE_PYTHON": "0"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    shown = done.stderr.split("(the longest step)\n", 1)[1]
    assert shown == failing.split("  Running command ")[-1].join(["  Running command ", ""])
    assert not list((tree / ".venv").glob(".installed-*"))  # set up again next time


def test_a_long_step_is_seen_going_on(tmp_path: Path) -> None:
    """A step with no new line for `tick` seconds gets a line saying which step, and how long."""
    spec = importlib.util.spec_from_file_location(
        "setup_progress", ROOT / "scripts/setup_progress.py"
    )
    assert spec is not None and spec.loader is not None
    progress = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(progress)
    script = f"echo '  {setup_py.MYPYC_STEP}'; sleep 1; exit 3"
    out = io.StringIO()
    assert progress.run(["sh", "-c", script], out, 5, tick=0.1) == 3
    first, *ticks, failed = out.getvalue().splitlines()
    assert first.endswith("] mypy and mypyc: type-checking 5 modules and generating their C")
    assert ticks and all(
        re.fullmatch(r"  \.\.\. mypy and mypyc: .* their C, \d+ s \(\d+ s in all\)", t)
        for t in ticks
    ), ticks
    assert failed == f"  {setup_py.MYPYC_STEP}"  # pip's output of the step, as it failed


# -- pagekv.testing without hypothesis -----------------------------------------------------------


def test_pagekv_testing_without_hypothesis_says_which_extra_installs_it() -> None:
    script = textwrap.dedent(
        """\
        import sys

        class NoHypothesis:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "hypothesis":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoHypothesis())
        for name in [m for m in sys.modules if m.partition(".")[0] == "hypothesis"]:
            del sys.modules[name]
        import pagekv.testing  # check_backend and the clauses need neither hypothesis nor pytest

        assert callable(pagekv.testing.check_backend)
        try:
            from pagekv.testing import machine
        except ModuleNotFoundError as e:
            print(e.name)
            print(e)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    name, message = done.stdout.splitlines()
    assert name == "hypothesis"
    assert message == (
        "pagekv.testing needs hypothesis, which pagekv's testing extra installs: "
        "pip install 'pagekv[testing]'"
    )


def test_the_testing_extra_installs_hypothesis() -> None:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert any(r.startswith("hypothesis") for r in extras["testing"]), extras


_CONSUMERS = {
    "all",
    "any",
    "bytes",
    "dict",
    "frozenset",
    "list",
    "max",
    "min",
    "set",
    "sorted",
    "sum",
    "tuple",
}
_CONSUMING_METHODS = {"executemany", "extend", "fromkeys", "join", "update"}


def test_compiled_modules_use_no_generator_expression_lazily() -> None:
    """mypyc compiles a generator expression as a list comprehension: one that is consumed
    lazily (`next`, `islice`, a merge, a variable) reads everything at once in the compiled
    build, as the `file:` store's `list` once did. Only a whole consumer may take one."""
    lazy = []
    for source in SOURCES:
        tree = ast.parse((ROOT / source).read_text())
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                if not isinstance(child, ast.GeneratorExp):
                    continue
                func = node.func if isinstance(node, ast.Call) else None
                name = (
                    func.id
                    if isinstance(func, ast.Name)
                    else func.attr
                    if isinstance(func, ast.Attribute)
                    else None
                )
                if name in _CONSUMERS or name in _CONSUMING_METHODS:
                    continue
                if isinstance(node, ast.Starred):
                    continue
                lazy.append(f"{source}:{child.lineno}")
    assert not lazy, f"generator expressions a compiled build evaluates eagerly: {lazy}"
