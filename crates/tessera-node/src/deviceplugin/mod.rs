//! The kubelet device plugin (API `v1beta1`, protocols.md §2).
//!
//! # Resources and device IDs
//!
//! Tessera's scheduler decides *which* GPU (or share, or MIG instance) a pod
//! gets and writes it in the pod's `tessera.io/allocation` annotation. The
//! kubelet still needs countable devices to admit pods, so the agent
//! advertises tokens and answers `Allocate` from the decision, not from the
//! device IDs the kubelet picked:
//!
//! - `tessera.io/gpu`: every GPU without MIG mode is advertised as `slots`
//!   virtual devices `<GPU-uuid>::<k>` (`k` in `0..slots`, default 16), as
//!   NVIDIA's plugin names replicas. A pod asking `tessera.io/gpu: N` takes N
//!   tokens whether it gets N whole GPUs or N shares; at most `slots` pods can
//!   share one GPU. Capacity is therefore `GPUs × slots`; the scheduler, not the
//!   kubelet, guards memory and compute. The tokens of an unhealthy GPU are
//!   advertised `Unhealthy`, so the GPU's slots leave `allocatable`.
//! - `tessera.io/mig-<profile>` (`+` written `.`, as NVIDIA's mixed strategy
//!   does): one device per existing MIG instance, ID = its `MIG-…` UUID, health
//!   = its parent GPU's. On a GPU where the agent may create instances (the
//!   Node's `tessera.io/mig-dynamic` label: `instances` for a GPU in MIG mode,
//!   `mode` for any MIG-capable GPU), every profile of the GPU's model is
//!   advertised instead as that profile's most instances per GPU in tokens
//!   `<GPU-uuid>::<profile>-<k>`, whatever exists now: the kubelet then admits a
//!   pod whose profile has no instance yet, `Allocate` creates the instance the
//!   decision planned and answers with it, and the list does not change as
//!   instances come and go. As for `tessera.io/gpu`, the scheduler, not the
//!   kubelet's count, guards what fits.
//! - `nvidia.com/gpu` (optional, on by default): one device per GPU without MIG
//!   mode, ID = its UUID, so pods written for NVIDIA's device plugin run on
//!   Tessera's nodes. Answered from the decision like the others, for whole
//!   (exclusive) GPUs only. The kubelet uses one plugin per resource name (the
//!   last to register), so this must not be on where NVIDIA's plugin also runs.
//! - `nvidia.com/mig-<profile>` (with `nvidia.com/gpu`, by the same switch): the
//!   names the GPU Operator's "mixed" MIG strategy gives instances, with the same
//!   devices as `tessera.io/mig-<profile>`, so `nvidia.com/mig-1g.10gb` pods run on
//!   Tessera's MIG GPUs (the request parser reads both names as one MIG request).
//!   Like `nvidia.com/gpu`, never beside NVIDIA's plugin on one node.
//! - The GPU Operator's "single" MIG strategy (Node label `tessera.io/mig-strategy`
//!   or GFD's `nvidia.com/mig.strategy` = `single`): a GPU in MIG mode offers each
//!   instance as a GPU, under `tessera.io/gpu` (`<MIG-uuid>::<k>` tokens) and
//!   `nvidia.com/gpu` (its `MIG-…` UUID), and no `*/mig-<profile>` resource. A
//!   whole-GPU decision then names the instance's UUID, and `Allocate` hands over
//!   exactly that instance.
//!
//! Each resource has its own socket `tessera-<name>.sock` in the device-plugins
//! directory, and re-registers when the kubelet's socket is recreated
//! ([`registration`]).

pub mod allocate;
pub mod handover;
pub mod preferred;
pub mod registration;
pub mod response;
pub mod service;

use std::collections::BTreeMap;

use std::sync::LazyLock;

use tessera_core::fit::mig_layout::MigDynamic;
use tessera_core::model::single::MigStrategy;
use tessera_core::model::{Catalog, MigGeometry};

use crate::backend::GpuInfo;
use crate::health::GpuHealth;
use crate::nodesettings::NodeSettings;
use crate::proto::deviceplugin as pb;

