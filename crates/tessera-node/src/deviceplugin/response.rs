//! One container's `Allocate` answer from its GPUs in a verified decision. Pure.
//!
//! The devices are the decision's (GPU UUIDs, or MIG instance UUIDs), not the
//! tokens the kubelet picked; they are handed over by the configured
//! [`DeviceList`](super::handover::DeviceList) strategies, and the share
//! settings (MPS limits, time-slice memory budget) follow the isolation mode.

use tessera_core::allocation::{AllocatedGpu, Allocation};
use tessera_core::request::Isolation;

use super::allocate::{AllocateError, Handover};
use super::{NodeView, Resource};
use crate::backend::GpuInfo;
use crate::proto::deviceplugin as pb;

pub(super) fn find_gpu<'a>(
    pod: &str,
    g: &AllocatedGpu,
    view: &'a NodeView,
) -> Result<&'a GpuInfo, AllocateError> {
    let gpu = view.grant_gpu(g).ok_or_else(|| AllocateError::UnknownGpu {
        pod: pod.to_string(),
        gpu: if g.uuid.is_empty() {
            format!("index {}", g.index)
        } else {
            g.uuid.clone()
        },
    })?;
    if let Some(crate::health::GpuHealth::Unhealthy { reason, .. }) = view.health.get(&gpu.uuid) {
        return Err(AllocateError::UnhealthyGpu {
            pod: pod.to_string(),
            gpu: gpu.uuid.clone(),
            reason: reason.clone(),
        });
    }
    Ok(gpu)
}

/// The UUID of the MIG instance a grant names: by UUID when the decision has
/// one (and then it must be the instance the decision describes), else by
/// profile and placement.
fn mig_instance(
    pod: &str,
    g: &AllocatedGpu,
    gpu: &GpuInfo,
    resource: &Resource,
) -> Result<String, AllocateError> {
    let no_instance = |profile: &str, start: u8| AllocateError::NoMigInstance {
        pod: pod.to_string(),
        gpu: gpu.uuid.clone(),
        profile: profile.to_string(),
        start,
    };
    let grant = g
        .mig
        .as_ref()
        .ok_or_else(|| no_instance("(none in decision)", 0))?;
    let inst = if grant.uuid.is_empty() {
        gpu.mig_instances
            .iter()
            .find(|m| m.profile == grant.profile && m.start.is_none_or(|s| s == grant.start))
            .ok_or_else(|| no_instance(&grant.profile, grant.start))?
    } else {
        let inst = gpu
            .mig_instances
            .iter()
            .find(|m| m.uuid == grant.uuid)
            .ok_or_else(|| no_instance(&grant.profile, grant.start))?;
        if inst.profile != grant.profile || inst.start.is_some_and(|s| s != grant.start) {
            return Err(AllocateError::MigMismatch {
                pod: pod.to_string(),
                gpu: gpu.uuid.clone(),
                uuid: grant.uuid.clone(),
                profile: grant.profile.clone(),
                start: grant.start,
                found: match inst.start {
                    Some(s) => format!("{} at start {s}", inst.profile),
                    None => inst.profile.clone(),
                },
            });
        }
        inst
    };
    if let Resource::Mig { profile } | Resource::NvidiaMig { profile } = resource
        && profile != &grant.profile
    {
        return Err(AllocateError::WrongResource {
            pod: pod.to_string(),
            isolation: format!("MIG {}", grant.profile),
            resource: resource.name(),
        });
    }
    Ok(inst.uuid.clone())
}

