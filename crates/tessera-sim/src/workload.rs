//! The built-in synthetic workload: a cluster and a pod trace shaped like the
//! openb `default` trace, generated from a seed with no files at all.
//!
//! It is what `tessera simulate` runs with no arguments. Only summary tables are
//! embedded, measured from `openb_pod_list_default.csv` and
//! `openb_node_list_gpu_node.csv` (the data itself stays in `shared/`):
//!
//! - **Cluster**: the openb GPU-node shapes scaled down by 8 (151 nodes, 782 GPUs;
//!   G2 / T4 / P100 / G3 / V100 in openb's proportions). Shapes with fewer than
//!   four nodes in openb (A10, two small P100 shapes) are left out.
//! - **Request shapes**: the pod kind (CPU-only 13.3 %, GPU share 37.8 %, one
//!   whole GPU 48.0 %, 2/4/8 GPUs 0.9 %) and, within each kind, the most frequent
//!   (GPUs, milli-GPU, CPU, memory) shapes covering ≥ 90 % of that kind,
//!   renormalised. The per-mille shares are therefore the trace's own (810, 470,
//!   650, 320, …).
//! - **Run times** (deletion − scheduled): the trace's quantile table (median
//!   479 s, p90 6,260 s, p99 70,065 s, max 2.6 M s), sampled by inverse transform
//!   with log-linear interpolation between quantiles, so the heavy tail is kept.
//!   (Lifetime deletion − creation has median 540 s and p90 ~6,600 s; the
//!   difference is the trace's own queueing.) Run time is drawn independently of
//!   the shape.
//! - **Arrivals**: hour by hour over 834 hours (the trace's active 35 days), the
//!   hour's count drawn from the trace's hourly-count quantiles (median 8, p90
//!   21, max 56 per hour on 1,213 nodes) scaled by the node ratio, spread
//!   uniformly within the hour. The per-GPU arrival rate therefore equals
//!   openb's, and a replay time-scale means the same load on both.
//!
//! The result has about 1,030 pods asking ≈ 0.75 GPU each on average, ≈ 98 % of
//! the cluster's GPUs in total, like openb `default`.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tessera_core::model::{Catalog, Cluster, Node};
use tessera_core::request::Request;

use crate::trace::TracePod;

/// Name under which the synthetic workload appears in reports.
pub const NAME: &str = "synthetic-default";

/// openb GPU-node shapes `(nodes in openb, vCPU milli, memory MiB, GPUs, model)`.
const OPENB_NODE_SHAPES: [(u32, u64, u64, u32, &str); 11] = [
    (549, 96_000, 393_216, 8, "G2"),
    (387, 104_000, 524_288, 2, "T4"),
    (107, 16_000, 122_880, 2, "P100"),
    (39, 128_000, 786_432, 8, "G3"),
    (28, 32_000, 131_072, 4, "V100-16GB"),
    (22, 64_000, 262_144, 2, "P100"),
    (21, 96_000, 786_432, 8, "V100-32GB"),
    (19, 8_000, 32_768, 1, "V100-16GB"),
    (17, 96_000, 393_216, 4, "T4"),
    (9, 48_000, 376_832, 4, "V100-32GB"),
    (7, 64_000, 262_144, 8, "V100-16GB"),
];

/// openb `default` pods by kind: CPU-only, share, whole, multi-GPU.
const KIND_COUNTS: [u32; 4] = [1_088, 3_078, 3_911, 75];

/// A pod shape `(GPUs, milli per GPU, CPU milli, memory MiB, pods with it)`.
type Shape = (u32, u32, u64, u64, u32);

