//! `tessera doctor pod NS/POD`: why is this GPU pod failing? Gathers the pod's
//! events, its grant, the health and recent XIDs of its GPUs and who else
//! shares them ([`tessera_k8s::view::pod_facts`]), reads every error message
//! it finds through the knowledge base, and says one verdict.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;
use tessera_k8s::view::{self, Connect, PodFacts, ViewError};

use super::kb::{self, Answer};
use crate::cmd::bad_input;

#[derive(Debug, clap::Args)]
pub struct PodArgs {
    /// The pod: NAMESPACE/NAME, or NAME in the namespace of -n or the context.
    pub pod: String,
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    #[arg(long)]
    pub context: Option<String>,
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// How GPU models count against queue quotas (the scheduler's --gpu-equivalents),
    /// e.g. `H100-80GB=1,T4=0.1`, so a pending pod is judged as the scheduler judges it.
    #[arg(long)]
    pub gpu_equivalents: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One thing found, with the knowledge base's answer when the text names a known error.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Where it was found, e.g. `container main (last termination)`.
    pub source: String,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
}

/// The facts, what they show, and the verdict.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnosis {
    pub facts: PodFacts,
    pub findings: Vec<Finding>,
    /// Why it is pending, from `tessera explain`, for an unbound pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    pub verdict: String,
}

/// The findings and the verdict from the facts (pure; the tests call it directly).
pub fn judge(facts: PodFacts, pending: Option<String>) -> Diagnosis {
    let mut findings = Vec::new();
    for g in facts.gpus.iter().filter(|g| !g.healthy) {
        let answer = tessera_node::snapshot::xids_in(&g.reason)
            .first()
            .map(|x| kb::xid_answer(*x));
        findings.push(Finding {
            source: format!("GPU {} ({})", g.index, g.uuid),
            text: if g.reason.is_empty() {
                "unhealthy".to_string()
            } else {
                format!("unhealthy: {}", g.reason)
            },
            answer,
        });
    }
    if let Some(m) = &facts.mps {
        let source = format!("MPS daemon for {}", m.gpus.join(","));
        match &m.daemon {
            None => findings.push(Finding {
                source,
                text: "the node agent runs no MPS control daemon for these GPUs".to_string(),
                answer: None,
            }),
            Some(d) if !d.running => findings.push(Finding {
                source,
                text: format!(
                    "down{} after {} restart(s)",
                    d.last_exit
                        .as_ref()
                        .map(|e| format!(" (last: {e})"))
                        .unwrap_or_default(),
                    d.restarts
                ),
                answer: None,
            }),
            Some(_) => {}
        }
    }
    let mut texts: Vec<(String, String)> = Vec::new();
    for c in &facts.containers {
        for (when, reason, message) in [
            ("now", &c.reason, &c.message),
            ("last termination", &c.last_reason, &c.last_message),
        ] {
            if !message.is_empty() {
                texts.push((format!("container {} ({when})", c.name), message.clone()));
            } else if reason == "OOMKilled" {
                texts.push((format!("container {} ({when})", c.name), reason.clone()));
            }
        }
    }
    for e in facts.events.iter().filter(|e| e.type_ == "Warning") {
        texts.push((format!("event {}", e.reason), e.message.clone()));
    }
    for (source, text) in texts {
        let answers = kb::lookup(&text).unwrap_or_default();
        if answers.is_empty() {
            findings.push(Finding {
                source,
                text,
                answer: None,
            });
            continue;
        }
        for a in answers {
            findings.push(Finding {
                source: source.clone(),
                text: text.clone(),
                answer: Some(a),
            });
        }
    }
    let verdict = verdict(&facts, &findings, pending.as_deref());
    Diagnosis {
        facts,
        findings,
        pending,
        verdict,
    }
}