/// `v1beta1`.
pub const API_VERSION: &str = "v1beta1";
/// Where the kubelet and the plugins keep their sockets.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's registration socket, in [`DEVICE_PLUGIN_DIR`].
pub const KUBELET_SOCKET: &str = "kubelet.sock";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
/// The built-in models, for the MIG geometry of a GPU.
static CATALOG: LazyLock<Catalog> = LazyLock::new(Catalog::default);
/// Default number of `tessera.io/gpu` tokens per GPU.
pub const DEFAULT_SLOTS: u32 = 16;

/// What the device plugin knows about the node at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeView {
    pub gpus: Vec<GpuInfo>,
    pub health: BTreeMap<String, GpuHealth>,
    /// What the Node's labels let the agent do to MIG (`tessera.io/mig-dynamic`)
    /// and how its instances are offered (the MIG strategy); both off until the
    /// Node has been read.
    pub settings: NodeSettings,
}

impl NodeView {
    pub fn is_healthy(&self, uuid: &str) -> bool {
        self.health.get(uuid).is_none_or(GpuHealth::is_healthy)
    }

    pub fn gpu(&self, uuid: &str) -> Option<&GpuInfo> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// The MIG geometry of `gpu` when the agent may create instances on it now
    /// (see [`MigDynamic`]): in MIG mode with `instances` or `mode`, out of it
    /// with `mode`; never for a model the catalog does not know.
    /// Never under the single strategy, whose instances are GPUs.
    pub fn creatable(&self, gpu: &GpuInfo) -> Option<&'static MigGeometry> {
        if self.single() {
            return None;
        }
        let allowed = match self.settings.mig_dynamic {
            MigDynamic::Off => false,
            MigDynamic::Instances => gpu.mig_enabled,
            MigDynamic::Mode => gpu.mig_capable || gpu.mig_enabled,
        };
        if !allowed {
            return None;
        }
        mig_geometry(gpu)
    }

    /// Whether the node's MIG strategy is `single`: every MIG instance is offered
    /// as a GPU of its own (`nvidia.com/gpu`, `tessera.io/gpu`).
    pub fn single(&self) -> bool {
        self.settings.mig_strategy == MigStrategy::Single
    }

    /// The GPU a decision's grant names: by UUID, or by NVML index when the
    /// decision has no UUID for it. A whole-GPU grant may name a MIG instance
    /// (the single strategy): the GPU is then its parent.
    pub fn grant_gpu(&self, g: &tessera_core::allocation::AllocatedGpu) -> Option<&GpuInfo> {
        if g.uuid.is_empty() {
            self.gpus.iter().find(|x| x.index == g.index)
        } else {
            self.gpu(&g.uuid).or_else(|| self.instance_parent(&g.uuid))
        }
    }

    /// The UUIDs of `gpu`'s MIG instances offered as GPUs: every named instance
    /// of a GPU in MIG mode under the single strategy, else none.
    pub fn whole_instances<'a>(&self, gpu: &'a GpuInfo) -> Vec<&'a str> {
        if !(self.single() && gpu.mig_enabled) {
            return Vec::new();
        }
        gpu.mig_instances
            .iter()
            .filter(|m| !m.uuid.is_empty())
            .map(|m| m.uuid.as_str())
            .collect()
    }

    /// The GPU in MIG mode that has the instance `uuid`.
    pub fn instance_parent(&self, uuid: &str) -> Option<&GpuInfo> {
        self.gpus
            .iter()
            .find(|g| g.mig_enabled && g.mig_instances.iter().any(|m| m.uuid == uuid))
    }
}

/// One extended resource the agent serves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    /// `tessera.io/gpu`: whole GPUs and shares, `slots` tokens per GPU.
    Gpu { slots: u32 },
    /// `tessera.io/mig-<profile>`: existing MIG instances of one profile.
    Mig { profile: String },
    /// `nvidia.com/gpu`: whole GPUs, one device each.
    NvidiaGpu,
    /// `nvidia.com/mig-<profile>`: the devices of [`Resource::Mig`] under the
    /// stock plugin's "mixed" strategy name.
    NvidiaMig { profile: String },
}

