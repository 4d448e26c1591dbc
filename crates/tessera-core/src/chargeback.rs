//! Chargeback: GPU time per namespace, model and mode, and what it costs.
//!
//! A [`Meter`] integrates a piecewise-constant signal: the caller observes the
//! allocations in force at a time (`now_ms`, passed in: the core has no clock),
//! and the meter charges the *previous* observation for the interval since.
//! The scheduler observes its mirror every few seconds; the simulator observes
//! at every event, so its integral is exact. Totals are kept as integers
//! (milli-GPU × milliseconds) so that splitting an interval across buckets
//! never loses or invents time.
//!
//! GPU time is kept in buckets of `bucket_ms` for a bounded number of buckets,
//! so a time range can be charged later; ranges are rounded to whole buckets.
//! Each bucket also keeps, per model, the allocated and the healthy capacity
//! integrals, so a [`DynamicPrice`] can be applied afterwards: pricing is a
//! pure function of what was measured, chosen when the bill is made.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// How a pod holds a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The whole GPU, nobody else.
    Whole,
    /// Part of a GPU's compute and memory, beside other tenants.
    Share,
    /// A MIG instance (counted as its share of the GPU's compute slices).
    Mig,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Whole => "whole",
            Mode::Share => "share",
            Mode::Mig => "mig",
        }
    }

    /// The mode of one GPU grant.
    pub fn of_grant(cores_milli: u32, mig: bool) -> Mode {
        if mig {
            Mode::Mig
        } else if cores_milli >= 1000 {
            Mode::Whole
        } else {
            Mode::Share
        }
    }
}

/// Who is charged and for what kind of GPU time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Account {
    pub namespace: String,
    /// Catalog name of the GPU model.
    pub model: String,
    pub mode: Mode,
    /// The `GpuQueue` the pod counts against (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub queue: String,
}

/// The allocations in force at one instant, summed per account, plus the
/// healthy GPU capacity per model (the denominator of utilisation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// Allocated compute per account, milli-GPU.
    pub milli: BTreeMap<Account, u64>,
    /// Healthy GPUs per model × 1000, milli-GPU.
    pub capacity_milli: BTreeMap<String, u64>,
}

impl Holding {
    /// Adds `milli` of compute to `account`.
    pub fn add(&mut self, account: Account, milli: u64) {
        *self.milli.entry(account).or_default() += milli;
    }
}

/// Per model: allocated and capacity integrals, milli-GPU × ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelLoad {
    pub allocated_milli_ms: u64,
    pub capacity_milli_ms: u64,
}

impl ModelLoad {
    /// Mean utilisation over the bucket, 0..=1 (0 without capacity).
    pub fn utilisation(&self) -> f64 {
        if self.capacity_milli_ms == 0 {
            0.0
        } else {
            (self.allocated_milli_ms as f64 / self.capacity_milli_ms as f64).min(1.0)
        }
    }
}

/// GPU time charged within `[start_ms, start_ms + bucket_ms)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub start_ms: u64,
    /// milli-GPU × ms per account.
    pub usage: BTreeMap<Account, u64>,
    pub models: BTreeMap<String, ModelLoad>,
}

/// Integrates holdings over time (see the module docs).
#[derive(Debug, Clone)]
pub struct Meter {
    bucket_ms: u64,
    retention: usize,
    last: Option<(u64, Holding)>,
    buckets: VecDeque<Bucket>,
    /// Since the meter started, milli-GPU × ms per account (never dropped).
    totals: BTreeMap<Account, u64>,
}

impl Meter {
    /// A meter keeping `retention` buckets of `bucket_ms` (both at least 1).
    pub fn new(bucket_ms: u64, retention: usize) -> Meter {
        Meter {
            bucket_ms: bucket_ms.max(1),
            retention: retention.max(1),
            last: None,
            buckets: VecDeque::new(),
            totals: BTreeMap::new(),
        }
    }

