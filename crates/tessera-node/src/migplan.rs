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
//! - **Across restarts**: with a state file ([`MigPlanner::with_state`], a file under
//!   `/run`, so it lasts as long as the instances do: a reboot takes both), what the
//!   agent created survives an agent restart or upgrade and is still reaped; without
//!   it, instances made before a restart would never be destroyed. Entries are
//!   adopted again only if the GPU still has that instance (UUID, profile and start).
//!   An entry whose GPU cannot be seen (NVML failing, the driver not loaded yet,
//!   the GPU missing from the list) is kept unchecked, in the file too, and checked
//!   on a later reap tick that sees its GPU: a record is dropped only on evidence
//!   that its instance is gone, never because nothing could be read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tessera_core::allocation::{Allocation, VerifyingKeys};
use tokio::sync::watch;

use crate::backend::{BackendError, GpuBackend, GpuInfo, MigInstance};
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
    /// Where `created` and `switched` are kept across restarts.
    state: Option<PathBuf>,
    /// Entries of the state file not checked against the GPUs yet (they could not
    /// be listed): kept in the file, adopted or dropped once they can.
    unchecked: Mutex<State>,
}

/// The state file: what the planner made, without the in-memory timers (the grace
/// starts again after a restart, which only keeps an instance longer).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    created: Vec<StateInstance>,
    switched: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateInstance {
    /// The MIG device's UUID.
    uuid: String,
    /// Its GPU's UUID.
    gpu: String,
    profile: String,
    start: u8,
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
            state: None,
            unchecked: Mutex::new(State::default()),
        }
    }

    /// Keeps what the planner makes in `path` and adopts what an earlier run of the
    /// agent left there, if the GPUs still have it (checked later when they cannot be
    /// listed now). An unreadable or malformed file is logged and replaced; it never
    /// stops the agent.
    pub fn with_state(mut self, path: PathBuf) -> MigPlanner {
        let saved = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<State>(&bytes) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "MIG state file is not valid; starting without it");
                    State::default()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the MIG state file; starting without it");
                State::default()
            }
        };
        self.state = Some(path);
        *self.lock_unchecked() = saved;
        self.adopt_unchecked(true);
        self.save();
        self
    }

    /// Checks the entries not yet checked against the GPUs: on a GPU that is listed,
    /// adopts those it still has and drops the rest; entries of a GPU not listed (or
    /// all, while the GPUs cannot be listed) stay unchecked, so nothing is dropped,
    /// and nothing destroyed, on a guess. Returns whether any entry was decided.
    fn adopt_unchecked(&self, log: bool) -> bool {
        let pending = {
            let u = self.lock_unchecked();
            if u.created.is_empty() && u.switched.is_empty() {
                return false;
            }
            u.clone()
        };
        let gpus = match self.backend.discover() {
            Ok(g) => g,
            Err(e) => {
                if log {
                    tracing::warn!(error = %e, "cannot list GPUs; MIG records from before the restart are checked once they can be");
                }
                return false;
            }
        };
        let mut left = State::default();
        let mut decided = false;
        {
            let mut created = self.lock_created();
            for i in pending.created {
                let Some(g) = gpus.iter().find(|g| g.uuid == i.gpu) else {
                    left.created.push(i);
                    continue;
                };
                decided = true;
                let there = g.mig_enabled
                    && g.mig_instances.iter().any(|m| {
                        m.uuid == i.uuid && m.profile == i.profile && m.start == Some(i.start)
                    });
                if there {
                    tracing::info!(gpu = %i.gpu, uuid = %i.uuid, "adopted a MIG instance this agent made before a restart");
                    created.insert(
                        i.uuid,
                        Created {
                            gpu: i.gpu,
                            profile: i.profile,
                            start: i.start,
                            unheld_since: None,
                        },
                    );
                }
            }
            let mut switched = self.lock_switched();
            for u in pending.switched {
                let Some(g) = gpus.iter().find(|g| g.uuid == u) else {
                    left.switched.push(u);
                    continue;
                };
                decided = true;
                if g.mig_enabled && !switched.contains(&u) {
                    switched.push(u);
                }
            }
        }
        if log && (!left.created.is_empty() || !left.switched.is_empty()) {
            tracing::warn!(
                instances = left.created.len(),
                gpus = left.switched.len(),
                "GPUs not seen; MIG records from before the restart are checked once they are"
            );
        }
        *self.lock_unchecked() = left;
        decided
    }

    /// Writes the state file (when there is one): a temporary file renamed over it, so
    /// a crash leaves the old state or the new, never half of one.
    fn save(&self) {
        let Some(path) = &self.state else {
            return;
        };
        let mut state = State {
            created: self
                .lock_created()
                .iter()
                .map(|(uuid, c)| StateInstance {
                    uuid: uuid.clone(),
                    gpu: c.gpu.clone(),
                    profile: c.profile.clone(),
                    start: c.start,
                })
                .collect(),
            switched: self.lock_switched().clone(),
        };
        // Not checked yet: kept as they were, for a later check or agent.
        let unchecked = self.lock_unchecked().clone();
        state.created.extend(unchecked.created);
        for u in unchecked.switched {
            if !state.switched.contains(&u) {
                state.switched.push(u);
            }
        }
        if let Err(e) = write_atomically(path, &state) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the MIG state file: instances made now are not reaped after an agent restart");
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
            let inst = match ensure_instance(
                self.backend.as_ref(),
                gpu,
                &m.profile,
                m.start,
                m.enable_mig_mode,
                &mut || {
                    self.lock_switched().push(gpu.uuid.clone());
                    self.save();
                },
            )? {
                Ensured::Existing => continue,
                Ensured::Created(inst) => inst,
            };
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
            self.save();
            self.refresh()
        } else {
            Ok(view.clone())
        }
    }

    /// Destroys created instances no live pod's decision (verified with `key`) has
    /// held for the grace period; switches GPUs it put in MIG mode back when empty.
    /// Returns how many instances were destroyed.
    pub fn reap<K: VerifyingKeys + ?Sized>(
        &self,
        pods: &[PodInfo],
        key: &K,
        node: &str,
        now: Instant,
    ) -> Result<usize, BackendError> {
        if self.adopt_unchecked(false) {
            self.save();
        }
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
            if let Err(e) = self.backend.destroy_mig_instance(gpu, mig_uuid) {
                // Those already destroyed leave the state file too.
                self.save();
                return Err(e);
            }
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
            self.save();
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

    fn lock_unchecked(&self) -> std::sync::MutexGuard<'_, State> {
        self.unchecked.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What [`ensure_instance`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    /// The GPU already has an instance of that profile at that start: nothing done.
    Existing,
    /// The instance was created now.
    Created(MigInstance),
}

/// Makes an instance of `profile` at memory slice `start` exist on `gpu`: the one
/// creation path of the device-plugin planner ([`MigPlanner::apply`]) and the DRA
/// driver ([`crate::dra::mig`]). A GPU out of MIG mode is switched on only when
/// `may_switch` says so; `switched` runs right after a switch, before the creation,
/// so the caller records it even if the creation then fails. A refused creation
/// leaves the GPU's instances as they were (the backend's contract). Blocking.
pub fn ensure_instance(
    backend: &dyn GpuBackend,
    gpu: &GpuInfo,
    profile: &str,
    start: u8,
    may_switch: bool,
    switched: &mut dyn FnMut(),
) -> Result<Ensured, BackendError> {
    let exists = gpu.mig_enabled
        && gpu
            .mig_instances
            .iter()
            .any(|i| i.profile == profile && i.start == Some(start));
    if exists {
        return Ok(Ensured::Existing);
    }
    if !gpu.mig_enabled {
        if !may_switch {
            return Err(BackendError::Mig {
                gpu: gpu.uuid.clone(),
                code: "NVML_ERROR_NOT_SUPPORTED",
                message: "MIG mode is off and switching it on is not allowed here".into(),
            });
        }
        backend.set_mig_mode(&gpu.uuid, true)?;
        switched();
    }
    backend
        .create_mig_instance(&gpu.uuid, profile, start)
        .map(Ensured::Created)
}

fn write_atomically(path: &Path, state: &State) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(state)?)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use tessera_core::allocation::{AllocatedGpu, MigGrant, VERSION};
    use tessera_core::request::Isolation;

    use super::*;
    use crate::backend::fake::Fake;

    const GPUS: &str = r#"
