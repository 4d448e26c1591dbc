//! What `NodePrepareResources` sets up beyond the CDI spec, through `run_driver`
//! (what `node-agent --dra` runs) over the real DRA unix socket, with a client
//! that sends no `:authority` (as the kubelet's may), on fake GPUs:
//!
//! - the MIG instance of an allocated partitionable placement is created at
//!   prepare and destroyed at unprepare, also across a restart of the driver,
//!   and an instance the driver did not create is never destroyed;
//! - a refused creation fails the claim naming the device and leaves nothing;
//! - an MPS share gets its daemon, limits and mounts, and the daemon stops after
//!   the last claim using its GPU is unprepared;
//! - prepared claims are swept (read again) once the kubelet has registered the
//!   driver, and the releases are counted on its `/metrics`.

mod dra_common;
mod fake_mps;
mod http_get;
mod raw_grpc;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use serde_json::{Value, json};
use tessera_node::backend::GpuBackend;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::allocate::MpsConfig;
use tessera_node::dra::DraConfig;
use tessera_node::dra::driver::{DriverConfig, DriverError, run_driver_with_claims};
use tessera_node::dra::proto::v1;
use tessera_node::dra::slice::SliceOptions;
use tokio::sync::oneshot;

use dra_common::{FakeClaims, GPUS, NODE, device};
use fake_mps::{FAKE_CONTROL, write_script};
use raw_grpc::{notify_registered, raw_unary};

const PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
const UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";

/// A share of GPU `gpu-1` (GPU-s).
fn share(id: &str, memory: &str, compute: &str) -> Value {
    json!({
        "request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": "gpu-1",
        "shareID": id, "consumedCapacity": {"memory": memory, "compute": compute}
    })
}

struct Node {
    dir: tempfile::TempDir,
    fake: Fake,
    claims: Arc<FakeClaims>,
    config: DriverConfig,
}

struct Driver {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), DriverError>>,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let binary = write_script(dir.path(), FAKE_CONTROL);
        let config = DriverConfig {
            node_name: NODE.into(),
            sockets: DraConfig {
                registry_dir: dir.path().join("reg"),
                plugin_dir: dir.path().join("plugins/gpu.tessera.io"),
            },
            cdi_dir: dir.path().join("cdi"),
            options: SliceOptions {
                consumable_capacity: true,
                partitionable_mig: true,
                device_taints: false,
            },
            health_interval: Duration::from_secs(3600),
            xid_policy: Default::default(),
            quiet_period: Duration::from_secs(3600),
            probe_addr: None,
            mps: MpsConfig {
                host_root: dir.path().join("mps").display().to_string(),
                per_gpu_daemons: true,
                ..MpsConfig::default()
            },
            mps_binary: binary,
            mps_grace: Duration::ZERO,
            state_file: None,
            pod_resources_socket: None,
        };
        let mut config = config;
        // Where `node-agent --dra` keeps it.
        config.state_file = Some(DriverConfig::default_state_file(&config.sockets));
        Node {
            fake: Fake::from_yaml(GPUS, "t").unwrap(),
            claims: Arc::new(FakeClaims::default()),
            dir,
            config,
        }
    }

    /// `run_driver` on the node, once its sockets exist.
    async fn start(&self) -> Driver {
        let _ = std::fs::remove_file(self.config.sockets.registration_socket());
        let (stop, stopped) = oneshot::channel::<()>();
        let (c, fake, claims) = (self.config.clone(), self.fake.clone(), self.claims.clone());
        let task = tokio::spawn(async move {
            let procs = Arc::new(fake.proc_reader());
            run_driver_with_claims(c, Arc::new(fake), procs, None, claims, async {
                let _ = stopped.await;
            })
            .await
        });
        until("the driver's sockets", || {
            self.config.sockets.registration_socket().exists()
        })
        .await;
        Driver { stop, task }
    }

    /// `NodePrepareResources` for claim `name`, with no `:authority`: its devices'
    /// CDI IDs, or its error.
    async fn prepare(&self, name: &str) -> Result<Vec<Vec<String>>, String> {
        let uid = format!("uid-{name}");
        let body = raw_unary(
            &self.config.sockets.dra_socket(),
            PREPARE,
            None,
            &v1::NodePrepareResourcesRequest {
                claims: vec![claim_ref(name)],
            }
            .encode_to_vec(),
        )
        .await
        .expect("NodePrepareResources is answered");
        let resp = v1::NodePrepareResourcesResponse::decode(body.as_slice()).unwrap();
        let answer = &resp.claims[&uid];
        if answer.error.is_empty() {
            Ok(answer
                .devices
                .iter()
                .map(|d| d.cdi_device_ids.clone())
                .collect())
        } else {
            Err(answer.error.clone())
        }
    }

    /// `NodeUnprepareResources` for claim `name`, with no `:authority`.
    async fn unprepare(&self, name: &str) -> Result<(), String> {
        let body = raw_unary(
            &self.config.sockets.dra_socket(),
            UNPREPARE,
            None,
            &v1::NodeUnprepareResourcesRequest {
                claims: vec![claim_ref(name)],
            }
            .encode_to_vec(),
        )
        .await
        .expect("NodeUnprepareResources is answered");
        let resp = v1::NodeUnprepareResourcesResponse::decode(body.as_slice()).unwrap();
        match resp.claims[&format!("uid-{name}")].error.as_str() {
            "" => Ok(()),
            e => Err(e.to_string()),
        }
    }

    /// The MIG instances of GPU-m as `(uuid, profile, start)`.
    fn instances(&self) -> Vec<(String, String, u8)> {
        let gpus = self.fake.discover().unwrap();
        gpus[0]
            .mig_instances
            .iter()
            .map(|m| (m.uuid.clone(), m.profile.clone(), m.start.unwrap()))
            .collect()
    }

    fn spec(&self, name: &str) -> Option<Value> {
        let path = self
            .config
            .cdi_dir
            .join(format!("gpu.tessera.io-claim_uid-{name}.json"));
        std::fs::read(path)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn mps_dir(&self, gpu: &str) -> PathBuf {
        self.dir.path().join("mps").join(gpu)
    }
}

