//! `kubectl tessera` against the kube-rs mock API: the whole command (flags,
//! reading, rendering) except building the client from a kubeconfig, which
//! [`kubeconfig_context_and_namespace`] covers on its own.

use clap::Parser;

use super::*;
use crate::cmd::testkit::cluster;

async fn run(args: &[&str], mock: crate::cmd::testkit::MockCluster) -> (String, u8, Vec<String>) {
    let cli =
        KubectlCli::try_parse_from(std::iter::once("kubectl-tessera").chain(args.iter().copied()))
            .expect("flags parse");
    let (client, seen) = mock.client();
    let (out, code) = run_with(client, "ml", &cli).await;
    let text = out.unwrap_or_else(|e| format!("ERR {e}"));
    let seen = seen.lock().unwrap().clone();
    (text, code, seen)
}

fn line_of<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?} in\n{text}"))
}

#[tokio::test]
async fn top_shows_shares_health_and_fragmentation() {
    let (text, code, seen) = run(&["top"], cluster()).await;
    assert_eq!(code, 0, "{text}");
    // gpu-a: GPU 0 whole to ml/train (1000m of 2000m), GPU 1 withdrawn → Degraded.
    let a: Vec<&str> = line_of(&text, "gpu-a").split_whitespace().collect();
    assert_eq!(
        a,
        [
            "gpu-a",
            "A100-80GB",
            "2",
            "1",
            "50%",
            a[5],
            "Degraded",
            "True",
            "1"
        ]
    );
    // gpu-b: 500m + 300m on its one GPU; 200m left that a whole-GPU pod cannot use.
    let b: Vec<&str> = line_of(&text, "gpu-b").split_whitespace().collect();
    assert_eq!(&b[..5], ["gpu-b", "A100-80GB", "1", "800m", "80%"]);
    assert_eq!(&b[6..], ["Healthy", "True", "2"]);
    assert_ne!(b[5], "0", "a node with 200m stranded is fragmented: {text}");
    // One list each of nodes, GpuNodes and pods; nothing written.
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.iter()
            .any(|s| s.starts_with("/apis/tessera.io/v1alpha1/gpunodes"))
    );
}

#[tokio::test]
async fn top_wide_and_json_show_each_gpu() {
    let (text, _, _) = run(&["top", "-o", "wide"], cluster()).await;
    let g = line_of(&text, "gpu-b   0");
    assert!(
        g.contains("GPU-gpu-b-0") && g.contains("800m") && g.contains("65536/81920"),
        "{g}"
    );
    assert!(g.contains("ml/infer,team/chat"), "{g}");
    let bad = line_of(&text, "gpu-a   1");
    assert!(
        bad.contains("Unhealthy (XID 79: GPU has fallen off the bus)"),
        "{bad}"
    );

    let (json, _, _) = run(&["top", "-o", "json"], cluster()).await;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["name"], "gpu-a");
    assert_eq!(v[0]["gpus"][1]["healthy"], false);
    assert_eq!(v[1]["gpus"][0]["allocatedMilli"], 800);
    assert_eq!(
        v[1]["gpus"][0]["pods"],
        serde_json::json!(["ml/infer", "team/chat"])
    );
}

#[tokio::test]
async fn top_without_the_crd_says_no_inventory() {
    let mut mock = cluster();
    mock.no_crd = true;
    let (text, code, _) = run(&["top"], mock).await;
    assert_eq!(code, 0, "{text}");
    assert!(line_of(&text, "gpu-a").contains("NoInventory"), "{text}");
}

#[tokio::test]
async fn pods_lists_exact_grants_in_the_namespace() {
    // Default namespace: the context's ("ml"); only GPU pods.
    let (text, code, seen) = run(&["pods"], cluster()).await;
    assert_eq!(code, 0, "{text}");
    assert_eq!(seen, ["/api/v1/namespaces/ml/pods?"], "{seen:?}");
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(line_of(&text, "infer").contains("0:500m/40960Mi"), "{text}");
    assert!(line_of(&text, "train").contains("0:1/81920Mi"), "{text}");
    assert!(line_of(&text, "waiting").contains("<none>"), "{text}");
    assert!(!text.contains("web"), "{text}");

    let (text, _, seen) = run(&["-n", "team", "pods", "-o", "wide"], cluster()).await;
    assert_eq!(seen, ["/api/v1/namespaces/team/pods?"]);
    let chat = line_of(&text, "chat");
    assert!(
        chat.contains("mps") && chat.contains("GPU-gpu-b-0"),
        "{chat}"
    );
    assert!(chat.contains("tessera.io/gpu-milli=300"), "{chat}");
}

