//! Same inputs and seeds → byte-identical JSON, whatever the number of threads.

use std::sync::Arc;

use tessera_sim::experiment::replay::ReplayOptions;
use tessera_sim::grid::{self, ReplayPlan, Workload};
use tessera_sim::report::{self, Report};
use tessera_sim::workload;

fn report_json(threads: usize, synthetic_seed: u64) -> String {
    let s = workload::generate(synthetic_seed);
    let workloads = vec![Workload {
        name: workload::NAME.into(),
        cluster: Arc::new(s.cluster),
        pods: Arc::new(s.pods),
    }];
    let seeds = vec![42, 43];
    let fill_policies: Vec<String> = ["random", "tessera"].map(String::from).to_vec();
    let replay_policies: Vec<String> = ["k8s-default", "random"].map(String::from).to_vec();
    let plan = ReplayPlan {
        options: ReplayOptions {
            time_scale: 3200.0,
            ..ReplayOptions::default()
        },
        delay_bound_s: Some(30.0),
        search_cycles: 1,
        search_max: 8.0,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let (fill, replay) = pool.install(|| {
        (
            grid::fill_grid(&workloads, &fill_policies, &seeds, &|| {}).unwrap(),
            grid::replay_grid(&workloads, &replay_policies, &seeds, &plan, &|| {}).unwrap(),
        )
    });
    let r = Report {
        experiment: "fill+replay".into(),
        workloads: vec![workload::NAME.into()],
        source: "test".into(),
        seeds,
        fill_policies,
        fill,
        replay_policies,
        replay_plan: Some(plan),
        replay: Some(replay),
        notes: vec![],
        mosaic: None,
    };
    report::json::render(&r)
}

#[test]
fn json_is_byte_identical_across_runs_and_thread_counts() {
    let one = report_json(1, 42);
    let again = report_json(1, 42);
    let parallel = report_json(3, 42);
    assert!(one.len() > 1000, "the report has content");
    assert_eq!(one.as_bytes(), again.as_bytes(), "two runs, one thread");
    assert_eq!(one.as_bytes(), parallel.as_bytes(), "one thread vs three");
    // And it does depend on the inputs: another synthetic seed gives other bytes.
    assert_ne!(one, report_json(3, 7));
}

/// FNV-1a, 64 bits: a digest to pin bytes with, no dependency needed.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The fill and replay results of the synthetic default, as JSON, for the
/// policies whose decisions go through each path of the core's judge: the
/// cached best-node walk (bestfit, fgd, tessera, k8s-default), the scan of a
/// policy that draws from the RNG (random) and the replay's failed-shape check.
fn pinned_results() -> (String, String) {
    let s = workload::generate(42);
    let workloads = vec![Workload {
        name: workload::NAME.into(),
        cluster: Arc::new(s.cluster),
        pods: Arc::new(s.pods),
    }];
    let seeds = [42];
    let fill_policies: Vec<String> = ["random", "bestfit", "fgd", "tessera"]
        .map(String::from)
        .to_vec();
    let replay_policies: Vec<String> = ["k8s-default", "random", "tessera"]
        .map(String::from)
        .to_vec();
    let plan = ReplayPlan {
        options: ReplayOptions {
            time_scale: 3200.0,
            ..ReplayOptions::default()
        },
        delay_bound_s: None,
        search_cycles: 1,
        search_max: 8.0,
    };
    let fill = grid::fill_grid(&workloads, &fill_policies, &seeds, &|| {}).unwrap();
    let replay = grid::replay_grid(&workloads, &replay_policies, &seeds, &plan, &|| {}).unwrap();
    (
        serde_json::to_string(&fill).unwrap(),
        serde_json::to_string(&replay).unwrap(),
    )
}

/// The results must not move when the decision path is reshaped. The digests
/// were recorded by running this test on the code before the core's `judge`
/// module existed (commit 88e259d: the scheduler's own score cache, the
/// replay's own fit-then-score check) and printing `fnv1a` of both strings;
/// a change to placement, scores, tie-breaks or RNG use changes them. A change
/// that is meant to move results must record new digests and say why.
///
/// The replay digest moved once since, on purpose: the replay's `tessera` learns
/// its workload online (cold-start prior, rebuilt as the target moves) instead of
/// being given the trace's typical pods, and the result gained `policy_rebuilds`.
/// With learning switched off and that field not serialised, the new code gave
/// the old digest (`0x7c5e_1945_a984_ca7b`), so nothing else moved.
///
/// Both digests moved again when `tessera` began counting the CPU a node has left
/// for each shape in its fragment (and its pressure weight went to 2, its CPU-only
/// rule away): the results of both strings, before and after, differ only in
/// `tessera`'s entries (compared field by field; random, bestfit, fgd and
/// k8s-default unchanged). Before: fill `0x279b_5eeb_e6fc_57b0`, replay
/// `0x2eb3_a91d_ba95_230d`.
///
/// Neither moved when `tessera`'s model pressure began to follow the GPU compute
/// still free per model: the pinned workloads have no model-constrained pods, so
/// the policy has no pressure, does not follow the supply and is never rebuilt for
/// it (the results are identical, rebuild counts included).
///
/// The fill digest moved when `tessera`'s multi-GPU cap went from one band to half a
/// band (`multi_gpu_bands` 1 → 0.5, chosen on the tuning variants); only `tessera`
/// reads it. Before: fill `0x338e_2826_d84f_b07f`. The replay digest stayed: the
/// replay's `tessera` learns from a cold start with no multi-GPU shape, and the few
/// multi-GPU pods the built-in workload brings (75 of 8,152) stay under either cap.
///
/// Neither moved when `tessera`'s fragment began to ignore the shapes' models
/// (`ShapeModels::Ignored`): with no model-constrained shape every shape may use
/// every model either way.
///
/// Both moved when `tessera`'s fragment target began to keep 0.4 of generic shapes
/// beside the learned one (`generic_share`, chosen on the tuning variants): every
/// workload's fragment moves with it. Before: fill `0xe728_3129_e3be_fe31`, replay
/// `0xbf7c_a39a_2d48_a0df`.
///
/// Both moved again when the generic shapes became mostly quarter shares
/// ([`tessera_core::policy::tessera::generic_shapes`], chosen on the tuning
/// variants). Before: fill `0x38ae_ab73_f805_712a`, replay `0x08db_dc78_0383_04eb`.
#[test]
fn fill_and_replay_results_are_pinned() {
    let (fill, replay) = pinned_results();
    assert!(
        fill.len() > 1000 && replay.len() > 1000,
        "results have content"
    );
    let got = (fnv1a(fill.as_bytes()), fnv1a(replay.as_bytes()));
    println!("fill {:#018x} replay {:#018x}", got.0, got.1);
    assert_eq!(got, (PINNED_FILL, PINNED_REPLAY), "fill, replay digests");
}

const PINNED_FILL: u64 = 0x1a34_ff77_ab36_5fae;
const PINNED_REPLAY: u64 = 0xd8f3_d1a7_0ea5_85a7;
