//! GPU fragmentation as the FGD paper defines it (USENIX ATC'23, and its artifact's
//! `pkg/utils/frag.go`), measured against a target workload of "typical pods".
//!
//! For a node and one typical pod, the fragment is the idle GPU (in milli-GPU)
//! that this pod could not use there: all of it when the pod cannot run on the
//! node at all (CPU-only pod, model not allowed, not enough GPUs or CPU), and
//! otherwise only the GPUs whose free share is smaller than the pod's per-GPU
//! ask. A node's fragmentation is the expectation over the workload.

use serde::{Deserialize, Serialize};

use crate::model::{ModelId, ModelSet};
use crate::request::{GpuAsk, Request};

/// One pod shape of the target workload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TypicalPod {
    pub cpu_milli: u64,
    /// GPUs per pod (0 for CPU-only).
    pub gpus: u32,
    /// Milli-GPU asked of each GPU (1000 for whole GPUs).
    pub milli: u32,
    /// Allowed models.
    #[serde(skip, default = "all")]
    pub models: ModelSet,
    /// Probability of the shape; the workload's weights sum to 1.
    pub weight: f64,
}

fn all() -> ModelSet {
    ModelSet::ALL
}

/// The distribution of pod shapes fragmentation is measured against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TargetWorkload {
    pub pods: Vec<TypicalPod>,
}

/// The 35 most frequent (CPU, GPUs, milli-GPU) shapes of the openb `default` trace,
/// which cover 95.3 % of its 8,152 pods, with their pod counts.
const OPENB_DEFAULT_TOP: [(u64, u32, u32, u32); 35] = [
    (3152, 1, 810, 1047),
    (11300, 1, 1000, 874),
    (11400, 1, 1000, 599),
    (3152, 1, 1000, 470),
    (11908, 1, 470, 388),
    (12500, 0, 0, 366),
    (8000, 1, 470, 360),
    (12000, 1, 1000, 326),
    (32000, 0, 0, 290),
    (18708, 1, 1000, 255),
    (11908, 1, 650, 237),
    (4000, 1, 320, 232),
    (9810, 1, 1000, 195),
    (8000, 0, 0, 185),
    (8000, 1, 1000, 164),
    (4000, 1, 1000, 159),
    (15700, 1, 1000, 158),
    (11908, 1, 1000, 153),
    (16000, 1, 1000, 150),
    (4000, 1, 230, 122),
    (6000, 1, 460, 120),
    (15400, 0, 0, 120),
    (16500, 0, 0, 95),
    (14200, 1, 1000, 93),
    (24200, 1, 1000, 84),
    (3152, 1, 590, 75),
    (8000, 1, 320, 72),
    (4152, 1, 550, 72),
    (11900, 1, 1000, 55),
    (4000, 1, 160, 54),
    (4152, 1, 370, 45),
    (4000, 1, 220, 43),
    (8200, 1, 1000, 41),
    (15200, 1, 1000, 36),
    (4152, 1, 810, 31),
];

impl TargetWorkload {
    /// The built-in workload: the openb `default` trace's typical pods.
    pub fn builtin() -> TargetWorkload {
        let total: u32 = OPENB_DEFAULT_TOP.iter().map(|r| r.3).sum();
        TargetWorkload {
            pods: OPENB_DEFAULT_TOP
                .iter()
                .map(|&(cpu_milli, gpus, milli, n)| TypicalPod {
                    cpu_milli,
                    gpus,
                    milli,
                    models: ModelSet::ALL,
                    weight: f64::from(n) / f64::from(total),
                })
                .collect(),
        }
    }

