//! `tessera explain NAMESPACE/POD`: where the pod went and why, or why it is
//! pending (per-node reason counts), from the live cluster.

use std::process::ExitCode;

use super::bad_input;

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The pod, as NAMESPACE/NAME (or NAME in `default`).
    pub pod: String,
    /// Policy to judge a pending pod with (the scheduler's).
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    /// How GPU models count against quotas (the scheduler's --gpu-equivalents), e.g. `H100-80GB=1,T4=0.1`.
    #[arg(long)]
    pub gpu_equivalents: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ExplainArgs) -> anyhow::Result<ExitCode> {
    let (ns, name) = match a.pod.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => ("default".to_string(), a.pod.clone()),
    };
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        return bad_input(format!("{:?}: expected NAMESPACE/POD", a.pod));
    }
    let ge = match super::kubectl::gpu_equivalents(a.gpu_equivalents.as_deref()) {
        Ok(ge) => ge,
        Err(e) => return bad_input(e),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(tessera_k8s::explain::explain_live(
        &ns, &name, &a.policy, ge,
    ));
    match report {
        Ok(r) if a.json => println!("{}", serde_json::to_string_pretty(&r)?),
        Ok(r) => println!("{r}"),
        Err(tessera_k8s::explain::ExplainError::Policy(e)) => {
            return bad_input(format!("--policy: {e}"));
        }
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}
