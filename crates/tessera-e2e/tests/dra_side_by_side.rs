//! DRA side by side (issue 38): the same fake cluster (8 nodes of 8 A100-80GB,
//! consumable capacity on, 96 CPUs each) and the same seeded arrivals of openb
//! GPU pods with claims ([`tessera_e2e::fill`]), once placed by kube-scheduler's
//! own DRA plugin and once by Tessera `--mode standalone --dra`, each on a fresh
//! control plane. Submission stops at arrived GPUs = 100 % of the cluster's;
//! the figure is the GPU capacity left unallocated, summed over seeds. Tessera
//! must leave at least 25 % less, as the simulator's *dra* experiment predicts.
//! Every run's stored claims are audited: no device beyond what it allows.
//!
//! `TESSERA_E2E_FILL_SEEDS` (default `1,…,12`: single seeds differ by one large
//! pod, so the figure is a sum) picks the seeds.

use std::path::PathBuf;
use std::time::Duration;

use tessera_e2e::SERIAL;
use tessera_e2e::dra::{env_at_least, install_dra_chart, start_dra_nodes};
use tessera_e2e::fill::{
    DEFAULT_KUBE_SCHEDULER, FillRun, GPU_MIB, TracePod, arrivals, audit_claims, read_trace, run,
};
use tessera_e2e::plane::{ControlPlane, Env, Identity, Options, repo_root};
use tessera_e2e::tessera::{start_scheduler, write_key};

const NODES: usize = 8;
const GPUS_PER_NODE: usize = 8;
const NODE_CPUS: u32 = 96;

fn trace() -> Vec<TracePod> {
    let path: PathBuf = repo_root().join("../shared/data/openb/openb_pod_list_default.csv");
    read_trace(&path).unwrap()
}

/// One arm on a fresh control plane: `tessera` (standalone `--dra`) or kube-scheduler.
async fn arm(env: &Env, tessera: bool, pods: &[TracePod]) -> FillRun {
    let mut plane = ControlPlane::start(
        env,
        Options {
            kube_scheduler: (!tessera)
                .then(|| (DEFAULT_KUBE_SCHEDULER.to_string(), Identity::KubeScheduler)),
            ..Options::default()
        },
    )
    .await
    .unwrap();
    install_dra_chart(&plane).unwrap();
    let _scheduler = if tessera {
        let key = write_key(&plane).unwrap();
        Some(
            start_scheduler(
                &mut plane,
                "standalone",
                &key,
                &["--leader-elect=false", "--dra"],
            )
            .await
            .unwrap(),
        )
    } else {
        None
    };
    let _nodes = start_dra_nodes(
        &mut plane,
        NODES,
        GPUS_PER_NODE,
        "consumable-capacity",
        Some(NODE_CPUS),
    )
    .await
    .unwrap();
    let admin = plane.client(Identity::Admin).await.unwrap();
    let scheduler = if tessera {
        "tessera"
    } else {
        "default-scheduler"
    };
    let total = (NODES * GPUS_PER_NODE) as u64;
    let r = run(&admin, scheduler, pods, total, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{scheduler}: {e:#}"));
    let audit = audit_claims(&admin, GPU_MIB).await.unwrap();
    assert!(
        audit.violations.is_empty(),
        "{scheduler}: {:?}",
        audit.violations
    );
    let checked = audit.results;
    println!(
        "{scheduler}: {} pods submitted ({:.2} GPUs asked), {} bound ({:.2} GPUs), {:.2} of {total} GPUs unallocated; {checked} allocated results audited; median bind {:.2} s; {:.0} s",
        r.submitted,
        r.asked_milli as f64 / 1000.0,
        r.bound,
        r.bound_milli as f64 / 1000.0,
        r.unallocated(),
        median(&r.bind_latency),
        r.wall.as_secs_f64()
    );
    for (why, n) in &r.reasons {
        println!("  {n} × {why}");
    }
    r
}

fn median(v: &[Duration]) -> f64 {
    let mut s: Vec<f64> = v.iter().map(Duration::as_secs_f64).collect();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::test]
async fn tessera_leaves_less_unallocated_than_kube_schedulers_dra_plugin() {
    let Some(env) = env_at_least(
        "dra_side_by_side::tessera_leaves_less_unallocated_than_kube_schedulers_dra_plugin",
        36,
        "consumable capacity (beta, on by default)",
    ) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let seeds: Vec<u64> = std::env::var("TESSERA_E2E_FILL_SEEDS")
        .unwrap_or_else(|_| "1,2,3,4,5,6,7,8,9,10,11,12".into())
        .split(',')
        .map(|s| s.trim().parse().expect("TESSERA_E2E_FILL_SEEDS: numbers"))
        .collect();
    let trace = trace();
    let total = (NODES * GPUS_PER_NODE) as u64;
    let (mut kube, mut ours) = (0.0, 0.0);
    println!(
        "| seed | pods | kube-scheduler bound | kube unallocated GPUs | Tessera bound | Tessera unallocated GPUs |"
    );
    let mut rows = Vec::new();
    for &seed in &seeds {
        let pods = arrivals(&trace, seed, total, GPUS_PER_NODE as u64);
        let k = arm(&env, false, &pods).await;
        let t = arm(&env, true, &pods).await;
        kube += k.unallocated();
        ours += t.unallocated();
        rows.push(format!(
            "| {seed} | {} | {} | {:.2} | {} | {:.2} |",
            pods.len(),
            k.bound,
            k.unallocated(),
            t.bound,
            t.unallocated()
        ));
    }
    for r in &rows {
        println!("{r}");
    }
    let less = if kube > 0.0 { 1.0 - ours / kube } else { 0.0 };
    println!(
        "dra side by side over seeds {seeds:?}: kube-scheduler left {kube:.2} GPUs unallocated, Tessera {ours:.2}: {:.0} % less",
        less * 100.0
    );
    assert!(
        ours <= kube * 0.75,
        "Tessera left {ours:.2} GPUs unallocated against kube-scheduler's {kube:.2}: not 25 % less"
    );
}
