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

# tessera doctor snapshot on real GPUs: the archive a bug report gets (NVML state,
# driver, kernel NVRM/Xid lines, agent and plugin state). dmesg may need root; the
# snapshot records why a part is missing instead of failing.
echo "== tessera doctor snapshot --backend nvml" >&2
snap_dir="$(mktemp -d)"
"$TESSERA_BIN" doctor snapshot --backend nvml --agent-metrics off --node-name "$(hostname)" -o "$snap_dir/snapshot.tar.gz" >&2
listing="$(tar -tzf "$snap_dir/snapshot.tar.gz")"
echo "$listing" >&2
grep -q "snapshot.json" <<<"$listing" || { echo "FAIL: the snapshot has no snapshot.json" >&2; exit 1; }
tar -xzf "$snap_dir/snapshot.tar.gz" -C "$snap_dir"
json="$(find "$snap_dir" -name snapshot.json | head -n 1)"
grep -q '"uuid": *"GPU-' "$json" || { echo "FAIL: snapshot.json names no GPU UUID" >&2; exit 1; }
grep -q '"driverVersion": *"[0-9]' "$json" || { echo "FAIL: snapshot.json has no driver version" >&2; exit 1; }
echo "OK: doctor snapshot holds the GPUs (${snap_dir}/snapshot.tar.gz)" >&2

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
# yourself; this script never switches MIG mode or resets a GPU): the agent's own
# NVML calls (crates/tessera-node/src/backend/nvml/mig.rs), as it makes them for a
# planned decision: create a GPU instance and its compute instance at a placement,
# check that NVML discovery and nvidia-smi report it, that an overlapping
# placement is refused with NVML's error, destroy it, check that it is gone.
#   TESSERA_SMOKE_MIG_GPU (index, default 0), TESSERA_SMOKE_MIG_PROFILE (default:
#   the GPU's smallest 1g profile from `nvidia-smi mig -lgip`, e.g. 1g.10gb, 1g.18gb)
if [[ "${TESSERA_SMOKE_MIG:-0}" == 1 ]]; then
    gpu="${TESSERA_SMOKE_MIG_GPU:-0}"
    mode="$(nvidia-smi -i "$gpu" --query-gpu=mig.mode.current --format=csv,noheader | tr -d ' ')"
    if [[ "$mode" != "Enabled" ]]; then
        echo "FAIL: GPU $gpu is not in MIG mode ($mode); enable it yourself (nvidia-smi -i $gpu -mig 1)" >&2
        exit 1
    fi
    profile="${TESSERA_SMOKE_MIG_PROFILE:-$(nvidia-smi mig -i "$gpu" -lgip | grep -oE 'MIG 1g\.[0-9]+gb( |$)' | head -n 1 | sed 's/MIG //; s/ //g')}"
    [[ -n "$profile" ]] || { echo "FAIL: no 1g profile in nvidia-smi mig -lgip" >&2; exit 1; }
    agent=("$TESSERA_BIN" node-agent --backend nvml --metrics-addr off)
    created="" start=""
    for s in 0 1 2 3 4 5 6; do
        echo "== MIG: tessera node-agent --mig-create $gpu:$profile@$s" >&2
        if created="$("${agent[@]}" --mig-create "$gpu:$profile@$s")"; then start="$s"; break; fi
        created=""
    done
    [[ -n "$created" ]] || { echo "FAIL: the agent created no $profile instance at any start" >&2; exit 1; }
    echo "$created" >&2
    mig_uuid="$(sed -n 's/.*"uuid": *"\(MIG-[^"]*\)".*/\1/p' <<<"$created" | head -n 1)"
    [[ -n "$mig_uuid" ]] || { echo "FAIL: no MIG UUID in the agent's answer" >&2; exit 1; }
    nvidia-smi -L | grep -q "$mig_uuid" || { echo "FAIL: nvidia-smi -L does not list $mig_uuid" >&2; exit 1; }
    inventory="$("${agent[@]}" --once --print-inventory --node-name "$(hostname)")"
    grep -q "$mig_uuid" <<<"$inventory" || { echo "FAIL: the agent's discovery does not report $mig_uuid" >&2; exit 1; }
    grep -q "\"start\": $start" <<<"$inventory" || { echo "FAIL: discovery does not report start $start" >&2; exit 1; }
    if refusal="$("${agent[@]}" --mig-create "$gpu:$profile@$start" 2>&1 >/dev/null)"; then
        echo "FAIL: a second $profile at start $start (overlapping) was accepted" >&2
        exit 1
    fi
    echo "== MIG: the overlapping placement was refused: $refusal" >&2
    echo "== MIG: tessera node-agent --mig-destroy $gpu:$mig_uuid" >&2
    "${agent[@]}" --mig-destroy "$gpu:$mig_uuid" >&2
    if nvidia-smi -L | grep -q "$mig_uuid"; then
        echo "FAIL: $mig_uuid is still listed after destroy" >&2
        exit 1
    fi
    echo "OK: MIG $profile at memory slice $start created, discovered, an overlap refused, destroyed by the agent's NVML calls" >&2
fi
