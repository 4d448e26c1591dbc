//! `tessera doctor`: the troubleshooting kit.
//!
//! - `tessera doctor explain TEXT…` (or `tessera doctor CODE…`): what a GPU
//!   error means, who has to act, how to fix it and what Tessera can check,
//!   for CUDA, cuBLAS, cuDNN, NCCL and NVML codes and XIDs ([`kb`]); TEXT is
//!   a name, `NAMESPACE:NUMBER`, or a pasted log line.
//! - `tessera doctor list [DOMAIN]`: the knowledge base.
//! - `tessera doctor pod NS/POD`: why a GPU pod is failing ([`pod`]).
//! - `tessera doctor snapshot`: a node's GPU state in one archive ([`snapshot`]).
//!
//! XIDs come from the node agent's health table, so the answer matches what
//! the agent does with the GPU.

pub mod kb;
mod kb_data;
pub mod pod;
pub mod snapshot;

use std::process::ExitCode;

use kb::{Answer, Domain};

use super::bad_input;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DoctorArgs {
    #[command(subcommand)]
    command: Option<DoctorCommand>,
    /// Codes to explain, each a name, NAMESPACE:NUMBER or an XID number
    /// (`79`, `xid 79`, `CUDA_ERROR_OUT_OF_MEMORY`, `nvml:15`); none lists the XIDs.
    #[arg(value_name = "CODE")]
    codes: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Subcommand)]
enum DoctorCommand {
    /// Explain an error: a name, NAMESPACE:NUMBER, or a log line (all words are one text).
    Explain {
        #[arg(required = true, value_name = "TEXT")]
        text: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// List the known codes, of one domain (cuda, cublas, cudnn, nccl, nvml, xid) or all.
    List {
        domain: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Why is this GPU pod failing: events, grant, GPU health and XIDs, a verdict.
    Pod(pod::PodArgs),
    /// Pack this node's GPU state, driver, kernel NVRM/Xid lines and agent state into a .tar.gz.
    Snapshot(snapshot::SnapshotArgs),
}

/// Text for one answer.
pub fn render(a: &Answer) -> String {
    let mut out = format!("{} [{} {}]\n", a.name, a.domain.name(), a.code);
    if !a.aliases.is_empty() {
        out.push_str(&format!("  also:   {}\n", a.aliases.join(", ")));
    }
    out.push_str(&format!("  owner:  {}\n", a.owner.name()));
    out.push_str(&format!("  cause:  {}\n", a.cause));
    if let Some(w) = a.withdraws_gpu {
        let effect = if w {
            "the node agent withdraws the GPU (it comes back after the quiet period or a reset)"
        } else {
            "the GPU stays in service (application error)"
        };
        out.push_str(&format!("  effect: {effect}\n"));
    }
    out.push_str(&format!("  fix:    {}\n", a.fix));
    out.push_str(&format!("  check:  {}\n", a.tessera_checks));
    out
}

fn print(answers: &[Answer], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(answers)?);
    } else {
        for a in answers {
            println!("{}", render(a));
        }
    }
    Ok(())
}

/// Looks up each query; exit 1 when one finds nothing, 2 when one is malformed.
fn explain(queries: &[String], json: bool) -> anyhow::Result<ExitCode> {
    let mut answers = Vec::new();
    let mut missing = Vec::new();
    for q in queries {
        match kb::lookup(q) {
            Ok(found) if found.is_empty() => missing.push(q.clone()),
            Ok(found) => answers.extend(found),
            Err(e) => return bad_input(format!("{q:?}: {e}")),
        }
    }
    print(&answers, json)?;
    if missing.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for m in &missing {
        eprintln!(
            "no known GPU error in {m:?} (try a code name such as CUDA_ERROR_OUT_OF_MEMORY, NAMESPACE:NUMBER such as nvml:15, or `tessera doctor list`)"
        );
    }
    Ok(ExitCode::from(1))
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        Some(DoctorCommand::Explain { text, json }) => explain(&[text.join(" ")], json),
        Some(DoctorCommand::List { domain, json }) => {
            let d = match domain.as_deref().map(|d| (d, Domain::parse(d))) {
                None => None,
                Some((_, Some(d))) => Some(d),
                Some((d, None)) => {
                    return bad_input(format!(
                        "{d:?} is not a domain; use cuda, cublas, cudnn, nccl, nvml or xid"
                    ));
                }
            };
            print(&kb::list(d), json)?;
            Ok(ExitCode::SUCCESS)
        }
        Some(DoctorCommand::Pod(a)) => pod::run(a),
        Some(DoctorCommand::Snapshot(a)) => snapshot::run(a),
        None if args.codes.is_empty() => {
            if !args.json {
                println!(
                    "Known XIDs. Application XIDs {:?} leave the GPU in service; all others withdraw it.\n",
                    tessera_node::health::DEFAULT_IGNORED_XIDS
                );
            }
            print(&kb::list(Some(Domain::Xid)), args.json)?;
            Ok(ExitCode::SUCCESS)
        }
        None => {
            // `tessera doctor xid 79` is one query, as it always was.
            let codes: Vec<String> = args
                .codes
                .iter()
                .filter(|c| !c.eq_ignore_ascii_case("xid"))
                .cloned()
                .collect();
            explain(&codes, args.json)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: DoctorArgs,
    }

    fn code(args: &[&str]) -> String {
        let cli = Cli::try_parse_from(std::iter::once("doctor").chain(args.iter().copied()))
            .expect("flags parse");
        format!("{:?}", run(cli.args).unwrap())
    }

    #[test]
    fn exit_codes_follow_what_was_found() {
        let ok = format!("{:?}", ExitCode::SUCCESS);
        assert_eq!(code(&["79"]), ok);
        assert_eq!(code(&["xid", "79"]), ok);
        assert_eq!(code(&["CUDA_ERROR_OUT_OF_MEMORY", "nvml:15"]), ok);
        assert_eq!(
            code(&[
                "explain",
                "RuntimeError:",
                "CUDA",
                "error:",
                "out",
                "of",
                "memory"
            ]),
            ok
        );
        assert_eq!(code(&["list", "nccl"]), ok);
        assert_eq!(code(&[]), ok);
        assert_eq!(code(&["banana"]), format!("{:?}", ExitCode::from(1)));
        assert_eq!(code(&["gpu:3"]), format!("{:?}", ExitCode::from(2)));
        assert_eq!(
            code(&["list", "opencl"]),
            format!("{:?}", ExitCode::from(2))
        );
    }

    #[test]
    fn text_names_owner_cause_fix_and_check() {
        let a = &kb::lookup("cublas:3").unwrap()[0];
        let t = render(a);
        assert!(
            t.starts_with("CUBLAS_STATUS_ALLOC_FAILED [cublas 3]"),
            "{t}"
        );
        for field in ["owner:", "cause:", "fix:", "check:"] {
            assert!(t.contains(field), "{t}");
        }
        let x = render(&kb::lookup("79").unwrap()[0]);
        assert!(x.contains("withdraws the GPU"), "{x}");
    }
}
