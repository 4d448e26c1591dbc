//! The crash-and-restart loop of the randomized safety tests
//! (`crash_restart.rs`: grants; `dra_crash_restart.rs`: DRA claims).
//!
//! One seeded run: a scheduler [`Process`] is started whose session dies
//! before or after its k-th write (k drawn from `1..=span`, each kind half the
//! time), half the processes also having one write committed but answered
//! `504 Timeout` (and, where the plan says so, every process one write refused
//! with a `500` that did not commit, which the client cannot tell from one
//! that did); each time it dies a new one starts with fresh process state,
//! at most `max_crashes` times, and the last one runs until the test says the
//! run is done, or nothing moved for `quiet`. The faults are drawn from the
//! run's RNG in a fixed order, so a seed replays the same plan (the timing of
//! the writes, and so which write is the k-th, is not deterministic).
//!
//! What the stored objects must show afterwards is each test's audit
//! ([`super::check`], [`super::dra_check`]); [`over_seeds`] runs the seeds and
//! [`fail_on`] names every seed that broke a rule.

use std::future::Future;
use std::ops::Range;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::Rng;
use rand::rngs::SmallRng;
use tessera_k8s::run::Config;

use super::process::Process;
use super::{ApiServer, Fault};

/// A knob from the environment; its default when unset or unreadable.
pub fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The double's latency from the knob `name` (`lo-hi` in milliseconds,
/// fractions allowed), `default` when unset.
pub fn latency(name: &str, default: &str) -> (Duration, Duration) {
    let spec = std::env::var(name).unwrap_or_else(|_| default.into());
    let (lo, hi) = spec.split_once('-').unwrap_or((&spec, &spec));
    let ms =
        |s: &str| Duration::from_micros((s.trim().parse::<f64>().unwrap_or(0.0) * 1000.0) as u64);
    (ms(lo), ms(hi))
}

/// How a run's processes are faulted.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Crashes per run at most; the process after the last one runs to the end.
    pub max_crashes: usize,
    /// A crash (and the 504) comes at a write drawn from `1..=span`.
    pub span: u64,
    /// A run whose progress has not changed for this long has stalled.
    pub quiet: Duration,
    /// Every process also gets one write answered `500` without committing it.
    pub uncommitted: bool,
}

/// What the test sees each time the loop looks (every 10 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// Grows as the run gets on (pods bound, say); unchanged for
    /// [`Plan::quiet`] is a stall.
    pub progress: u64,
    /// The run has reached its goal.
    pub done: bool,
}

/// How a run's processes ended.
#[derive(Debug, Default)]
pub struct Restarts {
    /// Per crash: the write it came at, its kind, and the progress then.
    pub crashes: Vec<(u64, Fault, u64)>,
    /// Nothing moved for [`Plan::quiet`] before the run was done.
    pub stalled: bool,
    /// `run` ending by itself, which it must not.
    pub exits: Vec<String>,
}

enum Ended {
    Crashed,
    Done,
    Stalled,
    /// `run` returned by itself.
    Exited,
}

async fn wait(process: &Process, quiet: Duration, look: &mut impl FnMut() -> Look) -> Ended {
    let mut last = (None, Instant::now());
    loop {
        if process.session.is_dead() {
            return Ended::Crashed;
        }
        let now = look();
        if now.done {
            return Ended::Done;
        }
        if last.0 != Some(now.progress) {
            last = (Some(now.progress), Instant::now());
        } else if process.exited() {
            // The session may have died (an injected crash) after the check
            // above; the thread then ends by itself a moment later.
            if process.session.is_dead() {
                return Ended::Crashed;
            }
            return Ended::Exited;
        } else if last.1.elapsed() > quiet {
            return Ended::Stalled;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs scheduler processes with `config` against `server`, faulted as
/// `plan` and `rng` say, restarting each that dies, until `look` says done or
/// the run stalls. `started` sees each process once it runs (the extender
/// test points its kube-scheduler stand-in at it).
pub async fn restarts(
    server: &ApiServer,
    config: &Config,
    rng: &mut SmallRng,
    plan: &Plan,
    mut started: impl FnMut(&Process),
    mut look: impl FnMut() -> Look,
) -> Restarts {
    let mut out = Restarts::default();
    let mut retries = 0;
    loop {
        let crash = (out.crashes.len() < plan.max_crashes).then(|| {
            let kind = if rng.random_bool(0.5) {
                Fault::CrashBefore
            } else {
                Fault::CrashAfter
            };
            (rng.random_range(1..=plan.span), kind)
        });
        // Half the processes also see one write committed but answered 504.
        let mut faults: Vec<(u64, Fault)> = crash.into_iter().collect();
        if rng.random_bool(0.5) {
            faults.push((rng.random_range(1..=plan.span), Fault::FailAfter));
        }
        if plan.uncommitted {
            faults.push((rng.random_range(1..=plan.span), Fault::Fail));
        }
        let process = Process::start(server, config.clone(), &faults);
        started(&process);
        let ended = wait(&process, plan.quiet, &mut look).await;
        let exit = process.kill();
        match ended {
            Ended::Exited => match exit {
                // Another program took the port first: start again elsewhere.
                Err(e) if e.starts_with("binding") && retries < 5 => retries += 1,
                other => {
                    out.exits.push(format!("run returned by itself: {other:?}"));
                    return out;
                }
            },
            Ended::Crashed => {
                let (k, kind) = crash.unwrap_or((0, Fault::CrashAfter));
                out.crashes.push((k, kind, look().progress));
            }
            Ended::Done => return out,
            Ended::Stalled => {
                out.stalled = true;
                return out;
            }
        }
    }
}

/// Runs `run` for each seed of `seeds`, `jobs` at once; `each` takes every
/// outcome as it comes (to print it) and returns its seed and broken rules.
/// Returns the seeds that broke any, with what they broke.
pub async fn over_seeds<R, Fut>(
    seeds: Range<u64>,
    jobs: usize,
    run: impl FnMut(u64) -> Fut,
    mut each: impl FnMut(R) -> (u64, Vec<String>),
) -> Vec<(u64, Vec<String>)>
where
    Fut: Future<Output = R>,
{
    let mut failures = Vec::new();
    let mut done = futures::stream::iter(seeds)
        .map(run)
        .buffer_unordered(jobs.max(1));
    while let Some(outcome) = done.next().await {
        let (seed, problems) = each(outcome);
        if !problems.is_empty() {
            failures.push((seed, problems));
        }
    }
    failures
}

/// Panics naming every failed seed (five of its problems each) and how to
/// rerun one (`rerun`, e.g. `TESSERA_CRASH_SEED=<seed> TESSERA_CRASH_RUNS=1`).
pub fn fail_on(what: &str, runs: u64, failures: &[(u64, Vec<String>)], rerun: &str) {
    if failures.is_empty() {
        return;
    }
    let report: Vec<String> = failures
        .iter()
        .map(|(seed, p)| {
            let shown: Vec<&String> = p.iter().take(5).collect();
            format!("seed {seed} ({} problems): {shown:#?}", p.len())
        })
        .collect();
    panic!(
        "{} of {runs} {what} runs broke an invariant (rerun one with {rerun}):\n{}",
        failures.len(),
        report.join("\n")
    );
}
