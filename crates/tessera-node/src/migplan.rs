//! Dynamic MIG on the node: the agent applies the MIG instances the scheduler
//! planned (`create` in a decision's MIG grant, issue 13) and removes them again.
//!
//! - **Create**: when `Allocate` reaches a pod whose decision plans an instance that
//!   does not exist, the agent switches the GPU into MIG mode if the plan says so,
//!   creates the GPU instance and its compute instance at exactly the planned
//!   placement, and publishes the new layout in the node view, so the device
//!   plugins advertise the device and the answer names it, without a restart.
//!   A refused creation (an invalid placement, slices in use) fails that pod's
//!   admission with the driver's error and leaves the GPU as it was.
//! - **Destroy**: [`MigPlanner::reap`] destroys instances this agent created that no
//!   live decision has held for the grace period (so a pod arriving soon after can
//!   reuse one), and switches a GPU the agent put in MIG mode back once it holds no
//!   instance. Instances the agent did not create are never touched.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_core::allocation::Allocation;
use tokio::sync::watch;

use crate::backend::{BackendError, GpuBackend};
use crate::deviceplugin::NodeView;
use crate::deviceplugin::allocate::PodInfo;

/// Default time an instance nobody holds is kept for reuse.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);

/// An instance this agent created: its GPU, and since when no decision holds it.
#[derive(Debug, Clone)]
struct Created {
    gpu: String,
    profile: String,
    start: u8,
    unheld_since: Option<Instant>,
}

/// Applies and reaps planned MIG instances on one node.
pub struct MigPlanner {
    backend: Arc<dyn GpuBackend>,
    view: watch::Sender<NodeView>,
    grace: Duration,
    created: Mutex<BTreeMap<String, Created>>,
    /// GPUs this agent switched into MIG mode.
    switched: Mutex<Vec<String>>,
}

impl std::fmt::Debug for MigPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigPlanner")
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl MigPlanner {
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        view: watch::Sender<NodeView>,
        grace: Duration,
    ) -> MigPlanner {
        MigPlanner {
            backend,
            view,
            grace,
            created: Mutex::new(BTreeMap::new()),
            switched: Mutex::new(Vec::new()),
        }
    }

    /// Re-reads the GPUs and publishes them (health stays as tracked).
    fn refresh(&self) -> Result<NodeView, BackendError> {
        let gpus = self.backend.discover()?;
        self.view.send_modify(|v| v.gpus = gpus);
        Ok(self.view.borrow().clone())
    }

    /// Makes every instance `alloc` plans exist; returns the view to answer from
    /// (refreshed when anything was created). Blocking: NVML is synchronous.
    pub fn apply(&self, alloc: &Allocation, view: &NodeView) -> Result<NodeView, BackendError> {
        let mut changed = false;
        for g in &alloc.gpus {
            let Some(m) = g.mig.as_ref().filter(|m| m.create) else {
                continue;
            };
            let Some(gpu) = view.grant_gpu(g) else {
                continue;
            };
            let exists = gpu.mig_enabled
                && gpu
                    .mig_instances
                    .iter()
                    .any(|i| i.profile == m.profile && i.start == Some(m.start));
            if exists {
                continue;
            }
            if !gpu.mig_enabled {
                if !m.enable_mig_mode {
                    return Err(BackendError::Mig {
                        gpu: gpu.uuid.clone(),
                        code: "NVML_ERROR_NOT_SUPPORTED",
                        message: "MIG mode is off and the decision does not plan to switch it on"
                            .into(),
                    });
                }
                self.backend.set_mig_mode(&gpu.uuid, true)?;
                self.lock_switched().push(gpu.uuid.clone());
            }
            let inst = self
                .backend
                .create_mig_instance(&gpu.uuid, &m.profile, m.start)?;
            tracing::info!(gpu = %gpu.uuid, profile = %m.profile, start = m.start, uuid = %inst.uuid, pod = %alloc.pod, "created planned MIG instance");
            self.lock_created().insert(
                inst.uuid,
                Created {
                    gpu: gpu.uuid.clone(),
                    profile: m.profile.clone(),
                    start: m.start,
                    unheld_since: None,
                },
            );
            changed = true;
        }
        if changed {
            self.refresh()
        } else {
            Ok(view.clone())
        }
    }

    /// Destroys created instances no live pod's decision (verified with `key`) has
    /// held for the grace period; switches GPUs it put in MIG mode back when empty.
    /// Returns how many instances were destroyed.
    pub fn reap(
        &self,
        pods: &[PodInfo],
        key: &[u8],
        node: &str,
        now: Instant,
    ) -> Result<usize, BackendError> {
        let held: Vec<(String, u32, String, u8)> = PodInfo::live_decisions(pods, key, node)
            .flat_map(|a| {
                a.gpus
                    .into_iter()
                    .filter_map(|g| g.mig.map(|m| (g.uuid, g.index, m.profile, m.start)))
                    .collect::<Vec<_>>()
            })
            .collect();
        let view = self.view.borrow().clone();
        let index_of = |uuid: &str| view.gpu(uuid).map(|g| g.index);
        let mut doomed = Vec::new();
        {
            let mut created = self.lock_created();
            for (mig_uuid, c) in created.iter_mut() {
                let is_held = held.iter().any(|(u, i, p, s)| {
                    (u == &c.gpu || (u.is_empty() && Some(*i) == index_of(&c.gpu)))
                        && p == &c.profile
                        && *s == c.start
                });
                if is_held {
                    c.unheld_since = None;
                    continue;
                }
                let since = *c.unheld_since.get_or_insert(now);
                if now.duration_since(since) >= self.grace {
                    doomed.push((mig_uuid.clone(), c.gpu.clone()));
                }
            }
        }
        let mut destroyed = 0;
        for (mig_uuid, gpu) in &doomed {
            self.backend.destroy_mig_instance(gpu, mig_uuid)?;
            self.lock_created().remove(mig_uuid);
            tracing::info!(gpu = %gpu, uuid = %mig_uuid, "destroyed MIG instance no allocation holds");
            destroyed += 1;
        }
        if destroyed > 0 {
            let view = self.refresh()?;
            let mut switched = self.lock_switched();
            let mut still = Vec::new();
            for gpu in switched.drain(..) {
                let empty = view
                    .gpu(&gpu)
                    .is_some_and(|g| g.mig_enabled && g.mig_instances.is_empty());
                if empty && self.backend.set_mig_mode(&gpu, false).is_ok() {
                    tracing::info!(gpu = %gpu, "MIG mode off again: no instance left");
                } else {
                    still.push(gpu);
                }
            }
            *switched = still;
            drop(switched);
            self.refresh()?;
        }
        Ok(destroyed)
    }

    fn lock_created(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Created>> {
        self.created.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_switched(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.switched.lock().unwrap_or_else(|p| p.into_inner())
    }
}
