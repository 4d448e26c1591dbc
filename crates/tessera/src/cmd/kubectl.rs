//! `kubectl tessera`: the kubectl plugin. `top` (nodes and GPUs with their
//! shares, models, health and fragmentation), `pods` (GPU pods with their exact
//! grants), `explain NS/POD` and `queues` (GpuQueues in GPU-equivalents), with the flags kubectl users expect:
//! `--kubeconfig`, `--context`, `-n/--namespace`, `-A/--all-namespaces`, `-o`.
//!
//! The reading is [`tessera_k8s::view`] and [`tessera_k8s::explain`]; this
//! module parses flags and renders tables. [`run_with`] takes a client so tests
//! drive the whole command against the kube-rs mock service.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tessera_k8s::view::{self, Connect, NodeRow, PodRow};

use super::EXIT_BAD_INPUT;

/// Tessera's view of the cluster's GPUs, as a kubectl plugin.
#[derive(Debug, Parser)]
#[command(name = "kubectl-tessera", bin_name = "kubectl tessera", version, about)]
pub struct KubectlCli {
    #[command(flatten)]
    pub flags: Flags,
    #[command(subcommand)]
    pub command: KubectlCommand,
}

/// kubectl's connection and scope flags, accepted before or after the subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct Flags {
    /// Path to the kubeconfig file to use.
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace (default: the context's namespace).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long = "all-namespaces", global = true)]
    pub all_namespaces: bool,
}

#[derive(Debug, Subcommand)]
pub enum KubectlCommand {
    /// Nodes and GPUs: model, granted share, memory, health, fragmentation.
    Top(OutputArgs),
    /// GPU pods and their exact grants (GPU index, UUID, memory, compute, MIG instance).
    Pods(OutputArgs),
    /// Where a pod went and why, or why it is pending.
    Explain(ExplainArgs),
    /// GpuQueues: guarantee, what each holds, deserves now and borrows, and its waiting pods.
    Queues(QueuesArgs),
}

#[derive(Debug, clap::Args)]
pub struct QueuesArgs {
    /// Output format: json (default: a table).
    #[arg(short = 'o', long)]
    pub output: Option<Output>,
    /// How GPU models count (the scheduler's --gpu-equivalents), e.g. `H100-80GB=1,T4=0.1`.
    #[arg(long)]
    pub gpu_equivalents: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Json,
    Wide,
}

#[derive(Debug, clap::Args)]
pub struct OutputArgs {
    /// Output format: json or wide (default: a table).
    #[arg(short = 'o', long)]
    pub output: Option<Output>,
}

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The pod: NAMESPACE/NAME, or NAME in the namespace of -n or the context.
    pub pod: String,
    /// Policy to judge a pending pod with (the scheduler's).
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    /// How GPU models count against quotas (the scheduler's --gpu-equivalents), e.g. `H100-80GB=1,T4=0.1`.
    #[arg(long)]
    pub gpu_equivalents: Option<String>,
    /// Output format: json (default: text).
    #[arg(short = 'o', long)]
    pub output: Option<Output>,
}

/// Entry point of the `kubectl-tessera` binary.
pub fn main() -> ExitCode {
    let cli = match KubectlCli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_BAD_INPUT)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let connect = Connect {
        kubeconfig: cli.flags.kubeconfig.clone(),
        context: cli.flags.context.clone(),
    };
    let (out, code) = rt.block_on(async {
        match connect.client().await {
            Ok((client, namespace)) => run_with(client, &namespace, &cli).await,
            Err(e) => (Err(e.to_string()), 1),
        }
    });
    match out {
        Ok(text) => print!("{text}"),
        Err(message) => eprintln!("error: {message}"),
    }
    ExitCode::from(code)
}

/// Runs `cli` against `client`; `context_namespace` is the kubeconfig context's.
/// Returns the text for stdout (or the error for stderr) and the exit code.
pub async fn run_with(
    client: kube::Client,
    context_namespace: &str,
    cli: &KubectlCli,
) -> (Result<String, String>, u8) {
    let flags = &cli.flags;
    let namespace = flags.namespace.as_deref().unwrap_or(context_namespace);
    let result = match &cli.command {
        KubectlCommand::Top(o) => view::top(&client)
            .await
            .map(|rows| render_top(&rows, o.output)),
        KubectlCommand::Pods(o) => {
            let scope = (!flags.all_namespaces).then_some(namespace);
            view::pods(&client, scope)
                .await
                .map(|rows| render_pods(&rows, o.output, scope.is_none()))
        }
        KubectlCommand::Explain(a) => return explain(client, namespace, a).await,
        KubectlCommand::Queues(a) => return queues(client, a).await,
    };
    match result {
        Ok(Ok(text)) => (Ok(text), 0),
        Ok(Err(e)) => (Err(format!("rendering: {e}")), 1),
        Err(e) => (Err(e.to_string()), 1),
    }
}