impl Resource {
    /// The extended resource name.
    pub fn name(&self) -> String {
        match self {
            Resource::Gpu { .. } => tessera_core::request::RES_GPU.to_string(),
            Resource::Mig { profile } => format!(
                "{}{}",
                tessera_core::request::RES_MIG_PREFIX,
                profile.replace('+', ".")
            ),
            Resource::NvidiaGpu => tessera_core::request::RES_NVIDIA_GPU.to_string(),
            Resource::NvidiaMig { profile } => format!(
                "{}{}",
                tessera_core::request::RES_NVIDIA_MIG_PREFIX,
                profile.replace('+', ".")
            ),
        }
    }

    /// The plugin's socket file name (relative to the device-plugins directory).
    pub fn socket_name(&self) -> String {
        let name = self.name();
        let (vendor, short) = name.split_once('/').unwrap_or(("", &name));
        // `tessera-gpu.sock` is tessera.io/gpu; NVIDIA's own plugin uses `nvidia-gpu.sock`.
        match vendor {
            "tessera.io" => format!("tessera-{short}.sock"),
            _ => format!(
                "tessera-{}-{short}.sock",
                vendor.split('.').next().unwrap_or(vendor)
            ),
        }
    }

    /// The resources a node with these GPUs offers; `nvidia_gpu` adds the stock
    /// names `nvidia.com/gpu` and `nvidia.com/mig-<profile>`.
    pub fn for_node(view: &NodeView, slots: u32, nvidia_gpu: bool) -> Vec<Resource> {
        let mut out = Vec::new();
        if view
            .gpus
            .iter()
            .any(|g| !g.mig_enabled || !view.whole_instances(g).is_empty())
        {
            out.push(Resource::Gpu { slots });
            if nvidia_gpu {
                out.push(Resource::NvidiaGpu);
            }
        }
        let mut profiles: Vec<String> = view
            .gpus
            .iter()
            // Under the single strategy instances are GPUs, not profiles.
            .filter(|_| !view.single())
            .flat_map(|g| match view.creatable(g) {
                Some(geo) => geo.profiles.iter().map(|p| p.name.clone()).collect(),
                None => g
                    .mig_instances
                    .iter()
                    .map(|m| m.profile.clone())
                    .collect::<Vec<_>>(),
            })
            .collect();
        profiles.sort();
        profiles.dedup();
        out.extend(profiles.iter().map(|profile| Resource::Mig {
            profile: profile.clone(),
        }));
        if nvidia_gpu {
            out.extend(
                profiles
                    .into_iter()
                    .map(|profile| Resource::NvidiaMig { profile }),
            );
        }
        out
    }

    /// The complete device list for `ListAndWatch`.
    pub fn devices(&self, view: &NodeView) -> Vec<pb::Device> {
        let topo = |gpu: &GpuInfo| {
            gpu.numa_node.map(|n| pb::TopologyInfo {
                nodes: vec![pb::NumaNode { id: i64::from(n) }],
            })
        };
        let health = |gpu: &GpuInfo| {
            if view.is_healthy(&gpu.uuid) {
                HEALTHY
            } else {
                UNHEALTHY
            }
            .to_string()
        };
        let mut out = Vec::new();
        for gpu in &view.gpus {
            // Under the single strategy, a GPU in MIG mode offers its instances as
            // GPUs: `slots` tokens each for `tessera.io/gpu`, the instance itself
            // for `nvidia.com/gpu`, with the parent's health and NUMA node.
            if gpu.mig_enabled && view.single() {
                for m in view.whole_instances(gpu) {
                    let ids = match self {
                        Resource::Gpu { slots } => (0..*slots).map(|k| slot_id(m, k)).collect(),
                        Resource::NvidiaGpu => vec![m.to_string()],
                        Resource::Mig { .. } | Resource::NvidiaMig { .. } => Vec::new(),
                    };
                    out.extend(ids.into_iter().map(|id| pb::Device {
                        id,
                        health: health(gpu),
                        topology: topo(gpu),
                    }));
                }
                continue;
            }
            match self {
                Resource::Gpu { slots } if !gpu.mig_enabled => {
                    for k in 0..*slots {
                        out.push(pb::Device {
                            id: slot_id(&gpu.uuid, k),
                            health: health(gpu),
                            topology: topo(gpu),
                        });
                    }
                }
                Resource::Mig { profile } | Resource::NvidiaMig { profile } => {
                    match view.creatable(gpu) {
                        // Tokens: the instance is the decision's, made at Allocate.
                        Some(geo) => {
                            let most = geo.profile(profile).map_or(0, |(_, p)| p.max_instances);
                            for k in 0..most {
                                out.push(pb::Device {
                                    id: mig_token_id(&gpu.uuid, profile, k),
                                    health: health(gpu),
                                    topology: topo(gpu),
                                });
                            }
                        }
                        None => {
                            for m in gpu.mig_instances.iter().filter(|m| &m.profile == profile) {
                                out.push(pb::Device {
                                    id: m.uuid.clone(),
                                    health: health(gpu),
                                    topology: topo(gpu),
                                });
                            }
                        }
                    }
                }
                Resource::NvidiaGpu if !gpu.mig_enabled => out.push(pb::Device {
                    id: gpu.uuid.clone(),
                    health: health(gpu),
                    topology: topo(gpu),
                }),
                Resource::Gpu { .. } | Resource::NvidiaGpu => {}
            }
        }
        out
    }
}

