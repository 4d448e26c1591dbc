//! The DRA driver's gRPC over real unix sockets, as the kubelet reaches it
//! (protocols.md §3.10, §3.11): the plugin watcher's `GetInfo` /
//! `NotifyRegistrationStatus` on the registration socket, and
//! `NodePrepareResources` / `NodeUnprepareResources` (v1 and v1beta1) on
//! `dra.sock`.
//!
//! The kubelet's plugin-watcher client may send a request with no
//! `:authority` at all. A tonic (or hyper) client cannot: an `http::Uri` with a
//! scheme always has an authority, and `:scheme` is mandatory. So
//! [`raw_unary`] (tests/raw_grpc) speaks HTTP/2 by hand (preface, SETTINGS, one HEADERS
//! frame of literal HPACK fields, one DATA frame) and sends exactly the
//! pseudo-headers it is given.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tessera_node::dra::DraConfig;
use tessera_node::dra::proto::pluginregistration::{
    self as reg, registration_client::RegistrationClient,
};
use tessera_node::dra::proto::{v1, v1beta1};
use tessera_node::dra::registration::RegistrationState;
use tessera_node::dra::server::serve;
use tessera_node::dra::service::{ClaimPreparer, ClaimRef, PreparedDevice};
use tokio::net::UnixStream;
use tokio::sync::{oneshot, watch};
use tonic::transport::{Channel, Endpoint};

mod http_get;
use http_get::get;
mod raw_grpc;
use raw_grpc::{notify_registered, raw_unary};

/// Prepares claim `uid-ok` as one device, fails `uid-bad`.
struct FakePreparer;

#[tonic::async_trait]
impl ClaimPreparer for FakePreparer {
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        match claim.uid.as_str() {
            "uid-ok" => Ok(vec![PreparedDevice {
                request_names: vec!["gpu".into()],
                pool_name: "node-a".into(),
                device_name: "gpu-0".into(),
                cdi_device_ids: vec![format!("gpu.tessera.io/claim={}-gpu-0", claim.uid)],
                share_id: Some("share-1".into()),
            }]),
            _ => Err(format!(
                "claim {}/{} is not allocated",
                claim.namespace, claim.name
            )),
        }
    }
    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), String> {
        match claim.uid.as_str() {
            "uid-bad" => Err("cannot remove CDI spec".into()),
            _ => Ok(()),
        }
    }
}

struct Running {
    config: DraConfig,
    state: watch::Receiver<RegistrationState>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let config = DraConfig {
        registry_dir: dir.path().join("plugins_registry"),
        plugin_dir: dir.path().join("plugins/gpu.tessera.io"),
    };
    let (state_tx, state) = watch::channel(RegistrationState::Pending);
    let (stop, stopped) = oneshot::channel::<()>();
    let c = config.clone();
    let task = tokio::spawn(async move {
        serve(&c, Arc::new(FakePreparer), state_tx, async {
            let _ = stopped.await;
        })
        .await
        .expect("the DRA driver serves");
    });
    // Wait for the registration socket: it is bound after dra.sock.
    for _ in 0..200 {
        if config.registration_socket().exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        config.registration_socket().exists(),
        "registration socket never appeared"
    );
    assert!(config.dra_socket().exists());
    Running {
        config,
        state,
        stop,
        task,
        _dir: dir,
    }
}

/// A tonic channel over a unix socket whose requests carry `:authority: localhost`
/// (what grpc-go sends for a `unix://` target).
async fn localhost_channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .unwrap()
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap()
}

