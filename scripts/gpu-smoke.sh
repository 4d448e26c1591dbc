#!/usr/bin/env bash
# GPU smoke test for the Tessera node agent on a machine with a real NVIDIA GPU.
#
# Builds the agent, asks NVML what it sees, prints the discovered inventory
# (GPUs, GpuNode spec, GFD-style labels) and one /metrics scrape, and exits
# non-zero if NVML is unavailable or finds no GPU. Needs only cargo and the
# NVIDIA driver (libnvidia-ml.so.1); no Kubernetes.
#
#   scripts/gpu-smoke.sh            # build (release) and run
#   TESSERA_SMOKE_MIG=1 scripts/gpu-smoke.sh   # also a MIG create/discover/destroy step (see below)
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

# MIG (opt-in: TESSERA_SMOKE_MIG=1, as root, on a GPU you have put in MIG mode
# yourself; this script never switches MIG mode or resets a GPU): create one GPU
# instance and its compute instance, check that the agent's NVML discovery
# reports it, destroy it, and check that it is gone.
#   TESSERA_SMOKE_MIG_GPU (default 0), TESSERA_SMOKE_MIG_PROFILE (GPU instance
#   profile ID, default 19: the 1-slice profile of A100/H100/H200; 14 on an A30)
if [[ "${TESSERA_SMOKE_MIG:-0}" == 1 ]]; then
    gpu="${TESSERA_SMOKE_MIG_GPU:-0}"
    profile="${TESSERA_SMOKE_MIG_PROFILE:-19}"
    mode="$(nvidia-smi -i "$gpu" --query-gpu=mig.mode.current --format=csv,noheader | tr -d ' ')"
    if [[ "$mode" != "Enabled" ]]; then
        echo "FAIL: GPU $gpu is not in MIG mode ($mode); enable it yourself (nvidia-smi -i $gpu -mig 1)" >&2
        exit 1
    fi
    echo "== MIG: nvidia-smi mig -i $gpu -cgi $profile -C" >&2
    created="$(nvidia-smi mig -i "$gpu" -cgi "$profile" -C)"
    echo "$created" >&2
    gi="$(sed -n 's/.*created GPU instance ID *\([0-9][0-9]*\).*/\1/p' <<<"$created" | head -n 1)"
    if [[ -z "$gi" ]]; then
        echo "FAIL: no GPU instance ID in nvidia-smi's answer" >&2
        exit 1
    fi
    inventory="$("$TESSERA_BIN" node-agent --backend nvml --once --print-inventory --node-name "$(hostname)")"
    count_with="$(grep -c 'MIG-' <<<"$inventory" || true)"
    echo "== MIG: the agent sees $count_with MIG device line(s) with instance $gi created" >&2
    nvidia-smi mig -i "$gpu" -gi "$gi" -dci >&2
    nvidia-smi mig -i "$gpu" -gi "$gi" -dgi >&2
    inventory="$("$TESSERA_BIN" node-agent --backend nvml --once --print-inventory --node-name "$(hostname)")"
    count_without="$(grep -c 'MIG-' <<<"$inventory" || true)"
    if (( count_with <= count_without )); then
        echo "FAIL: the agent's inventory did not change with the instance ($count_with vs $count_without MIG lines)" >&2
        exit 1
    fi
    echo "OK: MIG instance $gi created, discovered by the agent, destroyed" >&2
fi

echo "== XID knowledge base sample: tessera doctor 79" >&2
"$TESSERA_BIN" doctor 79
echo "OK: NVML discovery and metrics work" >&2
