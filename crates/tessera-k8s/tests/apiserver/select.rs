//! Label and field selectors as the API server parses them for LIST and WATCH.
//!
//! Field selectors support only the fields each resource registers; anything
//! else is the recorded `400 field label not supported: …` (file 17).

use serde_json::Value;

use super::status::{ApiError, bad_request};
use super::store::Resource;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Exists(String),
    Absent(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector`; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits on commas outside parentheses (`a in (x,y),b`).
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn set_values(s: &str) -> Vec<String> {
    s.trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(|v| v.trim().to_string())
        .collect()
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let req = if let Some(k) = p.strip_prefix('!') {
                LabelReq::Absent(k.trim().into())
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(v))
            } else if let Some((k, v)) = p.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(v))
            } else if p.contains(' ') || p.contains('(') {
                return Err(bad_request(format!("unable to parse requirement: {p:?}")));
            } else {
                LabelReq::Exists(p.into())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::Absent(k) => get(k).is_none(),
            LabelReq::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        })
    }
}

/// A parsed `fieldSelector`; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Where a selectable field lives in the object; `None`: not selectable.
fn field_pointer(resource: Resource, field: &str) -> Option<&'static str> {
    let common = match field {
        "metadata.name" => Some("/metadata/name"),
        "metadata.namespace" => Some("/metadata/namespace"),
        _ => None,
    };
    if common.is_some() {
        return common;
    }
    match (resource, field) {
        (Resource::Pods, "spec.nodeName") => Some("/spec/nodeName"),
        (Resource::Pods, "spec.schedulerName") => Some("/spec/schedulerName"),
        (Resource::Pods, "spec.restartPolicy") => Some("/spec/restartPolicy"),
        (Resource::Pods, "spec.serviceAccountName") => Some("/spec/serviceAccountName"),
        (Resource::Pods, "status.phase") => Some("/status/phase"),
        (Resource::Pods, "status.podIP") => Some("/status/podIP"),
        (Resource::Pods, "status.nominatedNodeName") => Some("/status/nominatedNodeName"),
        (Resource::Nodes, "spec.unschedulable") => Some("/spec/unschedulable"),
        _ => None,
    }
}

impl FieldSelector {
    pub fn parse(resource: Resource, s: &str) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let (field, equal, value) = if let Some((f, v)) = p.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = p.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = p.split_once('=') {
                (f, true, v)
            } else {
                return Err(bad_request(format!("invalid selector: '{p}'")));
            };
            if field_pointer(resource, field).is_none() {
                return Err(bad_request(format!("field label not supported: {field}")));
            }
            reqs.push((field.to_string(), equal, value.to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, resource: Resource, obj: &Value) -> bool {
        self.0.iter().all(|(field, equal, want)| {
            let got = field_pointer(resource, field)
                .and_then(|p| obj.pointer(p))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    Value::Bool(b) => b.to_string(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            (got == *want) == *equal
        })
    }
}
