# Sourced by ./run and ./test: create .venv on first use and keep it in step with pyproject.toml,
# setup.py and the modules mypyc compiles (an edited compiled module is rebuilt before it runs).
#
# Compiled or interpreted (setup.py): PAGEKV_PURE_PYTHON=1 installs interpreted, 0 compiled, and
# unset or empty keeps the choice the installed pagekv was built with (from its build record, so a
# `PAGEKV_PURE_PYTHON=1 pip install -e .` counts too); with none, compiled where the C compiler
# builds an extension with the Python headers, else interpreted.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
compiled="$(cd "$root" && python3 -c \
    'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["pagekv"]["compiled"])')"
pure="${PAGEKV_PURE_PYTHON:-}"
if [ -z "$pure" ]; then
    pure="$({ sed -n 's/.*"choice": "\([01]\)".*/\1/p' \
        "$venv"/lib/python3*/site-packages/pagekv-*.dist-info/pagekv-build.json 2>/dev/null \
        || true; } | head -n1)"
fi
# shellcheck disable=SC2086  # the module list is split on purpose
stamp="$venv/.installed-$(cd "$root" && { cat pyproject.toml setup.py $compiled; echo "pure=$pure"; } \
    | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    # One set-up at a time: two commands started together would both build, and one fail.
    mkdir -p "$venv"
    exec 9>"$venv/.setup.lock"
    flock 9
    if [ ! -f "$stamp" ]; then
        # One line before the build (or why it will not compile).
        (cd "$root" && PAGEKV_PURE_PYTHON="$pure" python3 -c \
            'import runpy; print(runpy.run_path("setup.py")["setup_notice"]())') >&2
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --upgrade pip
        # pip's verbose output, shown as a line per step of the build (scripts/setup_progress.py)
        # shellcheck disable=SC2086
        PAGEKV_PURE_PYTHON="$pure" PAGEKV_SETUP_NOTICE_SHOWN=1 python3 \
            "$root/scripts/setup_progress.py" "$(echo $compiled | wc -w)" \
            "$venv/bin/pip" install -v -e "$root[dev]"
        # built from these sources, even where mypyc found the C unchanged and kept an older file;
        # one whose source moved or went would still be imported by its old name, so it goes
        find "$root/pagekv" -name '*.so' -exec touch {} +
        for so in $(find "$root/pagekv" -name '*.so'); do
            [ -f "${so%%.cpython*}.py" ] || rm -f "$so"
        done
        rm -f "$venv"/.installed-*
        touch "$stamp"
    fi
    exec 9>&-
fi
export PATH="$venv/bin:$PATH"