impl Driver {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

fn claim_ref(name: &str) -> v1::Claim {
    v1::Claim {
        namespace: "ml".into(),
        uid: format!("uid-{name}"),
        name: name.into(),
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn alive(pid: &str) -> bool {
    !pid.trim().is_empty() && Path::new(&format!("/proc/{}", pid.trim())).exists()
}

/// A claim for a placement with no instance gets the instance, at exactly that
/// start, and a CDI spec naming its UUID; unprepare destroys it. Across a
/// restart of the driver between prepare and unprepare the instance is still
/// destroyed, and the instance the claims found there (made by someone else)
/// never is, though a claim used it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placements_get_their_instance_at_prepare_and_lose_it_at_unprepare() {
    let node = Node::new();
    let driver = node.start().await;
    let foreign = ("MIG-foreign".to_string(), "1g.10gb".to_string(), 0);
    assert_eq!(node.instances(), std::slice::from_ref(&foreign));

    node.claims
        .put("first", json!([device("gpu-0-mig-3g40gb-4")]));
    let ids = node.prepare("first").await.unwrap();
    let made = node.instances();
    assert_eq!(made.len(), 2, "{made:?}");
    let (uuid, profile, start) = made[1].clone();
    assert_eq!((profile.as_str(), start), ("3g.40gb", 4));
    assert_eq!(
        ids,
        [vec![
            "gpu.tessera.io/claim=uid-first-gpu-0-mig-3g40gb-4".to_string(),
            format!("nvidia.com/gpu={uuid}"),
        ]]
    );
    let spec = node.spec("first").unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"]["env"],
        json!([format!("TESSERA_DRA_DEVICE_0={uuid}")])
    );
    // Prepare again (the kubelet repeats calls): the same instance, no second one.
    assert_eq!(node.prepare("first").await.unwrap(), ids);
    assert_eq!(node.instances().len(), 2);
    node.unprepare("first").await.unwrap();
    assert_eq!(node.instances(), std::slice::from_ref(&foreign));
    assert!(node.spec("first").is_none());

    // Across a restart: one claim on a new instance, one on the foreign one.
    node.claims
        .put("kept", json!([device("gpu-0-mig-3g40gb-4")]));
    node.claims
        .put("theirs", json!([device("gpu-0-mig-1g10gb-0")]));
    node.prepare("kept").await.unwrap();
    let ids = node.prepare("theirs").await.unwrap();
    assert_eq!(ids[0][1], "nvidia.com/gpu=MIG-foreign");
    let made = node.instances();
    assert_eq!(made.len(), 2, "one new, one found: {made:?}");
    driver.stop().await;
    assert_eq!(node.instances(), made, "a stopping driver destroys nothing");

    let driver = node.start().await;
    node.unprepare("theirs").await.unwrap();
    assert_eq!(node.instances(), made, "the foreign instance stays");
    node.unprepare("kept").await.unwrap();
    assert_eq!(node.instances(), std::slice::from_ref(&foreign));
    // Repeated: nothing left to do, still success.
    node.unprepare("kept").await.unwrap();
    assert_eq!(node.instances(), [foreign]);
    driver.stop().await;
}

/// A creation the GPU refuses (NVML's INSUFFICIENT_RESOURCES: the placement
/// overlaps the foreign instance) fails the claim with an error naming the
/// device, and the instance the same prepare had already created for the
/// claim's other device is destroyed again: nothing is left, no spec either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_creation_names_the_device_and_leaves_nothing() {
    let node = Node::new();
    let driver = node.start().await;
    let before = node.instances();
    node.claims.put(
        "two",
        json!([device("gpu-0-mig-3g40gb-4"), device("gpu-0-mig-2g20gb-0")]),
    );
    let e = node.prepare("two").await.unwrap_err();
    assert!(
        e.contains("claim ml/two: device gpu-0-mig-2g20gb-0")
            && e.contains("2g.20gb at memory slice 0 of GPU GPU-m")
            && e.contains("NVML_ERROR_INSUFFICIENT_RESOURCES"),
        "{e}"
    );
    assert_eq!(node.instances(), before);
    assert!(node.spec("two").is_none());
    // Nothing recorded for a later unprepare to find either.
    let state: Value =
        serde_json::from_slice(&std::fs::read(node.config.state_file.as_ref().unwrap()).unwrap())
            .unwrap();
    assert_eq!(state["instances"], json!([]), "{state}");
    node.unprepare("two").await.unwrap();
    assert_eq!(node.instances(), before);
    driver.stop().await;
}