    /// FGD's typical pods: the most frequent shapes (CPU, GPU count, milli per GPU,
    /// model constraint) until they cover `coverage` (0–1) of the pods, renormalised.
    /// Ties in frequency keep first-seen order, so the result is deterministic.
    pub fn from_requests<'a>(
        reqs: impl IntoIterator<Item = &'a Request>,
        coverage: f64,
    ) -> TargetWorkload {
        let mut counts: Vec<(TypicalPod, u64, usize)> = Vec::new();
        let mut index: rustc_hash::FxHashMap<(u64, u32, u32, u64), usize> = Default::default();
        let mut total = 0u64;
        for r in reqs {
            let pod = typical_of(r);
            total += 1;
            let key = (pod.cpu_milli, pod.gpus, pod.milli, pod.models.0);
            match index.get(&key) {
                Some(&i) => counts[i].1 += 1,
                None => {
                    index.insert(key, counts.len());
                    counts.push((pod, 1, counts.len()));
                }
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
        let mut kept = Vec::new();
        let mut acc = 0u64;
        for (pod, n, _) in counts {
            kept.push((pod, n));
            acc += n;
            if total > 0 && acc as f64 / total as f64 >= coverage {
                break;
            }
        }
        let sum: u64 = kept.iter().map(|(_, n)| n).sum();
        TargetWorkload {
            pods: kept
                .into_iter()
                .map(|(mut p, n)| {
                    p.weight = n as f64 / sum.max(1) as f64;
                    p
                })
                .collect(),
        }
    }
}

/// The typical-pod shape of a request.
pub fn typical_of(r: &Request) -> TypicalPod {
    TypicalPod {
        cpu_milli: r.cpu_milli,
        gpus: r.gpu.gpu_count(),
        milli: match r.gpu {
            GpuAsk::Mig { .. } => 0,
            _ => r.gpu.milli_per_gpu(),
        },
        models: r.constraints.model_set,
        weight: 0.0,
    }
}

/// A node's GPU state as fragmentation sees it: free milli per GPU, free CPU and model.
#[derive(Debug, Clone, Copy)]
pub struct FragNode<'a> {
    pub free_milli: &'a [u32],
    pub free_cpu_milli: u64,
    pub model: Option<ModelId>,
}

/// Fragment of one node for one typical pod, in milli-GPU.
pub fn pod_frag(n: &FragNode<'_>, pod: &TypicalPod) -> u64 {
    let idle: u64 = n.free_milli.iter().map(|&l| u64::from(l)).sum();
    pod_frag_with_idle(n, pod, idle)
}

/// The pod can use none of the node's GPUs whatever their state: it asks for none,
/// the node's model is excluded, or the node lacks the CPU for one such pod. All the
/// node's free GPU is then fragment for it, in every measure.
#[inline]
fn serves_none(n: &FragNode<'_>, pod: &TypicalPod) -> bool {
    pod.gpus == 0
        || n.free_cpu_milli < pod.cpu_milli
        || n.model.is_some_and(|m| !pod.models.contains(m))
}

/// [`pod_frag`] with the node's idle milli-GPU already summed.
#[inline]
fn pod_frag_with_idle(n: &FragNode<'_>, pod: &TypicalPod, idle: u64) -> u64 {
    if serves_none(n, pod) {
        return idle;
    }
    let (fit_count, short): (u32, u64) = n.free_milli.iter().fold((0, 0), |(c, s), &l| {
        if l >= pod.milli {
            (c + 1, s)
        } else {
            (c, s + u64::from(l))
        }
    });
    if fit_count >= pod.gpus { short } else { idle }
}

/// [`pod_frag`] with the node's CPU counted: where the node has CPU for `n` more pods
/// of the shape, only the `n · gpus` fitting GPUs with the most free are usable and the
/// rest is fragment too (FGD's measure calls every fitting GPU usable as soon as one
/// pod's CPU is there). Tessera's measure; FGD keeps [`pod_frag`].
pub fn pod_frag_cpu_counted(n: &FragNode<'_>, pod: &TypicalPod) -> u64 {
    let idle: u64 = n.free_milli.iter().map(|&l| u64::from(l)).sum();
    if serves_none(n, pod) {
        return idle;
    }
    let mut fitting: smallvec::SmallVec<[u32; 8]> = n
        .free_milli
        .iter()
        .copied()
        .filter(|&l| l >= pod.milli)
        .collect();
    if fitting.len() < pod.gpus as usize {
        return idle;
    }
    let reach = match n.free_cpu_milli.checked_div(pod.cpu_milli) {
        Some(pods) => pods
            .saturating_mul(u64::from(pod.gpus))
            .min(fitting.len() as u64) as usize,
        None => fitting.len(),
    };
    fitting.sort_unstable_by(|a, b| b.cmp(a));
    idle - fitting[..reach].iter().map(|&l| u64::from(l)).sum::<u64>()
}

