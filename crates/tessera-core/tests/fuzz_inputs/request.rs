//! (d) The request parser (`request::parse`) and the quantity parsers, from
//! coherent asks changed one value at a time and from asks built at random.
//! Integer quantities have one meaning, which is checked; every error names
//! the field and says what is wrong with it.

use rand::Rng;
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use tessera_core::model::Catalog;
use tessera_core::request::{self, GpuAsk, Isolation, RequestError};

use crate::fuzz::{TOKENS, assert_reached, cases, fuzz, mutate_text};

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
    let n = cases();
    let tally = fuzz("quantities", n, quantity_case, |q| {
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
    assert_reached(&tally, n, &["parsed", "refused"]);
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
    let n = cases();
    let tally = fuzz("request parser", n, pod_ask, |ask| {
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
    });
    assert_reached(
        &tally,
        n,
        &["refused", "cpu only", "whole", "shared", "mig"],
    );
}