    pub fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// Charges the previous holding for `[previous, now_ms)` and makes
    /// `holding` the one in force from `now_ms`. Returns what was charged, per
    /// account, in milli-GPU × ms (for counters). A time before the previous
    /// observation (a clock stepped back) charges nothing and restarts there.
    pub fn observe(&mut self, now_ms: u64, holding: Holding) -> BTreeMap<Account, u64> {
        let mut charged = BTreeMap::new();
        if let Some((from, prev)) = self.last.take()
            && now_ms > from
        {
            let mut t = from;
            while t < now_ms {
                let start = t - t % self.bucket_ms;
                let end = (start + self.bucket_ms).min(now_ms);
                let dt = end - t;
                let bucket = self.bucket_at(start);
                for (acct, &m) in &prev.milli {
                    if m == 0 {
                        continue;
                    }
                    *bucket.usage.entry(acct.clone()).or_default() += m * dt;
                    *charged.entry(acct.clone()).or_default() += m * dt;
                }
                let mut allocated: BTreeMap<&str, u64> = BTreeMap::new();
                for (acct, &m) in &prev.milli {
                    *allocated.entry(acct.model.as_str()).or_default() += m;
                }
                for (model, &cap) in &prev.capacity_milli {
                    let load = bucket.models.entry(model.clone()).or_default();
                    load.capacity_milli_ms += cap * dt;
                    load.allocated_milli_ms +=
                        allocated.get(model.as_str()).copied().unwrap_or(0) * dt;
                }
                t = end;
            }
            for (acct, m) in &charged {
                *self.totals.entry(acct.clone()).or_default() += m;
            }
        }
        self.last = Some((now_ms, holding));
        charged
    }

    fn bucket_at(&mut self, start_ms: u64) -> &mut Bucket {
        if self.buckets.back().is_none_or(|b| b.start_ms < start_ms) {
            self.buckets.push_back(Bucket {
                start_ms,
                ..Bucket::default()
            });
            while self.buckets.len() > self.retention {
                self.buckets.pop_front();
            }
        }
        // Observations move forward, so the bucket is the last one.
        let last = self.buckets.len() - 1;
        &mut self.buckets[last]
    }

    /// The holding in force and since when.
    pub fn last(&self) -> Option<(u64, &Holding)> {
        self.last.as_ref().map(|(t, h)| (*t, h))
    }

    /// GPU time since the meter started, milli-GPU × ms per account.
    pub fn totals(&self) -> &BTreeMap<Account, u64> {
        &self.totals
    }

    /// The buckets starting within `[from_ms, to_ms)` that are still kept.
    pub fn buckets(&self, from_ms: u64, to_ms: u64) -> impl Iterator<Item = &Bucket> {
        self.buckets
            .iter()
            .filter(move |b| b.start_ms >= from_ms && b.start_ms < to_ms)
    }

    /// Start of the oldest bucket kept (charges before it are only in the totals).
    pub fn kept_from_ms(&self) -> Option<u64> {
        self.buckets.front().map(|b| b.start_ms)
    }
}

/// List prices per GPU-hour, by model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceTable {
    /// What prices are in (`USD`, `EUR`, `GPU-hour`…), for display.
    #[serde(default = "default_currency")]
    pub currency: String,
    /// Price of one GPU-hour per model catalog name.
    #[serde(default)]
    pub per_gpu_hour: BTreeMap<String, f64>,
    /// Price of a GPU-hour of a model not in the table.
    #[serde(default = "one")]
    pub default_per_gpu_hour: f64,
    /// The price rises with the model's utilisation when set.
    #[serde(default)]
    pub dynamic: Option<DynamicPrice>,
}

fn default_currency() -> String {
    "GPU-hour".into()
}
fn one() -> f64 {
    1.0
}

