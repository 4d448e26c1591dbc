//! The three patch formats the server takes: JSON merge patch (RFC 7386),
//! strategic merge patch (merge patch plus lists merged by their key, for the
//! lists a scheduler touches), and JSON patch (RFC 6902, where any failing
//! operation is the recorded generic 422 and a `test` without `value` is the
//! recorded dropped connection, file 05).

use serde_json::{Map, Value};

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq)]
pub enum PatchError {
    /// Any JSON-patch operation failed: the generic 422.
    OpFailed,
    /// The body is not a patch of this type: 400 with this text.
    Malformed(String),
    /// A `test` op without `value`: v1.28.0 panics and closes the connection.
    ServerPanic,
}

/// RFC 7386: objects merge, `null` deletes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The merge key of a list field, by the field's name (`patchMergeKey` in the API types).
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "schedulingGates"
        | "volumes"
        | "env"
        | "imagePullSecrets" => Some("name"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

/// Strategic merge patch: a merge patch, except that keyed lists merge item by
/// item, `finalizers` merge as a set, and `$patch: delete` removes an item.
pub fn strategic(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        match (v, merge_key(k), t.get_mut(k)) {
            (Value::Null, _, _) => {
                t.remove(k);
            }
            (Value::Array(items), Some(key), Some(Value::Array(current))) => {
                // The patch's items in patch order, then the items only the server has
                // (file 12: a gate added by strategic merge lands at index 0).
                let mut merged = Vec::new();
                for item in items {
                    let id = item.get(key).cloned();
                    let pos = current.iter().position(|c| c.get(key) == id.as_ref());
                    let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                    let existing = pos.map(|i| current.remove(i));
                    match (existing, delete) {
                        (_, true) => {}
                        (Some(mut e), false) => {
                            strategic(&mut e, item);
                            merged.push(e);
                        }
                        (None, false) => merged.push(item.clone()),
                    }
                }
                merged.append(current);
                *current = merged;
            }
            (Value::Array(items), None, Some(Value::Array(current))) if k == "finalizers" => {
                for item in items {
                    if !current.contains(item) {
                        current.push(item.clone());
                    }
                }
            }
            (Value::Object(_), _, Some(existing)) => strategic(existing, v),
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn tokens(path: &str) -> Result<Vec<String>, PatchError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path.strip_prefix('/').ok_or(PatchError::OpFailed)?;
    Ok(rest.split('/').map(unescape).collect())
}

fn parent_mut<'a>(doc: &'a mut Value, toks: &[String]) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m.get_mut(t).ok_or(PatchError::OpFailed)?,
            Value::Array(a) => {
                let i: usize = t.parse().map_err(|_| PatchError::OpFailed)?;
                a.get_mut(i).ok_or(PatchError::OpFailed)?
            }
            _ => return Err(PatchError::OpFailed),
        };
    }
    Ok(cur)
}

fn get<'a>(doc: &'a Value, toks: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m.get(t)?,
            Value::Array(a) => a.get(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn add(doc: &mut Value, toks: &[String], value: Value) -> Result<(), PatchError> {
    let Some((last, parent)) = toks.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, parent)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(value);
            } else {
                let i: usize = last.parse().map_err(|_| PatchError::OpFailed)?;
                if i > a.len() {
                    return Err(PatchError::OpFailed);
                }
                a.insert(i, value);
            }
        }
        _ => return Err(PatchError::OpFailed),
    }
    Ok(())
}

fn remove(doc: &mut Value, toks: &[String]) -> Result<Value, PatchError> {
    let (last, parent) = toks.split_last().ok_or(PatchError::OpFailed)?;
    match parent_mut(doc, parent)? {
        Value::Object(m) => m.remove(last).ok_or(PatchError::OpFailed),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| PatchError::OpFailed)?;
            if i >= a.len() {
                return Err(PatchError::OpFailed);
            }
            Ok(a.remove(i))
        }
        _ => Err(PatchError::OpFailed),
    }
}

/// RFC 6902, as evanphx/json-patch applies it: `test` of `null` also passes on
/// an absent member (file 05: `test /spec/nodeName null` on an unbound pod).
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        PatchError::Malformed(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch".into(),
        )
    })?;
    for op in ops {
        let name = op.get("op").and_then(Value::as_str).unwrap_or_default();
        let path = tokens(op.get("path").and_then(Value::as_str).unwrap_or_default())?;
        match name {
            "add" => add(
                doc,
                &path,
                op.get("value").cloned().ok_or(PatchError::OpFailed)?,
            )?,
            "remove" => {
                remove(doc, &path)?;
            }
            "replace" => {
                let value = op.get("value").cloned().ok_or(PatchError::OpFailed)?;
                remove(doc, &path)?;
                add(doc, &path, value)?;
            }
            "test" => {
                let want = op.get("value").ok_or(PatchError::ServerPanic)?;
                let ok = match get(doc, &path) {
                    None => want.is_null(),
                    Some(v) => v == want,
                };
                if !ok {
                    return Err(PatchError::OpFailed);
                }
            }
            "move" | "copy" => {
                let from = tokens(op.get("from").and_then(Value::as_str).unwrap_or_default())?;
                let value = if name == "move" {
                    remove(doc, &from)?
                } else {
                    get(doc, &from).cloned().ok_or(PatchError::OpFailed)?
                };
                add(doc, &path, value)?;
            }
            other => {
                return Err(PatchError::Malformed(format!("Unexpected kind: {other}")));
            }
        }
    }
    Ok(())
}
