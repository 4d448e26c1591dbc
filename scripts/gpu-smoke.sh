#!/usr/bin/env bash
# GPU smoke test for the Tessera node agent on a machine with a real NVIDIA GPU.
#
# Builds the agent, asks NVML what it sees, prints the discovered inventory
# (GPUs, GpuNode spec, GFD-style labels) and one /metrics scrape, and exits
# non-zero if NVML is unavailable or finds no GPU. Needs only cargo and the
# NVIDIA driver (libnvidia-ml.so.1); no Kubernetes.
#
#   scripts/gpu-smoke.sh            # build (release) and run
#   TESSERA_BIN=path scripts/gpu-smoke.sh   # use an existing binary
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ -z "${TESSERA_BIN:-}" ]]; then
    echo "== building: cargo build --release -p tessera" >&2
    cargo build --release -p tessera >&2
    target_dir="${CARGO_TARGET_DIR:-target}"
    TESSERA_BIN="$target_dir/release/tessera"
fi
[[ -x "$TESSERA_BIN" ]] || { echo "error: $TESSERA_BIN is not an executable" >&2; exit 1; }

if command -v nvidia-smi >/dev/null 2>&1; then
    echo "== nvidia-smi -L" >&2
    nvidia-smi -L >&2 || true
else
    echo "== nvidia-smi not found (continuing: NVML is what matters)" >&2
fi

echo "== tessera node-agent --backend nvml --once --print-inventory" >&2
set +e
"$TESSERA_BIN" node-agent --backend nvml --once --print-inventory --node-name "$(hostname)"
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
    echo "FAIL: the agent found no GPU through NVML (exit $rc)" >&2
    exit "$rc"
fi

echo "== XID knowledge base sample: tessera doctor 79" >&2
"$TESSERA_BIN" doctor 79
echo "OK: NVML discovery and metrics work" >&2
