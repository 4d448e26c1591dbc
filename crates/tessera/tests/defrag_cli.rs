//! `tessera defrag --dry-run` and `tessera simulate --experiment gang|defrag` as a
//! user runs them, on the built-in synthetic workload (no files needed).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tessera");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run tessera");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_dry_run_prints_a_plan_whose_moves_add_up_to_its_gain() {
    let (code, out, err) = run(&["defrag", "--dry-run", "--count", "2"]);
    assert_eq!(code, 0, "{err}");
    // A scattering fill (random, 70 %): neither 8-GPU pod fits before the moves.
    let gain = out
        .lines()
        .find(|l| l.starts_with("expected gain:"))
        .unwrap_or_else(|| panic!("no gain line in\n{out}"));
    assert!(gain.contains("2/2 pending pods fit (before: 0)"), "{gain}");
    let evictions = out
        .lines()
        .filter(|l| l.trim_start().starts_with("evict "))
        .count();
    assert!(evictions > 0, "{out}");
    // "… N node(s) emptied by M move(s)": M is the number of evict lines, and
    // each step's "k move(s)" adds up to it too.
    let moves: usize = gain
        .rsplit("by ")
        .next()
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{gain}"));
    assert_eq!(moves, evictions, "{out}");
    let per_step: usize = out
        .lines()
        .filter(|l| l.starts_with("pending ") && l.contains(" move(s), then "))
        .filter_map(|l| {
            l.split("): ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert_eq!(per_step, moves, "{out}");
    // Every eviction names a pod, its node and a different destination node's GPU.
    for l in out.lines().filter(|l| l.trim_start().starts_with("evict ")) {
        assert!(
            l.contains(" from syn-node-") && l.contains("-> re-created on syn-node-"),
            "{l}"
        );
    }
}

#[test]
fn without_dry_run_it_refuses_with_exit_64_and_bad_requests_exit_2() {
    let (code, _, err) = run(&["defrag"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--dry-run"), "{err}");
    let (code, _, err) = run(&["defrag", "--dry-run", "--pending", "gpu=lots"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["simulate", "--experiment", "gangs"]);
    assert_eq!(code, 64, "{err}");
}

#[test]
fn the_simulate_experiments_print_their_figures() {
    let (code, out, err) = run(&["simulate", "--experiment", "defrag", "--seeds", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("random: N = "), "{out}");
    let (code, out, err) = run(&["simulate", "--experiment", "gang", "--seeds", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("mean gang: jobs completed 300.0 (300.0 by the horizon), deadlocked runs 0/1"),
        "{out}"
    );
    assert!(out.contains("mean non-gang:"), "{out}");
}
