//! Two allocators on one real 1.36 cluster (issues 38 and 41, defect 2):
//! kube-scheduler with its DRA plugin and Tessera `--mode standalone --dra`
//! running together, pods of both (`default-scheduler` and `tessera`) with
//! claims of `gpu.tessera.io` submitted at once, more than the GPUs hold.
//!
//! - With Tessera's webhooks (the chart's configurations, served over TLS on
//!   loopback, `scheduler.dra` on): the mutating webhook reads each
//!   default-scheduler pod's claims and hands it to Tessera, so one allocator
//!   holds the devices. Over 10 seeded runs no device is in two claims beyond
//!   what it allows, audited from the stored claims.
//! - Without them (what the defect was): both allocate; any device the audit
//!   finds in two claims is prepared for both through the node's driver, which
//!   must refuse the second (the last line).

use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::Value;
use tessera_e2e::SERIAL;
use tessera_e2e::claims::delete_pods_and_claims;
use tessera_e2e::dra::{DraNode, dra_plane, env_at_least, start_dra_nodes};
use tessera_e2e::fill::{
    DEFAULT_KUBE_SCHEDULER, GPU_MIB, TracePod, audit_claims, claim, claims_resource, next, pod,
};
use tessera_e2e::plane::{ControlPlane, Env, Identity};
use tessera_e2e::tessera::start_scheduler;

const NODES: usize = 2;
const GPUS_PER_NODE: usize = 4;
const PODS: usize = 16;

struct Setup {
    plane: ControlPlane,
    nodes: Vec<DraNode>,
    admin: kube::Client,
}

async fn setup(env: &Env, webhooks: bool) -> Setup {
    let (mut plane, key) = dra_plane(env, Some(DEFAULT_KUBE_SCHEDULER)).await.unwrap();
    let mut args = vec!["--leader-elect=false".to_string(), "--dra".to_string()];
    let mut hook = None;
    if webhooks {
        let (more, port, certs) = tessera_e2e::webhook::scheduler_args(&plane).unwrap();
        args.extend(more);
        hook = Some((port, certs));
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let _s = start_scheduler(&mut plane, "standalone", &key, &a)
        .await
        .unwrap();
    if let Some((port, certs)) = &hook {
        let values = serde_json::json!({"scheduler": {"mode": "standalone", "dra": true},
            "nodeAgent": {"dra": {"enabled": true}}});
        for cfg in
            tessera_e2e::webhook::loopback_configs(&plane, &values, *port, &certs.ca_pem).unwrap()
        {
            plane
                .kubectl(
                    &["apply", "--validate=false", "-f", "-"],
                    Some(&cfg.to_string()),
                )
                .unwrap();
        }
    }
    let nodes = start_dra_nodes(
        &mut plane,
        NODES,
        GPUS_PER_NODE,
        "consumable-capacity",
        None,
    )
    .await
    .unwrap();
    let admin = plane.client(Identity::Admin).await.unwrap();
    Setup {
        plane,
        nodes,
        admin,
    }
}

/// `PODS` asks of seed `seed` (whole 1 or 2 GPUs, or a share of 250/500/750),
/// every second one for kube-scheduler.
fn asks(seed: u64) -> Vec<(TracePod, &'static str)> {
    let mut s = seed;
    (0..PODS)
        .map(|k| {
            let (gpus, share_milli) = match next(&mut s) % 5 {
                0 => (1, 0),
                1 => (2, 0),
                2 => (0, 250),
                3 => (0, 500),
                _ => (0, 750),
            };
            let p = TracePod {
                name: format!("s{seed}-{k}"),
                cpu_milli: 100,
                memory_mib: 128,
                gpus,
                share_milli,
            };
            (
                p,
                if next(&mut s).is_multiple_of(2) {
                    "default-scheduler"
                } else {
                    "tessera"
                },
            )
        })
        .collect()
}

fn claims_api(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), "default", &claims_resource())
}

struct Round {
    bound: usize,
    /// Default-scheduler pods the webhook handed to Tessera.
    routed: usize,
    by_kube: usize,
    audit: tessera_e2e::fill::ClaimAudit,
}

/// One seeded round: every claim and pod created at once, settled, audited,
/// then all deleted and their claims gone.
async fn round(s: &Setup, seed: u64) -> Round {
    let claims = claims_api(&s.admin);
    let pods: Api<Pod> = Api::namespaced(s.admin.clone(), "default");
    let asks = asks(seed);
    let names: Vec<String> = (0..asks.len()).map(|k| format!("r{seed}-{k:02}")).collect();
    join_all(asks.iter().zip(&names).map(|((p, _), n)| {
        let c: DynamicObject = serde_json::from_value(claim(n, p)).unwrap();
        let claims = claims.clone();
        async move { claims.create(&PostParams::default(), &c).await.unwrap() }
    }))
    .await;
    join_all(asks.iter().zip(&names).map(|((p, sched), n)| {
        let body: Pod = serde_json::from_value(pod(n, sched, p)).unwrap();
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &body).await.unwrap() }
    }))
    .await;
    // Settled: no new bind for 5 s (the GPUs are over-asked), or all bound.
    let (mut last, mut since) = (0, Instant::now());
    let t0 = Instant::now();
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap();
        let bound = list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        if bound != last {
            (last, since) = (bound, Instant::now());
        }
        if bound == PODS
            || since.elapsed() > Duration::from_secs(5)
            || t0.elapsed() > Duration::from_secs(90)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let list = pods.list(&ListParams::default()).await.unwrap();
    let routed = list
        .items
        .iter()
        .zip(&asks)
        .filter(|(p, (_, sched))| {
            *sched == "default-scheduler"
                && p.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()) == Some("tessera")
        })
        .count();
    let by_kube = list
        .items
        .iter()
        .filter(|p| {
            let sp = p.spec.as_ref();
            sp.is_some_and(|s| s.node_name.is_some())
                && sp.and_then(|s| s.scheduler_name.as_deref()) == Some("default-scheduler")
        })
        .count();
    let audit = audit_claims(&s.admin, GPU_MIB).await.unwrap();
    Round {
        bound: last,
        routed,
        by_kube,
        audit,
    }
}

