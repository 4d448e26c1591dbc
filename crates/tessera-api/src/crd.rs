//! The CRDs as the chart ships them: kube's generated schema, with only the
//! `format`s a Kubernetes API server knows. schemars writes `uint8`, `uint32`
//! and `uint64` for unsigned integers; a 1.36 API server warns
//! "unrecognized format" about each on every apply (issue 41, defect 11).
//! The range stays in the schema (`minimum: 0`, and `maximum` where schemars
//! writes one).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The formats an API server recognises in a CRD schema: OpenAPI's own
/// (`int32`, `int64`, `float`, `double`, `byte`, `binary`, `date`,
/// `date-time`, `password`) and those of kube-openapi's `strfmt` registry.
pub const KNOWN_FORMATS: &[&str] = &[
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "binary",
    "date",
    "date-time",
    "datetime",
    "duration",
    "password",
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
];

/// `K`'s CRD with every format outside [`KNOWN_FORMATS`] removed.
pub fn crd_of<K: CustomResourceExt>() -> CustomResourceDefinition {
    let mut value = serde_json::to_value(K::crd())
        .unwrap_or_else(|e| unreachable!("a generated CRD serialises: {e}"));
    strip_unknown_formats(&mut value);
    serde_json::from_value(value).unwrap_or_else(|e| unreachable!("and reads back: {e}"))
}

/// Removes every `format` outside [`KNOWN_FORMATS`] from a JSON schema (or a
/// CRD holding schemas), in place.
pub fn strip_unknown_formats(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if map
                .get("format")
                .and_then(|f| f.as_str())
                .is_some_and(|f| !KNOWN_FORMATS.contains(&f))
                && map.get("type").is_some_and(|t| t.is_string())
            {
                map.remove("format");
            }
            map.values_mut().for_each(strip_unknown_formats);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_unknown_formats),
        _ => {}
    }
}

/// Every `format` in a JSON value, with where it is.
pub fn formats(value: &serde_json::Value, at: &str, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            if let (Some(f), Some(_)) = (
                map.get("format").and_then(|f| f.as_str()),
                map.get("type").and_then(|t| t.as_str()),
            ) {
                out.push((at.to_string(), f.to_string()));
            }
            for (k, v) in map {
                formats(v, &format!("{at}/{k}"), out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                formats(v, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GpuNode, GpuQueue};

    #[test]
    fn only_known_formats_are_shipped_and_ranges_stay() {
        for (crd, raw) in [
            (crd_of::<GpuNode>(), GpuNode::crd()),
            (crd_of::<GpuQueue>(), GpuQueue::crd()),
        ] {
            let mut before = Vec::new();
            formats(&serde_json::to_value(&raw).unwrap(), "", &mut before);
            assert!(
                before.iter().any(|(_, f)| f.starts_with("uint")),
                "schemars writes uint formats: {before:?}"
            );
            let shipped = serde_json::to_value(&crd).unwrap();
            let mut after = Vec::new();
            formats(&shipped, "", &mut after);
            let unknown: Vec<_> = after
                .iter()
                .filter(|(_, f)| !KNOWN_FORMATS.contains(&f.as_str()))
                .collect();
            assert!(unknown.is_empty(), "{unknown:?}");
            // Where a uint format was, the lower bound is still there.
            for (at, f) in before.iter().filter(|(_, f)| f.starts_with("uint")) {
                let node = shipped.pointer(at).unwrap_or_else(|| panic!("{at} ({f})"));
                assert_eq!(node["minimum"].as_f64(), Some(0.0), "{at} ({f}): {node}");
            }
        }
    }

    #[test]
    fn a_property_named_format_is_left_alone() {
        let mut v = serde_json::json!({"properties": {"format": {"type": "string"}},
            "type": "object"});
        let want = v.clone();
        strip_unknown_formats(&mut v);
        assert_eq!(v, want);
    }
}
