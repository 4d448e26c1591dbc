//! Fake nodes and a kubelet stand-in (KWOK-style: Node objects whose status
//! the suite writes, no container runtime).
//!
//! The stand-in does for device plugins what the kubelet does, over real unix
//! sockets: it serves `Registration` on `<dir>/kubelet.sock`, dials each plugin
//! back (tonic's unix connector sends `:authority` "localhost", as the
//! kubelet's gRPC dialer does), runs `ListAndWatch` and writes the healthy
//! count into the Node's capacity and allocatable. It serves the PodResources
//! API listing the pods it has reached. It admits the pods bound to its node
//! one at a time, in creation order: `GetPreferredAllocation` (when offered)
//! then `Allocate` per container and resource, then marks the pod Running; a
//! refused `Allocate` fails the pod as the kubelet does
//! (`UnexpectedAdmissionError`). Deleted pods are removed with grace 0 under a
//! UID precondition, as the kubelet's status manager does once containers stop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;
use tessera_node::proto::deviceplugin as pb;
use tessera_node::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use tessera_node::proto::deviceplugin::registration_server::{Registration, RegistrationServer};
use tessera_node::proto::podresources as prpb;
use tessera_node::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// Creates the Node `name`, Ready, with `labels` and room for many pods.
pub async fn create_node(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert("kubernetes.io/hostname".into(), name.into());
    l.insert("kubernetes.io/os".into(), "linux".into());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": l},
        "spec": {},
    }))?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node).await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "e2e stand-in", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "e2e",
                     "kubeProxyVersion": "", "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "",
                     "machineID": "", "osImage": "", "systemUUID": ""},
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("status of Node {name}"))?;
    Ok(())
}

/// A device plugin as the stand-in knows it.
#[derive(Debug, Clone, Default)]
struct Plugin {
    endpoint: String,
    preferred: bool,
    pre_start: bool,
    /// Device ID -> healthy.
    devices: BTreeMap<String, bool>,
}

/// One container's answer from a plugin, kept for the scenarios to check.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub pod: String,
    pub uid: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
    pub response: pb::ContainerAllocateResponse,
}

#[derive(Default)]
struct State {
    plugins: BTreeMap<String, Plugin>,
    /// Pods reached (uid -> their PodResources entry).
    reached: BTreeMap<String, prpb::PodResources>,
    /// Pods failed at admission (uid -> message).
    failed: BTreeMap<String, String>,
    admitted: Vec<Admitted>,
}

/// The stand-in of one node's kubelet.
pub struct Kubelet {
    pub node: String,
    pub dir: PathBuf,
    state: Arc<Mutex<State>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Kubelet {
    /// Starts the stand-in of `node` in `dir` (which then holds
    /// `device-plugins/kubelet.sock` and `pod-resources/kubelet.sock`).
    pub fn start(client: Client, node: &str, dir: &Path) -> Result<Kubelet> {
        let plugins = dir.join("device-plugins");
        let podres = dir.join("pod-resources");
        std::fs::create_dir_all(&plugins)?;
        std::fs::create_dir_all(&podres)?;
        let state = Arc::new(Mutex::new(State::default()));
        let mut tasks = Vec::new();

        let reg = UnixListener::bind(plugins.join("kubelet.sock"))?;
        let svc = Registrar {
            dir: plugins.clone(),
            node: node.to_string(),
            client: client.clone(),
            state: state.clone(),
        };
        tasks.push(tokio::spawn(async move {
            let _ = Server::builder()
                .add_service(RegistrationServer::new(svc))
                .serve_with_incoming(UnixListenerStream::new(reg))
                .await;
        }));

        let pr = UnixListener::bind(podres.join("kubelet.sock"))?;
        let lister = Lister(state.clone());
        tasks.push(tokio::spawn(async move {
            let _ = Server::builder()
                .add_service(PodResourcesListerServer::new(lister))
                .serve_with_incoming(UnixListenerStream::new(pr))
                .await;
        }));

        let (c, n, s, d) = (client, node.to_string(), state.clone(), plugins.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                if let Err(e) = sync_pods(&c, &n, &s, &d).await {
                    eprintln!("kubelet stand-in {n}: {e:#}");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }));
        Ok(Kubelet {
            node: node.to_string(),
            dir: dir.to_path_buf(),
            state,
            tasks,
        })
    }

    /// The device-plugin directory to give the node agent.
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.dir.join("device-plugins")
    }

    /// The PodResources socket to give the node agent.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.dir.join("pod-resources/kubelet.sock")
    }

    /// Resources registered so far, with their healthy device count.
    pub fn resources(&self) -> BTreeMap<String, usize> {
        let st = self.state.lock().unwrap();
        st.plugins
            .iter()
            .map(|(r, p)| (r.clone(), p.devices.values().filter(|h| **h).count()))
            .collect()
    }

    /// Every container answer the plugins gave.
    pub fn admitted(&self) -> Vec<Admitted> {
        self.state.lock().unwrap().admitted.clone()
    }

    /// Pods failed at admission: uid -> the kubelet's message.
    pub fn failed(&self) -> BTreeMap<String, String> {
        self.state.lock().unwrap().failed.clone()
    }
}

