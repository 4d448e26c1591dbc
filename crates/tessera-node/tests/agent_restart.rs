//! Agent restarts between `Allocate` calls, as a seeded volume run (issue 28):
//! a kubelet-shaped client admits a node's pods one at a time in a seeded
//! order while the agent is killed and restarted on the same state file at
//! seeded points between its calls, and an audit checks every answer the
//! agent gave.
//!
//! Each run places pods on the two whole GPUs of the common fake node the way
//! the scheduler would (whole GPUs, MPS and time-slice shares, pods with two
//! app containers or an init container), adds adversarial pods (one created
//! with `spec.nodeName` preset and no decision, one whose decision is for
//! another node, one carrying a copy of another pod's decision, one whose
//! decision is not signed with the scheduler's key) and lets the kubelet model
//! work through them. Like the real kubelet it calls `Allocate` once per asking
//! container (init containers first), reserves the `tessera.io/gpu` device IDs
//! it passes, rejects some pods without calling the plugin (not enough device
//! IDs left, or another admission handler said no), fails a pod whose call was
//! refused or could not reach the plugin (the agent was down), and lists in
//! its PodResources API the pods it reached (app containers and sidecars, not
//! regular init containers), a container's devices appearing only once its
//! `Allocate` succeeded. The API server's phases (`Running`,
//! `Failed`) reach the agent a seeded number of calls late.
//!
//! The audit: an answer the agent accepted must hand exactly the asking
//! container's share of its own pod's decision (devices, isolation, MPS
//! limits, time-slice memory); a pod without a valid decision of its own is
//! never answered; no GPU is held by more pods than their grants allow.
//! Refusals are safe and only counted.
//!
//! Three PodResources modes, one test each: the API lists active pods only
//! (current kubelets), it also lists pods the kubelet rejected (older
//! kubelets), or it cannot be read (the agent's state file alone remembers).
//!
//! Knobs (environment): `TESSERA_AGENT_CRASH_RUNS` (seeds per mode, default
//! 20), `TESSERA_AGENT_CRASH_SEED` (first seed, default 1),
//! `TESSERA_AGENT_CRASH_JOBS` (seeds run at once, default 4: a run mostly
//! waits, above all for the agent to shut down),
//! `TESSERA_AGENT_CRASH_EVENTS` (1: print every run's events). A failure names
//! the seed and shows the run's events; rerun one with
//! `TESSERA_AGENT_CRASH_SEED=<seed> TESSERA_AGENT_CRASH_RUNS=1`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tessera_core::allocation::{AllocatedGpu, Allocation, ContainerGrant};
use tessera_core::request::Isolation;
use tessera_node::deviceplugin::allocate::{Container, ContainerKind, PodInfo};
use tessera_node::proto::deviceplugin as pb;
use tessera_node::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use tessera_node::proto::podresources as prpb;
use tonic::transport::Channel;

const RES: &str = "tessera.io/gpu";
/// Device IDs per whole GPU the agent advertises (`slots` in the common config).
const SLOTS: u32 = 4;
const GPU_MEMORY_MIB: u64 = 81_920;
/// The whole GPUs of the common fake node (the third is in MIG mode and
/// advertises no `tessera.io/gpu` slots).
const WHOLE: [(u32, &str); 2] = [(0, GPU0), (1, GPU1)];

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// SplitMix64: small, seeded, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// What the kubelet's PodResources API shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing {
    /// The pods it reached that are still active (current kubelets list
    /// active pods only).
    Active,
    /// Also the pods it rejected, without devices (older kubelets list every
    /// pod in the pod manager).
    WithRejected,
    /// Not readable: every pending pod is a candidate to the agent.
    Unreadable,
}

/// Why a pod is on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Placed by the scheduler: carries its own signed decision.
    Granted,
    /// Created with `spec.nodeName` preset: no decision.
    Preset,
    /// Its decision is for another node.
    Foreign,
    /// Carries a copy of another pod's decision.
    Copied,
    /// Its decision is not signed with the scheduler's key.
    Forged,
}

struct TestPod {
    info: PodInfo,
    role: Role,
    /// The decision the scheduler wrote for this pod on this node (`Granted` only).
    own: Option<Allocation>,
}

