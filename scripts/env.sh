# Sourced by ./run and ./test: create .venv on first use and keep it in step with pyproject.toml,
# setup.py and the modules mypyc compiles (an edited compiled module is rebuilt before it runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
compiled="$(cd "$root" && python3 -c \
    'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["pagekv"]["compiled"])')"
# shellcheck disable=SC2086  # the module list is split on purpose
stamp="$venv/.installed-$(cd "$root" && cat pyproject.toml setup.py $compiled | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    # One set-up at a time: two commands started together would both build, and one fail.
    mkdir -p "$venv"
    exec 9>"$venv/.setup.lock"
    flock 9
    if [ ! -f "$stamp" ]; then
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --upgrade pip
        "$venv/bin/pip" install --quiet -e "$root[dev]"
        # built from these sources, even where mypyc found the C unchanged and kept an older file
        find "$root/pagekv" -name '*.so' -exec touch {} +
        rm -f "$venv"/.installed-*
        touch "$stamp"
    fi
    exec 9>&-
fi
export PATH="$venv/bin:$PATH"