/// `<uuid>::<k>`.
pub fn slot_id(uuid: &str, k: u32) -> String {
    format!("{uuid}::{k}")
}

/// The built-in catalog, made once for the agent's lookups by model.
pub fn catalog() -> &'static Catalog {
    &CATALOG
}

/// The MIG geometry of `gpu`'s model (none for a model the catalog does not
/// know, or without MIG): what the `GpuNode` publishes for the scheduler to plan
/// instances on, and what the agent advertises tokens for.
pub fn mig_geometry(gpu: &GpuInfo) -> Option<&'static MigGeometry> {
    let id = CATALOG.find(gpu.model.as_deref()?)?;
    CATALOG.spec(id).mig.as_ref()
}

/// `<uuid>::<profile>-<k>`: the `k`-th token of a MIG profile on a GPU where the
/// agent may create instances (`+` written `.`, as in the resource name).
pub fn mig_token_id(uuid: &str, profile: &str, k: u8) -> String {
    format!("{uuid}::{}-{k}", profile.replace('+', "."))
}

/// Whether a device ID is a [`mig_token_id`]: it names a GPU, not an instance;
/// the instance the container gets is in its pod's decision. (`<uuid>::<k>` with
/// digits only is a share slot, or a time-slicing replica of NVIDIA's plugin.)
pub fn is_mig_token(id: &str) -> bool {
    id.split_once("::")
        .is_some_and(|(_, k)| !k.bytes().all(|b| b.is_ascii_digit()))
}

/// The GPU UUID of a device ID (strips a `::<k>` slot suffix).
pub fn device_gpu(id: &str) -> &str {
    id.split_once("::").map(|(u, _)| u).unwrap_or(id)
}