/// An MPS share's CDI device carries its limits, `CUDA_MPS_PIPE_DIRECTORY` and
/// the pipe and shm mounts, and its GPU's daemon runs (with only that GPU
/// visible) before prepare answers. Two claims share one daemon; it survives the
/// first unprepare, is started again after a restart of the driver for the claim
/// still prepared, and is told to quit after the last unprepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_shares_run_their_daemon_until_the_last_claim_goes() {
    let node = Node::new();
    let driver = node.start().await;
    node.claims
        .put("small", json!([share("share-1", "20Gi", "250")]));
    node.claims
        .put("other", json!([share("share-2", "10Gi", "500")]));
    let ids = node.prepare("small").await.unwrap();
    assert_eq!(ids[0][1], "nvidia.com/gpu=GPU-s");
    let daemon = node.mps_dir("GPU-s");
    let pid = read(&daemon.join("log/pid"));
    assert!(alive(&pid), "the daemon runs once prepare answered");
    assert!(
        read(&daemon.join("log/env")).contains("CUDA_VISIBLE_DEVICES=GPU-s"),
        "only the share's GPU"
    );
    let spec = node.spec("small").unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"],
        json!({
            "env": [
                "TESSERA_DRA_DEVICE_0=GPU-s",
                "CUDA_MPS_PIPE_DIRECTORY=/tessera/mps/pipe",
                // 250 per-mille → 25 %; 20Gi = 20480 MiB on the client's device 0.
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"
            ],
            "mounts": [
                {"hostPath": daemon.join("pipe").display().to_string(),
                 "containerPath": "/tessera/mps/pipe", "options": ["rbind", "rw"]},
                {"hostPath": node.dir.path().join("mps/shm").display().to_string(),
                 "containerPath": "/dev/shm", "options": ["rbind", "rw"]}
            ]
        })
    );
    assert!(node.dir.path().join("mps/shm").is_dir());
    node.prepare("other").await.unwrap();
    assert_eq!(read(&daemon.join("log/pid")), pid, "one daemon per GPU");
    node.unprepare("small").await.unwrap();
    assert!(alive(&pid), "'other' still uses the GPU");

    driver.stop().await;
    until("the daemon stops with the driver", || !alive(&pid)).await;
    let driver = node.start().await;
    until("the daemon is started again for 'other'", || {
        let now = read(&daemon.join("log/pid"));
        now != pid && alive(&now)
    })
    .await;
    let pid = read(&daemon.join("log/pid"));
    node.unprepare("other").await.unwrap();
    until("the daemon stops after the last unprepare", || !alive(&pid)).await;
    assert!(read(&daemon.join("log/commands")).contains("quit"));
    driver.stop().await;
}

/// A share whose daemon cannot start fails the claim with the reason (the
/// binary named), and leaves neither a spec nor a record of MPS use behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_whose_daemon_does_not_start_is_refused_and_leaves_nothing() {
    let mut node = Node::new();
    node.config.mps_binary = node.dir.path().join("no-such-mps-control");
    let driver = node.start().await;
    node.claims
        .put("small", json!([share("share-1", "20Gi", "250")]));
    let e = node.prepare("small").await.unwrap_err();
    assert!(
        e.contains("claim ml/small: MPS for GPU-s") && e.contains("no-such-mps-control"),
        "{e}"
    );
    assert!(node.spec("small").is_none());
    let state: Value =
        serde_json::from_slice(&std::fs::read(node.config.state_file.as_ref().unwrap()).unwrap())
            .unwrap();
    assert_eq!(state["mps"], json!({}), "{state}");
    driver.stop().await;
}

/// The sweep of claims whose unprepare never comes runs inside the driver: its
/// first pass reads the prepared claims once the kubelet has registered the
/// driver, and its count of released claims is on the driver's `/metrics`.
/// (What a sweep decides is shown in tests/dra_sweep.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_sweeps_prepared_claims_once_registered() {
    let mut node = Node::new();
    let probe = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    node.config.probe_addr = Some(probe);
    let driver = node.start().await;
    node.claims.put("first", json!([device("gpu-1")]));
    node.prepare("first").await.unwrap();
    assert_eq!(node.claims.reads("first"), 1, "read by prepare only");
    notify_registered(&node.config.sockets.registration_socket())
        .await
        .unwrap();
    until("the first sweep reads the prepared claim", || {
        node.claims.reads("first") > 1
    })
    .await;
    let (status, metrics) = http_get::get(probe, "/metrics").await.unwrap();
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics.contains("tessera_dra_claims_released_total{hostname=\"node-a\"} 0"),
        "{metrics}"
    );
    assert!(node.spec("first").is_some(), "still allocated: kept");
    driver.stop().await;
}
