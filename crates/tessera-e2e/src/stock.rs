//! A node with NVIDIA's stock device plugin, as far as the kubelet sees it: a
//! `v1beta1.DevicePlugin` that registers `nvidia.com/gpu` with the node's
//! kubelet stand-in and hands any device the kubelet picks (the stock
//! plugin's `Allocate` sets `NVIDIA_VISIBLE_DEVICES` to the device IDs it is
//! given). No Tessera agent runs there: a mixed cluster's non-Tessera GPU node.

use std::path::Path;
use std::pin::Pin;

use anyhow::Result;
use futures::{Stream, StreamExt};
use kube::Client;
use tessera_node::proto::deviceplugin as pb;
use tessera_node::proto::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use tessera_node::proto::deviceplugin::registration_client::RegistrationClient;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};

use crate::kubelet::{Kubelet, create_node};

/// The resource the stock plugin serves.
pub const RESOURCE: &str = "nvidia.com/gpu";

/// A stock GPU node: its kubelet stand-in and its plugin's server.
pub struct StockNode {
    pub name: String,
    pub kubelet: Kubelet,
    server: JoinHandle<()>,
}

impl Drop for StockNode {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Clone)]
struct StockPlugin {
    ids: Vec<String>,
}

type Devices = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for StockPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions::default()))
    }

    type ListAndWatchStream = Devices;

    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let devices = self
            .ids
            .iter()
            .map(|id| pb::Device {
                id: id.clone(),
                health: "Healthy".into(),
                topology: None,
            })
            .collect();
        // One list, then the stream stays open as the plugin's does.
        let first = futures::stream::iter([Ok(pb::ListAndWatchResponse { devices })]);
        Ok(Response::new(Box::pin(
            first.chain(futures::stream::pending()),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented(
            "the stock plugin offers no preference here",
        ))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| pb::ContainerAllocateResponse {
                envs: [(
                    "NVIDIA_VISIBLE_DEVICES".to_string(),
                    c.devices_ids.join(","),
                )]
                .into(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

/// Creates the Node `name` with a kubelet stand-in in `dir` and a stock plugin
/// of `gpus` devices registered with it; returns once the Node shows them.
pub async fn start_stock_node(
    admin: &Client,
    name: &str,
    dir: &Path,
    gpus: usize,
) -> Result<StockNode> {
    create_node(admin, name, &[]).await?;
    std::fs::create_dir_all(dir)?;
    let kubelet = Kubelet::start(admin.clone(), name, dir)?;
    let plugins = kubelet.device_plugin_dir();
    let endpoint = "nvidia-stock.sock";
    let listener = UnixListener::bind(plugins.join(endpoint))?;
    let plugin = StockPlugin {
        ids: (0..gpus)
            .map(|i| format!("GPU-570c0000-0000-4000-8000-{i:012}"))
            .collect(),
    };
    let server = tokio::spawn(async move {
        let _ = Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    });
    let sock = plugins.join("kubelet.sock");
    let ch = Endpoint::from_shared(format!("unix://{}", sock.display()))?
        .connect()
        .await?;
    RegistrationClient::new(ch)
        .register(pb::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: endpoint.into(),
            resource_name: RESOURCE.into(),
            options: Some(pb::DevicePluginOptions::default()),
        })
        .await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while kubelet.resources().get(RESOURCE) != Some(&gpus) {
        if std::time::Instant::now() > deadline {
            anyhow::bail!("the stock plugin of {name} never reached the kubelet stand-in");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(StockNode {
        name: name.to_string(),
        kubelet,
        server,
    })
}