/// Builds the answer for a container that gets `gpus` of the verified decision `alloc`.
pub fn container_response(
    pod: &str,
    alloc: &Allocation,
    gpus: &[&AllocatedGpu],
    resource: &Resource,
    view: &NodeView,
    handover: &Handover,
) -> Result<pb::ContainerAllocateResponse, AllocateError> {
    let fits = match resource {
        Resource::Mig { .. } | Resource::NvidiaMig { .. } => alloc.isolation == Isolation::Mig,
        // A share asked at an isolation level (`hard`, `any`) takes `tessera.io/gpu`
        // tokens and may be given a MIG instance: the decision then names one for
        // every GPU it grants.
        Resource::Gpu { .. } => {
            alloc.isolation != Isolation::Mig
                || (!gpus.is_empty() && gpus.iter().all(|g| g.mig.is_some()))
        }
        // Whole devices: a share or a MIG slice would let more pods use one GPU
        // than the kubelet counts for nvidia.com/gpu.
        Resource::NvidiaGpu => alloc.isolation == Isolation::Exclusive,
    };
    if !fits {
        return Err(AllocateError::WrongResource {
            pod: pod.to_string(),
            isolation: alloc.isolation.name().to_string(),
            resource: resource.name(),
        });
    }
    let mut ids = Vec::with_capacity(gpus.len());
    for g in gpus {
        let gpu = find_gpu(pod, g, view)?;
        ids.push(if alloc.isolation == Isolation::Mig {
            mig_instance(pod, g, gpu, resource)?
        } else if !g.uuid.is_empty() && g.uuid != gpu.uuid {
            // A MIG instance granted as a GPU (the single strategy): exactly that
            // instance, and only whole; a share there would let more pods use it
            // than the scheduler counts.
            if alloc.isolation != Isolation::Exclusive {
                return Err(AllocateError::WrongResource {
                    pod: pod.to_string(),
                    isolation: format!("{} on MIG instance {}", alloc.isolation.name(), g.uuid),
                    resource: resource.name(),
                });
            }
            g.uuid.clone()
        } else {
            gpu.uuid.clone()
        });
    }
    let mut resp = pb::ContainerAllocateResponse::default();
    handover.device_list.hand_over(&ids, &mut resp);
    resp.envs
        .insert("TESSERA_ISOLATION".into(), alloc.isolation.name().into());
    let mps = &handover.mps;
    match alloc.isolation {
        Isolation::Mps => {
            let max_milli = gpus.iter().map(|g| g.cores_milli).max().unwrap_or(1000);
            let pct = max_milli.div_ceil(10).clamp(1, 100);
            resp.envs
                .insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), pct.to_string());
            // Devices are numbered as the client sees them: by position in its own list.
            let limits: Vec<String> = gpus
                .iter()
                .enumerate()
                .map(|(i, g)| format!("{i}={}M", g.memory_mib))
                .collect();
            resp.envs
                .insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), limits.join(","));
            resp.envs.insert(
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                mps.container_pipe_dir.clone(),
            );
            // The pipe of the daemon for exactly this container's GPUs (`crate::mps`),
            // or the node's one daemon.
            let host_pipe = if mps.per_gpu_daemons {
                crate::mps::pipe_dir(
                    std::path::Path::new(&mps.host_root),
                    &crate::mps::daemon_key(&ids),
                )
                .display()
                .to_string()
            } else {
                format!("{}/pipe", mps.host_root)
            };
            resp.mounts.push(pb::Mount {
                container_path: mps.container_pipe_dir.clone(),
                host_path: host_pipe,
                read_only: false,
            });
            resp.mounts.push(pb::Mount {
                container_path: "/dev/shm".into(),
                host_path: format!("{}/shm", mps.host_root),
                read_only: false,
            });
        }
        Isolation::TimeSlice => {
            // Time slicing enforces nothing; tell the workload its memory budget.
            let mem: Vec<String> = gpus.iter().map(|g| g.memory_mib.to_string()).collect();
            resp.envs
                .insert("TESSERA_GPU_MEMORY_MIB".into(), mem.join(","));
        }
        Isolation::Exclusive | Isolation::Mig => {}
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::deviceplugin::allocate::MpsConfig;
    use crate::deviceplugin::handover::DeviceList;
    use tessera_core::allocation::{MigGrant, VERSION};

    fn view() -> NodeView {
        crate::deviceplugin::test_view()
    }

    fn alloc(isolation: Isolation, gpus: Vec<AllocatedGpu>) -> Allocation {
        Allocation {
            version: VERSION,
            pod_uid: "u".into(),
            pod: "ns/p".into(),
            node: "n".into(),
            policy: "tessera".into(),
            isolation,
            gpus,
            containers: Vec::new(),
            signature: String::new(),
        }
    }

    /// The answer when the container gets all of `alloc`'s GPUs, handed over by `envvar`.
    fn answer(
        a: &Allocation,
        resource: &Resource,
    ) -> Result<pb::ContainerAllocateResponse, AllocateError> {
        let handover = Handover {
            mps: MpsConfig::default(),
            device_list: "envvar".parse::<DeviceList>().unwrap(),
        };
        let gpus: Vec<&AllocatedGpu> = a.gpus.iter().collect();
        container_response("ns/p", a, &gpus, resource, &view(), &handover)
    }

    fn g(index: u32, uuid: &str, memory_mib: u64, cores_milli: u32) -> AllocatedGpu {
        AllocatedGpu {
            index,
            uuid: uuid.into(),
            memory_mib,
            cores_milli,
            mig: None,
        }
    }

    #[test]
    fn mps_share_sets_thread_percentage_memory_limit_and_pipe() {
        let a = alloc(Isolation::Mps, vec![g(2, "", 20_000, 333)]);
        let r = answer(&a, &Resource::Gpu { slots: 4 }).unwrap();
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-2");
        // 333 per-mille rounds up to 34 %.
        assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "34");
        assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20000M");
        assert_eq!(r.envs["CUDA_MPS_PIPE_DIRECTORY"], "/tessera/mps/pipe");
        assert_eq!(r.mounts[0].host_path, "/run/tessera/mps/pipe");
        assert_eq!(r.mounts[1].container_path, "/dev/shm");
    }

    #[test]
    fn mig_and_mismatches() {
        let mut m = g(4, "GPU-4", 40_192, 428);
        m.mig = Some(MigGrant {
            profile: "3g.40gb".into(),
            start: 4,
            size: 4,
            uuid: String::new(),
            create: false,
            enable_mig_mode: false,
        });
        let a = alloc(Isolation::Mig, vec![m.clone()]);
        let mig = Resource::Mig {
            profile: "3g.40gb".into(),
        };
        let r = answer(&a, &mig).unwrap();
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-x");
        assert!(!r.envs.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
        m.mig.as_mut().unwrap().start = 0;
        let a = alloc(Isolation::Mig, vec![m]);
        let e = answer(&a, &mig).unwrap_err();
        assert!(matches!(e, AllocateError::NoMigInstance { .. }), "{e}");
        let whole = alloc(Isolation::Exclusive, vec![g(0, "GPU-9", 0, 1000)]);
        let e = answer(&whole, &Resource::Gpu { slots: 1 }).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod ns/p: decision names GPU GPU-9, which this node does not have"
        );
        let e = answer(&whole, &mig).unwrap_err();
        assert!(matches!(e, AllocateError::WrongResource { .. }));
    }

    /// The single MIG strategy (issue 27 item 8): a whole-GPU decision naming a
    /// MIG instance hands over exactly that instance, never its parent GPU, for
    /// `nvidia.com/gpu` and `tessera.io/gpu` alike; a share naming one is refused.
    #[test]
    fn a_whole_grant_naming_an_instance_hands_over_the_instance() {
        let whole = alloc(Isolation::Exclusive, vec![g(4, "MIG-x", 40_192, 1000)]);
        for resource in [Resource::NvidiaGpu, Resource::Gpu { slots: 16 }] {
            let r = answer(&whole, &resource).unwrap();
            assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-x", "{resource:?}");
        }
        let share = alloc(Isolation::TimeSlice, vec![g(4, "MIG-x", 10_000, 250)]);
        let e = answer(&share, &Resource::Gpu { slots: 16 }).unwrap_err();
        assert!(
            e.to_string().contains("time-slice on MIG instance MIG-x"),
            "{e}"
        );
        // An instance this node does not have is no GPU at all.
        let gone = alloc(Isolation::Exclusive, vec![g(4, "MIG-gone", 40_192, 1000)]);
        assert!(matches!(
            answer(&gone, &Resource::NvidiaGpu),
            Err(AllocateError::UnknownGpu { .. })
        ));
    }

    /// `nvidia.com/mig-3g.40gb` (the mixed strategy's name) is answered like
    /// `tessera.io/mig-3g.40gb`: the decision's instance, and only for a MIG
    /// decision of that profile.
    #[test]
    fn stock_mig_names_are_answered_like_tessera_ones() {
        let mut m = g(4, "GPU-4", 40_192, 428);
        m.mig = Some(MigGrant {
            profile: "3g.40gb".into(),
            start: 4,
            size: 4,
            uuid: String::new(),
            create: false,
            enable_mig_mode: false,
        });
        let stock = |profile: &str| Resource::NvidiaMig {
            profile: profile.into(),
        };
        let r = answer(&alloc(Isolation::Mig, vec![m.clone()]), &stock("3g.40gb")).unwrap();
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-x");
        let e = answer(&alloc(Isolation::Mig, vec![m]), &stock("1g.10gb")).unwrap_err();
        assert!(matches!(e, AllocateError::WrongResource { .. }), "{e}");
        let whole = alloc(Isolation::Exclusive, vec![g(0, "GPU-0", 0, 1000)]);
        let e = answer(&whole, &stock("3g.40gb")).unwrap_err();
        assert!(matches!(e, AllocateError::WrongResource { .. }), "{e}");
    }

    #[test]
    fn a_hard_share_gets_its_mig_instance_through_gpu_tokens() {
        let mut m = g(4, "GPU-4", 40_192, 428);
        m.mig = Some(MigGrant {
            profile: "3g.40gb".into(),
            start: 4,
            size: 4,
            uuid: String::new(),
            create: false,
            enable_mig_mode: false,
        });
        let gpu = Resource::Gpu { slots: 4 };
        let r = answer(&alloc(Isolation::Mig, vec![m]), &gpu).unwrap();
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-x");
        assert_eq!(r.envs["TESSERA_ISOLATION"], "mig");
        // A MIG decision without an instance for its GPU is still refused there.
        let e = answer(
            &alloc(Isolation::Mig, vec![g(4, "GPU-4", 40_192, 428)]),
            &gpu,
        )
        .unwrap_err();
        assert!(matches!(e, AllocateError::WrongResource { .. }), "{e}");
    }

    #[test]
    fn mig_grant_by_uuid_hands_out_that_instance() {
        let mig = Resource::Mig {
            profile: "3g.40gb".into(),
        };
        let with_uuid = |profile: &str, start: u8, uuid: &str| {
            let mut m = g(4, "GPU-4", 40_192, 428);
            m.mig = Some(MigGrant {
                profile: profile.into(),
                start,
                size: 4,
                uuid: uuid.into(),
                create: false,
                enable_mig_mode: false,
            });
            alloc(Isolation::Mig, vec![m])
        };
        // The scheduler names the instance at placement start 4 by its UUID.
        let r = answer(&with_uuid("3g.40gb", 4, "MIG-x"), &mig).unwrap();
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-x");
        // A UUID that names an instance of another profile or placement than
        // the decision says is refused, not handed out.
        for (profile, start) in [("1g.10gb", 4), ("3g.40gb", 0)] {
            let e = answer(&with_uuid(profile, start, "MIG-x"), &mig).unwrap_err();
            assert!(e.to_string().contains("MIG-x"), "{e}");
        }
    }
}