struct Registrar {
    dir: PathBuf,
    node: String,
    client: Client,
    state: Arc<Mutex<State>>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let req = request.into_inner();
        if req.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "unsupported API version {:?}",
                req.version
            )));
        }
        let opts = req.options.unwrap_or_default();
        self.state.lock().unwrap().plugins.insert(
            req.resource_name.clone(),
            Plugin {
                endpoint: req.endpoint.clone(),
                preferred: opts.get_preferred_allocation_available,
                pre_start: opts.pre_start_required,
                devices: BTreeMap::new(),
            },
        );
        let (dir, node, client, state) = (
            self.dir.clone(),
            self.node.clone(),
            self.client.clone(),
            self.state.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = watch_plugin(&dir, &node, &client, &state, &req).await {
                eprintln!(
                    "kubelet stand-in {node}: plugin {}: {e:#}",
                    req.resource_name
                );
            }
        });
        Ok(Response::new(pb::Empty {}))
    }
}

async fn dial(path: &Path) -> Result<DevicePluginClient<Channel>> {
    let ch = Endpoint::from_shared(format!("unix://{}", path.display()))?
        .connect()
        .await?;
    Ok(DevicePluginClient::new(ch))
}

/// `ListAndWatch` of one plugin; every answer becomes the Node's capacity of
/// its resource (the healthy devices), as the kubelet's device manager does.
async fn watch_plugin(
    dir: &Path,
    node: &str,
    client: &Client,
    state: &Mutex<State>,
    req: &pb::RegisterRequest,
) -> Result<()> {
    let mut plugin = dial(&dir.join(&req.endpoint)).await?;
    let mut stream = plugin.list_and_watch(pb::Empty {}).await?.into_inner();
    let nodes: Api<Node> = Api::all(client.clone());
    while let Some(resp) = stream.message().await? {
        let healthy = resp
            .devices
            .iter()
            .filter(|d| d.health == "Healthy")
            .count();
        {
            let mut st = state.lock().unwrap();
            if let Some(p) = st.plugins.get_mut(&req.resource_name) {
                p.devices = resp
                    .devices
                    .iter()
                    .map(|d| (d.id.clone(), d.health == "Healthy"))
                    .collect();
            }
        }
        let n = healthy.to_string();
        let patch = json!({"status": {
            "capacity": {&req.resource_name: n},
            "allocatable": {&req.resource_name: n},
        }});
        nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

struct Lister(Arc<Mutex<State>>);

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _request: Request<prpb::ListPodResourcesRequest>,
    ) -> Result<Response<prpb::ListPodResourcesResponse>, Status> {
        let pod_resources = self.0.lock().unwrap().reached.values().cloned().collect();
        Ok(Response::new(prpb::ListPodResourcesResponse {
            pod_resources,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<prpb::AllocatableResourcesRequest>,
    ) -> Result<Response<prpb::AllocatableResourcesResponse>, Status> {
        let st = self.0.lock().unwrap();
        let devices = st
            .plugins
            .iter()
            .map(|(r, p)| prpb::ContainerDevices {
                resource_name: r.clone(),
                device_ids: p.devices.keys().cloned().collect(),
                topology: None,
            })
            .collect();
        Ok(Response::new(prpb::AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<prpb::GetPodResourcesRequest>,
    ) -> Result<Response<prpb::GetPodResourcesResponse>, Status> {
        let req = request.into_inner();
        let st = self.0.lock().unwrap();
        st.reached
            .values()
            .find(|p| p.name == req.pod_name && p.namespace == req.pod_namespace)
            .cloned()
            .map(|p| {
                Response::new(prpb::GetPodResourcesResponse {
                    pod_resources: Some(p),
                })
            })
            .ok_or_else(|| {
                Status::unknown(format!(
                    "pod {} in namespace {} not found",
                    req.pod_name, req.pod_namespace
                ))
            })
    }
}

/// One pass over the pods bound to `node`: completes deletions, admits new pods.
async fn sync_pods(client: &Client, node: &str, state: &Mutex<State>, dir: &Path) -> Result<()> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items;
    list.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
    let live: BTreeSet<String> = list.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    {
        let mut st = state.lock().unwrap();
        st.reached.retain(|uid, _| live.contains(uid));
        st.admitted.retain(|a| live.contains(&a.uid));
    }
    for pod in list {
        let (Some(uid), Some(ns), Some(name)) = (
            pod.metadata.uid.clone(),
            pod.metadata.namespace.clone(),
            pod.metadata.name.clone(),
        ) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if pod.metadata.deletion_timestamp.is_some() {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            let _ = api.delete(&name, &dp).await;
            state.lock().unwrap().reached.remove(&uid);
            continue;
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if phase != "Pending" && !phase.is_empty() {
            continue;
        }
        if state.lock().unwrap().reached.contains_key(&uid) {
            continue;
        }
        admit(&api, &pod, &uid, &ns, &name, state, dir).await?;
    }
    Ok(())
}

/// The kubelet's admission of one pod: devices per container, then Running.
async fn admit(
    api: &Api<Pod>,
    pod: &Pod,
    uid: &str,
    ns: &str,
    name: &str,
    state: &Mutex<State>,
    dir: &Path,
) -> Result<()> {
    let spec = pod.spec.clone().unwrap_or_default();
    let containers: Vec<_> = spec
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .chain(spec.containers)
        .collect();
    state.lock().unwrap().reached.insert(
        uid.to_string(),
        prpb::PodResources {
            name: name.to_string(),
            namespace: ns.to_string(),
            containers: containers
                .iter()
                .map(|c| prpb::ContainerResources {
                    name: c.name.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
    );
    let mut refused = None;
    'containers: for (ci, c) in containers.iter().enumerate() {
        let limits = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        for (resource, q) in limits {
            let plugin = state.lock().unwrap().plugins.get(&resource).cloned();
            let Some(plugin) = plugin else { continue };
            let want: usize = q.0.parse().unwrap_or(0);
            if want == 0 {
                continue;
            }
            match allocate(dir, &plugin, &resource, want, state).await {
                Ok((ids, response)) => {
                    let mut st = state.lock().unwrap();
                    if let Some(r) = st.reached.get_mut(uid) {
                        r.containers[ci].devices.push(prpb::ContainerDevices {
                            resource_name: resource.clone(),
                            device_ids: ids.clone(),
                            topology: None,
                        });
                    }
                    st.admitted.push(Admitted {
                        pod: format!("{ns}/{name}"),
                        uid: uid.to_string(),
                        container: c.name.clone(),
                        resource: resource.clone(),
                        device_ids: ids,
                        response,
                    });
                }
                Err(e) => {
                    refused = Some(format!("Allocate failed due to {e:#}, which is unexpected"));
                    break 'containers;
                }
            }
        }
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = match &refused {
        Some(msg) => {
            // A rejected pod holds nothing and is not listed any more.
            let mut st = state.lock().unwrap();
            st.failed.insert(uid.to_string(), msg.clone());
            st.reached.remove(uid);
            st.admitted.retain(|a| a.uid != uid);
            drop(st);
            json!({"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                              "message": format!("Pod was rejected: {msg}")}})
        }
        None => json!({"status": {
            "phase": "Running",
            "startTime": now,
            "hostIP": "127.0.0.1",
            "podIP": "10.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ],
            "containerStatuses": containers.iter().filter(|c| {
                pod.spec.as_ref().is_some_and(|s| s.containers.iter().any(|a| a.name == c.name))
            }).map(|c| json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "ready": true, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": now}},
            })).collect::<Vec<_>>(),
        }}),
    };
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("status of pod {ns}/{name}"))?;
    Ok(())
}

/// Picks `want` free healthy devices of `resource` (the plugin's preference
/// when it offers one) and asks the plugin to allocate them.
async fn allocate(
    dir: &Path,
    plugin: &Plugin,
    resource: &str,
    want: usize,
    state: &Mutex<State>,
) -> Result<(Vec<String>, pb::ContainerAllocateResponse)> {
    let used: BTreeSet<String> = {
        let st = state.lock().unwrap();
        st.reached
            .values()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name == resource)
            .flat_map(|d| d.device_ids.clone())
            .collect()
    };
    let free: Vec<String> = plugin
        .devices
        .iter()
        .filter(|(id, healthy)| **healthy && !used.contains(*id))
        .map(|(id, _)| id.clone())
        .collect();
    if free.len() < want {
        anyhow::bail!(
            "requested number of devices unavailable for {resource}. Requested: {want}, Available: {}",
            free.len()
        );
    }
    let mut client = dial(&dir.join(&plugin.endpoint)).await?;
    let mut ids: Vec<String> = free[..want].to_vec();
    if plugin.preferred {
        let pref = client
            .get_preferred_allocation(pb::PreferredAllocationRequest {
                container_requests: vec![pb::ContainerPreferredAllocationRequest {
                    available_device_i_ds: free.clone(),
                    must_include_device_i_ds: vec![],
                    allocation_size: want as i32,
                }],
            })
            .await?
            .into_inner();
        if let Some(p) = pref.container_responses.first()
            && p.device_i_ds.len() == want
            && p.device_i_ds.iter().all(|d| free.contains(d))
        {
            ids = p.device_i_ds.clone();
        }
    }
    let resp = client
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: ids.clone(),
            }],
        })
        .await
        .map_err(|s| anyhow::anyhow!("rpc error: code = {:?} desc = {}", s.code(), s.message()))?
        .into_inner();
    if plugin.pre_start {
        client
            .pre_start_container(pb::PreStartContainerRequest {
                devices_ids: ids.clone(),
            })
            .await?;
    }
    let first = resp
        .container_responses
        .into_iter()
        .next()
        .context("Allocate answered no container")?;
    Ok((ids, first))
}
