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

# The contract the agent's per-GPU MPS daemons rely on (--mps-daemons per-gpu,
# crates/tessera-node/src/mps.rs): `nvidia-cuda-mps-control -f` with one GPU
# visible opens <pipe>/control, and `echo quit | nvidia-cuda-mps-control` stops it.
if command -v nvidia-cuda-mps-control >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1; then
    echo "== MPS: one control daemon for the first GPU, as the agent starts it" >&2
    uuid="$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1)"
    mps="$(mktemp -d)"
    mkdir -p "$mps/pipe" "$mps/log"
    CUDA_VISIBLE_DEVICES="$uuid" CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log" \
        nvidia-cuda-mps-control -f &
    mps_pid=$!
    for _ in $(seq 100); do [[ -e "$mps/pipe/control" ]] && break; sleep 0.1; done
    if [[ ! -e "$mps/pipe/control" ]]; then
        kill "$mps_pid" 2>/dev/null || true
        echo "FAIL: nvidia-cuda-mps-control -f opened no $mps/pipe/control in 10 s" >&2
        exit 1
    fi
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" nvidia-cuda-mps-control
    wait "$mps_pid"
    echo "OK: MPS daemon for $uuid opened its control pipe and quit" >&2
else
    echo "== MPS step skipped: nvidia-cuda-mps-control not installed" >&2
fi

echo "== XID knowledge base sample: tessera doctor 79" >&2
"$TESSERA_BIN" doctor 79
echo "OK: NVML discovery and metrics work" >&2