#[tokio::test]
async fn registration_answers_a_request_without_authority() {
    let r = start().await;
    let body = raw_unary(
        &r.config.registration_socket(),
        "/pluginregistration.Registration/GetInfo",
        None,
        &reg::InfoRequest {}.encode_to_vec(),
    )
    .await
    .expect("GetInfo without :authority is answered");
    let info = reg::PluginInfo::decode(body.as_slice()).unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.tessera.io");
    assert_eq!(
        PathBuf::from(&info.endpoint),
        absolute(&r.config.dra_socket())
    );
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );

    // The kubelet's verdict, also without :authority.
    notify_registered(&r.config.registration_socket())
        .await
        .expect("NotifyRegistrationStatus without :authority is answered");
    assert_eq!(*r.state.borrow(), RegistrationState::Registered);

    // The same calls with `:authority: localhost` (grpc-go's unix:// targets).
    let body = raw_unary(
        &r.config.registration_socket(),
        "/pluginregistration.Registration/GetInfo",
        Some("localhost"),
        &reg::InfoRequest {}.encode_to_vec(),
    )
    .await
    .expect("GetInfo with :authority localhost is answered");
    assert_eq!(reg::PluginInfo::decode(body.as_slice()).unwrap(), info);

    // An unknown method is a gRPC error (no message), not an answer: the raw
    // client can tell success from failure.
    let err = raw_unary(
        &r.config.registration_socket(),
        "/pluginregistration.Registration/Nope",
        None,
        &[],
    )
    .await
    .unwrap_err();
    assert!(err.contains("no response message"), "{err}");

    let _ = r.stop.send(());
    r.task.await.unwrap();
    assert!(
        !r.config.registration_socket().exists(),
        "deregistered: socket removed"
    );
    assert!(!r.config.dra_socket().exists());
}

#[tokio::test]
async fn dra_v1_prepare_and_unprepare_without_authority() {
    let r = start().await;
    let claims = vec![
        v1::Claim {
            namespace: "ml".into(),
            uid: "uid-ok".into(),
            name: "train-gpu".into(),
        },
        v1::Claim {
            namespace: "ml".into(),
            uid: "uid-bad".into(),
            name: "other".into(),
        },
    ];
    let body = raw_unary(
        &r.config.dra_socket(),
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        None,
        &v1::NodePrepareResourcesRequest {
            claims: claims.clone(),
        }
        .encode_to_vec(),
    )
    .await
    .expect("NodePrepareResources without :authority is answered");
    let resp = v1::NodePrepareResourcesResponse::decode(body.as_slice()).unwrap();
    // Every claim gets an entry; a failing claim carries its error there.
    let keys: Vec<&String> = resp
        .claims
        .keys()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(keys, ["uid-bad", "uid-ok"]);
    let ok = &resp.claims["uid-ok"];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices.len(), 1);
    assert_eq!(ok.devices[0].device_name, "gpu-0");
    assert_eq!(ok.devices[0].pool_name, "node-a");
    assert_eq!(
        ok.devices[0].cdi_device_ids,
        ["gpu.tessera.io/claim=uid-ok-gpu-0"]
    );
    assert_eq!(ok.devices[0].share_id.as_deref(), Some("share-1"));
    let bad = &resp.claims["uid-bad"];
    assert!(bad.devices.is_empty());
    assert_eq!(bad.error, "claim ml/other is not allocated");

    // Unprepare through tonic with `:authority: localhost`.
    let mut client = v1::dra_plugin_client::DraPluginClient::new(
        localhost_channel(&r.config.dra_socket()).await,
    );
    let resp = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner();
    let errors: BTreeMap<String, String> =
        resp.claims.into_iter().map(|(k, v)| (k, v.error)).collect();
    assert_eq!(
        errors,
        BTreeMap::from([
            ("uid-bad".to_string(), "cannot remove CDI spec".to_string()),
            ("uid-ok".to_string(), String::new()),
        ])
    );
    let _ = r.stop.send(());
    r.task.await.unwrap();
}