impl TestPod {
    /// The asking containers in the kubelet's order, with their counts.
    fn askers(&self) -> Vec<(String, usize)> {
        let init = self
            .info
            .containers
            .iter()
            .filter(|c| c.kind != ContainerKind::App);
        let app = self
            .info
            .containers
            .iter()
            .filter(|c| c.kind == ContainerKind::App);
        init.chain(app)
            .filter_map(|c| Some((c.name.clone(), c.resources.get(RES)?.parse().ok()?)))
            .collect()
    }

    /// Device IDs the kubelet reserves for the pod: init containers reuse
    /// theirs for the containers after them.
    fn ids_needed(&self) -> usize {
        let asks = |kind: fn(&ContainerKind) -> bool| {
            self.info
                .containers
                .iter()
                .filter(move |c| kind(&c.kind))
                .filter_map(|c| c.resources.get(RES)?.parse::<usize>().ok())
        };
        let init = asks(|k| *k == ContainerKind::Init).max().unwrap_or(0);
        let rest: usize = asks(|k| *k != ContainerKind::Init).sum();
        init.max(rest)
    }
}

/// What an answer hands a container, as far as the audit compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Handed {
    devices: Vec<String>,
    envs: BTreeMap<String, String>,
}

const AUDITED_ENVS: [&str; 4] = [
    "TESSERA_ISOLATION",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "TESSERA_GPU_MEMORY_MIB",
];

impl Handed {
    fn observed(r: &pb::ContainerAllocateResponse) -> Handed {
        Handed {
            devices: mounted_devices(r).iter().map(|d| d.to_string()).collect(),
            envs: r
                .envs
                .iter()
                .filter(|(k, _)| AUDITED_ENVS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// What `container` of the pod `alloc` was written for must be handed:
    /// its GPUs, and the limits of the share (cores in per-mille, rounded up to
    /// whole percent; memory in MiB, per GPU by position).
    fn expected(alloc: &Allocation, container: &str) -> Option<Handed> {
        let gpus = alloc.gpus_of(container)?;
        let mut envs = BTreeMap::from([(
            "TESSERA_ISOLATION".to_string(),
            alloc.isolation.name().to_string(),
        )]);
        let memory: Vec<u64> = gpus.iter().map(|g| g.memory_mib).collect();
        match alloc.isolation {
            Isolation::Mps => {
                let milli = gpus.iter().map(|g| g.cores_milli).max().unwrap_or(1000);
                envs.insert(
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
                    milli.div_ceil(10).to_string(),
                );
                let limits: Vec<String> = memory
                    .iter()
                    .enumerate()
                    .map(|(i, m)| format!("{i}={m}M"))
                    .collect();
                envs.insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), limits.join(","));
            }
            Isolation::TimeSlice => {
                let mem: Vec<String> = memory.iter().map(u64::to_string).collect();
                envs.insert("TESSERA_GPU_MEMORY_MIB".into(), mem.join(","));
            }
            Isolation::Exclusive | Isolation::Mig => {}
        }
        Some(Handed {
            devices: gpus.iter().map(|g| g.uuid.clone()).collect(),
            envs,
        })
    }
}

impl std::fmt::Display for Handed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short: Vec<&str> = self
            .devices
            .iter()
            .map(|d| &d[d.len().saturating_sub(4)..])
            .collect();
        let envs: Vec<&str> = self
            .envs
            .iter()
            .filter(|(k, _)| *k != "TESSERA_ISOLATION")
            .map(|(_, v)| v.as_str())
            .collect();
        write!(
            f,
            "{} [{}] {}",
            self.envs.get("TESSERA_ISOLATION").map_or("?", |s| s),
            short.join(","),
            envs.join(" ")
        )
    }
}

/// One whole GPU as the scheduler's ledger sees it while placing the run's pods.
#[derive(Debug, Clone, Default)]
struct Ledger {
    isolation: Option<Isolation>,
    cores_milli: u32,
    memory_mib: u64,
}

impl Ledger {
    fn is_free(&self) -> bool {
        self.isolation.is_none()
    }
    fn fits(&self, isolation: Isolation, cores_milli: u32, memory_mib: u64) -> bool {
        self.isolation.is_none_or(|i| i == isolation)
            && self.cores_milli + cores_milli <= 1000
            && self.memory_mib + memory_mib <= GPU_MEMORY_MIB
    }
    fn take(&mut self, g: &AllocatedGpu, isolation: Isolation) {
        self.isolation = Some(isolation);
        self.cores_milli += g.cores_milli;
        self.memory_mib += g.memory_mib;
    }
}

