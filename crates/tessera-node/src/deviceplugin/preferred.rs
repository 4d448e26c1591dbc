//! `GetPreferredAllocation`: which of the kubelet's free devices a container
//! should get. The kubelet treats the answer as a hint; the scheduler's decision
//! still says which GPUs the container is handed in `Allocate`.

use std::collections::{BTreeMap, BTreeSet};

use super::{NodeView, device_gpu};
use crate::backend::LinkKind;

/// `GetPreferredAllocation` for one container: the topology-best set of `size`
/// devices from `available`, containing `must_include`.
///
/// For `tessera.io/gpu` tokens it spreads over distinct GPUs first (a pod that
/// asks for N GPUs wants N GPUs), choosing the GPU set with the strongest links
/// (NVLink count, then same PCIe switch, then same socket), and among equals the
/// GPUs with the most free tokens (the least shared). For MIG devices it keeps
/// the kubelet's order. The kubelet treats the answer as a hint.
pub fn preferred(
    available: &[String],
    must_include: &[String],
    size: usize,
    view: &NodeView,
) -> Vec<String> {
    let mut chosen: Vec<String> = must_include.to_vec();
    if chosen.len() >= size {
        chosen.truncate(size);
        return chosen;
    }
    let taken: BTreeSet<&String> = chosen.iter().collect();
    // Free tokens per GPU, in a stable order.
    let mut free: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for id in available.iter().filter(|id| !taken.contains(id)) {
        free.entry(device_gpu(id)).or_default().push(id);
    }
    let link_score = |a: &str, b: &str| -> u32 {
        let Some(ga) = view.gpu(a) else { return 0 };
        match ga.links.iter().find(|l| l.peer_uuid == b) {
            Some(l) if l.kind == LinkKind::Nvlink => 100 + l.nvlinks,
            Some(l) if l.kind == LinkKind::PcieSwitch => 30,
            Some(l) if l.kind == LinkKind::SameSocket => 10,
            _ => 0,
        }
    };
    let mut gpus: Vec<&str> = must_include.iter().map(|id| device_gpu(id)).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let wanted_gpus = size - chosen.len();
    let candidates: Vec<&str> = free.keys().copied().filter(|g| !gpus.contains(g)).collect();
    let target = gpus.len() + wanted_gpus;
    let free_tokens = |c: &str| free.get(c).map_or(0, Vec::len);
    let best_set = if gpus.is_empty() {
        candidates
            .iter()
            .map(|seed| grow_set(vec![*seed], target, &candidates, &free_tokens, &link_score))
            .max_by(|a, b| {
                a.0.cmp(&b.0).then_with(|| {
                    let fa: usize = a.1.iter().map(|g| free[g].len()).sum();
                    let fb: usize = b.1.iter().map(|g| free[g].len()).sum();
                    fa.cmp(&fb)
                })
            })
            .map(|(_, s)| s)
            .unwrap_or_default()
    } else {
        grow_set(gpus.clone(), target, &candidates, &free_tokens, &link_score).1
    };
    let mut best_set = best_set;
    best_set.sort_unstable();
    // One token from each chosen GPU, then fill round-robin if more are needed.
    let mut cursors: BTreeMap<&str, usize> = BTreeMap::new();
    'outer: loop {
        let mut progressed = false;
        for g in best_set
            .iter()
            .chain(free.keys().filter(|k| !best_set.contains(k)))
        {
            if chosen.len() >= size {
                break 'outer;
            }
            let Some(list) = free.get(g) else { continue };
            let cur = cursors.entry(g).or_default();
            if *cur < list.len() {
                chosen.push(list[*cur].clone());
                *cur += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    chosen
}

/// Grows `set` greedily to `target` GPUs: each step adds the candidate with the
/// strongest links to the set, then the most free tokens. Returns the link total.
fn grow_set<'a>(
    mut set: Vec<&'a str>,
    target: usize,
    candidates: &[&'a str],
    free_tokens: &dyn Fn(&str) -> usize,
    link_score: &dyn Fn(&str, &str) -> u32,
) -> (u64, Vec<&'a str>) {
    let mut total = 0u64;
    while set.len() < target {
        let best = candidates
            .iter()
            .filter(|c| !set.contains(c))
            .map(|c| {
                let s: u32 = set.iter().map(|g| link_score(g, c)).sum();
                (s, free_tokens(c), std::cmp::Reverse(*c), *c)
            })
            .max();
        match best {
            Some((s, _, _, c)) => {
                total += u64::from(s);
                set.push(c);
            }
            None => break,
        }
    }
    (total, set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> NodeView {
        crate::deviceplugin::test_view()
    }

    #[test]
    fn preferred_allocation_follows_nvlink() {
        let v = view();
        let mut avail = Vec::new();
        for gpu in ["GPU-0", "GPU-1", "GPU-2", "GPU-3"] {
            for k in 0..4 {
                avail.push(super::super::slot_id(gpu, k));
            }
        }
        // GPU-0 is partly used: the pair GPU-2/GPU-3 has more free tokens.
        avail.retain(|id| id != "GPU-0::0");
        let p = preferred(&avail, &[], 2, &v);
        assert_eq!(p, ["GPU-2::0", "GPU-3::0"]);
        // Must include a GPU-1 token: its NVLink peer GPU-0 comes next.
        let p = preferred(&avail, &["GPU-1::2".to_string()], 2, &v);
        assert_eq!(p, ["GPU-1::2", "GPU-0::1"]);
        // More tokens than GPUs: one per GPU first.
        let p = preferred(&avail, &[], 5, &v);
        let gpus: BTreeSet<&str> = p.iter().map(|id| device_gpu(id)).collect();
        assert_eq!((p.len(), gpus.len()), (5, 4));
    }
}
