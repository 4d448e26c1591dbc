//! The fuzzing harness and mutators that `tessera-core`'s and `tessera-k8s`'s
//! `fuzz_inputs` tests share (the latter includes this file by path: test
//! targets cannot depend on each other, and a crate for 300 lines of test
//! code would be more than it saves).
//!
//! Seeded and deterministic: `TESSERA_FUZZ_SEED` picks the stream,
//! `TESSERA_FUZZ_CASES` the number of inputs per target (default 20,000, a
//! few seconds in a debug build). A failing case prints its index, the seed
//! and the input, so it can be replayed.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;

pub fn cases() -> u64 {
    std::env::var("TESSERA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

pub fn seed() -> u64 {
    std::env::var("TESSERA_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7e55_e7a9)
}

pub fn rng_for(target: &str) -> SmallRng {
    // Each target its own stream, so adding one does not change the others.
    let salt = target.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    SmallRng::seed_from_u64(seed() ^ salt)
}

/// How often each kind of outcome came up, so a run shows it reached both
/// answers and refusals.
pub type Tally = BTreeMap<&'static str, u64>;

/// Runs `check` on `n` inputs from `generate`; a failure prints the case, the
/// seed and the input before it propagates.
pub fn fuzz<I: std::fmt::Debug>(
    target: &str,
    n: u64,
    mut generate: impl FnMut(&mut SmallRng) -> I,
    mut check: impl FnMut(&I) -> &'static str,
) -> Tally {
    let mut rng = rng_for(target);
    let mut tally = Tally::new();
    let started = Instant::now();
    for case in 0..n {
        let input = generate(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| check(&input))) {
            Ok(outcome) => *tally.entry(outcome).or_default() += 1,
            Err(panic) => {
                eprintln!(
                    "{target}: case {case} of seed {} failed on input:\n{input:?}",
                    seed()
                );
                resume_unwind(panic);
            }
        }
    }
    eprintln!(
        "fuzz {target}: {n} inputs {tally:?}, {:.2?}",
        started.elapsed()
    );
    tally
}

/// With enough inputs, every outcome in `want` must have come up.
pub fn assert_reached(tally: &Tally, n: u64, want: &[&str]) {
    if n >= 1_000 {
        for w in want {
            assert!(tally.contains_key(w), "no input reached {w:?}: {tally:?}");
        }
    }
}

/// Fragments that break parsers: JSON syntax, numeric edges, escapes, units.
pub const TOKENS: &[&str] = &[
    "\"",
    "\\",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "-0",
    "1e999",
    "-1e999",
    "1.5",
    "1e3",
    "0.0000001",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "4294967296",
    "\\u0000",
    "\\ud800",
    "\\uDFFF",
    "é",
    "😀",
    "\u{0}",
    " ",
    "\n",
    "m",
    "Mi",
    "Gi",
    "Ei",
    "E",
    "k",
    ".",
    "e",
    "+",
    "-",
    "|",
    ",,",
    "GPU-",
    "MIG-",
    "tessera.io/",
    "nvidia.com/",
    "NVIDIA_",
    "CUDA_MPS_",
];

pub fn mutate_bytes(rng: &mut SmallRng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let len = b.len();
        match rng.random_range(0..7) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                b[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                b[i] = rng.random();
            }
            2 if len > 0 => {
                let i = rng.random_range(0..len);
                let n = rng.random_range(1..=16).min(len - i);
                b.drain(i..i + n);
            }
            3 => {
                let i = rng.random_range(0..=len);
                let t = TOKENS.choose(rng).copied().unwrap_or("");
                b.splice(i..i, t.bytes());
            }
            4 if len > 0 => {
                let i = rng.random_range(0..len);
                let n = rng.random_range(1..=32).min(len - i);
                let chunk = b[i..i + n].to_vec();
                let at = rng.random_range(0..=len);
                b.splice(at..at, chunk);
            }
            5 if len > 0 => b.truncate(rng.random_range(0..len)),
            _ => {
                let i = rng.random_range(0..=len);
                b.insert(
                    i,
                    *b"0123456789.-+eEmMiGkK \"{}[]:,"
                        .choose(rng)
                        .unwrap_or(&b'0'),
                );
            }
        }
    }
    b
}