/// A node's free milli per GPU sorted ascending with prefix sums, so each typical
/// pod's fragment is one binary search instead of a pass over the GPUs.
struct SortedFree {
    vals: smallvec::SmallVec<[u32; 8]>,
    /// `prefix[i]` = sum of the `i` smallest free values.
    prefix: smallvec::SmallVec<[u64; 9]>,
}

impl SortedFree {
    fn new(free: &[u32]) -> SortedFree {
        let mut vals: smallvec::SmallVec<[u32; 8]> = free.iter().copied().collect();
        vals.sort_unstable();
        let mut prefix = smallvec::SmallVec::with_capacity(vals.len() + 1);
        let mut acc = 0u64;
        prefix.push(0);
        for &v in &vals {
            acc += u64::from(v);
            prefix.push(acc);
        }
        SortedFree { vals, prefix }
    }

    fn idle(&self) -> u64 {
        self.prefix.last().copied().unwrap_or(0)
    }

    /// Same value as [`pod_frag`].
    #[inline]
    fn pod_frag(&self, n: &FragNode<'_>, pod: &TypicalPod) -> u64 {
        let idle = self.idle();
        if serves_none(n, pod) {
            return idle;
        }
        // GPUs below the pod's per-GPU ask are the fragment; the rest must be enough.
        let short = self.vals.partition_point(|&l| l < pod.milli);
        if (self.vals.len() - short) as u32 >= pod.gpus {
            self.prefix[short]
        } else {
            idle
        }
    }
}

/// Expected fragment of one node over the typical pods that may use its GPU model,
/// in milli-GPU: [`node_frag`] without the pods the node's model excludes.
pub fn node_frag_accessible(n: &FragNode<'_>, wl: &TargetWorkload) -> f64 {
    let sorted = SortedFree::new(n.free_milli);
    if sorted.idle() == 0 {
        return 0.0;
    }
    wl.pods
        .iter()
        .filter(|p| n.model.is_none_or(|m| p.models.contains(m)))
        .map(|p| p.weight * sorted.pod_frag(n, p) as f64)
        .sum()
}

/// Expected fragment of one node over the workload, in milli-GPU.
pub fn node_frag(n: &FragNode<'_>, wl: &TargetWorkload) -> f64 {
    let sorted = SortedFree::new(n.free_milli);
    if sorted.idle() == 0 {
        return 0.0;
    }
    wl.pods
        .iter()
        .map(|p| p.weight * sorted.pod_frag(n, p) as f64)
        .sum()
}

/// A target workload grouped for speed: shapes that differ only in CPU share one
/// GPU-fit computation, and the CPU check becomes a binary search over the group's
/// CPU asks with prefix sums of their weights. [`CompiledWorkload::node_frag`] equals
/// [`node_frag`] (and [`node_frag_accessible`]) up to floating-point rounding, at a
/// cost that grows with the number of distinct GPU asks instead of pod shapes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CompiledWorkload {
    groups: Vec<Group>,
}

#[derive(Debug, Clone, PartialEq)]
struct Group {
    gpus: u32,
    milli: u32,
    models: ModelSet,
    /// CPU asks in ascending order.
    cpu: Vec<u64>,
    /// `cum[i]` = total weight of the first `i` CPU asks.
    cum: Vec<f64>,
}