/// Most frequent shapes per kind.
const CPU_ONLY_SHAPES: [Shape; 5] = [
    (0, 0, 12_500, 57_344, 364),
    (0, 0, 32_000, 49_152, 284),
    (0, 0, 8_000, 30_517, 163),
    (0, 0, 15_400, 51_200, 120),
    (0, 0, 16_500, 51_200, 95),
];
const SHARE_SHAPES: [Shape; 16] = [
    (1, 810, 3_152, 5_600, 1_047),
    (1, 470, 11_908, 47_104, 388),
    (1, 470, 8_000, 30_517, 360),
    (1, 650, 11_908, 47_104, 237),
    (1, 320, 4_000, 22_888, 111),
    (1, 230, 4_000, 30_517, 84),
    (1, 320, 4_000, 15_258, 78),
    (1, 590, 3_152, 5_600, 75),
    (1, 320, 8_000, 30_517, 72),
    (1, 550, 4_152, 10_600, 72),
    (1, 160, 4_000, 15_258, 53),
    (1, 460, 6_000, 6_144, 51),
    (1, 370, 4_152, 10_600, 45),
    (1, 320, 4_000, 30_517, 43),
    (1, 810, 4_152, 10_600, 31),
    (1, 460, 6_000, 12_288, 29),
];
const WHOLE_SHAPES: [Shape; 17] = [
    (1, 1000, 11_300, 49_152, 857),
    (1, 1000, 11_400, 48_128, 534),
    (1, 1000, 3_152, 5_600, 470),
    (1, 1000, 18_708, 64_512, 255),
    (1, 1000, 9_810, 41_560, 195),
    (1, 1000, 12_000, 24_576, 158),
    (1, 1000, 15_700, 58_368, 158),
    (1, 1000, 11_908, 47_104, 153),
    (1, 1000, 16_000, 32_768, 108),
    (1, 1000, 8_000, 16_384, 104),
    (1, 1000, 4_000, 24_576, 104),
    (1, 1000, 12_000, 16_384, 99),
    (1, 1000, 14_200, 58_368, 93),
    (1, 1000, 24_200, 93_184, 84),
    (1, 1000, 11_400, 77_824, 65),
    (1, 1000, 8_000, 32_768, 55),
    (1, 1000, 11_900, 77_824, 51),
];
const MULTI_SHAPES: [Shape; 10] = [
    (8, 1000, 88_000, 327_680, 18),
    (8, 1000, 64_200, 263_168, 18),
    (4, 1000, 32_200, 132_096, 9),
    (2, 1000, 16_200, 66_560, 7),
    (8, 1000, 120_000, 737_280, 3),
    (2, 1000, 6_000, 65_536, 3),
    (8, 1000, 64_000, 262_144, 3),
    (4, 1000, 32_000, 131_072, 3),
    (2, 1000, 30_200, 160_768, 3),
    (4, 1000, 60_200, 320_512, 3),
];

/// Run-time quantiles of openb `default` (deletion − scheduled, s; pods created in the last 35 days).
const RUN_QUANTILES: [(f64, f64); 17] = [
    (0.0, 1.0),
    (0.05, 40.0),
    (0.10, 60.0),
    (0.20, 113.0),
    (0.30, 168.0),
    (0.40, 256.0),
    (0.50, 479.0),
    (0.60, 821.0),
    (0.70, 1_339.0),
    (0.80, 2_578.0),
    (0.90, 6_260.0),
    (0.95, 15_088.0),
    (0.98, 33_436.0),
    (0.99, 70_065.0),
    (0.995, 145_258.0),
    (0.999, 1_070_192.0),
    (1.0, 2_612_709.0),
];

/// Quantiles of pods created per hour on the full openb cluster (834 hours).
const HOURLY_QUANTILES: [(f64, f64); 13] = [
    (0.0, 0.0),
    (0.1, 2.0),
    (0.2, 3.0),
    (0.3, 5.0),
    (0.4, 6.0),
    (0.5, 8.0),
    (0.6, 10.0),
    (0.7, 12.0),
    (0.8, 15.0),
    (0.9, 21.0),
    (0.95, 26.0),
    (0.99, 32.0),
    (1.0, 56.0),
];

/// Hours the trace is active for.
const HOURS: u64 = 834;
/// The openb GPU-node cluster's GPUs, for scaling arrival rates.
const OPENB_GPUS: f64 = 6_212.0;
/// Node scale: one synthetic node for every this many openb nodes of a shape.
const SCALE_DOWN: u32 = 8;

/// A generated workload: the cluster and the pods, in creation order.
#[derive(Debug, Clone)]
pub struct Synthetic {
    pub cluster: Cluster,
    pub pods: Vec<TracePod>,
}

/// The built-in cluster: openb's GPU-node shapes, one node per 8 (rounded).
pub fn builtin_cluster() -> Cluster {
    let catalog = Catalog::default();
    let mut nodes = Vec::new();
    for &(count, cpu, mem, gpus, model) in &OPENB_NODE_SHAPES {
        let id = catalog
            .find(model)
            .expect("built-in GPU model names are in the default catalog");
        let n = (count + SCALE_DOWN / 2) / SCALE_DOWN;
        for _ in 0..n.max(1) {
            let name = format!("syn-node-{:03}", nodes.len());
            nodes.push(Node::uniform(name, cpu, mem, id, gpus));
        }
    }
    Cluster::new(catalog, nodes).expect("built-in cluster is valid")
}

/// Inverse-transform sample of a quantile table, log-linear between points.
fn sample_quantiles(table: &[(f64, f64)], u: f64) -> f64 {
    for w in table.windows(2) {
        let ((p0, v0), (p1, v1)) = (w[0], w[1]);
        if u <= p1 {
            let f = if p1 > p0 { (u - p0) / (p1 - p0) } else { 0.0 };
            let (l0, l1) = ((v0 + 1.0).ln(), (v1 + 1.0).ln());
            return (l0 + f * (l1 - l0)).exp() - 1.0;
        }
    }
    table.last().map_or(0.0, |p| p.1)
}

fn pick<'a, T>(rng: &mut SmallRng, items: &'a [T], weight: impl Fn(&T) -> u32) -> &'a T {
    let total: u32 = items.iter().map(&weight).sum();
    let mut x = rng.random_range(0..total);
    for it in items {
        let w = weight(it);
        if x < w {
            return it;
        }
        x -= w;
    }
    items.last().expect("non-empty table")
}

