//! Fuzzing the core's readers of outside input (issue 9): the allocation
//! annotation codec and the pod request parser, with its quantity parsers.
//!
//! A seeded mutational fuzzer: it starts from valid inputs, flips and splices
//! bytes, rewrites JSON values, and also builds inputs from the grammar. Every
//! input must come back as a value or as an error that says what is wrong —
//! never a panic — and where the right answer is known (a signature cannot be
//! forged, an integer quantity has one meaning) the answer is checked too.
//!
//! `TESSERA_FUZZ_CASES` is the number of inputs per target (default 20,000:
//! seconds in a debug build), `TESSERA_FUZZ_SEED` the seed. At the volume:
//! `TESSERA_FUZZ_CASES=1000000 cargo test --release -p tessera-core --test fuzz_inputs -- --nocapture`

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tessera_core::allocation::{AllocatedGpu, Allocation, AllocationError, MigGrant, VERSION};
use tessera_core::model::Catalog;
use tessera_core::request::{self, GpuAsk, Isolation, RequestError};

fn cases() -> u64 {
    std::env::var("TESSERA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn seed() -> u64 {
    std::env::var("TESSERA_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7e55_e7a9)
}

/// How often each kind of outcome came up, so a run shows it reached both
/// answers and refusals.
type Tally = BTreeMap<&'static str, u64>;

/// Runs `check` on `cases()` inputs from `generate`. A failure prints the
/// case, the seed and the input before it propagates. With enough inputs,
/// every outcome in `reached` must have come up.
fn fuzz<I: std::fmt::Debug>(
    target: &str,
    reached: &[&str],
    mut generate: impl FnMut(&mut SmallRng) -> I,
    mut check: impl FnMut(&I) -> &'static str,
) {
    let (n, seed) = (cases(), seed());
    // Each target its own stream, so adding one does not change the others.
    let salt = target.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = SmallRng::seed_from_u64(seed ^ salt);
    let mut tally = Tally::new();
    let started = Instant::now();
    for case in 0..n {
        let input = generate(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| check(&input))) {
            Ok(outcome) => *tally.entry(outcome).or_default() += 1,
            Err(panic) => {
                eprintln!("{target}: case {case} of seed {seed} failed on input:\n{input:?}");
                resume_unwind(panic);
            }
        }
    }
    eprintln!(
        "fuzz {target}: {n} inputs {tally:?}, seed {seed}, {:.2?}",
        started.elapsed()
    );
    if n >= 1_000 {
        for w in reached {
            assert!(tally.contains_key(w), "no input reached {w:?}: {tally:?}");
        }
    }
}

/// Fragments that break parsers: JSON syntax, numeric edges, escapes, units.
const TOKENS: &[&str] = &[
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
];

fn mutate_bytes(rng: &mut SmallRng, input: &[u8]) -> Vec<u8> {
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

fn mutate_text(rng: &mut SmallRng, input: &str) -> String {
    String::from_utf8_lossy(&mutate_bytes(rng, input.as_bytes())).into_owned()
}

fn random_value(rng: &mut SmallRng, depth: u32, strings: &[&str]) -> Value {
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
fn random_node<'a>(rng: &mut SmallRng, v: &'a mut Value) -> &'a mut Value {
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
fn mutate_json(rng: &mut SmallRng, v: &mut Value, strings: &[&str]) {
    for _ in 0..rng.random_range(1..=3) {
        let node = random_node(rng, v);
        match (rng.random_range(0..5), &mut *node) {
            (0, Value::Object(m)) if !m.is_empty() => {
                let k = m.keys().nth(rng.random_range(0..m.len())).cloned();
                if let Some(k) = k {
                    let old = m.remove(&k);
                    // Sometimes the same value under another spelling of the key.
                    if rng.random() {
                        let renamed = if rng.random() {
                            k.to_ascii_uppercase()
                        } else {
                            mutate_text(rng, &k)
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

// ---- (c) the allocation annotation ----

const KEY: &[u8] = b"fuzz-signing-key";
const UID: &str = "uid-7";
const NODE: &str = "gpu-node-1";

fn gpu(index: u32, memory_mib: u64, cores_milli: u32, mig: Option<MigGrant>) -> AllocatedGpu {
    AllocatedGpu {
        index,
        uuid: format!("GPU-{index:04x}"),
        memory_mib,
        cores_milli,
        mig,
    }
}

fn allocation(isolation: Isolation, gpus: Vec<AllocatedGpu>) -> Allocation {
    Allocation {
        version: VERSION,
        pod_uid: UID.into(),
        pod: "ml/train-0".into(),
        node: NODE.into(),
        policy: "tessera".into(),
        isolation,
        gpus,
        signature: String::new(),
    }
}

/// The valid decisions the byte and JSON mutations start from.
fn seed_allocations() -> Vec<Allocation> {
    vec![
        allocation(Isolation::Mps, vec![gpu(3, 16_000, 400, None)]),
        allocation(
            Isolation::Exclusive,
            vec![gpu(0, 81_920, 1000, None), gpu(1, 81_920, 1000, None)],
        ),
        allocation(
            Isolation::Mig,
            vec![gpu(
                2,
                40_960,
                0,
                Some(MigGrant {
                    profile: "3g.40gb".into(),
                    start: 4,
                    size: 4,
                    uuid: "MIG-8a2f".into(),
                }),
            )],
        ),
        allocation(Isolation::TimeSlice, vec![gpu(7, 8_192, 0, None)]),
    ]
}

const ALLOCATION_STRINGS: &[&str] = &[
    "version",
    "podUid",
    "pod",
    "node",
    "policy",
    "isolation",
    "gpus",
    "signature",
    "index",
    "uuid",
    "memoryMib",
    "coresMilli",
    "mig",
    "profile",
    "start",
    "size",
    "mps",
    "exclusive",
    "time-slice",
    "mig",
    "uid-7",
    "uid-8",
    "gpu-node-1",
    "gpu-node-2",
    "1g.10gb",
    "",
];

/// An annotation value and, when the fuzzer built it signed and whole, the
/// decision `decode_verified` must return.
#[derive(Debug)]
struct Annotation {
    value: String,
    expect: Option<Result<Allocation, AllocationError>>,
}

fn random_allocation(rng: &mut SmallRng) -> Allocation {
    let isolation = *[
        Isolation::Exclusive,
        Isolation::Mps,
        Isolation::TimeSlice,
        Isolation::Mig,
    ]
    .choose(rng)
    .unwrap_or(&Isolation::Mps);
    let text = |rng: &mut SmallRng| {
        let s = ALLOCATION_STRINGS.choose(rng).copied().unwrap_or("");
        if rng.random_ratio(1, 4) {
            mutate_text(rng, s)
        } else {
            s.to_string()
        }
    };
    let gpus = (0..rng.random_range(0..4))
        .map(|_| AllocatedGpu {
            index: rng.random(),
            uuid: text(rng),
            memory_mib: rng.random(),
            cores_milli: rng.random(),
            mig: rng.random_ratio(1, 3).then(|| MigGrant {
                profile: text(rng),
                start: rng.random(),
                size: rng.random(),
                uuid: text(rng),
            }),
        })
        .collect();
    Allocation {
        version: VERSION,
        pod_uid: if rng.random_ratio(7, 8) {
            UID.into()
        } else {
            text(rng)
        },
        pod: text(rng),
        node: if rng.random_ratio(7, 8) {
            NODE.into()
        } else {
            text(rng)
        },
        policy: text(rng),
        isolation,
        gpus,
        signature: String::new(),
    }
}

fn annotation(rng: &mut SmallRng, seeds: &[String]) -> Annotation {
    let text = |value: String| Annotation {
        value,
        expect: None,
    };
    match rng.random_range(0..10) {
        0..=3 => {
            let s = seeds.choose(rng).cloned().unwrap_or_default();
            text(String::from_utf8_lossy(&mutate_bytes(rng, s.as_bytes())).into_owned())
        }
        4..=6 => {
            let s = seeds.choose(rng).cloned().unwrap_or_default();
            let mut v: Value = serde_json::from_str(&s).unwrap_or(Value::Null);
            mutate_json(rng, &mut v, ALLOCATION_STRINGS);
            text(v.to_string())
        }
        7 | 8 => {
            let a = random_allocation(rng);
            let value = a.encode_signed(KEY);
            let expect = if a.pod_uid != UID {
                Err(AllocationError::WrongPod {
                    expected: UID.into(),
                    found: a.pod_uid.clone(),
                })
            } else if a.node != NODE {
                Err(AllocationError::WrongNode {
                    expected: NODE.into(),
                    found: a.node.clone(),
                })
            } else if a.gpus.is_empty() {
                Err(AllocationError::Empty)
            } else {
                Ok(a)
            };
            Annotation {
                value,
                expect: Some(expect),
            }
        }
        _ => text(
            (0..rng.random_range(0..12))
                .map(|_| TOKENS.choose(rng).copied().unwrap_or(""))
                .collect(),
        ),
    }
}

fn assert_clear(e: &AllocationError, input: &str) {
    let m = e.to_string();
    // Every variant opens with the subject and goes on to say what is wrong.
    assert!(
        m.starts_with("allocation annotation ") && m.len() > "allocation annotation is ".len() + 8,
        "unclear error {m:?} for {input:?}"
    );
    if let AllocationError::Malformed(detail) = e {
        assert!(!detail.trim().is_empty(), "no detail for {input:?}");
    }
}

#[test]
fn fuzz_allocation_annotation() {
    let seeds: Vec<Allocation> = seed_allocations();
    let signed: Vec<String> = seeds.iter().map(|a| a.encode_signed(KEY)).collect();
    // The seeds themselves are valid (else the mutations would start from nothing).
    for (s, a) in signed.iter().zip(&seeds) {
        let back = Allocation::decode_verified(s, KEY, UID, NODE).expect("seed decodes");
        assert_eq!(back.gpus, a.gpus);
    }
    fuzz(
        "allocation annotation",
        &["verified", "refused", "malformed"],
        |rng| annotation(rng, &signed),
        |input| {
            let unverified = Allocation::decode_unverified(&input.value);
            let verified = Allocation::decode_verified(&input.value, KEY, UID, NODE);
            if let Err(e) = &unverified {
                assert_clear(e, &input.value);
                assert!(verified.is_err(), "verification is stricter: {input:?}");
            }
            match &verified {
                Err(e) => assert_clear(e, &input.value),
                Ok(a) => {
                    assert_eq!(unverified.as_ref().ok(), Some(a));
                    assert!(a.pod_uid == UID && a.node == NODE && !a.gpus.is_empty());
                    // A mutation cannot forge a signature: whatever verifies is one
                    // of the scheduler's own decisions, at most spelled differently.
                    if input.expect.is_none() {
                        let mut unsigned = a.clone();
                        unsigned.signature.clear();
                        assert!(seeds.contains(&unsigned), "forged decision accepted: {a:?}");
                    }
                }
            }
            let outcome = match (&unverified, &verified) {
                (Err(_), _) => "malformed",
                (Ok(_), Err(_)) => "refused",
                (Ok(_), Ok(_)) => "verified",
            };
            if let Some(expect) = &input.expect {
                let got = verified.map(|mut a| {
                    a.signature.clear();
                    a
                });
                assert_eq!(&got, expect, "{input:?}");
            }
            outcome
        },
    );
}

// ---- (d) the request parser and quantities ----

const QUANTITIES: &[&str] = &[
    "0", "1", "2", "8", "500m", "100m", "1.5", "0.5", ".5", "512Mi", "4Gi", "1G", "1000000", "1Ki",
    "8Ei", "16E", "1.5Gi", "20000", "100", "150", "1000", "1001", "", " 3 ", "-1", "1e3", "one",
];

const RESOURCE_KEYS: &[&str] = &[
    "cpu",
    "memory",
    request::RES_GPU,
    request::RES_GPU_MEMORY,
    request::RES_GPU_MEMORY_PERCENT,
    request::RES_GPU_CORES,
    request::RES_GPU_MILLI,
    "tessera.io/mig-1g.10gb",
    "tessera.io/mig-3g.40gb",
    "tessera.io/mig-1g.10gb.me",
    "tessera.io/mig-bogus",
    request::RES_NVIDIA_GPU,
    "nvidia.com/mig-2g.20gb",
    "ephemeral-storage",
    "example.com/foo",
];

const ANNOTATION_KEYS: &[&str] = &[
    request::ANN_GPU_MODEL,
    request::ANN_GPU_UUIDS,
    request::ANN_ISOLATION,
    request::ANN_TOPOLOGY,
    request::ANN_SINGLE_ARCH,
    "tessera.io/other",
    "example.com/x",
];

const ANNOTATION_VALUES: &[&str] = &[
    "A100-80GB",
    "A100-80GB|H100-80GB",
    "H100",
    "|",
    "",
    "GPU-abc,MIG-x",
    "GPU-1,,",
    "abc",
    "exclusive",
    "mps",
    "time-slice",
    "timeslice",
    "mig",
    "bogus",
    "nvlink-required,numa-preferred",
    "nvlink-preferred",
    "warp-drive",
    "true",
    "no",
    "maybe",
];

fn quantity(rng: &mut SmallRng) -> String {
    match rng.random_range(0..8) {
        0..=3 => QUANTITIES.choose(rng).copied().unwrap_or("").to_string(),
        4 | 5 => {
            let q = QUANTITIES.choose(rng).copied().unwrap_or("");
            mutate_text(rng, q)
        }
        6 => {
            let digits = if rng.random() {
                rng.random_range(1..=4)
            } else {
                rng.random_range(1..=40)
            };
            let n: String = (0..digits)
                .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
                .collect();
            let suffix = ["", "m", "Mi", "Gi", "Ei", "E", "k", "Ki", "T"]
                .choose(rng)
                .copied()
                .unwrap_or("");
            format!("{n}{suffix}")
        }
        _ => (0..rng.random_range(0..6))
            .map(|_| TOKENS.choose(rng).copied().unwrap_or(""))
            .collect(),
    }
}

#[derive(Debug)]
struct Quantity {
    text: String,
    /// Integer forms have one meaning: the expected milli-cores and MiB.
    cpu_milli: Option<Option<u64>>,
    memory_mib: Option<Option<u64>>,
}

fn quantity_case(rng: &mut SmallRng) -> Quantity {
    if rng.random_ratio(1, 3) {
        let n: u64 = match rng.random_range(0..3) {
            0 => rng.random_range(0..100_000),
            1 => rng.random(),
            _ => rng.random::<u64>() >> rng.random_range(0..64),
        };
        let units: [(&str, u128); 6] = [
            ("", 1),
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("k", 1_000),
            ("G", 1_000_000_000),
        ];
        let (suffix, mult) = *units.choose(rng).unwrap_or(&("", 1));
        let n128 = u128::from(n);
        let memory_mib = u64::try_from((n128 * mult).div_ceil(1 << 20)).ok();
        let (text, cpu_milli) = match suffix {
            "" if rng.random() => (format!("{n}m"), Some(n)),
            "" => (n.to_string(), n.checked_mul(1000)),
            _ => (format!("{n}{suffix}"), None),
        };
        let is_milli = text.ends_with('m');
        return Quantity {
            text,
            cpu_milli: (suffix.is_empty()).then_some(cpu_milli),
            // `Nm` is not a memory quantity.
            memory_mib: (!is_milli).then_some(memory_mib),
        };
    }
    Quantity {
        text: quantity(rng),
        cpu_milli: None,
        memory_mib: None,
    }
}

fn assert_names_field(e: &RequestError, field: &str, value: &str) {
    assert_eq!(e.field, field, "{e}");
    assert_eq!(e.value, value, "{e}");
    assert!(!e.problem.trim().is_empty(), "no problem stated: {e:?}");
    assert!(e.to_string().starts_with(field), "{e}");
}

#[test]
fn fuzz_quantities() {
    fuzz("quantities", &["parsed", "refused"], quantity_case, |q| {
        let cpu = request::parse_cpu_milli("cpu", &q.text);
        let mem = request::parse_memory_mib("memory", &q.text);
        if let Err(e) = &cpu {
            assert_names_field(e, "cpu", &q.text);
        }
        if let Err(e) = &mem {
            assert_names_field(e, "memory", &q.text);
        }
        if let Some(want) = q.cpu_milli {
            assert_eq!(cpu.as_ref().ok().copied(), want, "cpu {:?}", q.text);
        }
        if let Some(want) = q.memory_mib {
            assert_eq!(mem.as_ref().ok().copied(), want, "memory {:?}", q.text);
        }
        if cpu.is_ok() || mem.is_ok() {
            "parsed"
        } else {
            "refused"
        }
    });
}

#[derive(Debug)]
struct PodAsk {
    resources: Vec<(String, String)>,
    annotations: Vec<(String, String)>,
}

/// Name and value pairs, as a pod writes resources and annotations.
type Pairs = &'static [(&'static str, &'static str)];

/// Coherent asks (resources; annotations) that single mutations start from.
const ASKS: &[(Pairs, Pairs)] = &[
    (
        &[("cpu", "500m"), ("memory", "1Gi"), ("tessera.io/gpu", "2")],
        &[],
    ),
    (
        &[
            ("tessera.io/gpu", "1"),
            ("tessera.io/gpu-memory", "20Gi"),
            ("tessera.io/gpu-cores", "30"),
        ],
        &[("tessera.io/isolation", "mps")],
    ),
    (&[("tessera.io/gpu-milli", "250")], &[]),
    (&[("tessera.io/mig-1g.10gb", "1")], &[]),
    (&[("nvidia.com/mig-3g.40gb", "1")], &[]),
    (
        &[("nvidia.com/gpu", "1")],
        &[("tessera.io/gpu-model", "A100-80GB|H100-80GB")],
    ),
    (
        &[("tessera.io/gpu-memory-percent", "50")],
        &[("tessera.io/isolation", "time-slice")],
    ),
    (
        &[("tessera.io/gpu", "4")],
        &[
            ("tessera.io/topology", "nvlink-required,numa-preferred"),
            ("tessera.io/single-architecture", "false"),
            ("tessera.io/gpu-uuids", "GPU-1,GPU-2,GPU-3,GPU-4"),
        ],
    ),
];

/// One of [`ASKS`], and half the time one value changed.
fn coherent_ask(rng: &mut SmallRng) -> PodAsk {
    let (res, ann) = ASKS.choose(rng).copied().unwrap_or((&[], &[]));
    let own = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut ask = PodAsk {
        resources: own(res),
        annotations: own(ann),
    };
    if rng.random() {
        let list = if rng.random() || ask.annotations.is_empty() {
            &mut ask.resources
        } else {
            &mut ask.annotations
        };
        if !list.is_empty() {
            let i = rng.random_range(0..list.len());
            list[i].1 = if rng.random() {
                quantity(rng)
            } else {
                mutate_text(rng, &list[i].1)
            };
        }
    }
    ask
}

fn pod_ask(rng: &mut SmallRng) -> PodAsk {
    if rng.random() {
        return coherent_ask(rng);
    }
    let key = |rng: &mut SmallRng, keys: &[&str]| {
        let k = keys.choose(rng).copied().unwrap_or("");
        if rng.random_ratio(1, 10) {
            mutate_text(rng, k)
        } else {
            k.to_string()
        }
    };
    let resources = (0..rng.random_range(0..5))
        .map(|_| (key(rng, RESOURCE_KEYS), quantity(rng)))
        .collect();
    let annotations = (0..rng.random_range(0..4))
        .map(|_| {
            let k = key(rng, ANNOTATION_KEYS);
            let v = ANNOTATION_VALUES.choose(rng).copied().unwrap_or("");
            let v = if rng.random_ratio(1, 4) {
                mutate_text(rng, v)
            } else {
                v.to_string()
            };
            (k, v)
        })
        .collect();
    PodAsk {
        resources,
        annotations,
    }
}

#[test]
fn fuzz_request_parser() {
    let catalog = Catalog::default();
    fuzz(
        "request parser",
        &["refused", "cpu only", "whole", "shared", "mig"],
        pod_ask,
        |ask| {
            let parsed = request::parse(
                ask.resources.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                ask.annotations
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
                &catalog,
            );
            match parsed {
                Err(e) => {
                    // The error names a field the pod wrote (or the one the parser
                    // reconciles several into) and says what is wrong with it.
                    let given = ask
                        .resources
                        .iter()
                        .chain(&ask.annotations)
                        .any(|(k, _)| *k == e.field);
                    let derived = e.field == request::RES_GPU
                        || e.field == request::ANN_ISOLATION
                        || e.field.starts_with(request::RES_MIG_PREFIX);
                    assert!(given || derived, "{e:?} names no field of {ask:?}");
                    assert!(!e.problem.trim().is_empty(), "{e:?}");
                    assert!(e.to_string().contains(&e.field), "{e}");
                    "refused"
                }
                Ok(req) => match &req.gpu {
                    GpuAsk::None => "cpu only",
                    GpuAsk::Whole { count } => {
                        assert!(*count >= 1, "{req:?}");
                        "whole"
                    }
                    GpuAsk::Shared {
                        count, cores_milli, ..
                    } => {
                        assert!(*count >= 1 && *cores_milli <= 1000, "{req:?}");
                        assert_ne!(req.isolation, Isolation::Exclusive, "{req:?}");
                        "shared"
                    }
                    GpuAsk::Mig { .. } => {
                        assert_eq!(req.isolation, Isolation::Mig, "{req:?}");
                        "mig"
                    }
                },
            }
        },
    );
}
