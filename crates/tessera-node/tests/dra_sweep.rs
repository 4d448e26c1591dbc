//! The sweep of claims whose `NodeUnprepareResources` never comes, on fake GPUs,
//! reading claims through the real [`KubeClaims`] from a mock API server with
//! the real server's answers. Sweeps are called directly with the time they
//! run at, so a period passes without waiting for it:
//!
//! - a claim prepared with a MIG instance the driver created and then deleted
//!   (404) without any unprepare is released after two sweeps a period apart:
//!   instance destroyed, CDI spec removed, records updated, counted in
//!   `/metrics`; its late unprepare then succeeds with nothing to do;
//! - a claim still allocated here, one whose reads fail, and one an older agent
//!   recorded without its name are never released; a failed read between two
//!   "gone" verdicts starts the count over.

mod dra_common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_node::backend::GpuBackend;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::NodeView;
use tessera_node::deviceplugin::allocate::NoPods;
use tessera_node::dra::apiserver::KubeClaims;
use tessera_node::dra::mig::MigCreator;
use tessera_node::dra::prepare::Preparer;
use tessera_node::dra::service::{ClaimPreparer, ClaimRef};
use tessera_node::dra::slice::SliceOptions;
use tessera_node::dra::sweep::{SWEEP_PERIOD, SweepReport, Sweeper};
use tessera_node::metrics::{Collector, ReleasedClaims, XidStats};
use tokio::sync::watch;

use dra_common::{FakeClaims, GPUS, NODE, device, mock_api};

struct Setup {
    dir: tempfile::TempDir,
    fake: Fake,
    claims: Arc<FakeClaims>,
    preparer: Arc<Preparer>,
    sweeper: Sweeper,
    released: ReleasedClaims,
    view: watch::Receiver<NodeView>,
}

/// The driver's preparer as `run_driver` builds it (placements created, the
/// state file where `node-agent --dra` keeps it), after a run that left `state`.
fn setup(state: Option<Value>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("plugins/gpu.tessera.io/prepared.json");
    if let Some(s) = state {
        std::fs::create_dir_all(state_file.parent().unwrap()).unwrap();
        std::fs::write(&state_file, serde_json::to_vec(&s).unwrap()).unwrap();
    }
    let fake = Fake::from_yaml(GPUS, "t").unwrap();
    let (view_tx, view) = watch::channel(NodeView {
        settings: Default::default(),
        gpus: fake.discover().unwrap(),
        health: Default::default(),
    });
    let claims = Arc::new(FakeClaims::default());
    let source = Arc::new(KubeClaims::new(mock_api(claims.clone())));
    let preparer = Arc::new(
        Preparer::new(source, view.clone(), NODE.into(), dir.path().join("cdi"))
            .with_options(SliceOptions {
                consumable_capacity: true,
                partitionable_mig: true,
                device_taints: false,
            })
            .with_mig(MigCreator::new(Arc::new(fake.clone()), view_tx))
            .with_state(state_file),
    );
    let released = ReleasedClaims::default();
    let sweeper = Sweeper::new(preparer.clone(), released.clone());
    Setup {
        dir,
        fake,
        claims,
        preparer,
        sweeper,
        released,
        view,
    }
}

