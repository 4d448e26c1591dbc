//! The `v1beta1.DevicePlugin` gRPC service for one resource.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::allocate::Allocator;
use super::preferred::preferred;
use super::{NodeView, Resource};
use crate::proto::deviceplugin as pb;
use crate::proto::deviceplugin::device_plugin_server::DevicePlugin;

/// Serves one resource. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DevicePluginService {
    pub resource: Resource,
    view: watch::Receiver<NodeView>,
    allocator: Arc<Allocator>,
}

impl DevicePluginService {
    pub fn new(
        resource: Resource,
        view: watch::Receiver<NodeView>,
        allocator: Arc<Allocator>,
    ) -> Self {
        DevicePluginService {
            resource,
            view,
            allocator,
        }
    }

    /// The options sent at registration and from `GetDevicePluginOptions`.
    pub fn options() -> pb::DevicePluginOptions {
        pb::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(Self::options()))
    }

    type ListAndWatchStream = DeviceStream;

    /// Sends the complete list now and again on every change of it (health,
    /// inventory), for as long as the kubelet keeps the stream open.
    async fn list_and_watch(
        &self,
        _request: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.view.clone();
        let resource = self.resource.clone();
        let stream =
            futures::stream::unfold((rx, None::<Vec<pb::Device>>), move |(mut rx, last)| {
                let resource = resource.clone();
                async move {
                    loop {
                        let devices = resource.devices(&rx.borrow_and_update());
                        if last.as_ref() != Some(&devices) {
                            let msg = pb::ListAndWatchResponse {
                                devices: devices.clone(),
                            };
                            return Some((Ok(msg), (rx, Some(devices))));
                        }
                        // The agent is shutting down when the sender is gone: end the stream.
                        rx.changed().await.ok()?;
                    }
                }
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let view = self.view.borrow().clone();
        let mut container_responses = Vec::new();
        for c in &request.into_inner().container_requests {
            let size = usize::try_from(c.allocation_size).unwrap_or(0);
            // The asking container's granted devices first (the kubelet's record
            // then matches what Allocate hands); else the topology-best set.
            let granted = if c.must_include_device_i_ds.is_empty() {
                self.allocator
                    .granted_preference(&self.resource, size, &c.available_device_i_ds, &view)
                    .await
            } else {
                None
            };
            let device_i_ds = granted.unwrap_or_else(|| {
                preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    size,
                    &view,
                )
            });
            container_responses.push(pb::ContainerPreferredAllocationResponse { device_i_ds });
        }
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let view = self.view.borrow().clone();
        let mut container_responses = Vec::new();
        for c in &request.into_inner().container_requests {
            let r = self
                .allocator
                .allocate_container(&self.resource, c, &view)
                .await
                .map_err(|e| e.to_status())?;
            container_responses.push(r);
        }
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _request: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}
