//! `tessera bench extender`: filter + prioritize latency for one pod against N
//! nodes (`nodeCacheCapable`: names only), through the extender's router.

use std::process::ExitCode;

use super::bad_input;

#[derive(Debug, clap::Args)]
pub struct BenchExtenderArgs {
    /// Nodes in the synthetic cluster.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Timed filter + prioritize pairs.
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    /// Placement policy.
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    /// GpuNode status updates per second while timing (default: nodes / 60, the
    /// rate at which node agents republish their status; 0 for none).
    #[arg(long)]
    pub status_updates_per_sec: Option<f64>,
    /// Pending pods that kube-scheduler marked Unschedulable (none fits), over
    /// which extender-mode preemption rounds run while timing.
    #[arg(long, default_value_t = 0)]
    pub unschedulable: usize,
    /// Milliseconds between preemption rounds (the leader's 5 s; 0: back to
    /// back, the worst case).
    #[arg(long, default_value_t = 5000)]
    pub preemption_every_ms: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchExtenderArgs) -> anyhow::Result<ExitCode> {
    if a.nodes == 0 || a.iterations == 0 {
        return bad_input("--nodes and --iterations must be at least 1");
    }
    if a.status_updates_per_sec
        .is_some_and(|r| !r.is_finite() || r < 0.0)
    {
        return bad_input("--status-updates-per-sec must be a number of at least 0");
    }
    // Two workers: the preemption rounds run beside the timed verbs, as on the leader.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let r = match rt.block_on(tessera_k8s::bench::extender_latency(
        a.nodes,
        a.iterations,
        &a.policy,
        a.status_updates_per_sec.unwrap_or(a.nodes as f64 / 60.0),
        a.unschedulable,
        std::time::Duration::from_millis(a.preemption_every_ms),
    )) {
        Ok(r) => r,
        Err(e) => return bad_input(e),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "extender filter + prioritize, one pod against {} nodes ({} GPUs, {} pods placed), nodeCacheCapable, policy {}",
            r.nodes, r.gpus, r.pods_placed, r.policy
        );
        println!(
            "  GpuNode status updates: {:.1}/s, {} applied while timing",
            r.status_updates_per_sec, r.status_updates
        );
        println!(
            "  web view observer tick (every 2 s): {:.1} ms, of which {:.2} ms holding the mirror's lock",
            r.ui_tick_ms, r.ui_lock_ms
        );
        if r.unschedulable > 0 {
            println!(
                "  {} unschedulable pods waiting: {} preemption rounds ({}), {:.1} ms each (median), lock held up to {:.2} ms at once",
                r.unschedulable,
                r.preemption_rounds,
                if r.preemption_every_ms == 0 {
                    "back to back".to_string()
                } else {
                    format!("one every {} ms", r.preemption_every_ms)
                },
                r.preemption_round_ms,
                r.preemption_lock_max_ms
            );
        }
        println!(
            "  filter      p50 {:>8.1} µs   p99 {:>8.1} µs",
            r.filter_p50_us, r.filter_p99_us
        );
        println!(
            "  prioritize  p50 {:>8.1} µs   p99 {:>8.1} µs",
            r.prioritize_p50_us, r.prioritize_p99_us
        );
        println!(
            "  of which    decoding one request p50 {:>8.1} µs; filter + prioritize without HTTP/JSON p50 {:>8.1} µs",
            r.decode_p50_us, r.decide_p50_us
        );
        println!(
            "  both        p50 {:>8.1} µs   p99 {:>8.1} µs   max {:>8.1} µs   ({} pairs; p99 < 1000 µs: {})",
            r.p50_us,
            r.p99_us,
            r.max_us,
            r.iterations,
            if r.p99_us < 1000.0 { "met" } else { "NOT met" }
        );
    }
    Ok(ExitCode::SUCCESS)
}
