//! The tenants experiment on the built-in synthetic workload (no files needed):
//! four queues 40/30/20/10 %, the 40 % team away for the first 40 % of the
//! window. Under Tessera (fair order, borrowing, reclaim) GPU time follows the
//! entitlements (Jain ≥ 0.95), where FIFO's does not; borrowing keeps
//! utilisation above strict quotas; the returning team gets what it is owed
//! back quickly, where borrowing without reclaim makes it wait; and the run is
//! deterministic.

use tessera_sim::experiment::replay::prepare;
use tessera_sim::experiment::tenants::{Discipline, TenantOptions, TenantResult, run_tenants};
use tessera_sim::workload;

fn run(d: Discipline, opts: &TenantOptions) -> TenantResult {
    let s = workload::generate(42);
    let input = prepare(&s.pods, None).unwrap();
    run_tenants(&s.cluster, &input, d, 42, opts).unwrap()
}

#[test]
fn queues_share_by_entitlement_and_lent_capacity_comes_back() {
    let opts = TenantOptions {
        time_scale: 20_000.0,
        ..TenantOptions::default()
    };
    let fifo = run(Discipline::Fifo, &opts);
    let strict = run(Discipline::Strict, &opts);
    let borrow = run(Discipline::Borrow, &opts);
    let tessera = run(Discipline::Tessera, &opts);
    let shares = |r: &TenantResult| -> Vec<f64> {
        r.queues.iter().map(|q| q.share_of_entitlement).collect()
    };
    assert!(
        tessera.jain >= 0.95,
        "tessera {} {:?}",
        tessera.jain,
        shares(&tessera)
    );
    assert!(
        fifo.jain < tessera.jain - 0.1,
        "fifo {} {:?} vs tessera {}",
        fifo.jain,
        shares(&fifo),
        tessera.jain
    );
    assert!(
        borrow.util_mean_pct > strict.util_mean_pct + 2.0,
        "borrowing {} % vs strict {} %",
        borrow.util_mean_pct,
        strict.util_mean_pct
    );
    assert!(tessera.util_mean_pct > strict.util_mean_pct + 2.0);
    let back = tessera
        .return_delay_s
        .expect("the returning team gets its due");
    let waited = borrow.return_delay_s.unwrap_or(u64::MAX);
    assert!(back <= opts.min_runtime_s, "tessera {back} s");
    assert!(
        waited > 4 * back.max(60),
        "borrow without reclaim {waited} s"
    );
    assert!(tessera.evictions > 0 && borrow.evictions == 0);
    // Same inputs, same result.
    assert_eq!(run(Discipline::Tessera, &opts), tessera);
}

#[test]
fn bad_options_are_refused_by_name() {
    let s = workload::generate(42);
    let input = prepare(&s.pods, None).unwrap();
    let over = TenantOptions {
        queues: vec![("a".into(), 60), ("b".into(), 50)],
        ..TenantOptions::default()
    };
    let e = run_tenants(&s.cluster, &input, Discipline::Tessera, 1, &over).unwrap_err();
    assert!(e.to_string().contains("110"), "{e}");
    let away = TenantOptions {
        away_fraction: 1.5,
        ..TenantOptions::default()
    };
    assert!(run_tenants(&s.cluster, &input, Discipline::Fifo, 1, &away).is_err());
}