fn asking(name: &str, kind: ContainerKind, n: usize) -> Container {
    Container::new(name, kind, &[(RES, &n.to_string())])
}

/// A pod placed the way the scheduler would, on what `ledger` has left, or
/// `None` when nothing fits. Every share's memory is unique to the pod, so an
/// answer carrying another pod's share cannot pass for this one's.
fn place(
    rng: &mut Rng,
    i: usize,
    ledger: &mut [Ledger; 2],
) -> Option<(Vec<Container>, Allocation)> {
    let uid = format!("uid-p{i}");
    let whole = |k: usize| grant(WHOLE[k].0, WHOLE[k].1, GPU_MEMORY_MIB, 1000);
    let share = |rng: &mut Rng, k: usize| {
        grant(
            WHOLE[k].0,
            WHOLE[k].1,
            4096 + 256 * i as u64,
            100 + 50 * rng.below(4) as u32,
        )
    };
    let main = |n: usize| vec![asking("main", ContainerKind::App, n)];
    let two_apps = || {
        vec![
            asking("a", ContainerKind::App, 1),
            asking("b", ContainerKind::App, 1),
        ]
    };
    let init_two_then_one = || {
        vec![
            asking("load", ContainerKind::Init, 2),
            asking("main", ContainerKind::App, 1),
        ]
    };
    let free: Vec<usize> = (0..2).filter(|k| ledger[*k].is_free()).collect();
    // (containers, isolation, gpus, which container gets which of them)
    type Shape = (
        Vec<Container>,
        Isolation,
        Vec<AllocatedGpu>,
        Vec<ContainerGrant>,
    );
    let each = |names: &[(&str, Vec<u32>)]| -> Vec<ContainerGrant> {
        names
            .iter()
            .map(|(n, g)| ContainerGrant {
                name: n.to_string(),
                gpus: g.clone(),
            })
            .collect()
    };
    let wanted = rng.below(20);
    let shape: Option<Shape> = match wanted {
        0 | 1 if !free.is_empty() => {
            let k = free[rng.below(free.len() as u64) as usize];
            Some((main(1), Isolation::Exclusive, vec![whole(k)], Vec::new()))
        }
        2 if free.len() == 2 => Some((
            main(2),
            Isolation::Exclusive,
            vec![whole(0), whole(1)],
            Vec::new(),
        )),
        3 if free.len() == 2 => Some((
            two_apps(),
            Isolation::Exclusive,
            vec![whole(0), whole(1)],
            each(&[("a", vec![0]), ("b", vec![1])]),
        )),
        // An init container preparing on both GPUs, then the app on the first.
        6 if free.len() == 2 => Some((
            init_two_then_one(),
            Isolation::Exclusive,
            vec![whole(0), whole(1)],
            each(&[("load", vec![0, 1]), ("main", vec![0])]),
        )),
        4..=7 => {
            let (g0, g1) = (share(rng, 0), share(rng, 1));
            let fits = |k: usize, g: &AllocatedGpu| {
                ledger[k].fits(Isolation::Mps, g.cores_milli, g.memory_mib)
            };
            (fits(0, &g0) && fits(1, &g1)).then(|| {
                if wanted <= 5 {
                    (
                        two_apps(),
                        Isolation::Mps,
                        vec![g0, g1],
                        each(&[("a", vec![0]), ("b", vec![1])]),
                    )
                } else {
                    (
                        init_two_then_one(),
                        Isolation::Mps,
                        vec![g0, g1],
                        each(&[("load", vec![0, 1]), ("main", vec![0])]),
                    )
                }
            })
        }
        _ => None,
    };
    let shape = shape.or_else(|| {
        // A share on one GPU: MPS or time slicing, some with an init container
        // that loads data on the same share first.
        let isolation = if rng.chance(65) {
            Isolation::Mps
        } else {
            Isolation::TimeSlice
        };
        let k = rng.below(2) as usize;
        let g = share(rng, k);
        let k = [k, 1 - k]
            .into_iter()
            .find(|k| ledger[*k].fits(isolation, g.cores_milli, g.memory_mib))?;
        let g = AllocatedGpu {
            index: WHOLE[k].0,
            uuid: WHOLE[k].1.into(),
            ..g
        };
        Some(if wanted >= 17 {
            (
                vec![
                    asking("load", ContainerKind::Init, 1),
                    asking("main", ContainerKind::App, 1),
                ],
                isolation,
                vec![g],
                each(&[("load", vec![0]), ("main", vec![0])]),
            )
        } else {
            (main(1), isolation, vec![g], Vec::new())
        })
    })?;
    let (containers, isolation, gpus, grants) = shape;
    for g in &gpus {
        let k = WHOLE.iter().position(|w| w.1 == g.uuid).unwrap();
        ledger[k].take(g, isolation);
    }
    let mut alloc = decision(&uid, NODE, isolation, gpus);
    alloc.containers = grants;
    Some((containers, alloc))
}

