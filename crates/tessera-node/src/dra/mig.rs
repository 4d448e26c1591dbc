//! MIG instances at prepare: the driver creates the instance of an allocated
//! partitionable placement ([`super::placement`]) that does not exist yet, and
//! destroys it at unprepare once no claim uses it ([`super::records`]).
//!
//! Creation goes through the device-plugin planner's one path
//! ([`crate::migplan::ensure_instance`]) with MIG-mode switching off: the
//! published slices offer placements only on GPUs already in MIG mode. Every
//! change is followed by a fresh read of the GPUs into the node view, so the
//! slices are republished with the instance's UUID and prepare finds it by name.
//! The backend is synchronous (NVML): each call runs on a blocking thread.

use std::sync::Arc;

use tokio::sync::watch;

use super::placement::Placement;
use super::records::OwnedInstance;
use crate::backend::{BackendError, GpuBackend, GpuInfo, MigInstance};
use crate::deviceplugin::NodeView;
use crate::migplan::{Ensured, ensure_instance};

/// Creates and destroys MIG instances for claims, and keeps the view current.
#[derive(Clone)]
pub struct MigCreator {
    backend: Arc<dyn GpuBackend>,
    view: watch::Sender<NodeView>,
}

impl std::fmt::Debug for MigCreator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigCreator").finish_non_exhaustive()
    }
}

/// A join error of a blocking task, as a backend error.
fn joined(call: &'static str, e: tokio::task::JoinError) -> BackendError {
    BackendError::Nvml {
        call,
        gpu: "*".into(),
        message: e.to_string(),
    }
}

impl MigCreator {
    pub fn new(backend: Arc<dyn GpuBackend>, view: watch::Sender<NodeView>) -> MigCreator {
        MigCreator { backend, view }
    }

    /// Creates `placement`'s instance on `gpu`; `None` when the GPU already has
    /// one there (made by someone else since the view was read: not ours).
    pub async fn create(
        &self,
        gpu: GpuInfo,
        placement: Placement,
    ) -> Result<Option<MigInstance>, BackendError> {
        let backend = self.backend.clone();
        tokio::task::spawn_blocking(move || {
            ensure_instance(
                backend.as_ref(),
                &gpu,
                &placement.profile,
                placement.start,
                false,
                &mut || {},
            )
        })
        .await
        .map_err(|e| joined("create MIG instance", e))?
        .map(|e| match e {
            Ensured::Existing => None,
            Ensured::Created(i) => Some(i),
        })
    }

    /// Destroys an instance the driver created.
    pub async fn destroy(&self, owned: &OwnedInstance) -> Result<(), BackendError> {
        let backend = self.backend.clone();
        let (gpu, uuid) = (owned.gpu.clone(), owned.uuid.clone());
        tokio::task::spawn_blocking(move || backend.destroy_mig_instance(&gpu, &uuid))
            .await
            .map_err(|e| joined("destroy MIG instance", e))?
    }

    /// The GPUs as the backend lists them now.
    pub async fn discover(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let backend = self.backend.clone();
        tokio::task::spawn_blocking(move || backend.discover())
            .await
            .map_err(|e| joined("discover", e))?
    }

    /// Reads the GPUs again and publishes them in the view (health stays as
    /// tracked); returns the new view.
    pub async fn refresh(&self) -> Result<NodeView, BackendError> {
        let gpus = self.discover().await?;
        self.view.send_modify(|v| v.gpus = gpus);
        Ok(self.view.borrow().clone())
    }
}
