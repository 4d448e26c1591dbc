//! `tessera chargeback`: the bill for a time range, per namespace, GPU model
//! and mode, as CSV or JSON.
//!
//! GPU time comes from the scheduler's accounting (`GET /chargeback` on its
//! ops port, see `tessera_k8s::accounting`; reach it with `kubectl
//! port-forward`) or from a file saved from it. Prices come from a table per
//! model (`--prices`, YAML or JSON; without one every model costs 1 per
//! GPU-hour, so the bill is in GPU-hours); `--dynamic` prices each 5-minute
//! bucket by the model's utilisation in it, so teams see what their demand
//! costs at peak.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;
use tessera_core::chargeback::{Charge, DynamicPrice, PriceTable, bill, by_queue};
use tessera_k8s::accounting::Usage;

use super::bad_input;

#[derive(Debug, clap::Args)]
pub struct ChargebackArgs {
    /// The scheduler's ops address (`http://127.0.0.1:9090` after `kubectl
    /// port-forward`); its `/chargeback` is read.
    #[arg(long, default_value = "http://127.0.0.1:9090", conflicts_with = "file")]
    pub url: String,
    /// Read a saved `/chargeback` answer instead of asking the scheduler.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Start of the range: RFC 3339 (`2025-06-01T00:00:00Z`) or unix seconds.
    #[arg(long, conflicts_with = "since")]
    pub from: Option<String>,
    /// End of the range (exclusive): RFC 3339 or unix seconds. Default: now.
    #[arg(long)]
    pub to: Option<String>,
    /// The range is the last DURATION (`24h`, `90m`, `7d`).
    #[arg(long)]
    pub since: Option<String>,
    /// Price table per model (YAML or JSON): `currency`, `perGpuHour: {MODEL: price}`,
    /// `defaultPerGpuHour`, optional `dynamic: {idleFactor, targetUtilisation, peakFactor}`.
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// Price by utilisation (the table's `dynamic`, or 0.5× idle, 1× at 60 %, 2× full).
    #[arg(long)]
    pub dynamic: bool,
    /// csv or json.
    #[arg(short = 'o', long, default_value = "csv")]
    pub output: String,
    /// One line per namespace (with its GpuQueue), or per queue (its namespaces summed).
    #[arg(long, default_value = "namespace", value_parser = ["namespace", "queue"])]
    pub by: String,
}

/// The JSON form of a bill.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Bill {
    /// Unix seconds.
    from: u64,
    to: u64,
    currency: String,
    dynamic: Option<DynamicPrice>,
    bucket_seconds: u64,
    lines: Vec<Charge>,
    total_gpu_seconds: f64,
    total_cost: f64,
}