fn pod_info(
    name: &str,
    created: i64,
    containers: Vec<Container>,
    annotation: Option<String>,
) -> PodInfo {
    let mut p = pod(&format!("uid-{name}"), name, created, RES, 1, annotation);
    p.containers = containers;
    p
}

/// The node's pods for one run: placed pods, then the adversarial ones.
fn pods_for(rng: &mut Rng) -> Vec<TestPod> {
    let mut ledger: [Ledger; 2] = Default::default();
    let mut out: Vec<TestPod> = Vec::new();
    let wanted = 6 + rng.below(7) as usize;
    // Until the node is full: a pod that does not fit is not placed here.
    for i in 0..3 * wanted {
        if out.len() == wanted {
            break;
        }
        let Some((containers, alloc)) = place(rng, i, &mut ledger) else {
            continue;
        };
        out.push(TestPod {
            info: pod_info(
                &format!("p{i}"),
                i as i64,
                containers,
                Some(alloc.encode_signed(KEY)),
            ),
            role: Role::Granted,
            own: Some(alloc),
        });
    }
    let created = out.len() as i64;
    let one_or_two = |rng: &mut Rng| 1 + rng.below(2) as usize;
    if rng.chance(60) {
        let n = one_or_two(rng);
        out.push(TestPod {
            info: pod_info(
                "preset",
                created,
                vec![asking("main", ContainerKind::App, n)],
                None,
            ),
            role: Role::Preset,
            own: None,
        });
    }
    if rng.chance(50) {
        let d = decision(
            "uid-foreign",
            "gpu-node-9",
            Isolation::Exclusive,
            vec![grant(0, GPU0, GPU_MEMORY_MIB, 1000)],
        );
        out.push(TestPod {
            info: pod_info(
                "foreign",
                created + 1,
                vec![asking("main", ContainerKind::App, 1)],
                Some(d.encode_signed(KEY)),
            ),
            role: Role::Foreign,
            own: None,
        });
    }
    if rng.chance(50) && !out.is_empty() {
        // Same containers and asks as the pod it copied from: only the UID
        // inside the decision tells them apart.
        let from = &out[rng.below(out.len() as u64) as usize];
        if from.role == Role::Granted {
            let copy = pod_info(
                "copy",
                created + 2,
                from.info.containers.clone(),
                from.info.annotations.values().next().cloned(),
            );
            out.push(TestPod {
                info: copy,
                role: Role::Copied,
                own: None,
            });
        }
    }
    if rng.chance(40) {
        let d = decision(
            "uid-forged",
            NODE,
            Isolation::Exclusive,
            vec![grant(1, GPU1, GPU_MEMORY_MIB, 1000)],
        );
        out.push(TestPod {
            info: pod_info(
                "forged",
                created + 3,
                vec![asking("main", ContainerKind::App, 1)],
                Some(d.encode_signed(b"a-guess")),
            ),
            role: Role::Forged,
            own: None,
        });
    }
    out
}

/// Where the kubelet is with a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    Unreached,
    Admitting,
    Admitted,
    Rejected,
}

/// The kubelet's side: what it reached, the device IDs it handed out, and
/// what its PodResources API shows.
struct Kubelet {
    fate: Vec<Fate>,
    /// Per pod: container → the device IDs its `Allocate` succeeded with.
    held: Vec<BTreeMap<String, Vec<String>>>,
    /// Per pod: device IDs reserved for it.
    reserved: Vec<Vec<String>>,
    free: Vec<String>,
}

impl Kubelet {
    fn new(pods: usize) -> Kubelet {
        let free = WHOLE
            .iter()
            .flat_map(|(_, uuid)| (0..SLOTS).map(move |s| format!("{uuid}::{s}")))
            .collect();
        Kubelet {
            fate: vec![Fate::Unreached; pods],
            held: vec![BTreeMap::new(); pods],
            reserved: vec![Vec::new(); pods],
            free,
        }
    }

