//! `/healthz` and `/readyz` of the DRA driver, on the agent's `--metrics-addr`.
//!
//! A DaemonSet rollout, `kubectl get pods` and the chart's readiness probe
//! need to know whether the driver serves: `/healthz` says the process is
//! alive (200 always, so a slow kubelet never restarts it); `/readyz` is 200
//! once the kubelet has accepted the registration, the node has a GPU and the
//! node's ResourceSlices have been published at least once (a later failed
//! publish leaves the published slices in place, so the driver stays ready
//! and says so), and 503 naming what is missing otherwise. The device-plugin
//! agent's `/metrics` ([`crate::metrics`]) is served beside them
//! ([`super::driver::run_driver`]).

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

use super::registration::RegistrationState;
use crate::deviceplugin::NodeView;

/// What the slice publisher has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceState {
    /// Without an API server nothing is published and no claim can be read.
    pub no_api_server: bool,
    /// Slices in the last publish that succeeded (`None`: none has).
    pub published: Option<usize>,
    /// Why the last publish failed, when it did.
    pub last_error: Option<String>,
    /// Why nothing is published now (device-plugin pods still on the node).
    pub blocked: Option<String>,
}

/// `Ok(what serves)` when the driver is ready, `Err(what is missing)` when not.
pub fn readiness(
    registration: &RegistrationState,
    slices: &SliceState,
    view: &NodeView,
) -> Result<String, String> {
    let mut missing = Vec::new();
    match registration {
        RegistrationState::Registered => {}
        RegistrationState::Pending => {
            missing.push("the kubelet has not registered the driver yet".to_string())
        }
        RegistrationState::Refused(why) => {
            missing.push(format!("the kubelet refused the registration: {why}"))
        }
    }
    if view.gpus.is_empty() {
        missing.push("no GPU found".to_string());
    }
    if slices.no_api_server {
        missing.push(
            "no API server: no ResourceSlice is published and no claim can be read".to_string(),
        );
    } else if let Some(why) = &slices.blocked {
        missing.push(why.clone());
    } else if slices.published.is_none() {
        missing.push(match &slices.last_error {
            Some(e) => format!("ResourceSlices not published: {e}"),
            None => "ResourceSlices not published yet".to_string(),
        });
    }
    if !missing.is_empty() {
        return Err(missing.join("; "));
    }
    let healthy = view
        .gpus
        .iter()
        .filter(|g| view.is_healthy(&g.uuid))
        .count();
    let mut text = format!(
        "ready: registered with the kubelet; {} GPU(s), {healthy} healthy; {} ResourceSlice(s) published",
        view.gpus.len(),
        slices.published.unwrap_or(0)
    );
    if let Some(e) = &slices.last_error {
        text.push_str(&format!(
            " (the last publish failed: {e}; the slices before it stand)"
        ));
    }
    Ok(text)
}

/// The probe routes over the driver's live state.
pub fn router(
    registration: watch::Receiver<RegistrationState>,
    slices: watch::Receiver<SliceState>,
    view: watch::Receiver<NodeView>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let verdict = readiness(&registration.borrow(), &slices.borrow(), &view.borrow());
                async move {
                    match verdict {
                        Ok(text) => (StatusCode::OK, format!("{text}\n")),
                        Err(text) => (StatusCode::SERVICE_UNAVAILABLE, format!("{text}\n")),
                    }
                }
            }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(gpus: usize) -> NodeView {
        let yaml = if gpus == 0 {
            "gpus: []\n".to_string()
        } else {
            let list: String = (0..gpus)
                .map(|i| format!("  - {{ uuid: GPU-{i}, product: NVIDIA A100-SXM4-80GB }}\n"))
                .collect();
            format!("gpus:\n{list}")
        };
        let fake = crate::backend::fake::Fake::from_yaml(&yaml, "t").unwrap();
        use crate::backend::GpuBackend;
        NodeView {
            gpus: fake.discover().unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn ready_only_registered_with_a_gpu_and_slices_published() {
        let published = SliceState {
            published: Some(1),
            ..Default::default()
        };
        let ok = readiness(&RegistrationState::Registered, &published, &view(2)).unwrap();
        assert!(
            ok.contains("2 GPU(s), 2 healthy; 1 ResourceSlice(s)"),
            "{ok}"
        );

        let e = readiness(&RegistrationState::Pending, &published, &view(2)).unwrap_err();
        assert!(e.contains("not registered the driver yet"), "{e}");
        let e = readiness(
            &RegistrationState::Refused("version".into()),
            &published,
            &view(2),
        )
        .unwrap_err();
        assert!(e.contains("refused the registration: version"), "{e}");
        let e = readiness(&RegistrationState::Registered, &published, &view(0)).unwrap_err();
        assert!(e.contains("no GPU found"), "{e}");
        let failing = SliceState {
            last_error: Some("403 forbidden".into()),
            ..Default::default()
        };
        let e = readiness(&RegistrationState::Registered, &failing, &view(1)).unwrap_err();
        assert!(
            e.contains("ResourceSlices not published: 403 forbidden"),
            "{e}"
        );
        let none = SliceState {
            no_api_server: true,
            ..Default::default()
        };
        assert!(readiness(&RegistrationState::Registered, &none, &view(1)).is_err());
        // Published once, failing since: the slices stand, the driver stays ready.
        let stale = SliceState {
            published: Some(1),
            last_error: Some("timeout".into()),
            ..Default::default()
        };
        let ok = readiness(&RegistrationState::Registered, &stale, &view(1)).unwrap();
        assert!(ok.contains("the last publish failed: timeout"), "{ok}");
    }
}