/// Four A100s in two NVLink pairs on two NUMA nodes, and one in MIG mode with a
/// `3g.40gb` instance at start 4: the node the Allocate and preference tests share.
#[cfg(test)]
pub(crate) fn test_view() -> NodeView {
    use crate::backend::GpuBackend;
    let fake = crate::backend::fake::Fake::from_yaml(
        r#"
gpus:
  - { uuid: GPU-0, product: NVIDIA A100-SXM4-80GB, numaNode: 0, nvlinks: { GPU-1: 12 } }
  - { uuid: GPU-1, product: NVIDIA A100-SXM4-80GB, numaNode: 0 }
  - { uuid: GPU-2, product: NVIDIA A100-SXM4-80GB, numaNode: 1, nvlinks: { GPU-3: 12 } }
  - { uuid: GPU-3, product: NVIDIA A100-SXM4-80GB, numaNode: 1 }
  - uuid: GPU-4
    product: NVIDIA A100-SXM4-80GB
    mig: { enabled: true, instances: [ { uuid: MIG-x, profile: 3g.40gb, start: 4 } ] }
"#,
        "t",
    )
    .expect("a valid fake node");
    NodeView {
        settings: Default::default(),
        gpus: fake.discover().expect("fake GPUs"),
        health: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::GpuBackend;
    use crate::backend::fake::Fake;

    /// The GPU Operator's single MIG strategy (issue 27 item 8): a GPU in MIG
    /// mode offers its instances as GPUs, and no profile is advertised.
    #[test]
    fn under_the_single_strategy_instances_are_gpus() {
        let mut view = test_view();
        view.settings.mig_strategy = MigStrategy::Single;
        // Dynamic MIG does not apply: the instances are fixed GPUs.
        view.settings.mig_dynamic = MigDynamic::Mode;
        let names: Vec<String> = Resource::for_node(&view, 2, true)
            .iter()
            .map(Resource::name)
            .collect();
        assert_eq!(names, ["tessera.io/gpu", "nvidia.com/gpu"]);
        let ids = |r: &Resource, view: &NodeView| -> Vec<String> {
            r.devices(view).into_iter().map(|d| d.id).collect()
        };
        let nvidia = ids(&Resource::NvidiaGpu, &view);
        assert_eq!(nvidia, ["GPU-0", "GPU-1", "GPU-2", "GPU-3", "MIG-x"]);
        let slots = ids(&Resource::Gpu { slots: 2 }, &view);
        assert_eq!(&slots[8..], ["MIG-x::0", "MIG-x::1"]);
        // The instance carries its parent's health.
        view.health.insert(
            "GPU-4".into(),
            GpuHealth::Unhealthy {
                reason: "x".into(),
                xid: Some(79),
            },
        );
        let mig_x = Resource::NvidiaGpu
            .devices(&view)
            .into_iter()
            .find(|d| d.id == "MIG-x")
            .unwrap();
        assert_eq!(mig_x.health, UNHEALTHY);
        // Mixed (the default): the instance is a profile, never a GPU.
        view.settings.mig_strategy = MigStrategy::Mixed;
        assert!(!ids(&Resource::NvidiaGpu, &view).contains(&"MIG-x".to_string()));
        assert!(
            Resource::for_node(&view, 2, true).contains(&Resource::NvidiaMig {
                profile: "3g.40gb".into()
            })
        );
    }

    #[test]
    fn resources_and_device_ids() {
        let fake = Fake::from_yaml(
            r#"
gpus:
  - { uuid: GPU-a, product: NVIDIA A100-SXM4-80GB, numaNode: 1 }
  - uuid: GPU-b
    product: NVIDIA A100-SXM4-80GB
    mig:
      enabled: true
      instances:
        - { uuid: MIG-1, profile: 1g.10gb, start: 0 }
        - { uuid: MIG-2, profile: 1g.10gb+me, start: 1 }
"#,
            "t",
        )
        .unwrap();
        let mut view = NodeView {
            settings: Default::default(),
            gpus: fake.discover().unwrap(),
            health: BTreeMap::new(),
        };
        let res = Resource::for_node(&view, 4, false);
        let names: Vec<String> = res.iter().map(Resource::name).collect();
        assert_eq!(
            names,
            [
                "tessera.io/gpu",
                "tessera.io/mig-1g.10gb",
                "tessera.io/mig-1g.10gb.me"
            ]
        );
        assert_eq!(res[2].socket_name(), "tessera-mig-1g.10gb.me.sock");
        // nvidia.com/gpu: one device per GPU without MIG, named by UUID.
        let with_nvidia = Resource::for_node(&view, 4, true);
        assert_eq!(with_nvidia[1], Resource::NvidiaGpu);
        assert_eq!(with_nvidia[1].name(), "nvidia.com/gpu");
        assert_eq!(with_nvidia[1].socket_name(), "tessera-nvidia-gpu.sock");
        let whole = with_nvidia[1].devices(&view);
        let ids: Vec<&str> = whole.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["GPU-a"]);
        // nvidia.com/mig-<profile> (the mixed strategy's names) with the same
        // devices as tessera.io/mig-<profile>, by the same switch.
        let stock_mig: Vec<String> = with_nvidia[4..].iter().map(Resource::name).collect();
        assert_eq!(
            stock_mig,
            ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.me"]
        );
        assert_eq!(
            with_nvidia[4].socket_name(),
            "tessera-nvidia-mig-1g.10gb.sock"
        );
        assert_eq!(with_nvidia[4].devices(&view), res[1].devices(&view));
        assert!(
            !names.iter().any(|n| n.starts_with("nvidia.com/")),
            "off: no stock names at all"
        );
        let devs = res[0].devices(&view);
        assert_eq!(
            devs.len(),
            4,
            "4 slots of GPU-a; MIG GPU-b is not a tessera.io/gpu"
        );
        assert_eq!(devs[3].id, "GPU-a::3");
        assert_eq!(devs[0].topology.as_ref().unwrap().nodes[0].id, 1);
        assert!(devs.iter().all(|d| d.health == HEALTHY));
        view.health.insert(
            "GPU-b".into(),
            GpuHealth::Unhealthy {
                reason: "x".into(),
                xid: Some(79),
            },
        );
        let mig = res[1].devices(&view);
        assert_eq!(mig.len(), 1);
        assert_eq!(
            (mig[0].id.as_str(), mig[0].health.as_str()),
            ("MIG-1", UNHEALTHY)
        );
        assert_eq!(device_gpu("GPU-a::3"), "GPU-a");
        assert_eq!(device_gpu("MIG-1"), "MIG-1");
    }

    /// What the Node's `tessera.io/mig-dynamic` label lets the agent create is
    /// what it advertises: off, existing instances only; `instances`, every
    /// profile of the GPUs already in MIG mode as tokens; `mode`, also the GPUs
    /// it may switch. The MIG tokens resolve to their GPU and are told apart from
    /// share slots and NVIDIA's time-slicing replicas.
    #[test]
    fn mig_profiles_follow_the_nodes_mig_setting() {
        let mut view = test_view();
        let mig_names = |view: &NodeView| -> Vec<String> {
            Resource::for_node(view, 4, false)
                .iter()
                .map(Resource::name)
                .filter(|n| n.starts_with("tessera.io/mig-"))
                .collect()
        };
        assert_eq!(mig_names(&view), ["tessera.io/mig-3g.40gb"]);
        let three = Resource::Mig {
            profile: "3g.40gb".into(),
        };
        let ids = |view: &NodeView, r: &Resource| -> Vec<String> {
            r.devices(view).into_iter().map(|d| d.id).collect()
        };
        assert_eq!(ids(&view, &three), ["MIG-x"]);

        view.settings.mig_dynamic = MigDynamic::Instances;
        let names = mig_names(&view);
        assert!(
            names.contains(&"tessera.io/mig-1g.10gb".to_string())
                && names.contains(&"tessera.io/mig-7g.80gb".to_string()),
            "{names:?}"
        );
        // The existing instance's GPU holds at most two 3g.40gb: two tokens,
        // whatever exists; only GPU-4 is in MIG mode.
        assert_eq!(ids(&view, &three), ["GPU-4::3g.40gb-0", "GPU-4::3g.40gb-1"]);
        let one = Resource::Mig {
            profile: "1g.10gb".into(),
        };
        assert_eq!(ids(&view, &one).len(), 7);

        view.settings.mig_dynamic = MigDynamic::Mode;
        // Every A100 may be switched: five GPUs of two 3g.40gb each.
        let all = ids(&view, &three);
        assert_eq!(all.len(), 10, "{all:?}");
        assert!(all.contains(&"GPU-0::3g.40gb-1".to_string()));
        let me = Resource::Mig {
            profile: "1g.10gb+me".into(),
        };
        assert_eq!(ids(&view, &me)[0], "GPU-0::1g.10gb.me-0");

        assert!(is_mig_token("GPU-4::3g.40gb-0"));
        assert!(!is_mig_token("GPU-4::3"), "a share slot");
        assert!(!is_mig_token("MIG-x"));
        assert_eq!(device_gpu("GPU-4::3g.40gb-0"), "GPU-4");
    }
}