async fn explain(
    client: kube::Client,
    namespace: &str,
    a: &ExplainArgs,
) -> (Result<String, String>, u8) {
    let (ns, name) = match a.pod.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (namespace, a.pod.as_str()),
    };
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        return (
            Err(format!("{:?}: expected NAMESPACE/POD or POD", a.pod)),
            EXIT_BAD_INPUT,
        );
    }
    let ge = match gpu_equivalents(a.gpu_equivalents.as_deref()) {
        Ok(ge) => ge,
        Err(e) => return (Err(e), EXIT_BAD_INPUT),
    };
    match tessera_k8s::explain::explain(client, ns, name, &a.policy, ge).await {
        Ok(r) if a.output == Some(Output::Json) => match serde_json::to_string_pretty(&r) {
            Ok(s) => (Ok(s + "\n"), 0),
            Err(e) => (Err(e.to_string()), 1),
        },
        Ok(r) => (Ok(format!("{r}\n")), 0),
        Err(tessera_k8s::explain::ExplainError::Policy(e)) => {
            (Err(format!("--policy: {e}")), EXIT_BAD_INPUT)
        }
        Err(e) => (Err(e.to_string()), 1),
    }
}

async fn queues(client: kube::Client, a: &QueuesArgs) -> (Result<String, String>, u8) {
    let ge = match gpu_equivalents(a.gpu_equivalents.as_deref()) {
        Ok(ge) => ge,
        Err(e) => return (Err(e), EXIT_BAD_INPUT),
    };
    match tessera_k8s::queue_status::read(&client, ge).await {
        Ok((rows, problems)) => match render_queues(&rows, &problems, a.output) {
            Ok(s) => (Ok(s), 0),
            Err(e) => (Err(format!("rendering: {e}")), 1),
        },
        Err(e) => (Err(e.to_string()), 1),
    }
}

/// `--gpu-equivalents`, read as the scheduler reads it (factor 1 for every model without it).
pub fn gpu_equivalents(flag: Option<&str>) -> Result<tessera_core::queue::GpuEquivalents, String> {
    flag.map_or_else(
        || Ok(Default::default()),
        |t| {
            tessera_k8s::run::parse_gpu_equivalents(t)
                .map_err(|e| format!("--gpu-equivalents: {e}"))
        },
    )
}