pub fn mutate_text(rng: &mut SmallRng, input: &str) -> String {
    String::from_utf8_lossy(&mutate_bytes(rng, input.as_bytes())).into_owned()
}

pub fn random_value(rng: &mut SmallRng, depth: u32, strings: &[&str]) -> Value {
    let pick = if depth == 0 {
        rng.random_range(0..6)
    } else {
        rng.random_range(0..8)
    };
    match pick {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => serde_json::json!(
            *[0i64, -1, 1, i64::MIN, i64::MAX, 255, 256, 4_294_967_296]
                .choose(rng)
                .unwrap_or(&0)
        ),
        3 => serde_json::json!(*[u64::MAX, 1000, 1001].choose(rng).unwrap_or(&0)),
        4 => serde_json::json!(*[0.5f64, -0.0, 1e300, 3.0].choose(rng).unwrap_or(&0.5)),
        5 => {
            let s = strings.choose(rng).copied().unwrap_or("");
            Value::String(if rng.random_ratio(1, 3) {
                mutate_text(rng, s)
            } else {
                s.to_string()
            })
        }
        6 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth - 1, strings))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.random_range(0..4))
                .map(|_| {
                    let k = strings.choose(rng).copied().unwrap_or("k").to_string();
                    (k, random_value(rng, depth - 1, strings))
                })
                .collect(),
        ),
    }
}

/// A node of `v` chosen by a random walk from the root.
pub fn random_node<'a>(rng: &mut SmallRng, v: &'a mut Value) -> &'a mut Value {
    let n = match v {
        Value::Object(m) => m.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    };
    if n == 0 || rng.random_ratio(1, 4) {
        return v;
    }
    let i = rng.random_range(0..n);
    match v {
        Value::Object(m) => random_node(rng, m.values_mut().nth(i).expect("index below len")),
        Value::Array(a) => random_node(rng, &mut a[i]),
        _ => v,
    }
}

/// Rewrites one to three values of `v`: replaced, removed, added, renamed.
pub fn mutate_json(rng: &mut SmallRng, v: &mut Value, strings: &[&str]) {
    for _ in 0..rng.random_range(1..=3) {
        let node = random_node(rng, v);
        match (rng.random_range(0..5), &mut *node) {
            (0, Value::Object(m)) if !m.is_empty() => {
                let k = m.keys().nth(rng.random_range(0..m.len())).cloned();
                if let Some(k) = k {
                    let old = m.remove(&k);
                    // Sometimes the same value under another spelling of the key.
                    if rng.random() {
                        let renamed = match rng.random_range(0..3) {
                            0 => k.to_ascii_uppercase(),
                            1 => k.to_ascii_lowercase(),
                            _ => mutate_text(rng, &k),
                        };
                        m.insert(renamed, old.unwrap_or(Value::Null));
                    }
                }
            }
            (1, Value::Object(m)) => {
                let k = strings.choose(rng).copied().unwrap_or("k").to_string();
                m.insert(k, random_value(rng, 2, strings));
            }
            (1, Value::Array(a)) if !a.is_empty() => {
                let i = rng.random_range(0..a.len());
                let copy = a[i].clone();
                a.push(copy);
            }
            (2, Value::String(s)) => *s = mutate_text(rng, s),
            _ => *node = random_value(rng, 2, strings),
        }
    }
}

/// A request body, shown as text when a case fails.
#[derive(Clone)]
pub struct Body(pub Vec<u8>);

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// A body: a seed mutated byte-wise or value-wise, or (rarely) tokens.
pub fn mutated_body(rng: &mut SmallRng, seeds: &[Vec<u8>], strings: &[&str]) -> Body {
    let seed = seeds.choose(rng).cloned().unwrap_or_default();
    Body(match rng.random_range(0..10) {
        0..=4 => mutate_bytes(rng, &seed),
        5..=8 => {
            let mut v: Value = serde_json::from_slice(&seed).unwrap_or(Value::Null);
            mutate_json(rng, &mut v, strings);
            serde_json::to_vec(&v).unwrap_or_default()
        }
        _ => (0..rng.random_range(0..12))
            .flat_map(|_| TOKENS.choose(rng).copied().unwrap_or("").bytes())
            .collect(),
    })
}
