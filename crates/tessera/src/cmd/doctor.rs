//! `tessera doctor`: what an XID means, who caused it, and what to do.
//! The knowledge base is the node agent's health table, so the answer matches
//! what the agent does with the GPU.

use std::process::ExitCode;

use tessera_node::health::{DEFAULT_IGNORED_XIDS, XID_TABLE, XidPolicy, xid_info};

use super::bad_input;

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// XID codes to explain (e.g. `79`, `xid 79` or `XID79`); none lists the table.
    #[arg(value_name = "XID")]
    codes: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_code(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t
        .strip_prefix("XID")
        .or_else(|| t.strip_prefix("xid"))
        .or_else(|| t.strip_prefix("Xid"))
        .unwrap_or(t);
    t.trim_start_matches([' ', '-', '_', ':']).parse().ok()
}

fn explain(code: u64, policy: &XidPolicy) -> serde_json::Value {
    let fails = policy.is_fatal(code);
    match xid_info(code) {
        Some(i) => serde_json::json!({
            "xid": code,
            "name": i.name,
            "cause": i.cause.name(),
            "hardware": i.cause.is_hardware(),
            "failsGpu": fails,
            "action": i.action,
        }),
        None => serde_json::json!({
            "xid": code,
            "name": null,
            "cause": "unknown",
            "hardware": null,
            "failsGpu": fails,
            "action": "Not in Tessera's table. Look it up in NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors). The agent treats every XID outside the application list as fatal.",
        }),
    }
}

fn print_text(v: &serde_json::Value) {
    let code = &v["xid"];
    let name = v["name"].as_str().unwrap_or("(unlisted XID)");
    println!("XID {code}: {name}");
    println!("  cause:  {}", v["cause"].as_str().unwrap_or("unknown"));
    let verdict = if v["failsGpu"].as_bool().unwrap_or(true) {
        "the node agent withdraws the GPU (it comes back after the quiet period or a reset)"
    } else {
        "the GPU stays in service (application error)"
    };
    println!("  effect: {verdict}");
    println!("  do:     {}", v["action"].as_str().unwrap_or(""));
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let policy = XidPolicy::default();
    let mut codes = Vec::new();
    for c in args.codes.iter().filter(|c| !c.eq_ignore_ascii_case("xid")) {
        match parse_code(c) {
            Some(n) => codes.push(n),
            None => {
                return bad_input(format!(
                    "{c:?} is not an XID number (try `tessera doctor 79`)"
                ));
            }
        }
    }
    if codes.is_empty() {
        codes = XID_TABLE.iter().map(|i| i.code).collect();
        if !args.json {
            println!(
                "Known XIDs. Application XIDs {:?} leave the GPU in service; all others withdraw it.\n",
                DEFAULT_IGNORED_XIDS
            );
        }
    }
    let answers: Vec<serde_json::Value> = codes.iter().map(|c| explain(*c, &policy)).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answers)?);
    } else {
        for a in &answers {
            print_text(a);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_verdicts() {
        assert_eq!(parse_code("79"), Some(79));
        assert_eq!(parse_code("XID79"), Some(79));
        assert_eq!(parse_code("xid-13"), Some(13));
        assert_eq!(parse_code("banana"), None);
        let p = XidPolicy::default();
        assert_eq!(explain(13, &p)["failsGpu"], false);
        assert_eq!(explain(13, &p)["hardware"], false);
        assert_eq!(explain(79, &p)["failsGpu"], true);
        assert_eq!(explain(79, &p)["hardware"], true);
        assert_eq!(explain(4242, &p)["cause"], "unknown");
    }
}