fn verdict(facts: &PodFacts, findings: &[Finding], pending: Option<&str>) -> String {
    let pod = format!("{}/{}", facts.pod.namespace, facts.pod.name);
    let node = facts.pod.node.as_deref().unwrap_or("<none>");
    if let Some(g) = facts.gpus.iter().find(|g| !g.healthy) {
        return format!(
            "GPU {} of node {node} is withdrawn ({}): a fault of the GPU or its driver, not of the workload. Delete {pod} so that it is placed on a healthy GPU, and drain and reset that GPU.",
            g.index,
            if g.reason.is_empty() {
                "unhealthy"
            } else {
                &g.reason
            }
        );
    }
    if let Some(p) = &facts.pod.problem {
        return format!(
            "Its allocation annotation is unusable ({p}): the node agent refuses to start it. Delete the pod so the scheduler decides again."
        );
    }
    if let Some(m) = &facts.mps {
        let down = match &m.daemon {
            None => Some("no MPS control daemon serves its GPUs".to_string()),
            Some(d) if !d.running => Some(format!(
                "the MPS control daemon for its GPUs is down ({}, {} restart(s))",
                d.last_exit.as_deref().unwrap_or("exited"),
                d.restarts
            )),
            Some(_) => None,
        };
        if let Some(down) = down {
            return format!(
                "On node {node} {down}: its CUDA calls fail to connect (CUDA_ERROR_MPS_CONNECTION_FAILED) until the node agent starts it again, which it does with backoff while pods hold the GPUs. If it keeps failing, read the daemon's log under the agent's --mps-root on the node (`tessera doctor snapshot` lists the daemon directories) and restart {pod} once it is up."
            );
        }
    }
    if let Some(a) = findings.iter().find_map(|f| f.answer.as_ref()) {
        return format!("{}: {} Fix: {}", a.name, a.cause, a.fix);
    }
    if findings.iter().any(|f| f.text == "OOMKilled") {
        return "The container was killed for host memory (OOMKilled), not GPU memory: raise its memory limit.".to_string();
    }
    if let Some(p) = pending {
        return format!("Pending: {p}");
    }
    if let Some(c) = facts
        .containers
        .iter()
        .find(|c| c.restarts > 0 || c.state == "terminated")
    {
        return format!(
            "Container {} has restarted {} time(s) without a known GPU error in its status: read `kubectl logs --previous {pod} -c {}` (with terminationMessagePolicy: FallbackToLogsOnError the last log lines land in the status, where doctor reads them).",
            c.name, c.restarts, c.name
        );
    }
    if facts.pod.allocation.is_none() && facts.pod.node.is_some() {
        return format!(
            "{pod} has no Tessera GPU grant; if it asked for GPUs, another scheduler placed it."
        );
    }
    "No GPU problem found: the grant is valid, its GPUs are healthy and no known GPU error appears in the pod's status or events.".to_string()
}

/// Reads the facts (and, for a pending pod, the explanation with the
/// scheduler's GPU equivalents `ge`) and judges them.
pub async fn diagnose(
    client: kube::Client,
    namespace: &str,
    name: &str,
    ge: tessera_core::queue::GpuEquivalents,
) -> Result<Diagnosis, ViewError> {
    let facts = view::pod_facts(&client, namespace, name).await?;
    let pending = match facts.pod.node {
        // The built-in policy, the scheduler's default.
        None => tessera_k8s::explain::explain(client, namespace, name, "tessera", ge)
            .await
            .ok()
            .map(|r| r.report.to_string()),
        Some(_) => None,
    };
    Ok(judge(facts, pending))
}