pub fn run(args: ChargebackArgs) -> anyhow::Result<ExitCode> {
    if !matches!(args.output.as_str(), "csv" | "json") {
        return bad_input(format!("--output {:?}: must be csv or json", args.output));
    }
    let now = jiff::Timestamp::now().as_second().max(0) as u64;
    let to = match args.to.as_deref().map(parse_time).transpose() {
        Ok(t) => t.unwrap_or(now),
        Err(e) => return bad_input(format!("--to: {e}")),
    };
    let from = match (&args.from, &args.since) {
        (Some(f), _) => match parse_time(f) {
            Ok(t) => t,
            Err(e) => return bad_input(format!("--from: {e}")),
        },
        (None, Some(s)) => match parse_duration(s) {
            Ok(d) => to.saturating_sub(d),
            Err(e) => return bad_input(format!("--since: {e}")),
        },
        (None, None) => 0,
    };
    if from >= to {
        return bad_input(format!(
            "the range is empty: from {from} is not before to {to}"
        ));
    }
    let mut prices = match &args.prices {
        None => PriceTable::default(),
        Some(p) => match read_prices(p) {
            Ok(t) => t,
            Err(e) => return bad_input(e),
        },
    };
    if args.dynamic && prices.dynamic.is_none() {
        prices.dynamic = Some(DynamicPrice::default());
    }
    if !args.dynamic {
        prices.dynamic = None;
    }
    if let Err(e) = prices.validate() {
        return bad_input(format!("price table: {e}"));
    }
    let usage = match &args.file {
        Some(f) => std::fs::read(f)
            .map_err(|e| format!("{}: {e}", f.display()))
            .and_then(|b| {
                serde_json::from_slice::<Usage>(&b).map_err(|e| format!("{}: {e}", f.display()))
            }),
        None => fetch_usage(&args.url, from, to),
    };
    let usage = match usage {
        Ok(u) => u,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    if let Some(kept) = usage.kept_from
        && from < kept
        && args.from.is_some()
    {
        eprintln!(
            "note: the scheduler keeps buckets from {kept} (unix s) only; earlier GPU time is in Prometheus (tessera_gpu_seconds_total)"
        );
    }
    let buckets = usage.to_buckets();
    let mut lines = bill(
        buckets
            .iter()
            .filter(|b| b.start_ms >= from * 1000 && b.start_ms < to * 1000),
        &prices,
    );
    if args.by == "queue" {
        lines = by_queue(lines);
    }
    let out = render(
        &Bill {
            from,
            to,
            currency: prices.currency.clone(),
            dynamic: prices.dynamic,
            bucket_seconds: usage.bucket_seconds,
            total_gpu_seconds: lines.iter().map(|l| l.gpu_seconds).sum(),
            total_cost: lines.iter().map(|l| l.cost).sum(),
            lines,
        },
        &args.output,
    );
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

fn render(bill: &Bill, output: &str) -> String {
    if output == "json" {
        return serde_json::to_string_pretty(bill).unwrap_or_default() + "\n";
    }
    let mut s =
        String::from("namespace,queue,model,mode,gpu_seconds,gpu_hours,list_cost,cost,currency\n");
    for l in &bill.lines {
        s.push_str(&format!(
            "{},{},{},{},{:.3},{:.6},{:.6},{:.6},{}\n",
            csv_field(&l.namespace),
            csv_field(&l.queue),
            csv_field(&l.model),
            l.mode.name(),
            l.gpu_seconds,
            l.gpu_seconds / 3600.0,
            l.list_cost,
            l.cost,
            csv_field(&bill.currency)
        ));
    }
    s
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Unix seconds from RFC 3339 or a whole number.
fn parse_time(s: &str) -> Result<u64, String> {
    if let Ok(n) = s.parse::<u64>() {
        return Ok(n);
    }
    s.parse::<jiff::Timestamp>()
        .map(|t| t.as_second().max(0) as u64)
        .map_err(|e| format!("{s:?} is neither RFC 3339 nor unix seconds: {e}"))
}

/// Seconds in `24h`, `90m`, `7d`, `1h30m`.
fn parse_duration(s: &str) -> Result<u64, String> {
    let span: jiff::Span = s
        .parse()
        .map_err(|e| format!("{s:?} is not a duration like 24h or 7d: {e}"))?;
    let secs = span
        .total((
            jiff::Unit::Second,
            jiff::SpanRelativeTo::days_are_24_hours(),
        ))
        .map_err(|e| format!("{s:?}: {e}"))?;
    if secs <= 0.0 {
        return Err(format!("{s:?} must be positive"));
    }
    Ok(secs as u64)
}

fn read_prices(path: &std::path::Path) -> Result<PriceTable, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_saphyr::from_str::<PriceTable>(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `GET {url}/chargeback?from=&to=` over plain HTTP (the ops port has no TLS).
fn fetch_usage(url: &str, from: u64, to: u64) -> Result<Usage, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--url {url:?}: only http:// is served on the ops port"))?;
    let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let prefix = prefix.trim_end_matches('/');
    let path = if prefix.is_empty() {
        format!("/chargeback?from={from}&to={to}")
    } else {
        format!("/{prefix}/chargeback?from={from}&to={to}")
    };
    let mut s =
        std::net::TcpStream::connect(host).map_err(|e| format!("connecting to {host}: {e}"))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    // One write: a request split over segments can meet a server that answers after the first.
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .map_err(|e| format!("{host}: {e}"))?;
    let mut all = Vec::new();
    s.read_to_end(&mut all)
        .map_err(|e| format!("reading from {host}: {e}"))?;
    let at = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("{host}: not an HTTP answer"))?;
    let head = String::from_utf8_lossy(&all[..at]).to_string();
    let body = &all[at + 4..];
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!(
            "{url}{path}: {status}: {}",
            String::from_utf8_lossy(body).trim()
        ));
    }
    serde_json::from_slice(body).map_err(|e| format!("{url}{path}: not a chargeback answer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_json() -> String {
        // Two 5-minute buckets: ml holds 2 whole A100s in both, cv half an L4 in the second.
        // 2 GPUs × 300 s = 600 GPU-s = 2000 milli × 300,000 ms = 6×10⁸ milli-ms per bucket.
        serde_json::json!({
            "bucketSeconds": 300, "keptFrom": 1000,
            "buckets": [
                {"start": 1200, "usage": [
                    {"namespace": "ml", "model": "A100-80GB", "mode": "whole", "milliMs": 600_000_000u64}],
                 "models": {"A100-80GB": {"allocatedMilliMs": 600_000_000u64, "capacityMilliMs": 1_200_000_000u64}}},
                {"start": 1500, "usage": [
                    {"namespace": "ml", "model": "A100-80GB", "mode": "whole", "milliMs": 600_000_000u64},
                    {"namespace": "cv", "queue": "vision", "model": "L4", "mode": "share", "milliMs": 150_000_000u64}],
                 "models": {"A100-80GB": {"allocatedMilliMs": 600_000_000u64, "capacityMilliMs": 600_000_000u64}}}
            ]
        })
        .to_string()
    }

    fn bill_for(from: u64, to: u64, prices: &PriceTable) -> Vec<Charge> {
        let usage: Usage = serde_json::from_str(&usage_json()).unwrap();
        let buckets = usage.to_buckets();
        bill(
            buckets
                .iter()
                .filter(|b| b.start_ms >= from * 1000 && b.start_ms < to * 1000),
            prices,
        )
    }

    #[test]
    fn csv_lines_per_account_with_list_prices() {
        let prices: PriceTable =
            serde_saphyr::from_str("currency: USD\nperGpuHour:\n  A100-80GB: 3.6\n").unwrap();
        let lines = bill_for(0, 2000, &prices);
        let out = render(
            &Bill {
                from: 0,
                to: 2000,
                currency: prices.currency.clone(),
                dynamic: None,
                bucket_seconds: 300,
                total_gpu_seconds: 0.0,
                total_cost: 0.0,
                lines,
            },
            "csv",
        );
        // ml: 1200 GPU-s = 1/3 GPU-hour × 3.6 = 1.2; cv: 0.5 × 300 = 150 GPU-s at the default 1/h.
        assert_eq!(
            out,
            "namespace,queue,model,mode,gpu_seconds,gpu_hours,list_cost,cost,currency\n\
             cv,vision,L4,share,150.000,0.041667,0.041667,0.041667,USD\n\
             ml,,A100-80GB,whole,1200.000,0.333333,1.200000,1.200000,USD\n"
        );
    }

    /// `--by queue`: namespaces of one queue summed, one line per queue, model and mode.
    #[test]
    fn lines_by_queue_sum_their_namespaces() {
        let usage: Usage = serde_json::from_value(serde_json::json!({
            "bucketSeconds": 300, "keptFrom": null,
            "buckets": [{"start": 0, "usage": [
                {"namespace": "a", "queue": "team", "model": "L4", "mode": "whole", "milliMs": 1_000_000_000u64},
                {"namespace": "b", "queue": "team", "model": "L4", "mode": "whole", "milliMs": 500_000_000u64},
                {"namespace": "c", "model": "L4", "mode": "whole", "milliMs": 250_000_000u64}],
             "models": {}}]
        }))
        .unwrap();
        let lines = by_queue(bill(&usage.to_buckets(), &PriceTable::default()));
        // team: (10⁹ + 5×10⁸) milli-ms = 1500 GPU-s; c has no queue: 250 GPU-s.
        let got: Vec<(&str, &str, f64)> = lines
            .iter()
            .map(|l| (l.queue.as_str(), l.namespace.as_str(), l.gpu_seconds))
            .collect();
        assert_eq!(got, [("", "", 250.0), ("team", "", 1500.0)]);
    }

    #[test]
    fn ranges_take_whole_buckets_and_dynamic_prices_follow_utilisation() {
        let prices = PriceTable {
            dynamic: Some(DynamicPrice::default()),
            ..PriceTable::default()
        };
        // Only the first bucket (1200): A100s at 50 % → factor 0.5 + 0.5 × 0.5 / 0.6.
        let first = bill_for(1200, 1500, &prices);
        assert_eq!(first.len(), 1);
        let hours = 600.0 / 3600.0;
        assert!((first[0].cost - hours * (0.5 + 0.5 * 0.5 / 0.6)).abs() < 1e-12);
        // The second bucket is full (factor 2).
        let second = bill_for(1500, 1800, &prices);
        let ml = second.iter().find(|c| c.namespace == "ml").unwrap();
        assert!((ml.cost - hours * 2.0).abs() < 1e-12);
    }

    /// One HTTP answer from a loopback socket; the request line it got.
    fn answer_once(status: &str, body: String) -> (String, std::thread::JoinHandle<String>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let status = status.to_string();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // The whole request, so that closing the socket does not reset it.
            let mut req = Vec::new();
            let mut buf = [0u8; 256];
            while !req.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            let line = String::from_utf8_lossy(&req)
                .lines()
                .next()
                .unwrap_or("")
                .to_string();
            write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            line
        });
        (url, h)
    }

    #[test]
    fn reads_the_range_from_the_ops_port_and_reports_its_errors() {
        let (url, h) = answer_once("200 OK", usage_json());
        let u = fetch_usage(&url, 1200, 1800).unwrap();
        assert_eq!(
            h.join().unwrap(),
            "GET /chargeback?from=1200&to=1800 HTTP/1.0"
        );
        assert_eq!(u.buckets.len(), 2);
        let (url, h) = answer_once(
            "400 Bad Request",
            "chargeback: from (5) must be before to (1)\n".into(),
        );
        let e = fetch_usage(&format!("{url}/tessera/"), 5, 1).unwrap_err();
        assert_eq!(
            h.join().unwrap(),
            "GET /tessera/chargeback?from=5&to=1 HTTP/1.0"
        );
        assert!(
            e.ends_with("400: chargeback: from (5) must be before to (1)"),
            "{e}"
        );
        assert!(
            fetch_usage("https://x", 0, 1)
                .unwrap_err()
                .contains("only http://")
        );
    }

    #[test]
    fn bad_times_and_price_tables_are_named() {
        assert_eq!(parse_time("1700000000"), Ok(1_700_000_000));
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Ok(1_700_000_000));
        assert!(
            parse_time("yesterday")
                .unwrap_err()
                .contains("\"yesterday\"")
        );
        assert_eq!(parse_duration("7d"), Ok(7 * 86_400));
        assert_eq!(parse_duration("1h30m"), Ok(5_400));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("prices.yaml");
        std::fs::write(&p, "perGpuHour:\n  H100: 2\nsurcharge: 3\n").unwrap();
        let e = read_prices(&p).unwrap_err();
        assert!(e.contains("surcharge"), "{e}");
    }
}