#[tokio::test]
async fn pods_all_namespaces_and_json() {
    let (text, _, seen) = run(&["pods", "-A"], cluster()).await;
    assert_eq!(seen, ["/api/v1/pods?"]);
    assert!(text.starts_with("NAMESPACE"), "{text}");
    assert!(line_of(&text, "team").contains("chat"), "{text}");
    let (json, _, _) = run(&["pods", "-A", "-o", "json"], cluster()).await;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let chat = v
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "chat")
        .unwrap();
    assert_eq!(chat["allocation"]["gpus"][0]["coresMilli"], 300);
    assert_eq!(chat["allocation"]["isolation"], "mps");
}

#[tokio::test]
async fn a_broken_annotation_is_shown_not_fatal() {
    let mut mock = cluster();
    mock.pods.push(crate::cmd::testkit::pod(
        "ml",
        "forged",
        &[("tessera.io/gpu", "1")],
        Some("gpu-b"),
        Some("{not json".to_string()),
    ));
    let (text, code, _) = run(&["pods"], mock).await;
    assert_eq!(code, 0);
    assert!(
        line_of(&text, "forged").contains("<invalid: allocation annotation"),
        "{text}"
    );
}

#[tokio::test]
async fn explain_reuses_tessera_explain() {
    let (text, code, _) = run(&["explain", "ml/infer"], cluster()).await;
    assert_eq!(code, 0, "{text}");
    assert!(text.starts_with("ml/infer is on node gpu-b"), "{text}");
    // The workload the policy scores against, learned from the pods listed as the
    // scheduler rebuilds it after a restart: the four GPU pods and ml/web, which asks
    // no GPU but runs on the GPU node gpu-b.
    assert!(
        text.contains("fragment measured against the workload learned from 5 pod(s)"),
        "{text}"
    );
    let (json, code, _) = run(&["explain", "ml/infer", "-o", "json"], cluster()).await;
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["state"], "placed", "{v}");
    assert_eq!(v["workload"]["learned"], true, "{v}");
    assert_eq!(v["workload"]["podsLearned"], 5, "{v}");
    // NAME alone is looked up in the namespace of -n.
    let (text, code, _) = run(&["explain", "waiting", "-n", "ml"], cluster()).await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ml/waiting is pending"), "{text}");
    let (text, code, _) = run(&["explain", "ml/"], cluster()).await;
    assert_eq!(
        (code, text.starts_with("ERR")),
        (EXIT_BAD_INPUT, true),
        "{text}"
    );
    let (text, code, _) = run(&["explain", "ml/ghost"], cluster()).await;
    assert_eq!(code, 1);
    assert!(text.contains("not found"), "{text}");
}

/// Namespace `ml` in queue `ml-q`, guaranteed 1.5 GPU-equivalents and not borrowing:
/// ml/train (1 GPU) and ml/infer (500m) hold all of it.
fn ml_queue_full(mut c: crate::cmd::testkit::MockCluster) -> crate::cmd::testkit::MockCluster {
    c.gpuqueues = vec![
        serde_json::json!({"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQueue",
        "metadata": {"name": "ml-q"},
        "spec": {"guaranteed": {"gpus": "1500m"}, "borrow": false}}),
    ];
    c.namespaces = vec![serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "ml", "labels": {"tessera.io/queue": "ml-q"}}})];
    c
}

/// ml/small asks 100m of a GPU, which fits on gpu-b (800m of its GPU is granted).
fn small(c: &mut crate::cmd::testkit::MockCluster) {
    c.pods.push(crate::cmd::testkit::pod(
        "ml",
        "small",
        &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "100")],
        None,
        None,
    ));
}

/// A pod whose queue is full waits for the queue, with the mirror's quota sentence,
/// whatever the nodes have free; GpuQueues and namespaces are read as the scheduler reads them.
#[tokio::test]
async fn explain_says_a_pod_waits_for_its_full_queue() {
    let mut free = cluster();
    small(&mut free);
    let (text, code, _) = run(&["explain", "ml/small"], free.clone()).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.starts_with("ml/small is pending, but fits now"),
        "{text}"
    );

    let mut full = ml_queue_full(free);
    let (text, code, seen) = run(&["explain", "ml/small"], full.clone()).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.starts_with(
            "ml/small is pending: it waits for its queue's quota: queue ml-q would pass its guaranteed quota and does not borrow"
        ) && text.contains("holds 1.500)"),
        "{text}"
    );
    for listed in [
        "/apis/tessera.io/v1alpha1/gpuqueues?",
        "/api/v1/namespaces?",
        "/apis/scheduling.x-k8s.io/v1alpha1/podgroups?",
    ] {
        assert!(seen.iter().any(|s| s == listed), "{listed} in {seen:?}");
    }
    let (json, _, _) = run(&["explain", "ml/small", "-o", "json"], full.clone()).await;
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["state"], "waitsForQueue", "{v}");
    // An H100 factor does not change what A100s count: still full. A bad factor is a usage error.
    let (text, _, _) = run(
        &["explain", "ml/small", "--gpu-equivalents", "H100-80GB=2"],
        full.clone(),
    )
    .await;
    assert!(text.contains("waits for its queue's quota"), "{text}");
    let (text, code, _) = run(
        &["explain", "ml/small", "--gpu-equivalents", "Z9=1"],
        full.clone(),
    )
    .await;
    assert_eq!(code, EXIT_BAD_INPUT, "{text}");
    // Its namespace out of the queue: no quota applies.
    full.namespaces.clear();
    let (text, _, _) = run(&["explain", "ml/small"], full).await;
    assert!(
        text.starts_with("ml/small is pending, but fits now"),
        "{text}"
    );
}