/// The diagnosis as text.
pub fn render(d: &Diagnosis) -> String {
    let f = &d.facts;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Pod {}/{} ({}) on node {}",
        f.pod.namespace,
        f.pod.name,
        f.pod.phase,
        f.pod.node.as_deref().unwrap_or("<none>")
    );
    match (&f.pod.allocation, &f.pod.problem) {
        (Some(a), _) => {
            let _ = writeln!(
                out,
                "Grant: policy {}, isolation {}",
                a.policy,
                a.isolation.name()
            );
            for g in &a.gpus {
                let state = f.gpus.iter().find(|r| r.index == g.index);
                let health = match state {
                    Some(r) if r.healthy => "healthy".to_string(),
                    Some(r) => format!("UNHEALTHY: {}", r.reason),
                    None => "health unknown (no inventory)".to_string(),
                };
                let others: Vec<&String> = state
                    .map(|r| {
                        r.pods
                            .iter()
                            .filter(|p| **p != format!("{}/{}", f.pod.namespace, f.pod.name))
                            .collect()
                    })
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  GPU {} {}: {} MiB, {}.{}% compute{}; {health}; shared with: {}",
                    g.index,
                    g.uuid,
                    g.memory_mib,
                    g.cores_milli / 10,
                    g.cores_milli % 10,
                    g.mig
                        .as_ref()
                        .map(|m| format!(", MIG {}", m.profile))
                        .unwrap_or_default(),
                    if others.is_empty() {
                        "nobody".to_string()
                    } else {
                        others
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                );
            }
        }
        (None, Some(p)) => {
            let _ = writeln!(out, "Grant: invalid ({p})");
        }
        (None, None) => {
            let _ = writeln!(out, "Grant: none");
        }
    }
    if let Some(m) = &f.mps {
        let state = match &m.daemon {
            None => "none running".to_string(),
            Some(d) => format!(
                "{}, {} restart(s){}",
                if d.running { "running" } else { "DOWN" },
                d.restarts,
                d.last_exit
                    .as_ref()
                    .map(|e| format!(", last exit: {e}"))
                    .unwrap_or_default()
            ),
        };
        let _ = writeln!(out, "MPS daemon for {}: {state}", m.gpus.join(","));
    }
    for c in &f.containers {
        let _ = writeln!(
            out,
            "Container {}: {}{}{}, restarts {}",
            c.name,
            c.state,
            if c.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.reason)
            },
            c.exit_code
                .map(|e| format!(", exit {e}"))
                .unwrap_or_default(),
            c.restarts
        );
    }
    if !f.events.is_empty() {
        let _ = writeln!(out, "Events:");
        for e in f.events.iter().rev().take(10).rev() {
            let _ = writeln!(
                out,
                "  {} {} (x{}): {}",
                e.type_, e.reason, e.count, e.message
            );
        }
    }
    if !d.findings.is_empty() {
        let _ = writeln!(out, "Findings:");
        for x in &d.findings {
            match &x.answer {
                Some(a) => {
                    let _ = writeln!(
                        out,
                        "  {}: {} [{} {}], owner: {}",
                        x.source,
                        a.name,
                        a.domain.name(),
                        a.code,
                        a.owner.name()
                    );
                }
                None => {
                    let _ = writeln!(out, "  {}: {}", x.source, x.text);
                }
            }
        }
    }
    let _ = writeln!(out, "Verdict: {}", d.verdict);
    out
}

