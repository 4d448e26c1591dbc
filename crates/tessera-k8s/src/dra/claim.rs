//! A claim checked and resolved into what the allocator works on.
//!
//! The API server validates claims, but a claim from a newer server, an older
//! one, or a bug must not panic the scheduler nor be allocated half-read: every
//! problem is a [`ClaimError`] naming the field path, and the claim then stays
//! unallocated with that reason. Selectors are compiled here, once per claim.

use std::collections::{BTreeMap, BTreeSet};

use super::cel::{Selector, SelectorError};
use super::quantity::Quantity;
use super::types::{
    CapacityRequirements, DeviceClass, DeviceSelector, DeviceToleration, ResourceClaim,
};

/// Most devices one request may ask for by count (a bound on the search; the
/// API allows more, but no node of ours has as many).
pub const MAX_COUNT: i64 = 128;

/// Most results one claim's allocation may hold: the API server refuses a
/// status with more (`AllocationResultsMaxSize`, 32 in resource.k8s.io/v1).
/// A claim whose requests need more can never be allocated: it is refused
/// with that reason instead of retried forever on the server's 422.
pub const MAX_RESULTS: usize = 32;

/// Why a claim cannot be allocated by anyone: it is malformed or uses what is
/// not supported. Not a "does not fit".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    #[error("{field}: {source}")]
    Selector {
        field: String,
        #[source]
        source: SelectorError,
    },
    #[error("{field}: device class {class:?} not found")]
    UnknownClass { field: String, class: String },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ClaimError {
    ClaimError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

/// How many devices an alternative takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Count(u32),
    /// Every matching device of the node, at least one.
    All,
}

/// One way to satisfy a request: the request itself, or one `firstAvailable`
/// subrequest.
#[derive(Debug)]
pub struct Alternative {
    /// The name in results and constraints: `<request>` or `<request>/<sub>`.
    pub name: String,
    pub class: String,
    /// The class's selectors, then the request's: all must match.
    pub selectors: Vec<Selector>,
    pub mode: Mode,
    pub admin_access: bool,
    pub tolerations: Vec<DeviceToleration>,
    /// Capacity name → amount asked of each device (consumable capacity).
    pub capacity: BTreeMap<String, Quantity>,
}

#[derive(Debug)]
pub struct RequestAsk {
    pub name: String,
    /// One for `exactly`; the subrequests in order for `firstAvailable`.
    pub alternatives: Vec<Alternative>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConstraintKind {
    /// Every chosen device has the same value of this fully qualified attribute.
    Match(String),
    /// Every chosen device has a different value.
    Distinct(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    /// Request names (`req` covers all its subrequests, `req/sub` one); empty: all.
    pub requests: Vec<String>,
    pub kind: ConstraintKind,
}

impl Constraint {
    /// Whether the constraint covers alternative `name` (`req` or `req/sub`).
    pub fn covers(&self, name: &str) -> bool {
        let request = name.split_once('/').map_or(name, |(r, _)| r);
        self.requests.is_empty() || self.requests.iter().any(|r| r == name || r == request)
    }
}

/// A claim ready for the allocator.
#[derive(Debug)]
pub struct ClaimAsk {
    pub requests: Vec<RequestAsk>,
    pub constraints: Vec<Constraint>,
}

fn compile(field: &str, selectors: &[DeviceSelector]) -> Result<Vec<Selector>, ClaimError> {
    selectors
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let f = format!("{field}[{i}].cel.expression");
            let expr = s
                .cel
                .as_ref()
                .ok_or_else(|| invalid(format!("{field}[{i}]"), "no cel selector"))?;
            Selector::compile(&expr.expression)
                .map_err(|source| ClaimError::Selector { field: f, source })
        })
        .collect()
}

struct Exact<'a> {
    field: String,
    name: String,
    class: &'a str,
    selectors: &'a [DeviceSelector],
    mode: Option<&'a str>,
    count: Option<i64>,
    admin: bool,
    tolerations: &'a [DeviceToleration],
    capacity: Option<&'a CapacityRequirements>,
}