gpus:
  - uuid: GPU-m
    product: NVIDIA H100 80GB HBM3
"#;

    /// A planner over `fake` keeping its state in `path` (none: no state file).
    fn planner(fake: &Fake, path: Option<&Path>) -> MigPlanner {
        planner_over(Arc::new(fake.clone()), fake, path)
    }

    /// A planner over `backend`, its view starting with `fake`'s GPUs.
    fn planner_over(backend: Arc<dyn GpuBackend>, fake: &Fake, path: Option<&Path>) -> MigPlanner {
        let view = NodeView {
            settings: Default::default(),
            gpus: fake.discover().unwrap(),
            health: BTreeMap::new(),
        };
        let (tx, _rx) = watch::channel(view);
        let p = MigPlanner::new(backend, tx, Duration::ZERO);
        match path {
            Some(path) => p.with_state(path.to_path_buf()),
            None => p,
        }
    }

    /// The state file as written.
    fn recorded(path: &Path) -> State {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// An agent with its state in `path` creates the planned instance, then stops.
    fn agent_made_one(fake: &Fake, path: &Path) {
        let first = planner(fake, Some(path));
        let view = first.view.borrow().clone();
        first.apply(&planned(), &view).unwrap();
    }

    /// A decision planning a 3g.40gb at memory slice 4 on GPU-m, in MIG mode or not yet.
    fn planned() -> Allocation {
        Allocation {
            version: VERSION,
            pod_uid: "uid-hard".into(),
            pod: "ml/hard".into(),
            node: "n".into(),
            policy: "tessera".into(),
            isolation: Isolation::Mig,
            gpus: vec![AllocatedGpu {
                index: 0,
                uuid: "GPU-m".into(),
                memory_mib: 40_192,
                cores_milli: 428,
                mig: Some(MigGrant {
                    profile: "3g.40gb".into(),
                    start: 4,
                    size: 4,
                    uuid: String::new(),
                    create: true,
                    enable_mig_mode: true,
                }),
            }],
            containers: Vec::new(),
            signature: String::new(),
        }
    }

    fn layout(fake: &Fake) -> (bool, Vec<String>) {
        let g = &fake.discover().unwrap()[0];
        (
            g.mig_enabled,
            g.mig_instances.iter().map(|m| m.uuid.clone()).collect(),
        )
    }

    /// An agent restarted (or upgraded) between creating an instance and the pod
    /// leaving still destroys it and switches MIG mode back; without the state file
    /// the instance would stay forever. An instance it did not make stays untouched.
    #[test]
    fn a_restarted_agent_still_reaps_what_it_made() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state/mig.json");
        let fake = Fake::from_yaml(GPUS, "test").unwrap();
        agent_made_one(&fake, &state);
        let (on, made) = layout(&fake);
        assert!(on);
        assert_eq!(made.len(), 1);
        // Someone else's instance beside it.
        let foreign = fake.create_mig_instance("GPU-m", "1g.10gb", 0).unwrap();

        // Without the state file a new agent knows nothing to reap.
        let forgetful = planner(&fake, None);
        assert_eq!(forgetful.reap(&[], b"k", "n", Instant::now()).unwrap(), 0);
        assert_eq!(layout(&fake).1.len(), 2);

        let restarted = planner(&fake, Some(&state));
        assert_eq!(restarted.reap(&[], b"k", "n", Instant::now()).unwrap(), 1);
        assert_eq!(layout(&fake), (true, vec![foreign.uuid.clone()]));
        // The foreign instance keeps the GPU in MIG mode, so the switch stays
        // recorded as ours to undo; the destroyed instance left the record.
        let saved = recorded(&state);
        assert!(saved.created.is_empty(), "{saved:?}");
        assert_eq!(saved.switched, ["GPU-m"]);
    }

    /// The fake, with `discover` failing while `down` is set (NVML not loaded yet).
    struct Flaky {
        fake: Fake,
        down: std::sync::atomic::AtomicBool,
    }

    impl GpuBackend for Flaky {
        fn name(&self) -> &'static str {
            "flaky"
        }
        fn driver_version(&self) -> Option<String> {
            None
        }
        fn discover(&self) -> Result<Vec<crate::backend::GpuInfo>, BackendError> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(BackendError::NvmlUnavailable("driver not loaded".into()));
            }
            self.fake.discover()
        }
        fn read(&self, uuid: &str) -> Result<crate::backend::GpuReadings, BackendError> {
            self.fake.read(uuid)
        }
        fn wait_xid_events(
            &self,
            timeout: Duration,
        ) -> Result<Vec<crate::backend::XidEvent>, BackendError> {
            self.fake.wait_xid_events(timeout)
        }
        fn destroy_mig_instance(&self, gpu: &str, mig_uuid: &str) -> Result<(), BackendError> {
            self.fake.destroy_mig_instance(gpu, mig_uuid)
        }
        fn set_mig_mode(&self, gpu: &str, enabled: bool) -> Result<(), BackendError> {
            self.fake.set_mig_mode(gpu, enabled)
        }
    }

    /// An agent that starts while the GPUs cannot be listed (NVML failing, or the
    /// driver not loaded: no GPU at all) keeps the records unchecked instead of
    /// dropping them: in the file for the next agent, and checked by its own reap
    /// once the GPUs are back, which then destroys the instance.
    #[test]
    fn records_outlive_an_agent_that_cannot_see_the_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("mig.json");
        let fake = Fake::from_yaml(GPUS, "test").unwrap();
        agent_made_one(&fake, &state);
        assert_eq!(recorded(&state).created.len(), 1);

        // No driver: the backend lists no GPU.
        let blind = planner_over(
            Arc::new(crate::backend::Unavailable {
                reason: "libnvidia-ml.so.1: cannot open shared object file".into(),
            }),
            &fake,
            Some(&state),
        );
        assert_eq!(blind.reap(&[], b"k", "n", Instant::now()).unwrap(), 0);
        drop(blind);
        let kept = recorded(&state);
        assert_eq!(
            (kept.created.len(), kept.switched.len()),
            (1, 1),
            "{kept:?}"
        );
        assert_eq!(layout(&fake).1.len(), 1);

        // NVML failing at start, working by the first reap tick after.
        let flaky = Arc::new(Flaky {
            fake: fake.clone(),
            down: true.into(),
        });
        let p = planner_over(flaky.clone(), &fake, Some(&state));
        assert_eq!(p.reap(&[], b"k", "n", Instant::now()).unwrap(), 0);
        assert_eq!(recorded(&state).created.len(), 1);
        flaky.down.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(p.reap(&[], b"k", "n", Instant::now()).unwrap(), 1);
        assert_eq!(layout(&fake), (false, Vec::new()));
        let done = recorded(&state);
        assert!(
            done.created.is_empty() && done.switched.is_empty(),
            "{done:?}"
        );
    }

    /// Only entries the GPU still has are adopted; a malformed file starts empty and
    /// is replaced, and nothing is destroyed on its account.
    #[test]
    fn the_state_is_checked_against_the_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("mig.json");
        let fake = Fake::from_yaml(GPUS, "test").unwrap();
        fake.set_mig_mode("GPU-m", true).unwrap();
        let real = fake.create_mig_instance("GPU-m", "3g.40gb", 4).unwrap();
        let entry = |uuid: &str, start: u8| StateInstance {
            uuid: uuid.into(),
            gpu: "GPU-m".into(),
            profile: "3g.40gb".into(),
            start,
        };
        let written = State {
            // The real one, one that no longer exists, the real UUID at another start.
            created: vec![
                entry(&real.uuid, 4),
                entry("MIG-gone", 0),
                entry(&real.uuid, 0),
            ],
            switched: vec!["GPU-m".into(), "GPU-elsewhere".into()],
        };
        std::fs::write(&state, serde_json::to_vec(&written).unwrap()).unwrap();
        let p = planner(&fake, Some(&state));
        let adopted: Vec<(String, u8)> = p
            .lock_created()
            .iter()
            .map(|(u, c)| (u.clone(), c.start))
            .collect();
        assert_eq!(adopted, [(real.uuid.clone(), 4)]);
        assert_eq!(*p.lock_switched(), ["GPU-m"]);
        drop(p);

        std::fs::write(&state, b"{ not json").unwrap();
        let p = planner(&fake, Some(&state));
        assert!(p.lock_created().is_empty());
        assert_eq!(p.reap(&[], b"k", "n", Instant::now()).unwrap(), 0);
        assert_eq!(layout(&fake).1, std::slice::from_ref(&real.uuid));
        let replaced = recorded(&state);
        assert!(replaced.created.is_empty() && replaced.switched.is_empty());
    }
}