async fn clean(s: &Setup) {
    delete_pods_and_claims(&s.admin).await;
}

#[tokio::test]
async fn with_the_webhook_one_allocator_holds_each_device() {
    let Some(env) = env_at_least(
        "dra_two_allocators::with_the_webhook_one_allocator_holds_each_device",
        36,
        "consumable capacity",
    ) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let s = setup(&env, true).await;
    let seeds: Vec<u64> = (1..=10).collect();
    let (mut bound, mut routed, mut results) = (0, 0, 0);
    for &seed in &seeds {
        let r = round(&s, seed).await;
        let asked_kube = asks(seed)
            .iter()
            .filter(|(_, k)| *k == "default-scheduler")
            .count();
        println!(
            "seed {seed}: {} of {PODS} bound, {}/{asked_kube} default-scheduler pods handed to Tessera, {} bound by kube-scheduler, {} allocated results audited, {} over-held",
            r.bound,
            r.routed,
            r.by_kube,
            r.audit.results,
            r.audit.violations.len()
        );
        assert!(
            r.audit.violations.is_empty(),
            "seed {seed}: {:?}",
            r.audit.violations
        );
        assert_eq!(
            r.routed, asked_kube,
            "seed {seed}: every default-scheduler pod with a gpu.tessera.io claim is Tessera's"
        );
        assert_eq!(r.by_kube, 0, "seed {seed}");
        bound += r.bound;
        routed += r.routed;
        results += r.audit.results;
        clean(&s).await;
    }
    for n in &s.nodes {
        assert!(n.kubelet.failed().is_empty(), "{:?}", n.kubelet.failed());
    }
    println!(
        "two allocators with the webhook, seeds {seeds:?}: {bound} pods bound, {routed} default-scheduler pods handed to Tessera, {results} allocated results audited: no device in two claims beyond what it allows"
    );
    drop(s.plane);
}

/// Without the webhook both schedulers allocate `gpu.tessera.io` claims. Where
/// the stored claims show a device given beyond what it allows, the node's
/// driver is asked to prepare every claim holding it: it prepares the first
/// and refuses the others, naming the holder.
#[tokio::test]
async fn without_the_webhook_the_driver_refuses_a_device_given_twice() {
    let Some(env) = env_at_least(
        "dra_two_allocators::without_the_webhook_the_driver_refuses_a_device_given_twice",
        36,
        "consumable capacity",
    ) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let s = setup(&env, false).await;
    let claims = claims_api(&s.admin);
    let (mut doubles, mut refused) = (0, 0);
    for seed in 1..=3u64 {
        let mut done: Vec<(usize, (String, String, String))> = Vec::new();
        let r = round(&s, seed).await;
        println!(
            "seed {seed}: {} of {PODS} bound ({} by kube-scheduler), {} allocated results, devices over-held: {:?}",
            r.bound, r.by_kube, r.audit.results, r.audit.violations
        );
        for (device, holders) in &r.audit.violations {
            doubles += 1;
            let pool = device.split('/').nth(1).unwrap_or_default().to_string();
            let at = s
                .nodes
                .iter()
                .position(|n| n.name == pool)
                .expect("the device's node");
            let node = &s.nodes[at];
            let mut prepared = 0;
            for h in holders {
                let c: Value = serde_json::to_value(claims.get(h).await.unwrap()).unwrap();
                let claim_ref = (
                    "default".to_string(),
                    c["metadata"]["uid"].as_str().unwrap().to_string(),
                    h.clone(),
                );
                let answer = node
                    .prepare(std::slice::from_ref(&claim_ref))
                    .await
                    .unwrap();
                let a = &answer.claims[&claim_ref.1];
                if a.error.is_empty() {
                    prepared += 1;
                    done.push((at, claim_ref.clone()));
                } else {
                    println!("  {h}: refused: {}", a.error);
                    refused += 1;
                }
            }
            assert!(
                prepared < holders.len(),
                "{device}: prepared for all of {holders:?}"
            );
            assert!(
                prepared <= 1 || device.contains(" MiB"),
                "{device}: held whole, prepared for {prepared} of {holders:?}"
            );
        }
        // What was prepared is unprepared before the round's claims go.
        for (at, c) in &done {
            s.nodes[*at]
                .unprepare(std::slice::from_ref(c))
                .await
                .unwrap();
        }
        clean(&s).await;
    }
    println!(
        "two allocators without the webhook: {doubles} device(s) given beyond what they allow by the two schedulers; {refused} prepare(s) refused by the driver"
    );
    drop(s.plane);
}
