//! events.k8s.io/v1 validation as recorded (file 13). core/v1 events are
//! accepted as they come; both are counted by the double's request counters.

use serde_json::Value;

use super::leases::{is_micro_time, micro_time_error};
use super::status::{self, ApiError, Cause};
use super::store::{Resource, key_of};

const NAME_PART: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

fn name_part_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

fn subdomain_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn cause(reason: &'static str, field: &str, message: String) -> Cause {
    Cause {
        reason,
        message,
        field: field.into(),
    }
}

/// Checks an events.k8s.io/v1 Event the way the v1.28 server did.
pub fn validate(ev: &Value) -> Result<(), ApiError> {
    let s = |f: &str| ev.get(f).and_then(Value::as_str).unwrap_or_default();
    if !s("eventTime").is_empty() && !is_micro_time(s("eventTime")) {
        return Err(micro_time_error("Event", s("eventTime")));
    }
    let (namespace, name) = key_of(ev);
    let mut causes = Vec::new();
    if let Some(prefix) = ev.pointer("/metadata/generateName").and_then(Value::as_str)
        && (prefix.ends_with('.') || !subdomain_ok(prefix.trim_end_matches('-')))
    {
        causes.push(cause(
            "FieldValueInvalid",
            "metadata.generateName",
            format!("Invalid value: \"{prefix}\": {SUBDOMAIN}"),
        ));
    }
    let controller = s("reportingController");
    if controller.is_empty() {
        causes.push(cause(
            "FieldValueRequired",
            "reportingController",
            "Required value".into(),
        ));
        causes.push(cause(
            "FieldValueInvalid",
            "reportingController",
            "Invalid value: \"\": name part must be non-empty".into(),
        ));
        causes.push(cause(
            "FieldValueInvalid",
            "reportingController",
            format!("Invalid value: \"\": {NAME_PART}"),
        ));
    } else {
        let part = controller.rsplit('/').next().unwrap_or_default();
        let prefix_ok = controller
            .rsplit_once('/')
            .is_none_or(|(p, _)| subdomain_ok(p));
        if !name_part_ok(part) || !prefix_ok {
            causes.push(cause(
                "FieldValueInvalid",
                "reportingController",
                format!("Invalid value: \"{controller}\": {NAME_PART}"),
            ));
        }
    }
    for f in ["reportingInstance", "action", "reason", "eventTime"] {
        if s(f).is_empty() {
            causes.push(cause("FieldValueRequired", f, "Required value".into()));
        }
    }
    let type_ = s("type");
    if type_ != "Normal" && type_ != "Warning" {
        causes.push(cause(
            "FieldValueInvalid",
            "type",
            format!("Invalid value: \"\": has invalid value: {type_}"),
        ));
    }
    let regarding_ns = ev
        .pointer("/regarding/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if regarding_ns != namespace {
        causes.push(cause(
            "FieldValueInvalid",
            "involvedObject.namespace",
            format!("Invalid value: \"{regarding_ns}\": does not match event.namespace"),
        ));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(status::invalid(Resource::Events, &name, causes))
    }
}