/// A gang member says how far its PodGroup is; without the PodGroup CRD (404) explain
/// still answers, and the group does not exist, as the scheduler sees it.
#[tokio::test]
async fn explain_reads_the_gangs_podgroup() {
    let mut c = cluster();
    small(&mut c);
    let member = c.pods.last_mut().expect("ml/small");
    member["metadata"]["labels"] = serde_json::json!({"scheduling.x-k8s.io/pod-group": "train"});
    c.podgroups = vec![
        serde_json::json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup", "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"minMember": 3}}),
    ];
    let (text, code, _) = run(&["explain", "ml/small"], c.clone()).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.starts_with(
            "ml/small is pending: it is placed only with its gang ml/train: minMember 3: 0 placed, 1 waiting"
        ),
        "{text}"
    );
    c.no_crd = true;
    let (text, code, _) = run(&["explain", "ml/small"], c).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("its gang ml/train: PodGroup ml/train does not exist"),
        "{text}"
    );
}

#[test]
fn bad_flags_are_usage_errors() {
    assert!(KubectlCli::try_parse_from(["kubectl-tessera", "top", "-o", "yaml"]).is_err());
    assert!(KubectlCli::try_parse_from(["kubectl-tessera", "frobnicate"]).is_err());
}

/// `--kubeconfig` and `--context` pick the context, and its namespace becomes the default.
#[tokio::test]
async fn kubeconfig_context_and_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: one\n\
clusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:1'}\n\
users:\n- name: u\n  user: {token: t}\n\
contexts:\n- name: one\n  context: {cluster: c, user: u}\n- name: two\n  context: {cluster: c, user: u, namespace: team-b}\n",
    )
    .unwrap();
    let c = |context: Option<&str>| Connect {
        kubeconfig: Some(path.clone()),
        context: context.map(str::to_string),
    };
    assert_eq!(c(None).client().await.unwrap().1, "default");
    assert_eq!(c(Some("two")).client().await.unwrap().1, "team-b");
    let e = c(Some("three"))
        .client()
        .await
        .err()
        .expect("an unknown context")
        .to_string();
    assert!(e.contains("three"), "{e}");
    let missing = Connect {
        kubeconfig: Some(dir.path().join("nope")),
        context: None,
    };
    let e = missing
        .client()
        .await
        .err()
        .expect("a missing file")
        .to_string();
    assert!(e.contains("nope"), "{e}");
}

#[tokio::test]
async fn queues_show_the_tree_with_use_share_and_waiting_pods() {
    let mut c = cluster();
    let q = |name: &str, parent: Option<&str>, gpus: &str| {
        serde_json::json!({"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": name}, "spec": {"parent": parent, "guaranteed": {"gpus": gpus}}})
    };
    c.gpuqueues = vec![
        q("research", None, "2"),
        q("research-ml", Some("research"), "1"),
        q("prod", None, "1"),
    ];
    let ns = |name: &str, queue: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"tessera.io/queue": queue}}})
    };
    c.namespaces = vec![ns("ml", "research-ml"), ns("team", "prod")];
    let (text, code, _) = run(&["queues"], c.clone()).await;
    assert_eq!(code, 0, "{text}");
    // ml/train holds a whole GPU (1), ml/infer 500m of compute and half the memory (500m):
    // 1500m, beyond research-ml's guarantee of 1 by 500m; ml/waiting (4 GPUs) waits.
    let ml: Vec<&str> = line_of(&text, "  research-ml").split_whitespace().collect();
    assert_eq!(
        ml,
        ["research-ml", "1", "1500m", ml[3], "500m", "1"],
        "{text}"
    );
    let research: Vec<&str> = line_of(&text, "research ").split_whitespace().collect();
    assert_eq!(&research[..3], ["research", "2", "1500m"]);
    let prod: Vec<&str> = line_of(&text, "prod").split_whitespace().collect();
    assert_eq!(prod[5], "0", "{text}");
    let (json, _, _) = run(&["queues", "-o", "json"], c.clone()).await;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["queues"].as_array().unwrap().len(), 3);
    let (bad, code, _) = run(&["queues", "--gpu-equivalents", "Z9=1"], c).await;
    assert_eq!(code, EXIT_BAD_INPUT, "{bad}");
    assert!(bad.contains("Z9"), "{bad}");
    let (none, _, _) = run(&["queues"], cluster()).await;
    assert_eq!(none, "No GpuQueues found.\n");
}
