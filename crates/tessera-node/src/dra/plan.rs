//! The pure half of `NodePrepareResources`: what a claim's allocation means on
//! this node ([`resolve`]: checked, each device found or a placement to create)
//! and, once every device exists, its CDI spec and the kubelet's answer
//! ([`cdi_spec`]). [`super::prepare`] does the I/O between and around them.

use std::collections::BTreeSet;

use serde_json::json;
use tessera_core::model::spec::Catalog;

use super::DRIVER_NAME;
use super::placement::{Placement, find_placement};
use super::prepare::{
    AllocationResult, CDI_CLAIM_KIND, CDI_VERSION, ResourceClaim, Target, find_device,
    quantity_count, quantity_mib,
};
use super::service::{ClaimRef, PreparedDevice};
use super::share::{ShareMps, share_edits, thread_percentage};
use super::slice::SliceOptions;
use crate::deviceplugin::NodeView;
use crate::deviceplugin::handover::CDI_KIND;

/// What one allocated device of a claim is on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// It exists: a whole GPU, or a MIG instance.
    Ready(Target),
    /// A published placement whose MIG instance does not exist yet.
    Create(Placement),
}

/// The claim's `gpu.tessera.io` results on this node, each resolved, or why the
/// claim cannot be prepared: another UID than the kubelet's, not allocated,
/// another node's pool, a device this node does not publish, an unhealthy GPU. Pure.
pub fn resolve<'a>(
    claim: &ClaimRef,
    rc: &'a ResourceClaim,
    view: &NodeView,
    node: &str,
    options: SliceOptions,
) -> Result<Vec<(&'a AllocationResult, Want)>, String> {
    let who = format!("claim {}/{}", claim.namespace, claim.name);
    if rc.metadata.uid != claim.uid {
        return Err(format!(
            "{who} has UID {:?}, not {:?} as the kubelet asked (recreated?)",
            rc.metadata.uid, claim.uid
        ));
    }
    let alloc = rc
        .status
        .allocation
        .as_ref()
        .ok_or_else(|| format!("{who} is not allocated"))?;
    let catalog = Catalog::default();
    let mut out = Vec::new();
    for r in alloc
        .devices
        .results
        .iter()
        .filter(|r| r.driver == DRIVER_NAME)
    {
        if r.pool != node {
            return Err(format!(
                "{who}: device {}/{} is in pool {:?}, not this node's ({node:?})",
                r.pool, r.device, r.pool
            ));
        }
        let want = match find_device(&view.gpus, &r.device) {
            Some(t) => Want::Ready(t),
            None => find_placement(&view.gpus, &r.device, options, &catalog)
                .map(Want::Create)
                .ok_or_else(|| format!("{who}: this node has no device {:?}", r.device))?,
        };
        let gpu = match &want {
            Want::Ready(t) => &t.gpu_uuid,
            Want::Create(p) => &p.gpu_uuid,
        };
        if !view.is_healthy(gpu) {
            return Err(format!(
                "{who}: device {} (GPU {gpu}) is unhealthy",
                r.device
            ));
        }
        out.push((r, want));
    }
    Ok(out)
}

/// The GPUs (UUIDs, sorted, once each) of a claim's shares: one MPS daemon set.
pub fn share_gpus(devices: &[(&AllocationResult, Target)]) -> Vec<String> {
    let set: BTreeSet<String> = devices
        .iter()
        .filter(|(r, _)| r.share_id.is_some())
        .map(|(_, t)| t.gpu_uuid.clone())
        .collect();
    set.into_iter().collect()
}

