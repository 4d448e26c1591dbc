//! A node whose agent stopped reporting takes no new pods: its `GpuNode`
//! carries a heartbeat but has not changed for the TTL, on the scheduler's own
//! clock (tokio's paused clock here). What is placed there stays counted.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use tessera_api::GpuNode;
use tessera_core::allocation::ANNOTATION;
use tessera_k8s::mirror::{INVENTORY_TTL, Reservation, ReserveError, SharedMirror};

const SECOND: Duration = Duration::from_secs(1);

/// `name`'s GpuNode as the API server has it at `version`, written by an agent
/// that heartbeats (`heartbeat`) or by one too old to (`None`).
fn inventory(name: &str, version: u32, heartbeat: Option<&str>) -> GpuNode {
    let mut gn = gpu_node(name, "A100-80GB", 81_920, 2);
    gn.metadata.resource_version = Some(version.to_string());
    gn.status = Some(tessera_api::GpuNodeStatus {
        health: "Healthy".into(),
        heartbeat_time: heartbeat.map(str::to_string),
        ..Default::default()
    });
    gn
}

/// n1 and n2 run agents that heartbeat; n3 an agent older than heartbeats.
fn objects() -> (Vec<k8s_openapi::api::core::v1::Node>, Vec<GpuNode>) {
    (
        ["n1", "n2", "n3"]
            .iter()
            .map(|n| kube_node(n, "64", "512Gi"))
            .collect(),
        vec![
            inventory("n1", 1, Some("2026-12-04T19:00:00Z")),
            inventory("n2", 1, Some("2026-12-04T19:00:00Z")),
            inventory("n3", 1, None),
        ],
    )
}

const NODES: [&str; 3] = ["n1", "n2", "n3"];

/// The filter's answer for a pod asking one whole GPU: (passed, reason for n1).
fn judge(m: &SharedMirror) -> (Vec<String>, Option<String>) {
    let probe = pod("default", "probe", "uid-probe", &[("tessera.io/gpu", "1")]);
    let mut m = m.lock();
    let out = m.filter(&probe, &NODES).expect("request parses");
    (
        out.passed.iter().map(|s| s.to_string()).collect(),
        out.reason("n1").map(str::to_string),
    )
}

/// Reserves `p` on `node` and feeds it back as the API server has it once bound.
fn reserve_bound(m: &SharedMirror, mut p: Pod, node: &str) {
    let Reservation::Write { annotation } = m.lock().reserve(&p, node).expect("fits") else {
        panic!("fresh pod")
    };
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION.to_string(), annotation.expect("a GPU grant"));
    p.spec.as_mut().unwrap().node_name = Some(node.to_string());
    m.lock().upsert_pod(p);
}

/// GPUs of `node` the ledger counts as held whole.
fn held_gpus(m: &SharedMirror, node: &str) -> usize {
    let mut m = m.lock();
    m.usage()[node].gpus.iter().filter(|g| g.exclusive).count()
}