fn alternative(e: Exact<'_>, classes: &[DeviceClass]) -> Result<Alternative, ClaimError> {
    let f = &e.field;
    if e.class.is_empty() {
        return Err(invalid(format!("{f}.deviceClassName"), "empty"));
    }
    let class = classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(e.class))
        .ok_or_else(|| ClaimError::UnknownClass {
            field: format!("{f}.deviceClassName"),
            class: e.class.to_string(),
        })?;
    let mut selectors = compile(
        &format!("deviceclass {}.spec.selectors", e.class),
        &class.spec.selectors,
    )?;
    selectors.extend(compile(&format!("{f}.selectors"), e.selectors)?);
    let mode = match (e.mode.unwrap_or("ExactCount"), e.count) {
        ("ExactCount", None) => Mode::Count(1),
        ("ExactCount", Some(n)) if (1..=MAX_COUNT).contains(&n) => Mode::Count(n as u32),
        ("ExactCount", Some(n)) => {
            return Err(invalid(
                format!("{f}.count"),
                format!("must be between 1 and {MAX_COUNT}, got {n}"),
            ));
        }
        ("All", None | Some(0)) => Mode::All,
        ("All", Some(n)) => {
            return Err(invalid(
                format!("{f}.count"),
                format!("must not be set with allocationMode All, got {n}"),
            ));
        }
        (other, _) => {
            return Err(invalid(
                format!("{f}.allocationMode"),
                format!("{other:?} is neither ExactCount nor All"),
            ));
        }
    };
    let mut capacity = BTreeMap::new();
    for (k, v) in e.capacity.map(|c| &c.requests).into_iter().flatten() {
        let q = Quantity::parse(v)
            .map_err(|err| invalid(format!("{f}.capacity.requests[{k}]"), err.to_string()))?;
        if q < Quantity::ZERO {
            return Err(invalid(format!("{f}.capacity.requests[{k}]"), "negative"));
        }
        capacity.insert(k.clone(), q);
    }
    Ok(Alternative {
        name: e.name,
        class: e.class.to_string(),
        selectors,
        mode,
        admin_access: e.admin,
        tolerations: e.tolerations.to_vec(),
        capacity,
    })
}

