//! Tolerations the mutating webhook gives the pods it sends to Tessera.
//!
//! Where Tessera's nodes are tainted (`tessera.io/managed=true:NoSchedule`, see
//! docs/kubernetes.md §2b) so that the default scheduler never sends a stock
//! GPU pod there — the node agent would refuse it at admission, having no grant
//! for it — the pods Tessera places need the matching toleration. The operator
//! names the taint once (`--pod-toleration`, the chart's `webhook.podTolerations`)
//! in `kubectl taint`'s syntax, and the webhook adds a toleration of it to every
//! pod it hands to Tessera that does not tolerate it already (judged by
//! [`crate::convert::tolerates`], the scheduler's own rule), so manifests need
//! no change.

use k8s_openapi::api::core::v1::{Taint, Toleration};

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

/// Parses the taint to tolerate, `KEY[=VALUE]:EFFECT` as `kubectl taint`
/// writes it.
pub fn parse_taint(given: &str) -> Result<Taint, TolerationError> {
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
    Ok(Taint {
        key: key.to_string(),
        value: value.map(str::to_string),
        effect: effect.to_string(),
        time_added: None,
    })
}

/// The toleration the webhook adds for `taint`: `Equal` to its value, or
/// `Exists` when it has none.
pub fn toleration_for(taint: &Taint) -> Toleration {
    Toleration {
        key: Some(taint.key.clone()),
        operator: Some(
            if taint.value.is_some() {
                "Equal"
            } else {
                "Exists"
            }
            .to_string(),
        ),
        value: taint.value.clone(),
        effect: Some(taint.effect.clone()),
        toleration_seconds: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::tolerates;

    #[test]
    fn parses_kubectl_taint_syntax() {
        let parse = |s| parse_taint(s).map(|t| toleration_for(&t));
        let t = parse("tessera.io/managed=true:NoSchedule").unwrap();
        assert_eq!(t.key.as_deref(), Some("tessera.io/managed"));
        assert_eq!(t.operator.as_deref(), Some("Equal"));
        assert_eq!(t.value.as_deref(), Some("true"));
        assert_eq!(t.effect.as_deref(), Some("NoSchedule"));
        let t = parse("tessera.io/managed:NoExecute").unwrap();
        assert_eq!(t.operator.as_deref(), Some("Exists"));
        assert_eq!(t.value, None);
        for bad in [
            "tessera.io/managed",
            "tessera.io/managed=true:Never",
            "=true:NoSchedule",
            ":NoSchedule",
            "a b:NoSchedule",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    /// A pod's own toleration of the same key and effect, or a wider one,
    /// already tolerates the taint: nothing is added beside it.
    #[test]
    fn an_existing_toleration_covers_the_same_or_wider() {
        let taint = parse_taint("tessera.io/managed=true:NoSchedule").unwrap();
        let t =
            |key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>| Toleration {
                key: key.map(Into::into),
                operator: Some(op.into()),
                value: value.map(Into::into),
                effect: effect.map(Into::into),
                toleration_seconds: None,
            };
        assert!(tolerates(&toleration_for(&taint), &taint));
        assert!(tolerates(
            &t(Some("tessera.io/managed"), "Exists", None, None),
            &taint
        ));
        assert!(
            tolerates(&t(None, "Exists", None, None), &taint),
            "tolerates everything"
        );
        assert!(!tolerates(
            &t(Some("tessera.io/managed"), "Equal", Some("false"), None),
            &taint
        ));
        assert!(!tolerates(&t(Some("other"), "Exists", None, None), &taint));
        assert!(!tolerates(
            &t(
                Some("tessera.io/managed"),
                "Exists",
                None,
                Some("NoExecute")
            ),
            &taint
        ));
    }
}