fn sample_request(rng: &mut SmallRng) -> Request {
    let kinds: [(u32, &[Shape]); 4] = [
        (KIND_COUNTS[0], &CPU_ONLY_SHAPES),
        (KIND_COUNTS[1], &SHARE_SHAPES),
        (KIND_COUNTS[2], &WHOLE_SHAPES),
        (KIND_COUNTS[3], &MULTI_SHAPES),
    ];
    let (_, table) = *pick(rng, &kinds, |k| k.0);
    let &(gpus, milli, cpu, mem, _) = pick(rng, table, |s| s.4);
    match (gpus, milli) {
        (0, _) => Request::cpu_only(cpu, mem),
        (1, m) if m < 1000 => Request::share_milli(m, cpu, mem),
        (n, _) => Request::whole(n, cpu, mem),
    }
}

/// Generates the synthetic `default` workload from `seed`: the built-in cluster and
/// its pod trace (creation, scheduled and deletion times in seconds).
pub fn generate(seed: u64) -> Synthetic {
    let cluster = builtin_cluster();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7e55_e7a5_u64);
    let rate_scale = cluster.gpu_count() as f64 / OPENB_GPUS;
    let mut pods = Vec::new();
    for hour in 0..HOURS {
        let mean = sample_quantiles(&HOURLY_QUANTILES, rng.random::<f64>()) * rate_scale;
        // Stochastic rounding keeps the expected count exact.
        let mut count = mean.floor() as u64;
        if rng.random::<f64>() < mean - mean.floor() {
            count += 1;
        }
        let mut times: Vec<u64> = (0..count)
            .map(|_| hour * 3600 + rng.random_range(0..3600))
            .collect();
        times.sort_unstable();
        for created in times {
            let request = sample_request(&mut rng);
            let run = sample_quantiles(&RUN_QUANTILES, rng.random::<f64>())
                .round()
                .max(1.0) as u64;
            pods.push(TracePod {
                name: format!("syn-pod-{:05}", pods.len()),
                request,
                creation_s: Some(created),
                scheduled_s: Some(created),
                deletion_s: Some(created + run),
            });
        }
    }
    Synthetic { cluster, pods }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_is_openb_scaled_down() {
        let c = builtin_cluster();
        // 69 G2 + 48 T4 + 13 P100 + 5 G3 + 4 + 3 + 3 + 2 + 2 + 1 + 1 = 151 nodes.
        assert_eq!(c.len(), 151);
        // 552 + 96 + 26 + 40 + 16 + 6 + 24 + 2 + 8 + 4 + 8 = 782 GPUs.
        assert_eq!(c.gpu_count(), 782);
    }

    #[test]
    fn same_seed_same_pods_other_seed_other_pods() {
        let a = generate(42);
        let b = generate(42);
        let c = generate(43);
        assert_eq!(a.pods, b.pods);
        assert_ne!(a.pods, c.pods);
    }

    #[test]
    fn distributions_match_the_trace_summary() {
        let s = generate(42);
        let n = s.pods.len() as f64;
        // 8,152 pods × 782 / 6,212 GPUs ≈ 1,026 expected.
        assert!((850.0..1_250.0).contains(&n), "{n} pods");
        let demand: u64 = s.pods.iter().map(|p| p.request.gpu.total_milli()).sum();
        let per_cap = demand as f64 / (s.cluster.gpu_count() as f64 * 1000.0);
        // openb default asks 98 % of its capacity; allow sampling noise.
        assert!((0.8..1.2).contains(&per_cap), "demand {per_cap}");
        let shares = s
            .pods
            .iter()
            .filter(|p| p.request.gpu.gpu_count() == 1 && p.request.gpu.milli_per_gpu() < 1000)
            .count() as f64;
        assert!(
            (shares / n - 0.378).abs() < 0.05,
            "share fraction {}",
            shares / n
        );
        let mut runs: Vec<u64> = s
            .pods
            .iter()
            .map(|p| p.deletion_s.unwrap() - p.scheduled_s.unwrap())
            .collect();
        runs.sort_unstable();
        let median = runs[runs.len() / 2] as f64;
        let p90 = runs[runs.len() * 9 / 10] as f64;
        assert!((300.0..800.0).contains(&median), "median run {median}");
        assert!((3_500.0..11_000.0).contains(&p90), "p90 run {p90}");
    }

    #[test]
    fn quantile_sampling_interpolates() {
        // Halfway between (0.4, 256) and (0.5, 479) in log(1+v) space.
        let v = sample_quantiles(&RUN_QUANTILES, 0.45);
        let expect = (((257.0f64).ln() + (480.0f64).ln()) / 2.0).exp() - 1.0;
        assert!((v - expect).abs() < 1e-9);
        assert!((sample_quantiles(&RUN_QUANTILES, 1.0) - 2_612_709.0).abs() < 1e-3);
    }
}
