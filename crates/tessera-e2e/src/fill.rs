//! The DRA fill on a real control plane (issue 38, "DRA side by side"): the
//! simulator's *dra* experiment ([`tessera_sim`'s fill protocol]) run for real.
//!
//! GPU pods of the openb trace (`../shared/data/openb/openb_pod_list_default.csv`),
//! shuffled by a seed, are submitted one at a time, each with a ResourceClaim of
//! its own: a whole-GPU pod asks `count` devices of `gpu.tessera.io`, a share asks
//! one device with `capacity.requests` memory (its per-mille of the GPU's 80 GiB)
//! and compute (its per-mille). Each pod also asks its CPU and memory, so a node's
//! CPU can strand its GPUs as in the trace. After each pod the run waits until it
//! is bound or its scheduler has written `PodScheduled=False`. Submission stops once
//! the GPUs asked, bound or not, reach the cluster's total (arrived workload =
//! 100 %, FGD's protocol); the pods never leave. The figure is the GPU capacity
//! left unallocated then: total GPUs minus what the bound pods hold.
//!
//! [`tessera_sim`'s fill protocol]: ../../tessera-sim/src/experiment/fill.rs

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// An A100-80GB's memory in MiB, as the fake backend reports it.
pub const GPU_MIB: u64 = 81920;

/// One GPU pod of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Whole GPUs (0 for a share).
    pub gpus: u64,
    /// Per-mille of one GPU (a share; 0 for whole GPUs).
    pub share_milli: u64,
}

impl TracePod {
    /// The GPUs it asks, in thousandths.
    pub fn milli(&self) -> u64 {
        if self.gpus > 0 {
            self.gpus * 1000
        } else {
            self.share_milli
        }
    }
}

/// The GPU pods of an openb pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,…`).
pub fn read_trace(path: &Path) -> Result<Vec<TracePod>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().context("empty trace")?.split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| anyhow!("{}: no column {name}", path.display()))
    };
    let (n, c, m, g, gm) = (
        col("name")?,
        col("cpu_milli")?,
        col("memory_mib")?,
        col("num_gpu")?,
        col("gpu_milli")?,
    );
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        let num = |k: usize| -> Result<u64> {
            f.get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("{} line {}: bad field {k}", path.display(), i + 2))
        };
        let (gpus, milli) = (num(g)?, num(gm)?);
        if gpus == 0 || milli == 0 {
            continue;
        }
        out.push(TracePod {
            name: f[n].to_string(),
            cpu_milli: num(c)?,
            memory_mib: num(m)?,
            gpus: if milli >= 1000 { gpus } else { 0 },
            share_milli: if milli >= 1000 { 0 } else { milli },
        });
    }
    Ok(out)
}

/// kube-scheduler's default profile (its DRA plugin on), no leader election.
pub const DEFAULT_KUBE_SCHEDULER: &str = "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
";

/// splitmix64: seeded draws (the arrival order is a Fisher–Yates shuffle by
/// them), the same for both arms.
pub fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The trace's GPU pods in the order of `seed`, as many as arrive before the GPUs
/// asked reach `total_gpus` (the pod that crosses it included) and that fit
/// a node of `node_gpus` GPUs at all.
pub fn arrivals(trace: &[TracePod], seed: u64, total_gpus: u64, node_gpus: u64) -> Vec<TracePod> {
    let mut pods: Vec<TracePod> = trace
        .iter()
        .filter(|p| p.gpus <= node_gpus)
        .cloned()
        .collect();
    let mut s = seed;
    for i in (1..pods.len()).rev() {
        let j = (next(&mut s) % (i as u64 + 1)) as usize;
        pods.swap(i, j);
    }
    let mut asked = 0;
    let mut out = Vec::new();
    for p in pods {
        if asked >= total_gpus * 1000 {
            break;
        }
        asked += p.milli();
        out.push(p);
    }
    out
}

/// `resourceclaims` of `resource.k8s.io/v1`.
pub fn claims_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceClaim"),
        "resourceclaims",
    )
}

/// The claim of pod `k` of the run: `count` whole GPUs, or one share.
pub fn claim(name: &str, p: &TracePod) -> Value {
    let exactly = if p.gpus > 0 {
        json!({"deviceClassName": "gpu.tessera.io", "count": p.gpus})
    } else {
        let mib = (p.share_milli * GPU_MIB).div_ceil(1000);
        json!({"deviceClassName": "gpu.tessera.io", "count": 1,
               "capacity": {"requests": {"memory": format!("{mib}Mi"), "compute": p.share_milli.to_string()}}})
    };
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
}

/// Pod `name` of `scheduler` using claim `name`, asking the trace pod's CPU and memory.
pub fn pod(name: &str, scheduler: &str, p: &TracePod) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
            "labels": {"e2e.tessera.io/trace-pod": p.name}},
        "spec": {"schedulerName": scheduler, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                "resources": {"requests": {"cpu": format!("{}m", p.cpu_milli), "memory": format!("{}Mi", p.memory_mib)},
                              "claims": [{"name": "gpu"}]}}]}})
}

/// How one pod ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Bound {
        node: String,
        after: Duration,
    },
    /// `PodScheduled=False` (reason, message).
    Unschedulable(String),
}

fn outcome(p: &Pod, created: Instant) -> Option<Outcome> {
    if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
        return Some(Outcome::Bound {
            node: n,
            after: created.elapsed(),
        });
    }
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(Outcome::Unschedulable(format!(
        "{}: {}",
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default()
    )))
}