    fn reject(&mut self, i: usize) {
        self.fate[i] = Fate::Rejected;
        self.held[i].clear();
        self.free.append(&mut self.reserved[i]);
    }

    /// The PodResources `List` answer. Regular init containers are not
    /// listed (the kubelet lists app containers and sidecars only).
    fn list(&self, pods: &[TestPod], listing: Listing) -> Option<Vec<prpb::PodResources>> {
        let shown = |f: &Fate| match listing {
            Listing::Active => matches!(f, Fate::Admitting | Fate::Admitted),
            Listing::WithRejected => *f != Fate::Unreached,
            Listing::Unreadable => false,
        };
        (listing != Listing::Unreadable).then(|| {
            pods.iter()
                .enumerate()
                .filter(|(i, _)| shown(&self.fate[*i]))
                .map(|(i, p)| prpb::PodResources {
                    name: p.info.name.clone(),
                    namespace: p.info.namespace.clone(),
                    containers: p
                        .info
                        .containers
                        .iter()
                        .filter(|c| c.kind != ContainerKind::Init)
                        .map(|c| prpb::ContainerResources {
                            name: c.name.clone(),
                            devices: self.held[i]
                                .get(&c.name)
                                .map(|ids| prpb::ContainerDevices {
                                    resource_name: RES.into(),
                                    device_ids: ids.clone(),
                                    topology: None,
                                })
                                .into_iter()
                                .collect(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect()
        })
    }
}

/// The agent under test and the kubelet's connection to its `tessera.io/gpu` plugin.
struct Plugin {
    agent: Agent,
    client: DevicePluginClient<Channel>,
}

async fn start(dir: &Path, kubelet: &mut common::Kubelet) -> Plugin {
    let state = dir.join("state/allocate.json");
    let agent = start_agent_tweaked(dir, Duration::from_secs(3600), "volume-mounts", |c| {
        c.allocate_state = Some(state)
    });
    // The kubelet calls a plugin once it has registered.
    while next_register(kubelet).await.resource_name != RES {}
    let deadline = Instant::now() + WAIT;
    let client = loop {
        match dial(&dir.join("tessera-gpu.sock")).await {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => panic!("cannot dial the plugin: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    Plugin { agent, client }
}

/// Stops the agent; registrations still queued are the old agent's.
async fn kill(plugin: Plugin, kubelet: &mut common::Kubelet) {
    drop(plugin.client);
    stop_agent(plugin.agent).await;
    while kubelet.seen.try_recv().is_ok() {}
}

#[derive(Debug, Default)]
struct Tally {
    restarts: u64,
    /// Calls the kubelet made while the agent was down (they fail).
    down_calls: u64,
    calls: u64,
    accepted: u64,
    refused: u64,
    violations: Vec<String>,
    events: Vec<String>,
}

/// Checks one accepted answer; returns what is wrong with it.
fn audit_answer(pods: &[TestPod], i: usize, container: &str, got: &Handed) -> Option<String> {
    let p = &pods[i];
    let whose = || {
        pods.iter()
            .filter_map(|q| Some((q, q.own.as_ref()?)))
            .flat_map(|(q, a)| {
                q.askers()
                    .into_iter()
                    .filter(|(c, _)| Handed::expected(a, c).as_ref() == Some(got))
                    .map(|(c, _)| format!("{}/{c}", q.info.name))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    match &p.own {
        None => Some(format!(
            "{}/{container} ({:?}, no valid decision of its own) was answered {got} (the grant of: {})",
            p.info.name,
            p.role,
            whose()
        )),
        Some(a) => {
            let want = Handed::expected(a, container);
            (want.as_ref() != Some(got)).then(|| {
                format!(
                    "{}/{container} was answered {got}, its own grant is {} (the answer is the grant of: {})",
                    p.info.name,
                    want.map_or_else(|| "none".to_string(), |w| w.to_string()),
                    whose()
                )
            })
        }
    }
}

/// No GPU held by more pods than the grants their answers carry allow (an
/// answer that is nobody's grant counts as the whole GPU).
fn audit_capacity(pods: &[TestPod], handed: &BTreeMap<(usize, String), Handed>) -> Vec<String> {
    // GPU → pod → (isolation, cores in per-mille) of what it was handed there.
    let mut holders: BTreeMap<&str, BTreeMap<usize, (Isolation, u32)>> = BTreeMap::new();
    for ((i, _), h) in handed {
        let carried = pods.iter().find_map(|q| {
            let a = q.own.as_ref()?;
            q.askers()
                .iter()
                .any(|(c, _)| Handed::expected(a, c).as_ref() == Some(h))
                .then_some(a)
        });
        for d in &h.devices {
            let amount = carried
                .and_then(|a| {
                    let g = a.gpus.iter().find(|g| &g.uuid == d)?;
                    Some((a.isolation, g.cores_milli))
                })
                .unwrap_or((Isolation::Exclusive, 1000));
            holders.entry(d).or_default().insert(*i, amount);
        }
    }
    let mut out = Vec::new();
    for (gpu, who) in holders {
        let exclusive = who.values().any(|g| g.0 == Isolation::Exclusive);
        let cores: u32 = who.values().map(|g| g.1).sum();
        if (exclusive && who.len() > 1) || cores > 1000 {
            let held: Vec<String> = who
                .iter()
                .map(|(i, (iso, milli))| format!("{} ({} {milli})", pods[*i].info.name, iso.name()))
                .collect();
            out.push(format!(
                "GPU {gpu} held by {}: more than their grants allow",
                held.join(", ")
            ));
        }
    }
    out
}

async fn run_seed(seed: u64, listing: Listing) -> Tally {
    let mut rng = Rng::new(seed);
    let mut pods = pods_for(&mut rng);
    let mut order: Vec<usize> = (0..pods.len()).collect();
    rng.shuffle(&mut order);
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet_reg = start_kubelet(dir.path());
    let mut kubelet = Kubelet::new(pods.len());
    let mut tally = Tally::default();
    let mut handed: BTreeMap<(usize, String), Handed> = BTreeMap::new();
    // Phase changes the API server has not delivered to the agent yet: (due call, pod, phase).
    let mut phases: Vec<(u64, usize, &str)> = Vec::new();
    let mut step = 0u64;
    let mut plugin = start(dir.path(), &mut kubelet_reg).await;
    let lag = |rng: &mut Rng, step: u64| step + rng.below(6);

    for &i in &order {
        step += 1;
        let name = pods[i].info.name.clone();
        let needed = pods[i].ids_needed();
        if needed > kubelet.free.len() || rng.chance(10) {
            kubelet.reject(i);
            phases.push((lag(&mut rng, step), i, "Failed"));
            tally.events.push(format!(
                "{step}: kubelet rejects {name} without a call ({} device IDs free, {needed} needed)",
                kubelet.free.len()
            ));
            continue;
        }
        kubelet.fate[i] = Fate::Admitting;
        kubelet.reserved[i] = kubelet.free.drain(..needed).collect();
        let mut ok = true;
        let mut next_id = 0;
        for (container, count) in pods[i].askers() {
            step += 1;
            // Init containers' device IDs are reused by the containers after them.
            let init = pods[i]
                .info
                .containers
                .iter()
                .any(|c| c.name == container && c.kind == ContainerKind::Init);
            let ids: Vec<String> = kubelet.reserved[i][next_id..next_id + count].to_vec();
            if !init {
                next_id += count;
            }
            let mut down = false;
            if rng.chance(25) {
                kill(plugin, &mut kubelet_reg).await;
                tally.restarts += 1;
                // Sometimes the kubelet calls before the agent is back: the call
                // fails and the pod's admission with it, part-way or not.
                if rng.chance(30) {
                    down = true;
                    let answered = match dial(&dir.path().join("tessera-gpu.sock")).await {
                        Ok(mut gone) => {
                            let ids = refs(&ids);
                            let r = tokio::time::timeout(WAIT, allocate(&mut gone, &ids)).await;
                            matches!(r, Ok(Ok(_)))
                        }
                        Err(_) => false,
                    };
                    assert!(!answered, "seed {seed}: a stopped agent answered");
                    tally.down_calls += 1;
                }
                tally.events.push(format!(
                    "{step}: agent restarted{}",
                    if down {
                        format!("; the call for {name}/{container} came while it was down")
                    } else {
                        String::new()
                    }
                ));
                plugin = start(dir.path(), &mut kubelet_reg).await;
            }
            if down {
                ok = false;
                break;
            }
            // What the agent reads now.
            let mut due = Vec::new();
            phases.retain(|(at, p, phase)| {
                let now = *at <= step;
                if now {
                    due.push((*p, *phase));
                }
                !now
            });
            for (p, phase) in due {
                pods[p].info.phase = phase.to_string();
            }
            plugin
                .agent
                .pods
                .set(pods.iter().map(|p| p.info.clone()).collect());
            if let Some(list) = kubelet.list(&pods, listing) {
                plugin.agent.kubelet.set(list);
            }
            tally.calls += 1;
            let r = tokio::time::timeout(WAIT, allocate(&mut plugin.client, &refs(&ids)))
                .await
                .unwrap_or_else(|_| panic!("seed {seed}: Allocate for {name}/{container} hung"));
            match r {
                Ok(r) => {
                    tally.accepted += 1;
                    let got = Handed::observed(&r);
                    tally
                        .events
                        .push(format!("{step}: {name}/{container} asks {count}: {got}"));
                    if let Some(v) = audit_answer(&pods, i, &container, &got) {
                        tally.violations.push(format!("step {step}: {v}"));
                    }
                    handed.insert((i, container.clone()), got);
                    tally.violations.extend(
                        audit_capacity(&pods, &handed)
                            .into_iter()
                            .map(|v| format!("step {step}: {v}")),
                    );
                    kubelet.held[i].insert(container, ids);
                }
                Err(e) => {
                    tally.refused += 1;
                    tally.events.push(format!(
                        "{step}: {name}/{container} asks {count}: refused: {}",
                        e.message()
                    ));
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            kubelet.fate[i] = Fate::Admitted;
            phases.push((lag(&mut rng, step), i, "Running"));
        } else {
            kubelet.reject(i);
            handed.retain(|(p, _), _| *p != i);
            phases.push((lag(&mut rng, step), i, "Failed"));
        }
    }
    stop_agent(plugin.agent).await;
    let _ = kubelet_reg.stop.send(());
    tally
}

fn refs(ids: &[String]) -> Vec<&str> {
    ids.iter().map(String::as_str).collect()
}

/// Runs the seeds, each on its own runtime (so every agent's sockets and
/// tasks end with its run), `TESSERA_AGENT_CRASH_JOBS` at once.
fn volume(listing: Listing) {
    let runs: u64 = env("TESSERA_AGENT_CRASH_RUNS", 20);
    let first: u64 = env("TESSERA_AGENT_CRASH_SEED", 1);
    let jobs: u64 = env("TESSERA_AGENT_CRASH_JOBS", 4);
    let verbose = env("TESSERA_AGENT_CRASH_EVENTS", 0) == 1;
    let started = Instant::now();
    let next = AtomicU64::new(first);
    let results: Mutex<Vec<(u64, Tally)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= first + runs {
                        break;
                    }
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .unwrap();
                    let tally = rt.block_on(run_seed(seed, listing));
                    if verbose {
                        eprintln!("{listing:?} seed {seed}:\n  {}", tally.events.join("\n  "));
                    }
                    results.lock().unwrap().push((seed, tally));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let sum = |f: fn(&Tally) -> u64| results.iter().map(|(_, t)| f(t)).sum::<u64>();
    let violations: usize = results.iter().map(|(_, t)| t.violations.len()).sum();
    eprintln!(
        "agent restart ({listing:?} PodResources): {runs} runs, {} restarts ({} with a call while down), {} Allocate calls ({} answered, {} refused), {violations} violations, {:.1?}",
        sum(|t| t.restarts),
        sum(|t| t.down_calls),
        sum(|t| t.calls),
        sum(|t| t.accepted),
        sum(|t| t.refused),
        started.elapsed()
    );
    let failed: Vec<String> = results
        .iter()
        .filter(|(_, t)| !t.violations.is_empty())
        .map(|(seed, t)| {
            format!(
                "seed {seed}: {}\n  events:\n    {}",
                t.violations.join("\n  "),
                t.events.join("\n    ")
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {runs} runs ({listing:?} PodResources) handed a pod what its grant does not allow (rerun one with TESSERA_AGENT_CRASH_SEED=<seed> TESSERA_AGENT_CRASH_RUNS=1):\n{}",
        failed.len(),
        failed
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn restarts_between_allocate_calls_hand_no_pod_another_pods_grant() {
    volume(Listing::Active);
}

#[test]
fn restarts_with_rejected_pods_still_listed_hand_no_pod_another_pods_grant() {
    volume(Listing::WithRejected);
}

#[test]
fn restarts_without_pod_resources_hand_no_pod_another_pods_grant() {
    volume(Listing::Unreadable);
}
