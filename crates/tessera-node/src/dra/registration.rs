//! The plugin-watcher `Registration` service (protocols.md §3.10).
//!
//! The kubelet notices `<driver>-reg.sock` in its registry directory, calls
//! `GetInfo`, checks `supported_versions` against the DRA services it knows
//! and keeps the first match, then reports the outcome with
//! `NotifyRegistrationStatus`. The outcome is kept in a watch channel so the
//! agent can log it and tests can wait for it. Deregistration is the removal
//! of the socket ([`super::server`] removes it on shutdown).

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::proto::pluginregistration as pb;
use super::proto::pluginregistration::registration_server::Registration;
use super::{DRIVER_NAME, PLUGIN_TYPE, SUPPORTED_SERVICES};

/// What the kubelet last said about the registration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum RegistrationState {
    /// No `NotifyRegistrationStatus` yet.
    #[default]
    Pending,
    /// The kubelet accepted the driver.
    Registered,
    /// The kubelet refused it, with its reason.
    Refused(String),
}

/// Answers the kubelet's plugin watcher. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    /// Absolute path of the DRA service socket.
    endpoint: String,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    /// `endpoint` is the absolute path of `dra.sock`.
    pub fn new(endpoint: String, state: watch::Sender<RegistrationState>) -> Self {
        RegistrationService { endpoint, state }
    }

    /// The `GetInfo` answer.
    pub fn info(&self) -> pb::PluginInfo {
        pb::PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_SERVICES.iter().map(|s| s.to_string()).collect(),
        }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::PluginInfo>, Status> {
        Ok(Response::new(self.info()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<pb::RegistrationStatus>,
    ) -> Result<Response<pb::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let state = if status.plugin_registered {
            tracing::info!(
                driver = DRIVER_NAME,
                "registered with the kubelet as a DRA driver"
            );
            RegistrationState::Registered
        } else {
            tracing::warn!(driver = DRIVER_NAME, error = %status.error, "the kubelet refused the DRA driver");
            RegistrationState::Refused(status.error)
        };
        self.state.send_replace(state);
        Ok(Response::new(pb::RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn get_info_names_the_driver_its_socket_and_services_preferred_first() {
        let (tx, rx) = watch::channel(RegistrationState::Pending);
        let svc = RegistrationService::new("/p/gpu.tessera.io/dra.sock".into(), tx);
        let info = svc
            .get_info(Request::new(pb::InfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "gpu.tessera.io");
        assert_eq!(info.endpoint, "/p/gpu.tessera.io/dra.sock");
        // The kubelet keeps the first entry it supports: v1 before v1beta1.
        assert_eq!(
            info.supported_versions,
            ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        );
        svc.notify_registration_status(Request::new(pb::RegistrationStatus {
            plugin_registered: false,
            error: "version mismatch".into(),
        }))
        .await
        .unwrap();
        assert_eq!(
            *rx.borrow(),
            RegistrationState::Refused("version mismatch".into())
        );
    }
}
