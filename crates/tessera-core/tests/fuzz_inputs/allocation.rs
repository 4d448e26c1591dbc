//! (c) The allocation annotation: `Allocation::decode_unverified` and
//! `decode_verified`, from mutated signed decisions and from decisions built
//! and signed here. A mutation cannot forge a signature, so whatever verifies
//! must be one of the scheduler's own decisions.

use rand::Rng;
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use serde_json::Value;
use tessera_core::allocation::{
    AllocatedGpu, Allocation, AllocationError, ContainerGrant, MigGrant, VERSION,
};
use tessera_core::request::Isolation;

use crate::fuzz::{TOKENS, assert_reached, cases, fuzz, mutate_bytes, mutate_json, mutate_text};

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
        containers: Vec::new(),
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
                    create: false,
                    enable_mig_mode: false,
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
                create: rng.random(),
                enable_mig_mode: rng.random(),
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
        containers: if rng.random_ratio(1, 4) {
            (0..rng.random_range(1..4))
                .map(|_| ContainerGrant {
                    name: text(rng),
                    // Mostly positions inside the list (a consistent grant), sometimes not.
                    gpus: (0..rng.random_range(0..4))
                        .map(|_| {
                            if rng.random_ratio(7, 8) {
                                rng.random_range(0..4)
                            } else {
                                rng.random()
                            }
                        })
                        .collect(),
                })
                .collect()
        } else {
            Vec::new()
        },
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
            } else if let Some(why) = container_problem(&a) {
                Err(AllocationError::BadContainers(why))
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

/// The per-container list's rules, restated: each container once, with at
/// least one GPU, every position inside the pod's GPU list.
fn container_problem(a: &Allocation) -> Option<String> {
    let mut seen = std::collections::BTreeSet::new();
    for c in &a.containers {
        if !seen.insert(&c.name) {
            return Some(format!("container {} is listed twice", c.name));
        }
        if c.gpus.is_empty() {
            return Some(format!("container {} is given no GPU", c.name));
        }
        if let Some(p) = c.gpus.iter().find(|p| **p as usize >= a.gpus.len()) {
            return Some(format!(
                "container {} is given GPU position {p}, the pod has {} GPUs",
                c.name,
                a.gpus.len()
            ));
        }
    }
    None
}

fn assert_clear(e: &AllocationError, input: &str) {
    let m = e.to_string();
    // Every variant opens with the subject and goes on to say what is wrong.
    assert!(
        (m.starts_with("allocation annotation ") || m.starts_with("allocation annotation's "))
            && m.len() > "allocation annotation is ".len() + 8,
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
    let n = cases();
    let tally = fuzz(
        "allocation annotation",
        n,
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
    assert_reached(&tally, n, &["verified", "refused", "malformed"]);
}