impl CompiledWorkload {
    pub fn new(wl: &TargetWorkload) -> CompiledWorkload {
        let mut groups: Vec<Group> = Vec::new();
        let mut shapes: Vec<&TypicalPod> = wl.pods.iter().collect();
        shapes.sort_by_key(|p| p.cpu_milli);
        for p in shapes {
            let milli = if p.gpus == 0 { 0 } else { p.milli };
            let g = match groups
                .iter_mut()
                .find(|g| g.gpus == p.gpus && g.milli == milli && g.models == p.models)
            {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        gpus: p.gpus,
                        milli,
                        models: p.models,
                        cpu: Vec::new(),
                        cum: vec![0.0],
                    });
                    groups.last_mut().expect("just pushed")
                }
            };
            let last = *g.cum.last().unwrap_or(&0.0);
            g.cpu.push(p.cpu_milli);
            g.cum.push(last + p.weight);
        }
        CompiledWorkload { groups }
    }

    /// [`CompiledWorkload::node_frag`] with the node's CPU counted: the expectation of
    /// [`pod_frag_cpu_counted`] over the workload (the shapes the node's model excludes
    /// left out with `accessible_only`).
    pub fn node_frag_cpu_counted(&self, n: &FragNode<'_>, accessible_only: bool) -> f64 {
        let idle: u64 = n.free_milli.iter().map(|&l| u64::from(l)).sum();
        if idle == 0 {
            return 0.0;
        }
        let sorted = SortedFree::new(n.free_milli);
        let idle_f = idle as f64;
        let cpu = n.free_cpu_milli;
        let len = sorted.vals.len();
        let mut total = 0.0;
        for g in &self.groups {
            let all = *g.cum.last().unwrap_or(&0.0);
            if n.model.is_some_and(|m| !g.models.contains(m)) {
                if !accessible_only {
                    total += all * idle_f;
                }
                continue;
            }
            // CPU-only shapes, and shapes none of whose asks fit the CPU: all idle.
            if g.gpus == 0 || g.cpu.first().is_none_or(|&c| c > cpu) {
                total += all * idle_f;
                continue;
            }
            let short = sorted.vals.partition_point(|&l| l < g.milli);
            let fit_count = (len - short) as u64;
            if fit_count < u64::from(g.gpus) {
                total += all * idle_f;
                continue;
            }
            // Asks with CPU for enough pods to reach every fitting GPU: FGD's fragment.
            let pods_needed = fit_count.div_ceil(u64::from(g.gpus));
            let uncapped = |c: u64| c == 0 || c.saturating_mul(pods_needed) <= cpu;
            if g.cpu.last().is_some_and(|&c| uncapped(c)) {
                total += all * sorted.prefix[short] as f64;
                continue;
            }
            let ok_end = g.cpu.partition_point(|&c| c <= cpu);
            let uncapped_end = g.cpu[..ok_end].partition_point(|&c| uncapped(c));
            total += g.cum[uncapped_end] * sorted.prefix[short] as f64;
            // The capped asks, in runs with the same number of pods the CPU allows.
            let mut i = uncapped_end;
            while i < ok_end {
                let pods = cpu / g.cpu[i];
                let end = i + g.cpu[i..ok_end].partition_point(|&c| c.saturating_mul(pods) <= cpu);
                let k = pods.saturating_mul(u64::from(g.gpus)).min(fit_count) as usize;
                let usable = sorted.prefix[len] - sorted.prefix[len - k];
                total += (g.cum[end] - g.cum[i]) * (idle - usable) as f64;
                i = end;
            }
            total += (all - g.cum[ok_end]) * idle_f;
        }
        total
    }

    /// Expected fragment of one node, in milli-GPU; with `accessible_only`, the shapes
    /// the node's GPU model excludes are left out ([`node_frag_accessible`]).
    pub fn node_frag(&self, n: &FragNode<'_>, accessible_only: bool) -> f64 {
        let idle: u64 = n.free_milli.iter().map(|&l| u64::from(l)).sum();
        if idle == 0 {
            return 0.0;
        }
        let idle_f = idle as f64;
        let mut total = 0.0;
        for g in &self.groups {
            let all = *g.cum.last().unwrap_or(&0.0);
            if g.gpus == 0 {
                total += all * idle_f;
                continue;
            }
            if let Some(m) = n.model
                && !g.models.contains(m)
            {
                if !accessible_only {
                    total += all * idle_f;
                }
                continue;
            }
            let ok = g.cum[g.cpu.partition_point(|&c| c <= n.free_cpu_milli)];
            let (fit_count, short) = n.free_milli.iter().fold((0u32, 0u64), |(c, s), &l| {
                if l >= g.milli {
                    (c + 1, s)
                } else {
                    (c, s + u64::from(l))
                }
            });
            let gpu_frag = if fit_count >= g.gpus {
                short as f64
            } else {
                idle_f
            };
            total += ok * gpu_frag + (all - ok) * idle_f;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(gpus: u32, milli: u32, cpu: u64) -> TypicalPod {
        TypicalPod {
            cpu_milli: cpu,
            gpus,
            milli,
            models: ModelSet::ALL,
            weight: 1.0,
        }
    }

    /// The three cases of the paper, on a node with free GPUs [1000, 500, 200].
    #[test]
    fn fragment_cases() {
        let n = FragNode {
            free_milli: &[1000, 500, 200],
            free_cpu_milli: 8000,
            model: None,
        };
        // CPU-only pod: all 1700 idle milli are fragment.
        assert_eq!(pod_frag(&n, &pod(0, 0, 1000)), 1700);
        // A 600-milli pod fits on GPU 0; GPUs 1 and 2 (500 + 200) are too small.
        assert_eq!(pod_frag(&n, &pod(1, 600, 1000)), 700);
        // A 300-milli pod fits GPUs 0 and 1; only GPU 2's 200 is fragment.
        assert_eq!(pod_frag(&n, &pod(1, 300, 1000)), 200);
        // Two whole GPUs do not fit (one idle GPU): everything is fragment.
        assert_eq!(pod_frag(&n, &pod(2, 1000, 1000)), 1700);
        // Not enough CPU: everything is fragment.
        assert_eq!(pod_frag(&n, &pod(1, 300, 9000)), 1700);
        // Expectation over a 50/50 workload of the 600 and 300 pods: (700 + 200) / 2.
        let wl = TargetWorkload {
            pods: vec![
                TypicalPod {
                    weight: 0.5,
                    ..pod(1, 600, 1000)
                },
                TypicalPod {
                    weight: 0.5,
                    ..pod(1, 300, 1000)
                },
            ],
        };
        assert_eq!(node_frag(&n, &wl), 450.0);
    }

    /// The grouped computation equals the plain one on many node states.
    #[test]
    fn compiled_workload_equals_plain() {
        let wl = TargetWorkload::builtin();
        let mut wl_models = wl.clone();
        wl_models.pods[3].models = ModelSet(1 << 2);
        wl_models.pods[7].models = ModelSet(1 << 5);
        for wl in [wl, wl_models] {
            let cw = CompiledWorkload::new(&wl);
            let states: [&[u32]; 5] = [
                &[1000, 1000],
                &[190, 1000, 530, 0],
                &[0, 0, 0, 0, 0, 0, 0, 60],
                &[350, 350, 350, 1000, 1000, 1000, 810, 0],
                &[0, 0],
            ];
            for free in states {
                for cpu in [0, 3152, 4000, 11_300, 11_908, 64_000] {
                    for model in [None, Some(ModelId(2)), Some(ModelId(3))] {
                        let n = FragNode {
                            free_milli: free,
                            free_cpu_milli: cpu,
                            model,
                        };
                        let (a, b) = (node_frag(&n, &wl), cw.node_frag(&n, false));
                        assert!((a - b).abs() < 1e-6, "{free:?} {cpu} {model:?}: {a} vs {b}");
                        let (a, b) = (node_frag_accessible(&n, &wl), cw.node_frag(&n, true));
                        assert!((a - b).abs() < 1e-6, "{free:?} {cpu} {model:?}: {a} vs {b}");
                    }
                }
            }
        }
    }

    /// A node with three idle GPUs and CPU for one more 11-core pod: FGD calls all three
    /// usable by that pod, the counted measure two of them fragment.
    #[test]
    fn counted_cpu_strands_the_gpus_it_cannot_serve() {
        let n = FragNode {
            free_milli: &[1000, 1000, 1000, 190],
            free_cpu_milli: 15_000,
            model: None,
        };
        let whole = pod(1, 1000, 11_000);
        assert_eq!(pod_frag(&n, &whole), 190);
        assert_eq!(pod_frag_cpu_counted(&n, &whole), 2190);
        // A 4-core share can reach three GPUs: the fullest-free three, 190 left over.
        assert_eq!(pod_frag_cpu_counted(&n, &pod(1, 150, 4000)), 190);
        // With CPU for every fitting GPU (or no CPU asked) it is FGD's measure.
        assert_eq!(pod_frag_cpu_counted(&n, &pod(1, 1000, 5000)), 190);
        assert_eq!(pod_frag_cpu_counted(&n, &pod(1, 150, 0)), 0);
        // Three GPUs fit 2-GPU pods, CPU for one: one GPU and the 190 are fragment.
        assert_eq!(pod_frag_cpu_counted(&n, &pod(2, 1000, 8000)), 1190);
        // Not enough CPU for one pod, or a CPU-only pod: everything.
        assert_eq!(pod_frag_cpu_counted(&n, &pod(1, 100, 16_000)), 3190);
        assert_eq!(pod_frag_cpu_counted(&n, &pod(0, 0, 1000)), 3190);
    }

    #[test]
    fn builtin_workload_sums_to_one() {
        let wl = TargetWorkload::builtin();
        assert_eq!(wl.pods.len(), 35);
        assert!((wl.pods.iter().map(|p| p.weight).sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn typical_pods_cover_the_threshold() {
        let mut reqs = Vec::new();
        for _ in 0..6 {
            reqs.push(Request::share_milli(500, 1000, 0));
        }
        for _ in 0..3 {
            reqs.push(Request::whole(1, 2000, 0));
        }
        reqs.push(Request::cpu_only(4000, 0));
        // 60 % + 30 % = 90 % < 95 %: the CPU-only shape is kept too.
        assert_eq!(TargetWorkload::from_requests(&reqs, 0.95).pods.len(), 3);
        let wl = TargetWorkload::from_requests(&reqs, 0.85);
        assert_eq!(wl.pods.len(), 2);
        assert!((wl.pods[0].weight - 6.0 / 9.0).abs() < 1e-12);
    }

    proptest::proptest! {
        /// The grouped counted measure is the expectation of the plain definition.
        #[test]
        fn compiled_counted_equals_definition(
            free in proptest::collection::vec(0u32..=1000, 1..9),
            cpu in 0u64..40_000,
            model in proptest::option::of(0u8..3),
            pods in proptest::collection::vec(
                (0u32..4, 0u32..=1000, 0u64..20_000, 0u8..4, 0.01f64..1.0), 1..12),
        ) {
            let model = model.map(ModelId);
            let n = FragNode { free_milli: &free, free_cpu_milli: cpu, model };
            let wl = TargetWorkload {
                pods: pods
                    .into_iter()
                    .map(|(gpus, milli, cpu_milli, models, weight)| TypicalPod {
                        cpu_milli: cpu_milli / 1000 * 1000,
                        gpus,
                        milli,
                        models: if models == 3 { ModelSet::ALL } else { ModelSet(1 << models) },
                        weight,
                    })
                    .collect(),
            };
            let cw = CompiledWorkload::new(&wl);
            for accessible_only in [false, true] {
                let plain: f64 = wl
                    .pods
                    .iter()
                    .filter(|p| !accessible_only || n.model.is_none_or(|m| p.models.contains(m)))
                    .map(|p| p.weight * pod_frag_cpu_counted(&n, p) as f64)
                    .sum();
                let fast = cw.node_frag_cpu_counted(&n, accessible_only);
                proptest::prop_assert!((plain - fast).abs() < 1e-6, "{} vs {}", plain, fast);
            }
        }

        /// The sorted fast path gives exactly the plain definition's value.
        #[test]
        fn sorted_fast_path_equals_definition(
            free in proptest::collection::vec(0u32..=1000, 1..9),
            cpu in 0u64..20_000,
            pods in proptest::collection::vec((0u32..3, 0u32..=1000, 0u64..20_000), 1..12),
        ) {
            let n = FragNode { free_milli: &free, free_cpu_milli: cpu, model: None };
            let sorted = SortedFree::new(&free);
            for (gpus, milli, cpu_milli) in pods {
                let p = TypicalPod { cpu_milli, gpus, milli, models: ModelSet::ALL, weight: 1.0 };
                proptest::prop_assert_eq!(sorted.pod_frag(&n, &p), pod_frag(&n, &p));
            }
        }
    }
}