/// The queue tree as a table (children indented under their parent), or JSON.
pub fn render_queues(
    rows: &[tessera_k8s::mirror::QueueFigures],
    problems: &[String],
    output: Option<Output>,
) -> Result<String, serde_json::Error> {
    if output == Some(Output::Json) {
        let v = serde_json::json!({"queues": rows, "problems": problems});
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    if rows.is_empty() && problems.is_empty() {
        return Ok("No GpuQueues found.\n".to_string());
    }
    let mut t = vec![
        [
            "QUEUE",
            "GUARANTEED",
            "ALLOCATED",
            "DESERVED",
            "BORROWED",
            "PENDING",
        ]
        .map(String::from)
        .to_vec(),
    ];
    // Depth-first from the top-level queues, in name order.
    fn walk<'a>(
        rows: &'a [tessera_k8s::mirror::QueueFigures],
        parent: Option<&str>,
        depth: usize,
        out: &mut Vec<(usize, &'a tessera_k8s::mirror::QueueFigures)>,
    ) {
        let mut kids: Vec<_> = rows
            .iter()
            .filter(|r| r.parent.as_deref() == parent)
            .collect();
        kids.sort_by(|a, b| a.name.cmp(&b.name));
        for k in kids {
            out.push((depth, k));
            walk(rows, Some(&k.name), depth + 1, out);
        }
    }
    let mut ordered = Vec::new();
    walk(rows, None, 0, &mut ordered);
    for (depth, q) in ordered {
        t.push(vec![
            format!("{}{}", "  ".repeat(depth), q.name),
            milli(q.guaranteed.gpu_eq_milli),
            milli(q.allocated.gpu_eq_milli),
            milli(q.deserved.gpu_eq_milli),
            milli(q.borrowed.gpu_eq_milli),
            q.pending_pods.to_string(),
        ]);
    }
    let mut out = table(&t);
    for p in problems {
        let _ = writeln!(out, "problem: {p}");
    }
    Ok(out)
}

/// Milli-GPU as kubectl prints CPU: `1500m`, or `2` for whole GPUs.
fn milli(v: u64) -> String {
    if v.is_multiple_of(1000) {
        (v / 1000).to_string()
    } else {
        format!("{v}m")
    }
}

fn pct(part: u64, whole: u64) -> String {
    match (part * 100).checked_div(whole) {
        Some(p) => format!("{p}%"),
        None => "-".to_string(),
    }
}

/// Left-aligned columns separated by three spaces, like kubectl's tables.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}   ", w = width[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `top` as a table, `-o wide` adds one line per GPU, `-o json` the rows.
pub fn render_top(rows: &[NodeRow], output: Option<Output>) -> Result<String, serde_json::Error> {
    if output == Some(Output::Json) {
        return Ok(serde_json::to_string_pretty(rows)? + "\n");
    }
    if rows.is_empty() {
        return Ok("No nodes found.\n".to_string());
    }
    let mut t = vec![
        [
            "NODE",
            "MODEL",
            "GPUS",
            "ALLOCATED",
            "ALLOC%",
            "FRAGMENT",
            "HEALTH",
            "READY",
            "GPU-PODS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for n in rows {
        t.push(vec![
            n.name.clone(),
            if n.model.is_empty() {
                "-".into()
            } else {
                n.model.clone()
            },
            n.gpus.len().to_string(),
            milli(n.allocated_milli),
            pct(n.allocated_milli, n.capacity_milli),
            milli(n.fragmentation_milli.round() as u64),
            n.health.clone(),
            if n.ready { "True" } else { "False" }.into(),
            n.gpu_pods.to_string(),
        ]);
    }
    let mut out = table(&t);
    if output == Some(Output::Wide) {
        let mut g = vec![
            [
                "NODE",
                "GPU",
                "UUID",
                "MODEL",
                "SHARE",
                "MEMORY(MiB)",
                "HEALTH",
                "PODS",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for n in rows {
            for gpu in &n.gpus {
                let health = match (gpu.healthy, gpu.reason.is_empty()) {
                    (true, _) => "Healthy".to_string(),
                    (false, true) => "Unhealthy".to_string(),
                    (false, false) => format!("Unhealthy ({})", gpu.reason),
                };
                g.push(vec![
                    n.name.clone(),
                    format!("{}{}", gpu.index, if gpu.mig { " (MIG)" } else { "" }),
                    if gpu.uuid.is_empty() {
                        "-".into()
                    } else {
                        gpu.uuid.clone()
                    },
                    gpu.model.clone(),
                    milli(u64::from(gpu.allocated_milli)),
                    format!("{}/{}", gpu.allocated_memory_mib, gpu.memory_mib),
                    health,
                    if gpu.pods.is_empty() {
                        "-".into()
                    } else {
                        gpu.pods.join(",")
                    },
                ]);
            }
        }
        out.push('\n');
        out.push_str(&table(&g));
    }
    Ok(out)
}

/// One grant as `GPU:SHARE/MEMORY`, e.g. `0:500m/40960Mi` or `2:MIG 3g.40gb@4`.
fn grant(row: &PodRow) -> String {
    match (&row.allocation, &row.problem) {
        (Some(a), _) => a
            .gpus
            .iter()
            .map(|g| match &g.mig {
                Some(m) => format!("{}:MIG {}@{}", g.index, m.profile, m.start),
                None => format!(
                    "{}:{}/{}Mi",
                    g.index,
                    milli(u64::from(g.cores_milli)),
                    g.memory_mib
                ),
            })
            .collect::<Vec<_>>()
            .join(","),
        (None, Some(p)) => format!("<invalid: {p}>"),
        (None, None) => "<none>".to_string(),
    }
}

/// `pods` as a table (NAMESPACE first with -A), `-o wide` adds isolation, policy,
/// UUIDs and requests, `-o json` the rows.
pub fn render_pods(
    rows: &[PodRow],
    output: Option<Output>,
    all_namespaces: bool,
) -> Result<String, serde_json::Error> {
    if output == Some(Output::Json) {
        return Ok(serde_json::to_string_pretty(rows)? + "\n");
    }
    if rows.is_empty() {
        return Ok("No GPU pods found.\n".to_string());
    }
    let wide = output == Some(Output::Wide);
    let mut head: Vec<&str> = Vec::new();
    if all_namespaces {
        head.push("NAMESPACE");
    }
    head.extend(["NAME", "PHASE", "NODE", "GPUS"]);
    if wide {
        head.extend(["ISOLATION", "POLICY", "UUIDS", "REQUESTS"]);
    }
    let mut t = vec![head.into_iter().map(String::from).collect::<Vec<_>>()];
    for r in rows {
        let mut line = Vec::new();
        if all_namespaces {
            line.push(r.namespace.clone());
        }
        line.extend([
            r.name.clone(),
            r.phase.clone(),
            r.node.clone().unwrap_or_else(|| "<none>".into()),
            grant(r),
        ]);
        if wide {
            let a = r.allocation.as_ref();
            let uuids: Vec<&str> = a
                .map(|a| {
                    a.gpus
                        .iter()
                        .map(|g| match &g.mig {
                            Some(m) if !m.uuid.is_empty() => m.uuid.as_str(),
                            _ => g.uuid.as_str(),
                        })
                        .filter(|u| !u.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            line.extend([
                a.map(|a| a.isolation.name().to_string())
                    .unwrap_or_else(|| "-".into()),
                a.map(|a| a.policy.clone()).unwrap_or_else(|| "-".into()),
                if uuids.is_empty() {
                    "-".into()
                } else {
                    uuids.join(",")
                },
                if r.requests.is_empty() {
                    "-".into()
                } else {
                    r.requests.join(",")
                },
            ]);
        }
        t.push(line);
    }
    Ok(table(&t))
}

#[cfg(test)]
#[path = "kubectl_tests.rs"]
mod tests;
