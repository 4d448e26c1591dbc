//! Tolerations the mutating webhook gives the pods it sends to Tessera.
//!
//! Where Tessera's nodes are tainted (`tessera.io/managed=true:NoSchedule`, see
//! docs/kubernetes.md §2b) so that the default scheduler never sends a stock
//! GPU pod there — the node agent would refuse it at admission, having no grant
//! for it — the pods Tessera places need the matching toleration. The operator
//! names it once (`--pod-toleration`, the chart's `webhook.podTolerations`) in
//! `kubectl taint`'s syntax, and the webhook adds it to every pod it hands to
//! Tessera, so manifests need no change.

use k8s_openapi::api::core::v1::Toleration;

/// Taint effects a toleration may name.
const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// A `--pod-toleration` that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pod toleration {given:?}: {why} (want KEY[=VALUE]:EFFECT, e.g. tessera.io/managed=true:NoSchedule)"
)]
pub struct TolerationError {
    pub given: String,
    pub why: String,
}

/// Parses `KEY[=VALUE]:EFFECT` (as `kubectl taint` writes a taint): with a
/// value the toleration is `Equal` to it, without one it is `Exists`.
pub fn parse_toleration(given: &str) -> Result<Toleration, TolerationError> {
    let err = |why: &str| TolerationError {
        given: given.to_string(),
        why: why.to_string(),
    };
    let (key_value, effect) = given.rsplit_once(':').ok_or_else(|| err("no :EFFECT"))?;
    if !EFFECTS.contains(&effect) {
        return Err(err(&format!("effect {effect:?} is none of {EFFECTS:?}")));
    }
    let (key, value) = match key_value.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (key_value, None),
    };
    if key.is_empty() {
        return Err(err("empty key"));
    }
    if key.contains(char::is_whitespace) || value.is_some_and(|v| v.contains(char::is_whitespace)) {
        return Err(err("whitespace in the key or value"));
    }
    Ok(Toleration {
        key: Some(key.to_string()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_string()),
        value: value.map(str::to_string),
        effect: Some(effect.to_string()),
        toleration_seconds: None,
    })
}

/// Whether `have` already tolerates what `want` tolerates (same key and effect,
/// and `Exists`, or the same value), so it is not added twice.
pub fn covers(have: &Toleration, want: &Toleration) -> bool {
    let effect_ok = match have.effect.as_deref() {
        None | Some("") => true,
        e => e == want.effect.as_deref(),
    };
    let key_ok = match have.key.as_deref() {
        // An empty key with Exists tolerates every taint.
        None | Some("") => have.operator.as_deref() == Some("Exists"),
        k => k == want.key.as_deref(),
    };
    let value_ok = have.operator.as_deref() == Some("Exists")
        || have.value.as_deref().unwrap_or("") == want.value.as_deref().unwrap_or("");
    effect_ok && key_ok && value_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubectl_taint_syntax() {
        let t = parse_toleration("tessera.io/managed=true:NoSchedule").unwrap();
        assert_eq!(t.key.as_deref(), Some("tessera.io/managed"));
        assert_eq!(t.operator.as_deref(), Some("Equal"));
        assert_eq!(t.value.as_deref(), Some("true"));
        assert_eq!(t.effect.as_deref(), Some("NoSchedule"));
        let t = parse_toleration("tessera.io/managed:NoExecute").unwrap();
        assert_eq!(t.operator.as_deref(), Some("Exists"));
        assert_eq!(t.value, None);
        for bad in [
            "tessera.io/managed",
            "tessera.io/managed=true:Never",
            "=true:NoSchedule",
            ":NoSchedule",
            "a b:NoSchedule",
        ] {
            let e = parse_toleration(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn an_existing_toleration_covers_the_same_or_wider() {
        let want = parse_toleration("tessera.io/managed=true:NoSchedule").unwrap();
        let t =
            |key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>| Toleration {
                key: key.map(Into::into),
                operator: Some(op.into()),
                value: value.map(Into::into),
                effect: effect.map(Into::into),
                toleration_seconds: None,
            };
        assert!(covers(&want, &want));
        assert!(covers(
            &t(Some("tessera.io/managed"), "Exists", None, None),
            &want
        ));
        assert!(
            covers(&t(None, "Exists", None, None), &want),
            "tolerates everything"
        );
        assert!(!covers(
            &t(Some("tessera.io/managed"), "Equal", Some("false"), None),
            &want
        ));
        assert!(!covers(&t(Some("other"), "Exists", None, None), &want));
        assert!(!covers(
            &t(
                Some("tessera.io/managed"),
                "Exists",
                None,
                Some("NoExecute")
            ),
            &want
        ));
    }
}