impl Default for PriceTable {
    /// Every model at 1 per GPU-hour: bills in GPU-hours.
    fn default() -> Self {
        PriceTable {
            currency: default_currency(),
            per_gpu_hour: BTreeMap::new(),
            default_per_gpu_hour: 1.0,
            dynamic: None,
        }
    }
}

/// Why a price table is not usable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PriceError {
    #[error("{field}: {value} must be a finite number ≥ 0")]
    Negative { field: String, value: f64 },
    #[error("dynamic.targetUtilisation: {0} must be strictly between 0 and 1")]
    Target(f64),
}

impl PriceTable {
    /// Checks every number, naming the field that is wrong.
    pub fn validate(&self) -> Result<(), PriceError> {
        let check = |field: String, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Ok(())
            } else {
                Err(PriceError::Negative { field, value })
            }
        };
        check("defaultPerGpuHour".into(), self.default_per_gpu_hour)?;
        for (m, &p) in &self.per_gpu_hour {
            check(format!("perGpuHour.{m}"), p)?;
        }
        if let Some(d) = &self.dynamic {
            check("dynamic.idleFactor".into(), d.idle_factor)?;
            check("dynamic.peakFactor".into(), d.peak_factor)?;
            if !(d.target_utilisation > 0.0 && d.target_utilisation < 1.0) {
                return Err(PriceError::Target(d.target_utilisation));
            }
        }
        Ok(())
    }

    pub fn per_gpu_hour(&self, model: &str) -> f64 {
        self.per_gpu_hour
            .get(model)
            .copied()
            .unwrap_or(self.default_per_gpu_hour)
    }

    /// The price factor at `utilisation` (1 without dynamic pricing).
    pub fn factor(&self, utilisation: f64) -> f64 {
        self.dynamic.as_ref().map_or(1.0, |d| d.factor(utilisation))
    }
}

/// A price that follows demand: `idleFactor` × list price on an idle model,
/// the list price at `targetUtilisation`, `peakFactor` × list price when every
/// GPU of the model is taken; linear in between. Applied per bucket to the
/// model's mean utilisation in that bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DynamicPrice {
    pub idle_factor: f64,
    pub target_utilisation: f64,
    pub peak_factor: f64,
}

impl Default for DynamicPrice {
    fn default() -> Self {
        DynamicPrice {
            idle_factor: 0.5,
            target_utilisation: 0.6,
            peak_factor: 2.0,
        }
    }
}

impl DynamicPrice {
    pub fn factor(&self, utilisation: f64) -> f64 {
        let u = utilisation.clamp(0.0, 1.0);
        let t = self.target_utilisation;
        if u <= t {
            self.idle_factor + (1.0 - self.idle_factor) * u / t
        } else {
            1.0 + (self.peak_factor - 1.0) * (u - t) / (1.0 - t)
        }
    }
}

/// One line of a bill.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Charge {
    /// Empty in a bill [`by_queue`].
    pub namespace: String,
    /// The `GpuQueue` (empty: none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub queue: String,
    pub model: String,
    pub mode: Mode,
    pub gpu_seconds: f64,
    /// At list price.
    pub list_cost: f64,
    /// With the dynamic factor of each bucket (equal to `list_cost` without one).
    pub cost: f64,
}

/// milli-GPU × ms in one GPU-second.
pub const MILLI_MS_PER_GPU_SECOND: f64 = 1_000.0 * 1_000.0;

/// The bill for `buckets`, one line per account, in account order.
pub fn bill<'a>(buckets: impl IntoIterator<Item = &'a Bucket>, prices: &PriceTable) -> Vec<Charge> {
    let mut lines: BTreeMap<Account, Charge> = BTreeMap::new();
    for b in buckets {
        for (acct, &milli_ms) in &b.usage {
            let gpu_s = milli_ms as f64 / MILLI_MS_PER_GPU_SECOND;
            let list = gpu_s / 3600.0 * prices.per_gpu_hour(&acct.model);
            let util = b
                .models
                .get(&acct.model)
                .map_or(0.0, ModelLoad::utilisation);
            let line = lines.entry(acct.clone()).or_insert_with(|| Charge {
                namespace: acct.namespace.clone(),
                queue: acct.queue.clone(),
                model: acct.model.clone(),
                mode: acct.mode,
                gpu_seconds: 0.0,
                list_cost: 0.0,
                cost: 0.0,
            });
            line.gpu_seconds += gpu_s;
            line.list_cost += list;
            line.cost += list * prices.factor(util);
        }
    }
    lines.into_values().collect()
}