#[tokio::test(start_paused = true)]
async fn a_silent_agents_node_takes_no_new_pods_until_it_reports_again() {
    let (nodes, inv) = objects();
    let live = mirror("bestfit", nodes, inv.clone(), vec![]);
    reserve_bound(
        &live,
        pod("ml", "train", "uid-train", &[("tessera.io/gpu", "1")]),
        "n1",
    );
    assert_eq!(held_gpus(&live, "n1"), 1);

    // One second short of the TTL every node fits (and n1's "fits" is cached);
    // n2's agent reports then.
    tokio::time::advance(INVENTORY_TTL - SECOND).await;
    assert_eq!(
        judge(&live),
        (vec!["n1".into(), "n2".into(), "n3".into()], None)
    );
    let woke = live
        .lock()
        .upsert_inventory(inventory("n2", 2, Some("2026-12-04T19:01:29Z")));
    assert!(!woke, "a heartbeat alone is not worth a pass");

    // Two seconds later n1's GpuNode has not changed for TTL + 1 s: no new pods,
    // although nothing but time happened and its "fits" was cached.
    tokio::time::advance(2 * SECOND).await;
    let (passed, why) = judge(&live);
    assert_eq!(
        passed,
        ["n2", "n3"],
        "n2 reported 2 s ago; n3 never promised to"
    );
    let why = why.expect("n1 is rejected");
    assert!(
        why.contains(&format!(
            "GpuNode n1 has not changed for {}s",
            INVENTORY_TTL.as_secs() + 1
        )) && why.contains(&format!("stale after {}s", INVENTORY_TTL.as_secs()))
            && why.contains("without status.heartbeatTime"),
        "{why}"
    );
    // A bind there is refused too, and preemption would not make room there.
    let p = pod("ml", "late", "uid-late", &[("tessera.io/gpu", "1")]);
    assert!(
        matches!(live.lock().reserve(&p, "n1"), Err(ReserveError::DoesNotFit { ref reason, .. }) if reason.contains("GpuNode n1")),
        "a bind to n1 is refused"
    );
    // Its bound pod stays counted, and the block is listed among the problems.
    assert_eq!(held_gpus(&live, "n1"), 1);
    assert!(
        live.lock()
            .problems()
            .iter()
            .any(|p| p.starts_with("node n1: GpuNode n1 has not changed")),
        "{:?}",
        live.lock().problems()
    );

    // A relist of the same objects (same resourceVersions) is no change: still blocked.
    let (_, mut relist) = objects();
    relist[1] = inventory("n2", 2, Some("2026-12-04T19:01:29Z"));
    live.lock().replace_inventory(relist);
    assert_eq!(judge(&live).0, ["n2", "n3"]);

    // n1's agent reports again: the block lifts at once, and that is worth a pass.
    assert!(
        live.lock()
            .upsert_inventory(inventory("n1", 2, Some("2026-12-04T19:01:31Z"))),
        "lifting a block wakes the scheduler"
    );
    assert_eq!(
        judge(&live),
        (vec!["n1".into(), "n2".into(), "n3".into()], None)
    );
    assert_eq!(held_gpus(&live, "n1"), 1);

    // Much later, with no word from any agent: n1 and n2 are blocked, n3's
    // GpuNode (no heartbeat promised) never is.
    tokio::time::advance(INVENTORY_TTL * 10).await;
    let (passed, why) = judge(&live);
    assert_eq!(passed, ["n3"]);
    assert!(why.unwrap().contains(&format!(
        "has not changed for {}s",
        (INVENTORY_TTL * 10).as_secs()
    )));
}

/// A restarted scheduler starts every clock at its first list: however long the
/// GpuNodes had been unchanged, nothing is blocked at once; a dead agent's node
/// is blocked one TTL later (here a TTL set as `--gpunode-ttl` would).
#[tokio::test(start_paused = true)]
async fn a_restarted_scheduler_blocks_no_node_at_its_first_list() {
    let (nodes, inv) = objects();
    let before = mirror("bestfit", nodes.clone(), inv.clone(), vec![]);
    tokio::time::advance(INVENTORY_TTL * 5).await;
    assert_eq!(judge(&before).0, ["n3"], "the old process had them blocked");

    let restarted = mirror("bestfit", nodes, inv, vec![]);
    restarted.lock().set_inventory_ttl(Duration::from_secs(300));
    assert_eq!(
        judge(&restarted),
        (vec!["n1".into(), "n2".into(), "n3".into()], None)
    );
    tokio::time::advance(Duration::from_secs(299)).await;
    assert_eq!(judge(&restarted).0, ["n1", "n2", "n3"], "299 s < 300 s");
    tokio::time::advance(SECOND).await;
    let (passed, why) = judge(&restarted);
    assert_eq!(passed, ["n3"]);
    assert!(why.unwrap().contains("stale after 300s"));
}
