use std::path::Path;
use tessera_sim::experiment::replay::*;
use tessera_sim::trace::openb;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trace = &args[1];
    let cycles: u32 = args.get(3).map(|c| c.parse().unwrap()).unwrap_or(1);
    let scales: Vec<f64> = args[2].split(',').map(|s| s.parse().unwrap()).collect();
    let c = openb::load_nodes(Path::new(
        "/work/shared/data/openb/openb_node_list_gpu_node.csv",
    ))
    .unwrap();
    let pods = openb::load_pods(
        Path::new(&format!(
            "/work/shared/data/openb/openb_pod_list_{trace}.csv"
        )),
        &c.catalog,
    )
    .unwrap();
    let input = prepare(&pods, None).unwrap();
    println!(
        "start {} present {} dropped {} nosched {}",
        input.start_s, input.present_at_start, input.dropped_before_start, input.without_scheduled
    );
    for s in scales {
        for p in ["k8s-default", "tessera"] {
            let t = std::time::Instant::now();
            let r = run_replay(
                &c,
                &input,
                trace,
                p,
                42,
                &ReplayOptions {
                    time_scale: s,
                    cycles,
                    ..Default::default()
                },
            )
            .unwrap();
            println!(
                "{s:>6} {p:>12} mean {:>9.1} p50 {:>6} p95 {:>7} p99 {:>7} waited {:>5} util {:>5.1} alloc {:>5.1} peakA {:>5.1} qpeak {:>5} rej {} win {} {:.2}s",
                r.delay.mean_s,
                r.delay.p50_s,
                r.delay.p95_s,
                r.delay.p99_s,
                r.delay.waited,
                r.util_mean_pct,
                r.alloc_share_mean_pct,
                r.alloc_share_peak_pct,
                r.queue_peak,
                r.rejected,
                r.window_s,
                t.elapsed().as_secs_f64()
            );
        }
    }
}