/// A bill's lines summed per queue, model and mode instead of per namespace (the
/// namespace left empty): what each team's queue cost, whichever namespaces ran it.
pub fn by_queue(lines: Vec<Charge>) -> Vec<Charge> {
    let mut out: BTreeMap<(String, String, Mode), Charge> = BTreeMap::new();
    for l in lines {
        let line = out
            .entry((l.queue.clone(), l.model.clone(), l.mode))
            .or_insert_with(|| Charge {
                namespace: String::new(),
                queue: l.queue.clone(),
                model: l.model.clone(),
                mode: l.mode,
                gpu_seconds: 0.0,
                list_cost: 0.0,
                cost: 0.0,
            });
        line.gpu_seconds += l.gpu_seconds;
        line.list_cost += l.list_cost;
        line.cost += l.cost;
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn acct(ns: &str, model: &str, mode: Mode) -> Account {
        Account {
            queue: String::new(),
            namespace: ns.into(),
            model: model.into(),
            mode,
        }
    }

    fn holding(lines: &[(&str, Mode, u64)], cap: u64) -> Holding {
        let mut h = Holding::default();
        for &(ns, mode, m) in lines {
            h.add(acct(ns, "A100", mode), m);
        }
        h.capacity_milli.insert("A100".into(), cap);
        h
    }

    #[test]
    fn intervals_split_across_buckets_keep_every_millisecond() {
        let mut m = Meter::new(1_000, 10);
        m.observe(500, holding(&[("ml", Mode::Whole, 2000)], 4000));
        // 2 GPUs from 500 ms to 2,500 ms: 500 ms in bucket 0, 1,000 in bucket 1, 500 in bucket 2.
        m.observe(2_500, Holding::default());
        let per_bucket: Vec<u64> = m
            .buckets(0, u64::MAX)
            .map(|b| b.usage.values().sum())
            .collect();
        assert_eq!(per_bucket, vec![2000 * 500, 2000 * 1000, 2000 * 500]);
        assert_eq!(
            m.totals()[&acct("ml", "A100", Mode::Whole)],
            2000 * 2000,
            "4 GPU-seconds"
        );
    }

    #[test]
    fn dynamic_price_is_list_price_at_target_and_bounded_by_factors() {
        let d = DynamicPrice::default();
        assert!((d.factor(0.0) - 0.5).abs() < 1e-12);
        assert!((d.factor(0.6) - 1.0).abs() < 1e-12);
        assert!((d.factor(1.0) - 2.0).abs() < 1e-12);
        // Half-way between target and full: 1 + (2 - 1) × 0.2 / 0.4 = 1.5.
        assert!((d.factor(0.8) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn a_busy_bucket_costs_more_than_an_idle_one_with_dynamic_prices() {
        let mut m = Meter::new(3_600_000, 10);
        // Hour 0: 1 of 4 GPUs (25 %); hour 1: 4 of 4 (100 %), the team holding 1 of them.
        m.observe(0, holding(&[("ml", Mode::Whole, 1000)], 4000));
        m.observe(
            3_600_000,
            holding(
                &[("ml", Mode::Whole, 1000), ("cv", Mode::Whole, 3000)],
                4000,
            ),
        );
        m.observe(7_200_000, Holding::default());
        let prices = PriceTable {
            per_gpu_hour: [("A100".to_string(), 2.0)].into(),
            dynamic: Some(DynamicPrice::default()),
            ..PriceTable::default()
        };
        let b: Vec<&Bucket> = m.buckets(0, u64::MAX).collect();
        let hour0 = bill(b[..1].iter().copied(), &prices);
        let hour1 = bill(b[1..].iter().copied(), &prices);
        let ml = |c: &[Charge]| c.iter().find(|c| c.namespace == "ml").unwrap().clone();
        // Both hours: 1 GPU-hour at 2.0 list. Factor at 25 %: 0.5 + 0.5 × 0.25 / 0.6 = 0.7083;
        // at 100 %: 2.0.
        assert!((ml(&hour0).list_cost - 2.0).abs() < 1e-9);
        assert!((ml(&hour0).cost - 2.0 * (0.5 + 0.5 * 0.25 / 0.6)).abs() < 1e-9);
        assert!((ml(&hour1).cost - 4.0).abs() < 1e-9);
    }

    #[test]
    fn price_table_errors_name_the_field() {
        let mut p = PriceTable::default();
        p.per_gpu_hour.insert("H100".into(), -1.0);
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "perGpuHour.H100: -1 must be a finite number ≥ 0"
        );
        let p = PriceTable {
            dynamic: Some(DynamicPrice {
                target_utilisation: 1.0,
                ..DynamicPrice::default()
            }),
            ..PriceTable::default()
        };
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("targetUtilisation")
        );
    }

    #[test]
    fn a_clock_stepping_back_charges_nothing() {
        let mut m = Meter::new(1_000, 10);
        m.observe(5_000, holding(&[("ml", Mode::Share, 300)], 1000));
        assert!(
            m.observe(4_000, holding(&[("ml", Mode::Share, 300)], 1000))
                .is_empty()
        );
        m.observe(5_000, Holding::default());
        // Only [4,000, 5,000): 300 × 1,000.
        assert_eq!(m.totals().values().sum::<u64>(), 300_000);
    }

    fn mode() -> impl Strategy<Value = Mode> {
        prop_oneof![Just(Mode::Whole), Just(Mode::Share), Just(Mode::Mig)]
    }

    proptest! {
        /// The bill's GPU-seconds are the integral of the allocations over time:
        /// Σ allocation × time it was in force, per account, however the
        /// observations fall across buckets.
        #[test]
        fn chargeback_totals_equal_the_integral_of_allocations(
            steps in prop::collection::vec(
                (1u64..20_000, prop::collection::vec((0usize..3, mode(), 0u64..8_000), 0..6)),
                1..40,
            ),
            bucket_ms in 1u64..10_000,
        ) {
            let namespaces = ["ml", "cv", "nlp"];
            let mut m = Meter::new(bucket_ms, usize::MAX);
            let mut expected: BTreeMap<Account, u64> = BTreeMap::new();
            let mut t = 1_000u64;
            for (dt, lines) in &steps {
                let mut h = Holding::default();
                for &(ns, mode, milli) in lines {
                    h.add(acct(namespaces[ns], "L4", mode), milli);
                }
                m.observe(t, h.clone());
                for (a, milli) in &h.milli {
                    if *milli > 0 {
                        *expected.entry(a.clone()).or_default() += milli * dt;
                    }
                }
                t += dt;
            }
            m.observe(t, Holding::default());
            prop_assert_eq!(m.totals(), &expected);
            let billed = bill(m.buckets(0, u64::MAX), &PriceTable::default());
            for c in &billed {
                let a = acct(&c.namespace, &c.model, c.mode);
                let want = expected[&a] as f64 / MILLI_MS_PER_GPU_SECOND;
                prop_assert!((c.gpu_seconds - want).abs() <= 1e-9 * want.max(1.0));
                // Default prices: 1 per GPU-hour, so cost is GPU-hours.
                prop_assert!((c.cost - want / 3600.0).abs() <= 1e-9 * want.max(1.0));
            }
            prop_assert_eq!(billed.len(), expected.len());
        }
    }
}