#[tokio::test]
async fn dra_v1beta1_and_registration_over_tonic_with_localhost() {
    let r = start().await;
    let mut reg_client =
        RegistrationClient::new(localhost_channel(&r.config.registration_socket()).await);
    let info = reg_client
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "gpu.tessera.io");
    reg_client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: false,
            error: "no supported version".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        *r.state.borrow(),
        RegistrationState::Refused("no supported version".into())
    );

    let mut client = v1beta1::dra_plugin_client::DraPluginClient::new(
        localhost_channel(&r.config.dra_socket()).await,
    );
    let resp = client
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "ml".into(),
                uid: "uid-ok".into(),
                name: "c".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims.len(), 1);
    assert_eq!(
        resp.claims["uid-ok"].devices[0].cdi_device_ids,
        ["gpu.tessera.io/claim=uid-ok-gpu-0"]
    );

    // v1beta1 without :authority, too.
    let body = raw_unary(
        &r.config.dra_socket(),
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        None,
        &v1beta1::NodeUnprepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "ml".into(),
                uid: "uid-ok".into(),
                name: "c".into(),
            }],
        }
        .encode_to_vec(),
    )
    .await
    .unwrap();
    let resp = v1beta1::NodeUnprepareResourcesResponse::decode(body.as_slice()).unwrap();
    assert_eq!(resp.claims["uid-ok"].error, "");
    let _ = r.stop.send(());
    r.task.await.unwrap();
}

/// What a path-like `:authority` does (what grpc-go sends for a bare socket
/// path unless the caller sets `WithAuthority("localhost")`, as kubernetes PR
/// 112597 did for the kubelet's clients): h2 resets the stream. Recorded so a
/// change in the HTTP/2 stack (hyperium/h2 PR 487) shows up here.
#[tokio::test]
async fn path_like_authority_is_refused_by_the_http2_layer() {
    let r = start().await;
    let socket = r.config.registration_socket();
    let path_like = socket.display().to_string();
    let res = raw_unary(
        &socket,
        "/pluginregistration.Registration/GetInfo",
        Some(&path_like),
        &[],
    )
    .await;
    assert!(
        res.is_err(),
        "a path as :authority is not a valid authority: {res:?}"
    );
    // Nor grpc-go's percent-encoded form of it (`%` is not allowed in a host).
    let encoded = path_like.replace('/', "%2F");
    let res = raw_unary(
        &socket,
        "/pluginregistration.Registration/GetInfo",
        Some(&encoded),
        &[],
    )
    .await;
    assert!(res.is_err(), "{encoded}: {res:?}");
    let _ = r.stop.send(());
    r.task.await.unwrap();
}