pub fn run(a: PodArgs) -> anyhow::Result<ExitCode> {
    let (ns, name) = match a.pod.split_once('/') {
        Some((ns, name)) => (Some(ns.to_string()), name.to_string()),
        None => (a.namespace.clone(), a.pod.clone()),
    };
    if ns.as_deref() == Some("") || name.is_empty() || name.contains('/') {
        return bad_input(format!("{:?}: expected NAMESPACE/POD or POD", a.pod));
    }
    let ge = match crate::cmd::kubectl::gpu_equivalents(a.gpu_equivalents.as_deref()) {
        Ok(ge) => ge,
        Err(e) => return bad_input(e),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let connect = Connect {
        kubeconfig: a.kubeconfig.clone(),
        context: a.context.clone(),
    };
    let result = rt.block_on(async {
        let (client, context_ns) = connect.client().await?;
        let ns = ns.unwrap_or(context_ns);
        diagnose(client, &ns, &name, ge).await
    });
    match result {
        Ok(d) if a.json => println!("{}", serde_json::to_string_pretty(&d)?),
        Ok(d) => print!("{}", render(&d)),
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cmd::testkit::cluster;

    fn event(name: &str, type_: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{name}.1"), "namespace": "ml"},
            "involvedObject": {"kind": "Pod", "namespace": "ml", "name": name, "uid": format!("uid-{name}")},
            "type": type_, "reason": reason, "message": message, "count": 3,
            "lastTimestamp": "2026-12-01T00:00:00Z"})
    }

    /// A pod whose GPU was withdrawn: the verdict blames the GPU, with the XID's meaning.
    #[tokio::test]
    async fn a_withdrawn_gpu_is_the_verdict() {
        let mut mock = cluster();
        // ml/train is moved onto gpu-a's GPU 1, the one withdrawn for XID 79.
        mock.pods[0] = crate::cmd::testkit::pod(
            "ml",
            "train",
            &[("tessera.io/gpu", "1")],
            Some("gpu-a"),
            Some(crate::cmd::testkit::allocation(
                "ml",
                "train",
                "gpu-a",
                tessera_core::request::Isolation::Exclusive,
                &[(1, 1000, 81920, None)],
            )),
        );
        let (client, seen) = mock.client();
        let d = diagnose(client, "ml", "train", Default::default())
            .await
            .unwrap();
        assert!(
            d.verdict
                .starts_with("GPU 1 of node gpu-a is withdrawn (XID 79"),
            "{}",
            d.verdict
        );
        let xid = d.findings[0].answer.as_ref().unwrap();
        assert_eq!((xid.code.as_str(), xid.withdraws_gpu), ("79", Some(true)));
        let text = render(&d);
        assert!(
            text.contains("GPU 1 GPU-gpu-a-1: 81920 MiB, 100.0% compute; UNHEALTHY"),
            "{text}"
        );
        // The events were asked for this pod only.
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter()
                .any(|s| s.starts_with("/api/v1/namespaces/ml/events?")
                    && s.contains("involvedObject.name")),
            "{seen:?}"
        );
    }

    /// A crash-looping pod whose last termination says CUDA out of memory, sharing its GPU.
    #[tokio::test]
    async fn a_cuda_error_in_the_status_is_explained() {
        let mut mock = cluster();
        mock.pods[1]["status"] = json!({"phase": "Running", "containerStatuses": [{
            "name": "main", "image": "img", "imageID": "", "ready": false, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}}}]});
        mock.events.push(event(
            "infer",
            "Warning",
            "BackOff",
            "Back-off restarting failed container main",
        ));
        mock.events
            .push(event("other", "Warning", "Failed", "not about this pod"));
        let (client, _) = mock.client();
        let d = diagnose(client, "ml", "infer", Default::default())
            .await
            .unwrap();
        assert!(
            d.verdict.starts_with("CUDA_ERROR_OUT_OF_MEMORY:"),
            "{}",
            d.verdict
        );
        assert_eq!(d.facts.events.len(), 1);
        let text = render(&d);
        assert!(text.contains("shared with: team/chat"), "{text}");
        assert!(
            text.contains("Container main: waiting (CrashLoopBackOff), restarts 4"),
            "{text}"
        );
    }

    /// An MPS share whose node agent reports the daemon for its GPU down: that is
    /// the verdict, with what the agent last saw; a running daemon is no finding.
    #[tokio::test]
    async fn a_down_mps_daemon_is_the_verdict() {
        let with_daemon = |running: bool| {
            let mut mock = cluster();
            mock.gpunodes[1]["status"] = json!({"model": "A100-80GB", "gpuCount": 1, "healthyGpus": 1,
                "health": "Healthy", "mpsDaemons": [
                    {"gpus": ["GPU-gpu-b-0"], "running": running, "restarts": 3, "lastExit": "exit status: 1"}]});
            mock
        };
        let (client, _) = with_daemon(false).client();
        let d = diagnose(client, "ml", "infer", Default::default())
            .await
            .unwrap();
        assert!(
            d.verdict.starts_with(
                "On node gpu-b the MPS control daemon for its GPUs is down (exit status: 1, 3 restart(s))"
            ),
            "{}",
            d.verdict
        );
        assert_eq!(d.findings[0].source, "MPS daemon for GPU-gpu-b-0");
        assert!(
            render(&d).contains(
                "MPS daemon for GPU-gpu-b-0: DOWN, 3 restart(s), last exit: exit status: 1"
            ),
            "{}",
            render(&d)
        );
        // Up again: nothing to say about it.
        let (client, _) = with_daemon(true).client();
        let d = diagnose(client, "ml", "infer", Default::default())
            .await
            .unwrap();
        assert!(
            d.findings.iter().all(|f| !f.source.starts_with("MPS")),
            "{:?}",
            d.findings
        );
        assert!(d.facts.mps.unwrap().daemon.unwrap().running);
    }

    #[tokio::test]
    async fn a_pending_pod_gets_its_reasons_and_a_missing_pod_an_error() {
        let (client, _) = cluster().client();
        let d = diagnose(client, "ml", "waiting", Default::default())
            .await
            .unwrap();
        assert!(
            d.verdict.starts_with("Pending: ml/waiting is pending"),
            "{}",
            d.verdict
        );
        let (client, _) = cluster().client();
        let e = diagnose(client, "ml", "ghost", Default::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("ml/ghost not found"), "{e}");
    }

    /// A pending pod whose queue is full: the verdict is the quota, not a node that fits.
    #[tokio::test]
    async fn a_pod_in_a_full_queue_is_pending_for_its_quota() {
        let mut mock = cluster();
        // ml/small (100m) fits on gpu-b; queue ml-q's 1.5 GPU-equivalents are held
        // by ml/train (1) and ml/infer (500m), and it does not borrow.
        mock.pods.push(crate::cmd::testkit::pod(
            "ml",
            "small",
            &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "100")],
            None,
            None,
        ));
        mock.gpuqueues = vec![
            json!({"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQueue",
            "metadata": {"name": "ml-q"},
            // CPU and memory ample: only the GPUs can pass the guarantee.
            "spec": {"guaranteed": {"gpus": "1500m", "cpu": "1000", "memory": "4Ti"}, "borrow": false}}),
        ];
        mock.namespaces = vec![json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "ml", "labels": {"tessera.io/queue": "ml-q"}}})];
        let (client, _) = mock.clone().client();
        let d = diagnose(client, "ml", "small", Default::default())
            .await
            .unwrap();
        assert!(
            d.verdict.starts_with(
                "Pending: ml/small is pending: it waits for its queue's quota: queue ml-q"
            ),
            "{}",
            d.verdict
        );
        // With the scheduler's --gpu-equivalents (an A100 counts half), the queue
        // holds 0.75 of its 1.5 and ml/small fits: doctor judges as the scheduler
        // does. Before, doctor pod always counted every model 1.
        let ge = crate::cmd::kubectl::gpu_equivalents(Some("A100-80GB=0.5")).unwrap();
        let (client, _) = mock.client();
        let d = diagnose(client, "ml", "small", ge).await.unwrap();
        assert!(
            d.verdict
                .starts_with("Pending: ml/small is pending, but fits now"),
            "{}",
            d.verdict
        );
    }

    #[tokio::test]
    async fn a_healthy_pod_has_no_problem() {
        let (client, _) = cluster().client();
        let d = diagnose(client, "team", "chat", Default::default())
            .await
            .unwrap();
        assert!(
            d.verdict.starts_with("No GPU problem found"),
            "{}",
            d.verdict
        );
        assert!(d.findings.is_empty());
    }
}
