//! The entries of the knowledge base ([`super::kb`]), one file per group of
//! libraries; values as in NVIDIA's headers (see the module doc of `kb`).

mod comm;
#[cfg(test)]
mod completeness;
mod cuda;
mod dnn;

use super::kb::{Code, Domain, Owner};

/// Every known code: CUDA, cuBLAS, cuDNN, NCCL, NVML (cuBLAS before cuDNN:
/// answers for a shared suffix come in this order).
pub fn codes() -> impl Iterator<Item = &'static Code> {
    [cuda::CODES, dnn::CODES, comm::CODES].into_iter().flatten()
}

// One positional constructor keeps the table readable: one entry, one block.
#[allow(clippy::too_many_arguments)]
pub(super) const fn c(
    domain: Domain,
    name: &'static str,
    aliases: &'static [&'static str],
    values: &'static [(&'static str, i64)],
    messages: &'static [&'static str],
    owner: Owner,
    cause: &'static str,
    fix: &'static str,
    check: &'static str,
) -> Code {
    Code {
        domain,
        name,
        aliases,
        values,
        messages,
        owner,
        cause,
        fix,
        check,
    }
}

pub(super) const GRANT: &str = "`tessera doctor pod NS/POD` shows the pod's grant (GPUs, memory MiB, compute share) from its tessera.io/allocation annotation and who else shares the GPU; `kubectl tessera top` shows the GPU's free memory.";
pub(super) const HEALTH: &str = "The node agent withdraws a GPU on a hardware XID and writes why into the GpuNode status; `tessera doctor pod` shows the health and recent XIDs of the pod's GPUs; `tessera doctor snapshot` collects ECC counters and the kernel's NVRM/Xid lines.";
pub(super) const DRIVER: &str = "`tessera doctor snapshot` records the driver and CUDA driver versions; the node agent labels nodes with nvidia.com/cuda.driver-version.* and nvidia.com/cuda.runtime-version.*, so a pod can select a node whose driver is new enough.";
pub(super) const VISIBLE: &str = "`tessera doctor pod` shows which GPUs the pod was granted (an empty or missing grant means the device plugin gave it none); `tessera doctor snapshot` shows whether the agent's device-plugin sockets exist on the node.";
pub(super) const MPS: &str = "Tessera's MPS isolation mounts the control daemon's pipe directory into the pod: with the node agent's --mps-daemons per-gpu (the chart's default) the agent runs one daemon per GPU set, piped at <mps-root>/<GPU UUID>/pipe, and refuses an MPS pod whose daemon does not start; `tessera doctor snapshot` lists those daemon directories and whether each has its control pipe, and whether <mps-root>/pipe and shm/ exist (default root /run/tessera/mps).";
pub(super) const APP: &str = "Nothing on the node: this is the workload's own fault. `tessera doctor pod` confirms the GPU is healthy, so the pod can be restarted on the same GPU.";
pub(super) const ARCH: &str = "`kubectl tessera top -o wide` shows each node's GPU model; the node agent labels nodes with nvidia.com/gpu.compute.major/minor, so a pod can select (or `tessera.io/gpu-model` pin) the GPUs it was built for.";
pub(super) const MIG: &str = "The node agent makes a pod's planned MIG instance (and any MIG mode switch) when the kubelet admits the pod, through NVML; a refused change fails that admission with NVML's code and what it means (`MIG on GPU …: NVML_ERROR_…: …`), which the kubelet records as a Warning event that `tessera doctor pod` reads, and leaves the GPU as it was. `tessera doctor snapshot` records each GPU's MIG capability, mode and instances; on the node, `tessera node-agent --mig-create GPU:PROFILE@START` and `--mig-destroy GPU:MIG-UUID` repeat one change by hand.";
