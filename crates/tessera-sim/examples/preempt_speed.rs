//! How long one preemption plan takes on a full openb cluster (1,213 nodes, about
//! 11,700 running pods): the preempt experiment's fill, then the planner asked for
//! each arrival against that same state (nothing applied), timed.
//!
//! `cargo run --release -p tessera-sim --example preempt_speed -- [TRACE_DIR] [SEED]`

use std::path::PathBuf;
use std::time::Instant;

use tessera_core::Scheduler;
use tessera_core::policy::{self, PolicyArgs};
use tessera_core::queue::preempt::{Context, plan};
use tessera_core::queue::{Budgets, PodMeta};
use tessera_sim::experiment::preempt::{PREEMPTOR_PRIORITY, PreemptConfig, setup};
use tessera_sim::trace::openb;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "../shared/data/openb".into()));
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(42);
    let cluster = openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).expect("node list");
    let pods = openb::load_pods(&dir.join("openb_pod_list_default.csv"), &cluster.catalog)
        .expect("pod list");
    let config = PreemptConfig {
        arrivals: 200,
        ..PreemptConfig::default()
    };
    let s = setup(&cluster, &pods, seed, &config).expect("setup");
    let mut scheduler = Scheduler::new(policy::by_name("tessera", &PolicyArgs::default()).unwrap());
    let budgets = Budgets::new();
    let preemptor = PodMeta {
        priority: PREEMPTOR_PRIORITY,
        ..PodMeta::default()
    };
    let mut times_us = Vec::new();
    let mut planned = 0;
    for (now_s, req) in &s.arrivals {
        let ctx = Context {
            cluster: &cluster,
            ledger: &s.ledger,
            running: &s.running,
            budgets: &budgets,
            now_s: *now_s,
            min_runtime_s: config.min_runtime_s,
        };
        let t = Instant::now();
        let p = plan(&mut scheduler, &ctx, req, &preemptor, &|_| true);
        times_us.push(t.elapsed().as_micros() as u64);
        planned += usize::from(p.is_some());
    }
    times_us.sort_unstable();
    let n = times_us.len();
    println!(
        "{} nodes, {} running pods, {n} plans ({planned} found): median {} µs, p90 {} µs, max {} µs",
        cluster.len(),
        s.running.len(),
        times_us[n / 2],
        times_us[n * 9 / 10],
        times_us[n - 1]
    );
}