/// What one arm's run gave.
#[derive(Debug, Clone, Default)]
pub struct FillRun {
    pub submitted: usize,
    pub bound: usize,
    /// Thousandths of a GPU asked by all submitted pods / held by the bound ones.
    pub asked_milli: u64,
    pub bound_milli: u64,
    pub total_gpus: u64,
    /// Bind latency of the bound pods (from their creation).
    pub bind_latency: Vec<Duration>,
    pub wall: Duration,
    /// The first few unschedulable reasons, by count.
    pub reasons: BTreeMap<String, usize>,
}

impl FillRun {
    /// Unallocated GPU capacity at the end, in GPUs.
    pub fn unallocated(&self) -> f64 {
        (self.total_gpus * 1000).saturating_sub(self.bound_milli) as f64 / 1000.0
    }
}

/// Submits `pods` one at a time to `scheduler`, each after the previous one's
/// outcome (within `each`).
pub async fn run(
    client: &Client,
    scheduler: &str,
    pods: &[TracePod],
    total_gpus: u64,
    each: Duration,
) -> Result<FillRun> {
    let claims: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &claims_resource());
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut r = FillRun {
        total_gpus,
        ..FillRun::default()
    };
    let t0 = Instant::now();
    for (k, p) in pods.iter().enumerate() {
        let name = format!("fill-{k:03}");
        let c: DynamicObject = serde_json::from_value(claim(&name, p))?;
        claims
            .create(&PostParams::default(), &c)
            .await
            .with_context(|| format!("claim {name}"))?;
        let created = Instant::now();
        let body: Pod = serde_json::from_value(pod(&name, scheduler, p))?;
        api.create(&PostParams::default(), &body)
            .await
            .with_context(|| format!("pod {name}"))?;
        r.submitted += 1;
        r.asked_milli += p.milli();
        let end = loop {
            let now = api.get(&name).await?;
            match outcome(&now, created) {
                // Tried before its claim reached the scheduler's watch: it waits
                // for it, which is not the pod's outcome.
                Some(Outcome::Unschedulable(why)) if why.contains("does not exist (yet)") => {}
                Some(o) => break o,
                None => {}
            }
            if created.elapsed() > each {
                bail!(
                    "pod {name} ({p:?}): neither bound nor PodScheduled=False within {} s",
                    each.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        match end {
            Outcome::Bound { after, .. } => {
                r.bound += 1;
                r.bound_milli += p.milli();
                r.bind_latency.push(after);
            }
            Outcome::Unschedulable(why) => {
                let short: String = why.chars().take(120).collect();
                *r.reasons.entry(short).or_default() += 1;
            }
        }
    }
    r.wall = t0.elapsed();
    Ok(r)
}

/// What [`audit_claims`] found in the stored claims.
#[derive(Debug, Clone, Default)]
pub struct ClaimAudit {
    /// Allocated results checked.
    pub results: usize,
    /// Devices held beyond what they allow, each with its holders.
    pub violations: Vec<(String, Vec<String>)>,
}

/// Every allocated claim's devices within what they allow, from the stored
/// claims: a device without consumed capacity (a whole allocation) in one claim
/// only; the shares of a device within its memory and 1000 per-mille of compute.
pub async fn audit_claims(client: &Client, gpu_mib: u64) -> Result<ClaimAudit> {
    let claims: Api<DynamicObject> = Api::all_with(client.clone(), &claims_resource());
    let list = claims.list(&ListParams::default()).await?;
    let mut whole: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut shares: BTreeMap<String, (u64, u64, Vec<String>)> = BTreeMap::new();
    let mut audit = ClaimAudit::default();
    for c in &list.items {
        let name = c.metadata.name.clone().unwrap_or_default();
        let results = c
            .data
            .pointer("/status/allocation/devices/results")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for res in results {
            audit.results += 1;
            let key = format!(
                "{}/{}/{}",
                res["driver"].as_str().unwrap_or(""),
                res["pool"].as_str().unwrap_or(""),
                res["device"].as_str().unwrap_or("")
            );
            match res.get("consumedCapacity") {
                None => whole.entry(key).or_default().push(name.clone()),
                Some(cc) => {
                    let mem = cc["memory"]
                        .as_str()
                        .and_then(tessera_node::dra::prepare::quantity_mib)
                        .ok_or_else(|| anyhow!("claim {name}: memory {cc}"))?;
                    let compute: u64 = cc["compute"]
                        .as_str()
                        .and_then(tessera_node::dra::prepare::quantity_count)
                        .ok_or_else(|| anyhow!("claim {name}: compute {cc}"))?;
                    let e = shares.entry(key).or_default();
                    e.0 += mem;
                    e.1 += compute;
                    e.2.push(name.clone());
                }
            }
        }
    }
    for (d, holders) in &whole {
        if holders.len() > 1 || shares.contains_key(d) {
            let mut all = holders.clone();
            all.extend(shares.get(d).map(|s| s.2.clone()).unwrap_or_default());
            audit.violations.push((d.clone(), all));
        }
    }
    for (d, (mem, compute, holders)) in &shares {
        if (*mem > gpu_mib || *compute > 1000) && !whole.contains_key(d) {
            audit.violations.push((
                format!("{d} ({mem} MiB, {compute} per-mille)"),
                holders.clone(),
            ));
        }
    }
    Ok(audit)
}
