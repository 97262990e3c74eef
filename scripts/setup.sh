#!/usr/bin/env bash
# Set up the development environment in .venv: the CPU build of torch first (so that the project's
# plain `torch` requirement is already met and no CUDA build is pulled), then dsconf in editable mode
# with its dev extras (DeepSpeed 0.19.8, pytest, ruff, submitit, the build backend).
#
#   bash scripts/setup.sh                  # .venv only
#   bash scripts/setup.sh --with-ds0195    # also .venv-ds0195: torch + DeepSpeed 0.19.5, no dsconf
#                                          # (same as DSCONF_WITH_DS0195=1)
#
# Idempotent: a second run with an unchanged pyproject.toml and this script skips the installs.
# Environment: PYTHON (interpreter for the venvs; default python3.11, else python3),
#              DSCONF_TORCH (torch requirement; default torch==2.13.0).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

with_ds0195="${DSCONF_WITH_DS0195:-0}"
for arg in "$@"; do
    case "$arg" in
        --with-ds0195) with_ds0195=1 ;;
        -h | --help)
            sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "setup.sh: unknown argument: $arg" >&2
            exit 2
            ;;
    esac
done

torch_req="${DSCONF_TORCH:-torch==2.13.0}"
ds0195_req="deepspeed==0.19.5"

if [[ -z "${PYTHON:-}" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
    echo "setup.sh: $PYTHON is older than Python 3.9" >&2
    exit 1
}

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { echo "[setup] $*"; }

# make_venv DIR: create DIR with $PYTHON unless it already holds a working interpreter.
make_venv() {
    local dir="$1"
    if [[ -x "$dir/bin/python" ]] && "$dir/bin/python" -c 'import pip' >/dev/null 2>&1; then
        return 0
    fi
    log "creating $dir with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv --clear "$dir"
}

# stamp_of ...: a digest of what an environment was built from.
stamp_of() {
    { printf '%s\n' "$@"; "$PYTHON" --version 2>&1; } | sha256sum | cut -d' ' -f1
}

# has_modules DIR MODULE...: DIR's interpreter finds every MODULE (a cheap check: nothing is imported).
has_modules() {
    local dir="$1"
    shift
    "$dir/bin/python" - "$@" >/dev/null 2>&1 <<'PY'
import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))
PY
}

# --- .venv: dsconf (editable) + dev extras -------------------------------------------------------
main_stamp="$(stamp_of "$torch_req" "$(cat pyproject.toml scripts/setup.sh)")"
if [[ -f .venv/.dsconf-setup-stamp && "$(cat .venv/.dsconf-setup-stamp)" == "$main_stamp" ]] &&
    has_modules .venv dsconf torch deepspeed hydra omegaconf pytest hatchling; then
    log ".venv is up to date"
else
    make_venv .venv
    log "installing $torch_req into .venv"
    .venv/bin/python -m pip install "$torch_req"
    log "installing dsconf (editable) with dev extras into .venv"
    # torch is named again so the resolver keeps the build installed above.
    .venv/bin/python -m pip install "$torch_req" -e '.[dev]'
    echo "$main_stamp" >.venv/.dsconf-setup-stamp
fi

# Build DeepSpeed's CPU ops once here (about 2 minutes on a fresh machine; cached afterwards), so that
# neither the tests nor the example look hung while they compile.
log "building DeepSpeed's CPU ops once (about 2 minutes on first use, seconds afterwards)"
DS_ACCELERATOR=cpu .venv/bin/python examples/warmup.py

# --- Chromium: tests/launch/test_report.py renders `dsconf report`'s page in it, headless ------------
# Only where apt-get exists and Chromium is missing (Debian's package; CI runs this as root on a fresh
# machine). Elsewhere, or if the install fails, that test skips and says why: setup goes on.
as_root() { if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    log "installing chromium with apt-get (for the report's browser test)"
    if ! { as_root apt-get update -q && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; then
        log "could not install chromium: the browser tests (tests/launch/test_report.py, tests/tune/) will skip"
    fi
fi

# --- .venv-ds0195: torch + DeepSpeed 0.19.5 only, for comparisons against the older DeepSpeed -----
if [[ "$with_ds0195" == 1 ]]; then
    ds_stamp="$(stamp_of "$torch_req" "$ds0195_req")"
    if [[ -f .venv-ds0195/.dsconf-setup-stamp && "$(cat .venv-ds0195/.dsconf-setup-stamp)" == "$ds_stamp" ]] &&
        has_modules .venv-ds0195 torch deepspeed; then
        log ".venv-ds0195 is up to date"
    else
        make_venv .venv-ds0195
        log "installing $torch_req into .venv-ds0195"
        .venv-ds0195/bin/python -m pip install "$torch_req"
        log "installing $ds0195_req into .venv-ds0195"
        .venv-ds0195/bin/python -m pip install "$torch_req" "$ds0195_req"
        echo "$ds_stamp" >.venv-ds0195/.dsconf-setup-stamp
    fi
fi

log "done"