/// `run_driver` (what `node-agent --dra` runs) serves both sockets from the
/// backend's GPUs; without an API server every claim fails with that reason.
#[tokio::test]
async fn the_driver_serves_its_sockets_and_says_why_it_cannot_prepare() {
    let (_dir, config, stop, task) = start_driver(None).await;
    let body = raw_unary(
        &config.sockets.registration_socket(),
        "/pluginregistration.Registration/GetInfo",
        None,
        &reg::InfoRequest {}.encode_to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(
        reg::PluginInfo::decode(body.as_slice()).unwrap().name,
        "gpu.tessera.io"
    );
    let body = raw_unary(
        &config.sockets.dra_socket(),
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        None,
        &v1::NodePrepareResourcesRequest {
            claims: vec![v1::Claim {
                namespace: "ml".into(),
                uid: "u-1".into(),
                name: "c".into(),
            }],
        }
        .encode_to_vec(),
    )
    .await
    .unwrap();
    let resp = v1::NodePrepareResourcesResponse::decode(body.as_slice()).unwrap();
    assert!(
        resp.claims["u-1"]
            .error
            .contains("without a Kubernetes API server"),
        "{resp:?}"
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    assert!(!config.sockets.registration_socket().exists());
}

/// A fatal XID withdraws the GPU in the driver's view (the device plugin's
/// rules), so its device is tainted in the slices and refused at prepare.
#[tokio::test]
async fn an_xid_taints_the_gpu_through_the_health_watch() {
    use tessera_node::dra::driver::watch_health;
    use tessera_node::dra::slice::{DriverVersions, SliceOptions, resource_slices};
    let fake = tessera_node::backend::fake::Fake::from_yaml(
        "gpus:\n  - { uuid: GPU-0, product: NVIDIA A100-SXM4-80GB }\n  - { uuid: GPU-1, product: NVIDIA A100-SXM4-80GB }\n",
        "t",
    )
    .unwrap();
    let xids = tessera_node::metrics::XidStats::default();
    let (mut view, _guard) = watch_health(
        Arc::new(fake.clone()),
        Default::default(),
        Duration::from_secs(3600),
        Duration::from_secs(3600),
        xids.clone(),
    )
    .await
    .unwrap();
    assert!(view.borrow().is_healthy("GPU-1"));
    fake.inject_xid("GPU-1", 79);
    tokio::time::timeout(Duration::from_secs(10), view.changed())
        .await
        .expect("the XID reaches the view")
        .unwrap();
    let now = view.borrow().clone();
    assert!(now.is_healthy("GPU-0"));
    assert!(!now.is_healthy("GPU-1"));
    // Counted for /metrics, as on the device-plugin path.
    assert!(xids.0.lock().unwrap().contains_key("GPU-1"), "no XID count");
    let options = SliceOptions {
        device_taints: true,
        ..Default::default()
    };
    let slices = resource_slices("node-a", &now, &DriverVersions::default(), 1, options);
    let devices = &slices[0].spec.devices;
    assert!(devices[0].taints.is_empty());
    assert_eq!(devices[1].taints.len(), 1);
    assert_eq!(devices[1].taints[0].key, "gpu.tessera.io/xid");
    assert_eq!(devices[1].taints[0].value.as_deref(), Some("79"));
}

/// `/healthz` and `/readyz` of `node-agent --dra` (the chart's readiness
/// probe): alive at once; not ready until the kubelet has accepted the
/// registration, and, without an API server, never ready, each reason named.
/// Before, the DRA agent served no HTTP at all and its pod was Ready as soon as
/// it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_is_not_ready_until_the_kubelet_registers_it() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let (_dir, config, stop, task) = start_driver(Some(probe)).await;
    assert_eq!(get(probe, "/healthz").await.unwrap().0, 200);
    // The GPU readings, as the device-plugin agent serves them (issue 29: the
    // DRA pods served no /metrics).
    let (status, metrics) = get(probe, "/metrics").await.unwrap();
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("DCGM_FI_DEV_FB_FREE{") && l.contains("UUID=\"GPU-0\"")),
        "{metrics}"
    );
    let (status, body) = get(probe, "/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("the kubelet has not registered the driver yet")
            && body.contains("no API server"),
        "{body}"
    );
    notify_registered(&config.sockets.registration_socket())
        .await
        .unwrap();
    let (status, body) = get(probe, "/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        !body.contains("not registered") && body.contains("no API server"),
        "{body}"
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    assert!(
        get(probe, "/healthz").await.is_err(),
        "the probe port is closed"
    );
}

/// `run_driver` (what `node-agent --dra` runs) on one fake GPU without an API
/// server, in a temporary directory, once its registration socket exists.
async fn start_driver(
    probe_addr: Option<std::net::SocketAddr>,
) -> (
    tempfile::TempDir,
    tessera_node::dra::driver::DriverConfig,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tessera_node::dra::driver::DriverError>>,
) {
    use tessera_node::dra::driver::{DriverConfig, run_driver};
    let dir = tempfile::tempdir().unwrap();
    let config = DriverConfig {
        node_name: "node-a".into(),
        sockets: DraConfig {
            registry_dir: dir.path().join("reg"),
            plugin_dir: dir.path().join("plugins/gpu.tessera.io"),
        },
        cdi_dir: dir.path().join("cdi"),
        options: Default::default(),
        health_interval: Duration::from_secs(3600),
        xid_policy: Default::default(),
        quiet_period: Duration::from_secs(3600),
        probe_addr,
        mps: Default::default(),
        mps_binary: "nvidia-cuda-mps-control".into(),
        mps_grace: Duration::ZERO,
        state_file: None,
        pod_resources_socket: None,
    };
    let fake = tessera_node::backend::fake::Fake::from_yaml(
        "gpus:\n  - { uuid: GPU-0, product: NVIDIA A100-SXM4-80GB }\n",
        "t",
    )
    .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let c = config.clone();
    let task = tokio::spawn(async move {
        let procs = Arc::new(fake.proc_reader());
        run_driver(c, Arc::new(fake), procs, None, async {
            let _ = stopped.await;
        })
        .await
    });
    for _ in 0..300 {
        if config.sockets.registration_socket().exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (dir, config, stop, task)
}
