//! Splitting a pod's granted GPUs between its containers.

use super::{ContainerKind, GpuDemand};
use crate::allocation::ContainerGrant;

/// Why a pod's granted GPUs cannot be split between its containers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "container {container} needs {needed} GPUs beside the ones already taken, but the pod was granted {granted}"
)]
pub struct AssignError {
    pub container: String,
    pub needed: u32,
    pub granted: usize,
}

/// Splits `granted` GPUs (positions `0..granted` in the allocation's list)
/// between the containers of `demands` (from [`gpu_demands`], kubelet order).
///
/// Sidecars and app containers run together: each takes the next unused
/// positions, so their sets are disjoint. An init container runs beside the
/// sidecars started before it only, so it takes the first positions those
/// sidecars do not hold, reusing positions that later containers get.
pub fn assign(demands: &[GpuDemand], granted: usize) -> Result<Vec<ContainerGrant>, AssignError> {
    let mut next = 0usize;
    let mut out = Vec::with_capacity(demands.len());
    for d in demands {
        let n = d.gpus as usize;
        let short = || AssignError {
            container: d.name.clone(),
            needed: d.gpus,
            granted,
        };
        let gpus: Vec<u32> = match d.kind {
            // Sidecars come before app containers in the kubelet's order, so the
            // positions below `next` are exactly the sidecars started so far.
            ContainerKind::Init => (next..granted).take(n).map(|p| p as u32).collect(),
            ContainerKind::Sidecar | ContainerKind::App => {
                let end = next
                    .checked_add(n)
                    .filter(|e| *e <= granted)
                    .ok_or_else(short)?;
                let taken = (next..end).map(|p| p as u32).collect();
                next = end;
                taken
            }
        };
        if gpus.len() != n {
            return Err(short());
        }
        out.push(ContainerGrant {
            name: d.name.clone(),
            gpus,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::ContainerKind::{App, Init, Sidecar};
    use super::super::{Container, effective_request, gpu_demands};
    use super::*;
    use crate::request::RES_GPU;

    fn c(name: &str, kind: ContainerKind, resources: &[(&str, &str)]) -> Container {
        Container::new(name, kind, resources)
    }

    fn demand(name: &str, kind: ContainerKind, gpus: u32) -> GpuDemand {
        GpuDemand {
            name: name.into(),
            kind,
            gpus,
        }
    }

    #[test]
    fn assignment_table() {
        // (case, demands in kubelet order, granted, expected positions per container)
        type Case = (&'static str, Vec<GpuDemand>, usize, Vec<Vec<u32>>);
        let cases: Vec<Case> = vec![
            (
                "two apps: disjoint",
                vec![demand("a", App, 1), demand("b", App, 2)],
                3,
                vec![vec![0], vec![1, 2]],
            ),
            (
                "init reuses what the apps get later",
                vec![
                    demand("i", Init, 2),
                    demand("a", App, 1),
                    demand("b", App, 1),
                ],
                2,
                vec![vec![0, 1], vec![0], vec![1]],
            ),
            (
                "init after a sidecar avoids the sidecar's GPU",
                vec![
                    demand("s", Sidecar, 1),
                    demand("i", Init, 1),
                    demand("a", App, 1),
                ],
                2,
                vec![vec![0], vec![1], vec![1]],
            ),
            (
                "init before a sidecar may use it",
                vec![
                    demand("i", Init, 2),
                    demand("s", Sidecar, 1),
                    demand("a", App, 1),
                ],
                2,
                vec![vec![0, 1], vec![0], vec![1]],
            ),
            (
                "MIG: one instance for the init container and then the app",
                vec![demand("i", Init, 1), demand("a", App, 1)],
                1,
                vec![vec![0], vec![0]],
            ),
        ];
        for (case, demands, granted, expected) in cases {
            let got = assign(&demands, granted).unwrap_or_else(|e| panic!("{case}: {e}"));
            let positions: Vec<Vec<u32>> = got.iter().map(|g| g.gpus.clone()).collect();
            assert_eq!(positions, expected, "{case}");
            let names: Vec<&str> = got.iter().map(|g| g.name.as_str()).collect();
            let want: Vec<&str> = demands.iter().map(|d| d.name.as_str()).collect();
            assert_eq!(names, want, "{case}");
        }
    }

    #[test]
    fn assignment_refuses_a_grant_too_small() {
        let e = assign(&[demand("a", App, 1), demand("b", App, 1)], 1).unwrap_err();
        assert_eq!((e.container.as_str(), e.needed, e.granted), ("b", 1, 1));
        let e = assign(&[demand("s", Sidecar, 1), demand("i", Init, 1)], 1).unwrap_err();
        assert_eq!(e.container, "i");
    }

    #[test]
    fn effective_and_assignment_agree() {
        // The effective count is always enough for the assignment (seeded sweep).
        let kinds = [Init, Sidecar, App];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut pod = Vec::new();
            let n = 1 + (seed % 5) as usize;
            for i in 0..n {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let kind = kinds[(seed % 3) as usize];
                let count = (seed >> 8) % 3;
                pod.push(c(&format!("c{i}"), kind, &[(RES_GPU, &count.to_string())]));
            }
            // The spec lists init containers and sidecars first.
            pod.sort_by_key(|c| c.kind == App);
            let total: usize = effective_request(&pod)
                .unwrap()
                .into_iter()
                .find(|(k, _)| k == RES_GPU)
                .map_or(0, |(_, v)| v.parse().unwrap());
            let demands = gpu_demands(&pod).unwrap();
            let grants = assign(&demands, total).unwrap_or_else(|e| panic!("{pod:?}: {e}"));
            // Long-running containers never share a position.
            let mut held: Vec<u32> = grants
                .iter()
                .zip(&demands)
                .filter(|(_, d)| d.kind != Init)
                .flat_map(|(g, _)| g.gpus.clone())
                .collect();
            let len = held.len();
            held.sort_unstable();
            held.dedup();
            assert_eq!(held.len(), len, "{pod:?}");
            // An init container never takes a GPU of a sidecar already running.
            let mut running: Vec<u32> = Vec::new();
            for (g, d) in grants.iter().zip(&demands) {
                match d.kind {
                    Sidecar => running.extend(&g.gpus),
                    Init => assert!(g.gpus.iter().all(|p| !running.contains(p)), "{pod:?}"),
                    App => {}
                }
            }
        }
    }
}