impl ClaimAsk {
    /// Checks `claim` against the API's rules and resolves its classes.
    pub fn resolve(claim: &ResourceClaim, classes: &[DeviceClass]) -> Result<ClaimAsk, ClaimError> {
        let devices = &claim.spec.devices;
        if devices.requests.is_empty() {
            return Err(invalid("spec.devices.requests", "no requests"));
        }
        let mut names = BTreeSet::new();
        let mut requests = Vec::new();
        for (i, r) in devices.requests.iter().enumerate() {
            let f = format!("spec.devices.requests[{i}]");
            if r.name.is_empty() {
                return Err(invalid(format!("{f}.name"), "empty"));
            }
            if !names.insert(r.name.as_str()) {
                return Err(invalid(
                    format!("{f}.name"),
                    format!("{:?} repeats", r.name),
                ));
            }
            let alternatives = match (&r.exactly, r.first_available.as_slice()) {
                (Some(e), []) => vec![alternative(
                    Exact {
                        field: format!("{f}.exactly"),
                        name: r.name.clone(),
                        class: &e.device_class_name,
                        selectors: &e.selectors,
                        mode: e.allocation_mode.as_deref(),
                        count: e.count,
                        admin: e.admin_access == Some(true),
                        tolerations: &e.tolerations,
                        capacity: e.capacity.as_ref(),
                    },
                    classes,
                )?],
                (None, []) => {
                    return Err(invalid(f, "neither exactly nor firstAvailable is set"));
                }
                (Some(_), _) => {
                    return Err(invalid(f, "both exactly and firstAvailable are set"));
                }
                (None, subs) => {
                    let mut seen = BTreeSet::new();
                    let mut alts = Vec::new();
                    for (j, s) in subs.iter().enumerate() {
                        let sf = format!("{f}.firstAvailable[{j}]");
                        if s.name.is_empty() || !seen.insert(s.name.as_str()) {
                            return Err(invalid(
                                format!("{sf}.name"),
                                "empty or repeated subrequest name",
                            ));
                        }
                        alts.push(alternative(
                            Exact {
                                field: sf,
                                name: format!("{}/{}", r.name, s.name),
                                class: &s.device_class_name,
                                selectors: &s.selectors,
                                mode: s.allocation_mode.as_deref(),
                                count: s.count,
                                admin: false,
                                tolerations: &s.tolerations,
                                capacity: s.capacity.as_ref(),
                            },
                            classes,
                        )?);
                    }
                    alts
                }
            };
            requests.push(RequestAsk {
                name: r.name.clone(),
                alternatives,
            });
        }
        // The fewest results any choice of alternatives needs (All: at least one).
        let least: u64 = requests
            .iter()
            .map(|r| {
                r.alternatives
                    .iter()
                    .map(|a| match a.mode {
                        Mode::Count(n) => u64::from(n),
                        Mode::All => 1,
                    })
                    .min()
                    .unwrap_or(1)
            })
            .sum();
        if least > MAX_RESULTS as u64 {
            return Err(invalid(
                "spec.devices.requests",
                format!(
                    "asks for at least {least} devices, but the API server stores at most {MAX_RESULTS} results in one claim's allocation"
                ),
            ));
        }
        let mut constraints = Vec::new();
        for (i, c) in devices.constraints.iter().enumerate() {
            let f = format!("spec.devices.constraints[{i}]");
            let kind = match (&c.match_attribute, &c.distinct_attribute) {
                (Some(a), None) => ConstraintKind::Match(a.clone()),
                (None, Some(a)) => ConstraintKind::Distinct(a.clone()),
                _ => {
                    return Err(invalid(
                        f,
                        "exactly one of matchAttribute and distinctAttribute must be set",
                    ));
                }
            };
            let attr = match &kind {
                ConstraintKind::Match(a) | ConstraintKind::Distinct(a) => a,
            };
            if !attr.contains('/') {
                return Err(invalid(
                    f,
                    format!("{attr:?} is not a fully qualified attribute name (domain/name)"),
                ));
            }
            for (j, r) in c.requests.iter().enumerate() {
                let request = r.split_once('/').map_or(r.as_str(), |(q, _)| q);
                let known = requests.iter().any(|q| {
                    q.name == request
                        && (request == r.as_str() || q.alternatives.iter().any(|a| &a.name == r))
                });
                if !known {
                    return Err(invalid(
                        format!("{f}.requests[{j}]"),
                        format!("{r:?} names no request of the claim"),
                    ));
                }
            }
            constraints.push(Constraint {
                requests: c.requests.clone(),
                kind,
            });
        }
        Ok(ClaimAsk {
            requests,
            constraints,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn classes() -> Vec<DeviceClass> {
        serde_json::from_value(json!([
            {"metadata": {"name": "gpu.tessera.io"}, "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.tessera.io' && device.attributes['gpu.tessera.io'].type == 'gpu'"}}]}},
            {"metadata": {"name": "mig.tessera.io"}, "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.tessera.io' && device.attributes['gpu.tessera.io'].type == 'mig'"}}]}}
        ]))
        .unwrap()
    }

    fn resolve(spec: serde_json::Value) -> Result<ClaimAsk, ClaimError> {
        let claim: ResourceClaim =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"devices": spec}}))
                .unwrap();
        ClaimAsk::resolve(&claim, &classes())
    }

    #[test]
    fn resolves_requests_alternatives_and_constraints() {
        let a = resolve(json!({
            "requests": [
                {"name": "a", "exactly": {"deviceClassName": "gpu.tessera.io", "count": 2,
                    "capacity": {"requests": {"memory": "20Gi"}}}},
                {"name": "b", "firstAvailable": [
                    {"name": "x", "deviceClassName": "gpu.tessera.io"},
                    {"name": "y", "deviceClassName": "mig.tessera.io", "allocationMode": "All"}]}],
            "constraints": [{"requests": ["a", "b/y"], "distinctAttribute": "gpu.tessera.io/uuid"}]
        }))
        .unwrap();
        assert_eq!(a.requests[0].alternatives[0].mode, Mode::Count(2));
        assert_eq!(
            a.requests[0].alternatives[0].capacity["memory"],
            Quantity::parse("20Gi").unwrap()
        );
        // The class's selector comes first.
        assert_eq!(a.requests[0].alternatives[0].selectors.len(), 1);
        let names: Vec<&str> = a.requests[1]
            .alternatives
            .iter()
            .map(|x| x.name.as_str())
            .collect();
        assert_eq!(names, ["b/x", "b/y"]);
        assert_eq!(a.requests[1].alternatives[1].mode, Mode::All);
        let c = &a.constraints[0];
        assert!(c.covers("a") && c.covers("b/y") && !c.covers("b/x"));
    }

    /// Each malformed claim is refused with an error naming its field.
    #[test]
    fn bad_claims_name_the_field_at_fault() {
        let gpu = |extra: serde_json::Value| {
            let mut e = json!({"deviceClassName": "gpu.tessera.io"});
            e.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            e
        };
        let cases = [
            (
                json!({"requests": []}),
                "spec.devices.requests: no requests",
            ),
            (json!({"requests": [{"name": "a"}]}), "requests[0]: neither"),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({})), "firstAvailable": [{"name": "x", "deviceClassName": "gpu.tessera.io"}]}]}),
                "both exactly and firstAvailable",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({"count": 0}))}]}),
                "requests[0].exactly.count",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({"allocationMode": "Some"}))}]}),
                "allocationMode: \"Some\"",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": {"deviceClassName": "nope"}}]}),
                "device class \"nope\" not found",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({"selectors": [{"cel": {"expression": "device.driver =="}}]}))}]}),
                "requests[0].exactly.selectors[0].cel.expression",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({"capacity": {"requests": {"memory": "lots"}}}))}]}),
                "capacity.requests[memory]",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({}))}, {"name": "a", "exactly": gpu(json!({}))}]}),
                "requests[1].name",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({}))}], "constraints": [{"matchAttribute": "numa"}]}),
                "not a fully qualified",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({}))}], "constraints": [{"requests": ["z"], "matchAttribute": "gpu.tessera.io/numa"}]}),
                "constraints[0].requests[0]",
            ),
            (
                json!({"requests": [{"name": "a", "exactly": gpu(json!({}))}], "constraints": [{}]}),
                "exactly one of matchAttribute",
            ),
        ];
        for (spec, want) in cases {
            let e = resolve(spec.clone()).expect_err(&spec.to_string());
            assert!(e.to_string().contains(want), "{spec}: {e}");
        }
    }
}
