//! `resource.k8s.io/v1` validation the double copies from the API server
//! (Kubernetes 1.34–1.36, `pkg/apis/resource/validation/validation.go`; the
//! limits are `pkg/apis/resource/types.go`'s constants). Not recorded: the
//! fixtures are v1.28, which has no `resource.k8s.io/v1`. Each check names the
//! function it copies; messages are those `field.Error` prints
//! (`Invalid value: "x": …`, `Required value: …`, `Too many: N: must have at
//! most M items`, `Duplicate value: "x"`, `Forbidden: …`).
//!
//! - ResourceSlices ([`slice`], on create and update): the pool, exactly one
//!   of `nodeName`/`nodeSelector`/`allNodes`/`perDeviceNodeSelection`, only one
//!   of `sharedCounters` or `devices` (1.35+), at most 128 devices (64 when
//!   any device consumes counters or has taints), device names DNS labels and
//!   unique, at most 8 counter sets with DNS-label names and 1–32 counters,
//!   at most 2 counter consumptions per device, `requestPolicy` only on an
//!   `allowMultipleAllocations` device, per-device node selection only with
//!   `perDeviceNodeSelection`; `driver`, `pool.name` and `nodeName` immutable.
//! - ResourceClaim status ([`claim_status`], on the status subresource): new
//!   `reservedFor` entries refused while the claim has a `deletionTimestamp`;
//!   a new allocation's results at most 32 (`AllocationResultsMaxSize`), each
//!   naming a request (or `request/subrequest`) of the claim's spec, a driver,
//!   a pool and a device that is a DNS label, and a `shareID` (set for a share
//!   of an `allowMultipleAllocations` device) in normalized RFC 4122 form.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::status::{ApiError, Cause, invalid_kind};
use super::store::{Resource, key_of};

/// `resource.ResourceSliceMaxDevices`.
pub const SLICE_MAX_DEVICES: usize = 128;
/// `resource.ResourceSliceMaxDevicesWithAdvancedFeatures` (taints, counters).
pub const SLICE_MAX_DEVICES_ADVANCED: usize = 64;
/// `resource.ResourceSliceMaxCounterSets`.
pub const SLICE_MAX_COUNTER_SETS: usize = 8;
/// `resource.ResourceSliceMaxCountersPerCounterSet`.
const MAX_COUNTERS_PER_SET: usize = 32;
/// `resource.ResourceSliceMaxDeviceCounterConsumptionsPerDevice`.
const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// `resource.ResourceSliceMaxCountersPerDeviceCounterConsumption`.
const MAX_COUNTERS_PER_CONSUMPTION: usize = 32;
/// `resource.AllocationResultsMaxSize`.
pub const ALLOCATION_RESULTS_MAX: usize = 32;

/// Field errors, collected as `field.ErrorList` is.
#[derive(Default)]
struct Errors(Vec<Cause>);

impl Errors {
    fn push(&mut self, reason: &'static str, field: String, message: String) {
        self.0.push(Cause {
            reason,
            message,
            field,
        });
    }

    /// `field.Invalid(path, value, detail)` with a string value.
    fn invalid(&mut self, field: String, value: &str, detail: &str) {
        self.push(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {value:?}: {detail}"),
        );
    }

    /// `field.Invalid` with a number or bool value (printed bare).
    fn invalid_bare(&mut self, field: String, value: impl std::fmt::Display, detail: &str) {
        self.push(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {value}: {detail}"),
        );
    }

    fn required(&mut self, field: String, detail: &str) {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        self.push("FieldValueRequired", field, message);
    }

    fn forbidden(&mut self, field: String, detail: &str) {
        self.push("FieldValueForbidden", field, format!("Forbidden: {detail}"));
    }

    fn too_many(&mut self, field: String, actual: usize, max: usize) {
        self.push(
            "FieldValueTooMany",
            field,
            format!("Too many: {actual}: must have at most {max} items"),
        );
    }

    fn duplicate(&mut self, field: String, value: &str) {
        self.push(
            "FieldValueDuplicate",
            field,
            format!("Duplicate value: {value:?}"),
        );
    }