fn claim(name: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

impl Setup {
    /// The MIG instances of GPU-m by UUID.
    fn instances(&self) -> Vec<String> {
        self.fake.discover().unwrap()[0]
            .mig_instances
            .iter()
            .map(|m| m.uuid.clone())
            .collect()
    }

    fn spec(&self, name: &str) -> PathBuf {
        self.dir
            .path()
            .join(format!("cdi/gpu.tessera.io-claim_uid-{name}.json"))
    }

    fn state(&self) -> Value {
        let path = self.dir.path().join("plugins/gpu.tessera.io/prepared.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    async fn sweep(&mut self, at: Instant) -> SweepReport {
        self.sweeper.sweep(at).await
    }
}

fn uids(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| format!("uid-{n}")).collect()
}

#[tokio::test]
async fn a_deleted_claim_is_released_after_two_sweeps_a_period_apart() {
    let mut s = setup(None);
    s.claims.put("gone", json!([device("gpu-0-mig-3g40gb-4")]));
    s.claims.put("kept", json!([device("gpu-1")]));
    s.preparer.prepare(&claim("gone")).await.unwrap();
    s.preparer.prepare(&claim("kept")).await.unwrap();
    let made = s.instances();
    assert_eq!(made.len(), 2, "the foreign one and the claim's: {made:?}");
    let created = made[1].clone();
    assert!(s.spec("gone").exists());
    assert_eq!(
        s.state()["claims"]["uid-gone"],
        json!({"namespace": "ml", "name": "gone", "devices": ["gpu-0-mig-3g40gb-4"],
               // What it holds of its GPU: memory slices 4-7 (issue 41, defect 2).
               "holds": [{"device": "gpu-0-mig-3g40gb-4", "gpu": "GPU-m",
                          "footprint": {"kind": "slices", "mask": 240}}]})
    );

    // Force-deleted: the API answers 404; the kubelet never unprepares.
    s.claims.delete("gone");
    let t0 = Instant::now();
    let first = s.sweep(t0).await;
    assert_eq!(first.pending, uids(&["gone"]));
    assert!(first.released.is_empty());
    // A second verdict less than a period later is not enough.
    let early = s.sweep(t0 + SWEEP_PERIOD - Duration::from_secs(1)).await;
    assert!(early.released.is_empty(), "{early:?}");
    assert_eq!(s.instances(), made);
    assert!(s.spec("gone").exists());
    assert_eq!(s.released.get(), 0);

    let second = s.sweep(t0 + SWEEP_PERIOD).await;
    assert_eq!(second.released, uids(&["gone"]));
    assert_eq!(s.instances(), ["MIG-foreign"], "{created} destroyed");
    assert!(!s.spec("gone").exists());
    let state = s.state();
    assert_eq!(state["instances"], json!([]), "{state}");
    assert!(state["claims"].get("uid-gone").is_none(), "{state}");
    assert!(state["claims"].get("uid-kept").is_some(), "{state}");
    assert!(s.spec("kept").exists(), "the other claim is untouched");
    assert_eq!(s.released.get(), 1);
    // The view no longer lists the destroyed instance (slices follow it).
    assert!(
        !s.view.borrow().gpus[0]
            .mig_instances
            .iter()
            .any(|m| m.uuid == created)
    );

    // The unprepare that comes late after all finds nothing and succeeds.
    s.preparer.unprepare(&claim("gone")).await.unwrap();
    assert_eq!(s.instances(), ["MIG-foreign"]);
    let later = s.sweep(t0 + 2 * SWEEP_PERIOD).await;
    assert_eq!(later, SweepReport::default());
    assert_eq!(s.released.get(), 1);

    // Counted on the driver's /metrics.
    let fake = s.fake.clone();
    let collector = Collector::new(
        NODE.into(),
        Arc::new(fake.clone()),
        Arc::new(fake.proc_reader()),
        Arc::new(NoPods("no pods".into())),
        None,
        s.view.clone(),
        XidStats::default(),
    )
    .with_released_claims(s.released.clone());
    let text = collector.scrape().await;
    assert!(
        text.contains("tessera_dra_claims_released_total{hostname=\"node-a\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn claims_in_use_unreadable_or_unnamed_are_kept() {
    // An older agent's record: MIG-foreign held by a claim known by UID only.
    // The API has no such claim, so were it swept, MIG-foreign would go.
    let old = json!({"instances": [{"uuid": "MIG-foreign", "gpu": "GPU-m",
        "profile": "1g.10gb", "start": 0, "claims": ["uid-old"]}]});
    let mut s = setup(Some(old));
    s.claims.put("busy", json!([device("gpu-0-mig-3g40gb-4")]));
    s.preparer.prepare(&claim("busy")).await.unwrap();
    let made = s.instances();
    assert_eq!(made.len(), 2);

    let t0 = Instant::now();
    let at = |k: u32| t0 + SWEEP_PERIOD * k;
    // Still allocated here: kept, however many periods pass.
    for k in 0..3 {
        assert_eq!(s.sweep(at(k)).await, SweepReport::default(), "sweep {k}");
    }
    // The API fails: kept.
    s.claims.break_reads("busy", true);
    for k in 3..6 {
        assert_eq!(s.sweep(at(k)).await, SweepReport::default(), "sweep {k}");
    }
    // Deleted, but a failed read between two "gone" verdicts starts over: the
    // two must be consecutive.
    s.claims.break_reads("busy", false);
    s.claims.delete("busy");
    assert_eq!(s.sweep(at(6)).await.pending, uids(&["busy"]));
    s.claims.break_reads("busy", true);
    assert_eq!(s.sweep(at(7)).await, SweepReport::default());
    s.claims.break_reads("busy", false);
    let again = s.sweep(at(8)).await;
    assert_eq!(again.pending, uids(&["busy"]), "counted from here");
    assert!(again.released.is_empty());
    assert_eq!(s.instances(), made);
    assert!(s.spec("busy").exists());
    assert_eq!(s.released.get(), 0);

    // A period later it goes; the unnamed record's instance never does.
    assert_eq!(s.sweep(at(9)).await.released, uids(&["busy"]));
    assert_eq!(s.instances(), ["MIG-foreign"]);
    assert_eq!(
        s.state()["instances"][0]["claims"],
        json!(["uid-old"]),
        "the unnamed claim's record is kept"
    );
}