/// The CDI spec and the kubelet's answer for a claim's devices, all existing
/// now. Pure.
pub fn cdi_spec(
    claim: &ClaimRef,
    devices: &[(&AllocationResult, Target)],
    view: &NodeView,
    mps: &ShareMps,
) -> Result<(serde_json::Value, Vec<PreparedDevice>), String> {
    let who = format!("claim {}/{}", claim.namespace, claim.name);
    let mut answer = Vec::new();
    let mut limits = Vec::new();
    let mut memory = Vec::new();
    for (i, (r, target)) in devices.iter().enumerate() {
        // The memory of what the container gets: the MIG instance's, or the GPU's.
        let gpu_memory = view
            .gpu(&target.gpu_uuid)
            .map_or(0, |g| match &target.mig_uuid {
                Some(m) => g
                    .mig_instances
                    .iter()
                    .find(|i| &i.uuid == m)
                    .map_or(0, |i| i.memory_mib),
                None => g.memory_mib,
            });
        if r.share_id.is_some() {
            let mem = match r.consumed_capacity.get("memory") {
                Some(q) => quantity_mib(q).ok_or_else(|| {
                    format!("{who}: device {}: memory {q:?} is not a quantity", r.device)
                })?,
                None => gpu_memory,
            };
            let compute: u32 = match r.consumed_capacity.get("compute") {
                Some(q) => quantity_count(q)
                    .filter(|c| (1..=1000).contains(c))
                    .and_then(|c| u32::try_from(c).ok())
                    .ok_or_else(|| {
                        format!(
                            "{who}: device {}: compute {q:?} is not a per-mille in 1..=1000",
                            r.device
                        )
                    })?,
                None => 1000,
            };
            limits.push((i, mem, compute));
            memory.push(mem.to_string());
        } else {
            memory.push(gpu_memory.to_string());
        }
        let cdi_name = format!("{}-{}", claim.uid, r.device);
        answer.push(PreparedDevice {
            request_names: vec![r.request.clone()],
            pool_name: r.pool.clone(),
            device_name: r.device.clone(),
            cdi_device_ids: vec![
                format!("{CDI_CLAIM_KIND}={cdi_name}"),
                format!("{CDI_KIND}={}", target.uuid()),
            ],
            share_id: r.share_id.clone(),
        });
    }
    // A share's limits, numbered as the client sees the claim's devices; every
    // share device of the claim carries them, with the pipe of the claim's daemon.
    let percentage = limits
        .iter()
        .map(|(_, _, c)| thread_percentage(*c))
        .max()
        .unwrap_or(100);
    let memory_limits: Vec<String> = limits.iter().map(|(i, m, _)| format!("{i}={m}M")).collect();
    let pipe = mps.host_pipe(&share_gpus(devices));
    let mut cdi_devices = Vec::new();
    for (i, (r, target)) in devices.iter().enumerate() {
        let own = vec![format!("TESSERA_DRA_DEVICE_{i}={}", target.uuid())];
        let edits = if r.share_id.is_some() {
            share_edits(
                own,
                &mps.config,
                &pipe,
                &mps.host_shm(),
                percentage,
                &memory_limits.join(","),
            )
        } else {
            json!({ "env": own })
        };
        cdi_devices.push(json!({
            "name": format!("{}-{}", claim.uid, r.device),
            "containerEdits": edits,
        }));
    }
    let mut env = vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()];
    env.push(if limits.is_empty() {
        "TESSERA_ISOLATION=exclusive".into()
    } else {
        "TESSERA_ISOLATION=mps".into()
    });
    env.push(format!("TESSERA_GPU_MEMORY_MIB={}", memory.join(",")));
    let spec = json!({
        "cdiVersion": CDI_VERSION,
        "kind": CDI_CLAIM_KIND,
        "containerEdits": {"env": env},
        "devices": cdi_devices,
    });
    Ok((spec, answer))
}
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::*;
    use crate::backend::GpuBackend;
    use crate::backend::fake::Fake;
    use crate::health::GpuHealth;

    const PARTITIONED: SliceOptions = SliceOptions {
        consumable_capacity: false,
        partitionable_mig: true,
        device_taints: false,
    };

    fn view() -> NodeView {
        let fake = Fake::from_yaml(
            r#"
gpus:
  - uuid: GPU-m
    product: NVIDIA A100-SXM4-80GB
    mig: { enabled: true, instances: [ { uuid: MIG-a, profile: 1g.10gb, start: 0 } ] }
  - { uuid: GPU-w, product: NVIDIA A100-SXM4-80GB }
"#,
            "t",
        )
        .unwrap();
        NodeView {
            settings: Default::default(),
            gpus: fake.discover().unwrap(),
            health: BTreeMap::new(),
        }
    }

    fn claim(devices: &[&str]) -> ResourceClaim {
        let results: Vec<Value> = devices
            .iter()
            .map(|d| json!({"request": "r", "driver": DRIVER_NAME, "pool": "n", "device": d}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    fn kubelet() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        }
    }

    /// An existing instance is ready; a published placement without one is to
    /// be created, at exactly its profile and start; a placement on the GPU out
    /// of MIG mode is not published, so it is no device.
    #[test]
    fn devices_resolve_to_what_exists_or_what_to_create() {
        let v = view();
        let rc = claim(&["gpu-0-mig-1g10gb-0", "gpu-0-mig-3g40gb-4", "gpu-1"]);
        let wants: Vec<Want> = resolve(&kubelet(), &rc, &v, "n", PARTITIONED)
            .unwrap()
            .into_iter()
            .map(|(_, w)| w)
            .collect();
        assert!(matches!(&wants[0], Want::Ready(t) if t.mig_uuid.as_deref() == Some("MIG-a")));
        assert!(
            matches!(&wants[1], Want::Create(p) if p.gpu_uuid == "GPU-m" && p.profile == "3g.40gb" && p.start == 4)
        );
        assert!(
            matches!(&wants[2], Want::Ready(t) if t.gpu_uuid == "GPU-w" && t.mig_uuid.is_none())
        );
        let e = resolve(
            &kubelet(),
            &claim(&["gpu-1-mig-3g40gb-4"]),
            &v,
            "n",
            PARTITIONED,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "claim ns/c: this node has no device \"gpu-1-mig-3g40gb-4\""
        );
        // Without the feature nothing is created: the placement is no device.
        let e = resolve(
            &kubelet(),
            &claim(&["gpu-0-mig-3g40gb-4"]),
            &v,
            "n",
            Default::default(),
        )
        .unwrap_err();
        assert!(e.contains("no device"), "{e}");
    }

    /// A placement to create on an unhealthy GPU is refused before anything is made.
    #[test]
    fn an_unhealthy_gpu_gets_no_new_instance() {
        let mut v = view();
        v.health.insert(
            "GPU-m".into(),
            GpuHealth::Unhealthy {
                xid: Some(79),
                reason: "fell off the bus".into(),
            },
        );
        let e = resolve(
            &kubelet(),
            &claim(&["gpu-0-mig-3g40gb-4"]),
            &v,
            "n",
            PARTITIONED,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "claim ns/c: device gpu-0-mig-3g40gb-4 (GPU GPU-m) is unhealthy"
        );
    }
}
