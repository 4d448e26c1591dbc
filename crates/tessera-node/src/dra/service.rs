//! The `DRAPlugin` service, served as both `v1` and `v1beta1` (protocols.md §3.11).
//!
//! The kubelet sends only claim identities; what to prepare is the
//! [`ClaimPreparer`]'s business (it reads the claim's allocation itself). The
//! rules of the protocol live here: every claim of a request gets an entry in
//! the answer, keyed by its UID, and a claim that fails carries its error in
//! that entry instead of failing the whole call (a gRPC error makes the
//! kubelet ignore the answer for every claim).

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::proto::{v1, v1beta1};

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One prepared device, as the kubelet is told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim's requests this device serves (empty: all of them).
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    /// Fully-qualified CDI device names for the runtime.
    pub cdi_device_ids: Vec<String>,
    /// The share, for a device allocated several times (consumable capacity).
    pub share_id: Option<String>,
}

/// Prepares and unprepares claims on this node. Both must be idempotent: the
/// kubelet repeats calls after restarts and timeouts.
#[tonic::async_trait]
pub trait ClaimPreparer: Send + Sync + 'static {
    /// The devices of `claim` that belong to this driver, ready for use.
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, String>;
    /// Releases what [`ClaimPreparer::prepare`] set up; nothing to do is success.
    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), String>;
}

/// Serves `NodePrepareResources` / `NodeUnprepareResources` from a [`ClaimPreparer`].
#[derive(Clone)]
pub struct DraService {
    preparer: Arc<dyn ClaimPreparer>,
}

impl std::fmt::Debug for DraService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraService").finish_non_exhaustive()
    }
}

impl DraService {
    pub fn new(preparer: Arc<dyn ClaimPreparer>) -> Self {
        DraService { preparer }
    }

    /// Prepares every claim, one answer per claim UID (v1 shapes).
    pub async fn prepare_all(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, v1::NodePrepareResourceResponse> {
        let mut out = HashMap::with_capacity(claims.len());
        for claim in claims {
            let answer = match self.preparer.prepare(&claim).await {
                Ok(devices) => v1::NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| v1::Device {
                            request_names: d.request_names,
                            pool_name: d.pool_name,
                            device_name: d.device_name,
                            cdi_device_ids: d.cdi_device_ids,
                            share_id: d.share_id,
                        })
                        .collect(),
                    error: String::new(),
                },
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, %error, "cannot prepare claim");
                    v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            out.insert(claim.uid, answer);
        }
        out
    }

    /// Unprepares every claim, one answer per claim UID.
    pub async fn unprepare_all(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, v1::NodeUnprepareResourceResponse> {
        let mut out = HashMap::with_capacity(claims.len());
        for claim in claims {
            let error = match self.preparer.unprepare(&claim).await {
                Ok(()) => String::new(),
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, %error, "cannot unprepare claim");
                    error
                }
            };
            out.insert(claim.uid, v1::NodeUnprepareResourceResponse { error });
        }
        out
    }
}

fn claim_v1(c: v1::Claim) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace,
        name: c.name,
        uid: c.uid,
    }
}

fn claim_v1beta1(c: v1beta1::Claim) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace,
        name: c.name,
        uid: c.uid,
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(claim_v1)
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse {
            claims: self.prepare_all(claims).await,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(claim_v1)
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse {
            claims: self.unprepare_all(claims).await,
        }))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraService {
    /// As v1; v1beta1 has no `share_id`, so a shared device is answered without
    /// it (the kubelet of that version cannot have allocated shares).
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(claim_v1beta1)
            .collect();
        let claims = self
            .prepare_all(claims)
            .await
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| v1beta1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                let answer = v1beta1::NodePrepareResourceResponse {
                    devices,
                    error: r.error,
                };
                (uid, answer)
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(claim_v1beta1)
            .collect();
        let claims = self
            .unprepare_all(claims)
            .await
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    v1beta1::NodeUnprepareResourceResponse { error: r.error },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}
