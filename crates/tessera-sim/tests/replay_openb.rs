//! The replay on the real openb `default` trace: at a load where `k8s-default`
//! queues, `tessera` cuts the mean queueing delay to at most 0.4 × the baseline's.
//! Reads `../shared/data/openb`; under CI=true a missing file fails the test.

use std::path::{Path, PathBuf};

use tessera_sim::experiment::replay::{ReplayOptions, prepare, run_replay};
use tessera_sim::trace::openb;

fn data_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb");
    if dir.join("openb_pod_list_default.csv").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} is missing (required under CI)",
        dir.display()
    );
    eprintln!("skipping: {} not found", dir.display());
    None
}

#[test]
fn tessera_cuts_queueing_delay_on_default() {
    let Some(dir) = data_dir() else { return };
    let cluster = openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = openb::load_pods(&dir.join("openb_pod_list_default.csv"), &cluster.catalog).unwrap();
    let input = prepare(&pods, None).unwrap();
    // 26 pods were created before 9.9 M s; the start is the 0.5th percentile.
    assert!(input.start_s > 9_900_000, "start {}", input.start_s);
    assert_eq!(input.without_scheduled, 897, "the Pending pods");
    let opts = ReplayOptions {
        time_scale: 25_600.0,
        ..ReplayOptions::default()
    };
    let k = run_replay(&cluster, &input, "default", "k8s-default", 42, &opts).unwrap();
    let t = run_replay(&cluster, &input, "default", "tessera", 42, &opts).unwrap();
    assert!(
        k.delay.waited > 0 && k.delay.mean_s > 0.0,
        "k8s-default queues"
    );
    assert!(
        t.delay.mean_s <= 0.4 * k.delay.mean_s,
        "tessera {} s vs k8s-default {} s",
        t.delay.mean_s,
        k.delay.mean_s
    );
    assert_eq!(k.placed + k.rejected, k.pods);
    assert_eq!(t.placed + t.rejected, t.pods);
    // Same requested work in use on average, fewer GPUs held for it.
    assert!(t.alloc_share_mean_pct < k.alloc_share_mean_pct);
    assert!(t.util_mean_pct <= t.alloc_share_mean_pct + 1e-9);
}

#[test]
fn multigpu_traces_cannot_be_replayed() {
    let Some(dir) = data_dir() else { return };
    let cluster = openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods =
        openb::load_pods(&dir.join("openb_pod_list_multigpu20.csv"), &cluster.catalog).unwrap();
    let e = prepare(&pods, None).unwrap_err().to_string();
    assert!(e.contains("needs creation and deletion times"), "{e}");
}