    fn into_result(self, resource: Resource, name: &str) -> Result<(), ApiError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(invalid_kind(resource, name, self.0))
        }
    }
}

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `validation.IsDNS1123Label`: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(is_label_char)
        && s.ends_with(is_label_char)
        && s.chars().all(|c| is_label_char(c) || c == '-')
}

/// `corevalidation.ValidateDNS1123Label` (device, request and counter names).
fn dns_label(errs: &mut Errors, field: String, s: &str) {
    if s.len() > 63 {
        errs.invalid(field.clone(), s, "must be no more than 63 characters");
    }
    if !is_dns_label(s) {
        errs.invalid(field, s, DNS1123_LABEL_MSG);
    }
}

/// `validation.IsDNS1123Subdomain`: dot-separated labels, at most 253.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Whether a field is present in the JSON (Go's decoder gives a non-nil
/// pointer or slice for any value but `null`, an empty one included).
fn set(v: &Value, key: &str) -> bool {
    v.get(key).is_some_and(|x| !x.is_null())
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `validateDriverName` (`corevalidation.ValidateCSIDriverName`): required,
/// at most 63 characters, `([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]`.
fn driver_name(errs: &mut Errors, field: String, driver: &str) {
    if driver.is_empty() {
        errs.required(field, "");
        return;
    }
    if driver.len() > 63 {
        errs.push(
            "FieldValueTooLong",
            field.clone(),
            "Too long: may not be more than 63 bytes".into(),
        );
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if !(driver.starts_with(alnum)
        && driver.ends_with(alnum)
        && driver
            .chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.')))
    {
        errs.invalid(
            field,
            driver,
            "a DNS-1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        );
    }
}

/// `validatePoolName`: required, each `/`-separated part a DNS subdomain.
fn pool_name(errs: &mut Errors, field: String, name: &str) {
    if name.is_empty() {
        errs.required(field, "");
        return;
    }
    if name.len() > 253 {
        errs.push(
            "FieldValueTooLong",
            field.clone(),
            "Too long: may not be more than 253 bytes".into(),
        );
    }
    for part in name.split('/') {
        if !is_dns_subdomain(part) {
            errs.invalid(
                field.clone(),
                part,
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            );
        }
    }
}

/// `validateCounterSet` / `validateDeviceCounterConsumption`'s counters map:
/// required, at most `max`, names DNS labels.
fn counters(errs: &mut Errors, field: &str, counters: Option<&Value>, max: usize) {
    let map = counters.and_then(Value::as_object);
    match map {
        None => errs.required(field.into(), ""),
        Some(m) if m.is_empty() => errs.required(field.into(), ""),
        Some(m) if m.len() > max => errs.too_many(field.into(), m.len(), max),
        Some(m) => {
            for k in m.keys() {
                dns_label(errs, format!("{field}[{k}]"), k);
            }
        }
    }
}

/// `ValidateResourceSlice` and `ValidateResourceSliceUpdate`
/// (`validateResourceSliceSpec`, `validateResourcePool`, `validateDevice`,
/// `validateCounterSet`) as far as a driver's slices can break them.
pub fn slice(new: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let name = key_of(new).1;
    let mut errs = Errors::default();
    let null = Value::Null;
    let spec = new.get("spec").unwrap_or(&null);
    driver_name(
        &mut errs,
        "spec.driver".into(),
        str_of(spec, "driver").unwrap_or_default(),
    );
    // validateResourcePool.
    let pool = spec.get("pool").unwrap_or(&null);
    pool_name(
        &mut errs,
        "spec.pool.name".into(),
        str_of(pool, "name").unwrap_or_default(),
    );
    let count = pool
        .get("resourceSliceCount")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if count <= 0 {
        errs.invalid_bare(
            "spec.pool.resourceSliceCount".into(),
            count,
            "must be greater than zero",
        );
    }
    let generation = pool.get("generation").and_then(Value::as_i64).unwrap_or(0);
    if generation < 0 {
        errs.invalid_bare(
            "spec.pool.generation".into(),
            generation,
            "must be greater than or equal to zero",
        );
    }
    // Immutable on update: pool name, driver, node name.
    if let Some(old_spec) = old.and_then(|o| o.get("spec")) {
        for (path, ptr) in [
            ("spec.pool.name", "/pool/name"),
            ("spec.driver", "/driver"),
            ("spec.nodeName", "/nodeName"),
        ] {
            let (a, b) = (spec.pointer(ptr), old_spec.pointer(ptr));
            if a.filter(|v| !v.is_null()) != b.filter(|v| !v.is_null()) {
                let shown = a.and_then(Value::as_str).unwrap_or_default();
                errs.invalid(path.into(), shown, "field is immutable");
            }
        }
    }
    // Exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection.
    let mut chosen = Vec::new();
    if set(spec, "nodeName") {
        match str_of(spec, "nodeName") {
            Some(n) if !n.is_empty() => {
                chosen.push("`nodeName`");
                if !is_dns_subdomain(n) {
                    errs.invalid(
                        "spec.nodeName".into(),
                        n,
                        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                    );
                }
            }
            _ => errs.invalid(
                "spec.nodeName".into(),
                "",
                "must be either unset or set to a non-empty string",
            ),
        }
    }
    if set(spec, "nodeSelector") {
        chosen.push("`nodeSelector`");
        let terms = spec
            .pointer("/nodeSelector/nodeSelectorTerms")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if terms == 0 {
            errs.required(
                "spec.nodeSelector.nodeSelectorTerms".into(),
                "must have at least one node selector term",
            );
        }
        if terms != 1 {
            errs.invalid_bare(
                "spec.nodeSelector.nodeSelectorTerms".into(),
                format!("[{terms} terms]"),
                "must have exactly one node selector term",
            );
        }
    }
    for (key, label) in [
        ("allNodes", "`allNodes`"),
        ("perDeviceNodeSelection", "`perDeviceNodeSelection`"),
    ] {
        if set(spec, key) {
            if spec.get(key).and_then(Value::as_bool) == Some(true) {
                chosen.push(label);
            } else {
                errs.invalid_bare(
                    format!("spec.{key}"),
                    false,
                    "must be either unset or set to true",
                );
            }
        }
    }
    match chosen.len() {
        0 => errs.required(
            "spec".into(),
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        ),
        1 => {}
        _ => errs.invalid(
            "spec".into(),
            &format!("{{{}}}", chosen.join(", ")),
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set",
        ),
    }
    // 1.35+: "Only one of Devices and SharedCounters can be set in a ResourceSlice."
    if set(spec, "sharedCounters") && set(spec, "devices") {
        errs.invalid(
            "spec".into(),
            "",
            "only one of `sharedCounters` or `devices` is allowed",
        );
    }
    let devices = array(spec, "devices");
    let advanced = devices
        .iter()
        .any(|d| !array(d, "consumesCounters").is_empty() || !array(d, "taints").is_empty());
    let max = if advanced {
        SLICE_MAX_DEVICES_ADVANCED
    } else {
        SLICE_MAX_DEVICES
    };
    let per_device = spec.get("perDeviceNodeSelection").and_then(Value::as_bool) == Some(true);
    if devices.len() > max {
        // validateSet short-circuits on the size.
        errs.too_many("spec.devices".into(), devices.len(), max);
    } else {
        let mut names = BTreeSet::new();
        for (i, d) in devices.iter().enumerate() {
            let at = format!("spec.devices[{i}]");
            device(&mut errs, &at, d, per_device);
            let n = str_of(d, "name").unwrap_or_default();
            if !names.insert(n) {
                errs.duplicate(at, n);
            }
        }
    }
    let sets = array(spec, "sharedCounters");
    if sets.len() > SLICE_MAX_COUNTER_SETS {
        errs.too_many(
            "spec.sharedCounters".into(),
            sets.len(),
            SLICE_MAX_COUNTER_SETS,
        );
    } else {
        let mut names = BTreeSet::new();
        for (i, s) in sets.iter().enumerate() {
            let at = format!("spec.sharedCounters[{i}]");
            let n = str_of(s, "name").unwrap_or_default();
            if n.is_empty() {
                errs.required(format!("{at}.name"), "");
            } else {
                dns_label(&mut errs, format!("{at}.name"), n);
            }
            counters(
                &mut errs,
                &format!("{at}.counters"),
                s.get("counters"),
                MAX_COUNTERS_PER_SET,
            );
            if !names.insert(n) {
                errs.duplicate(at, n);
            }
        }
    }
    errs.into_result(Resource::Slices, &name)
}

/// `validateDevice`.
fn device(errs: &mut Errors, at: &str, d: &Value, per_device: bool) {
    let name = str_of(d, "name").unwrap_or_default();
    if name.is_empty() {
        errs.required(format!("{at}.name"), "");
    } else {
        dns_label(errs, format!("{at}.name"), name);
    }
    // validateSingleAllocatableDeviceCapacity: no consumable capacity on a
    // device that cannot be allocated more than once.
    let multiple = d.get("allowMultipleAllocations").and_then(Value::as_bool) == Some(true);
    if !multiple {
        for (k, c) in d
            .get("capacity")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if set(c, "requestPolicy") {
                errs.forbidden(
                    format!("{at}.capacity[{k}].requestPolicy"),
                    "allowMultipleAllocations must be true",
                );
            }
        }
    }
    let consumes = array(d, "consumesCounters");
    if consumes.len() > MAX_CONSUMPTIONS_PER_DEVICE {
        errs.too_many(
            format!("{at}.consumesCounters"),
            consumes.len(),
            MAX_CONSUMPTIONS_PER_DEVICE,
        );
    } else {
        let mut seen = BTreeSet::new();
        for (j, c) in consumes.iter().enumerate() {
            let cat = format!("{at}.consumesCounters[{j}]");
            let set_name = str_of(c, "counterSet").unwrap_or_default();
            if set_name.is_empty() {
                errs.required(format!("{cat}.counterSet"), "");
            } else {
                dns_label(errs, format!("{cat}.counterSet"), set_name);
            }
            counters(
                errs,
                &format!("{cat}.counters"),
                c.get("counters"),
                MAX_COUNTERS_PER_CONSUMPTION,
            );
            if !seen.insert(set_name) {
                errs.duplicate(cat, set_name);
            }
        }
    }
    let own = ["nodeName", "nodeSelector", "allNodes"]
        .iter()
        .filter(|k| set(d, k))
        .count();
    if per_device {
        if own != 1 {
            let detail = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec";
            if own == 0 {
                errs.required(at.into(), detail);
            } else {
                errs.invalid_bare(at.into(), "<fields>", detail);
            }
        }
    } else if own > 0 {
        errs.invalid_bare(
            at.into(),
            "null",
            "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        );
    }
}

/// The request names of a claim's spec (`gatherRequestNames`): a request,
/// with its `firstAvailable` subrequests.
fn request_names(claim: &Value) -> BTreeMap<String, BTreeSet<String>> {
    claim
        .pointer("/spec/devices/requests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            let subs = array(r, "firstAvailable")
                .iter()
                .filter_map(|s| str_of(s, "name").map(str::to_string))
                .collect();
            (str_of(r, "name").unwrap_or_default().to_string(), subs)
        })
        .collect()
}

/// `requestNames.Has`: `request` names a request, or `request/subrequest` a
/// subrequest of one.
fn names_request(names: &BTreeMap<String, BTreeSet<String>>, s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    match parts.as_slice() {
        [r] => names.contains_key(*r),
        [r, sub] => names.get(*r).is_some_and(|subs| subs.contains(*sub)),
        _ => false,
    }
}

/// `validateUID` (google/uuid `Validate`, then the normalized form).
fn uid(errs: &mut Errors, field: String, s: &str) {
    let hex_at = |i: usize| s.as_bytes()[i].is_ascii_hexdigit();
    let parse_error = match s.len() {
        36 => {
            let dashes = [8, 13, 18, 23];
            let ok = (0..36).all(|i| {
                if dashes.contains(&i) {
                    s.as_bytes()[i] == b'-'
                } else {
                    hex_at(i)
                }
            });
            (!ok).then_some("invalid UUID format".to_string())
        }
        // The 32-digit, braced and urn forms parse, but are not normalized.
        32 | 38 | 45 => None,
        n => Some(format!("invalid UUID length: {n}")),
    };
    if let Some(e) = parse_error {
        errs.invalid(field, s, &format!("error validating uid: {e}"));
    } else if s.len() != 36 || s != s.to_ascii_lowercase() {
        errs.invalid(
            field,
            s,
            "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters",
        );
    }
}

/// `ValidateResourceClaimStatusUpdate` (`validateResourceClaimStatusUpdate`,
/// `validateAllocationResult`, `validateDeviceRequestAllocationResult`) for
/// what it adds to the double's existing claim rules: `new` is the claim after
/// the status strategy (spec and metadata as stored).
pub fn claim_status(old: &Value, new: &Value) -> Result<(), ApiError> {
    let name = key_of(old).1;
    let mut errs = Errors::default();
    let reserved = |c: &Value| -> Vec<Value> {
        c.pointer("/status/reservedFor")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (was, is) = (reserved(old), reserved(new));
    for (i, r) in is.iter().enumerate() {
        // validateResourceClaimUserReference.
        for f in ["resource", "name", "uid"] {
            if str_of(r, f).unwrap_or_default().is_empty() {
                errs.required(format!("status.reservedFor[{i}].{f}"), "");
            }
        }
    }
    // "Items may be removed from ReservedFor while the claim is meant to be
    // deallocated, but not added" (claimDeleted: a deletionTimestamp).
    let deleted = new
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    let allocated = |c: &Value| {
        c.pointer("/status/allocation")
            .filter(|a| !a.is_null())
            .cloned()
    };
    if deleted && allocated(new).is_some() && is.iter().any(|r| !was.contains(r)) {
        errs.forbidden(
            "status.reservedFor".into(),
            "new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set",
        );
    }
    // A new allocation (an unchanged one is not validated again).
    if let (None, Some(a)) = (allocated(old), allocated(new)) {
        let names = request_names(new);
        let results = a
            .pointer("/devices/results")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let at = "status.allocation.devices.results";
        if results.len() > ALLOCATION_RESULTS_MAX {
            // validateSlice short-circuits on the size.
            errs.too_many(at.into(), results.len(), ALLOCATION_RESULTS_MAX);
        } else {
            for (i, r) in results.iter().enumerate() {
                let rat = format!("{at}[{i}]");
                // validateRequestNameRef.
                let request = str_of(r, "request").unwrap_or_default();
                let segments: Vec<&str> = request.split('/').collect();
                let ref_msg = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'";
                if segments.len() > 2 {
                    errs.invalid(format!("{rat}.request"), request, ref_msg);
                } else {
                    for s in &segments {
                        if s.is_empty() {
                            errs.required(format!("{rat}.request"), "");
                        } else {
                            dns_label(&mut errs, format!("{rat}.request"), s);
                        }
                    }
                    if !names_request(&names, request) {
                        errs.invalid(format!("{rat}.request"), request, ref_msg);
                    }
                }
                driver_name(
                    &mut errs,
                    format!("{rat}.driver"),
                    str_of(r, "driver").unwrap_or_default(),
                );
                pool_name(
                    &mut errs,
                    format!("{rat}.pool"),
                    str_of(r, "pool").unwrap_or_default(),
                );
                let device = str_of(r, "device").unwrap_or_default();
                if device.is_empty() {
                    errs.required(format!("{rat}.device"), "");
                } else {
                    dns_label(&mut errs, format!("{rat}.device"), device);
                }
                if set(r, "shareID") {
                    uid(
                        &mut errs,
                        format!("{rat}.shareID"),
                        str_of(r, "shareID").unwrap_or_default(),
                    );
                }
            }
        }
        // corevalidation.ValidateNodeSelector: at least one term.
        if set(&a, "nodeSelector")
            && a.pointer("/nodeSelector/nodeSelectorTerms")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
        {
            errs.required(
                "status.allocation.nodeSelector.nodeSelectorTerms".into(),
                "must have at least one node selector term",
            );
        }
    }
    errs.into_result(Resource::Claims, &name)
}
