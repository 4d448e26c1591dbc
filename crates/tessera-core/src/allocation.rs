//! The allocation annotation: the contract between the scheduler and the node agent.
//!
//! The scheduler writes one [`Allocation`] per pod into the pod annotation
//! [`ANNOTATION`] before it binds the pod; the node agent reads it back when the
//! kubelet calls `Allocate` and hands the container exactly those GPUs. Both sides
//! use this module, so neither links the other.
//!
//! The value is JSON. It carries an HMAC-SHA256 signature over its canonical
//! payload, keyed by a secret that only the scheduler and the node agents hold
//! (a Kubernetes Secret mounted into both). A pod that writes the annotation
//! itself cannot produce a valid signature, and a decision copied from another
//! pod names the wrong pod UID: the agent refuses both.
//!
//! # Which container gets which GPU
//!
//! The kubelet calls the device plugin once per container that asks GPUs. When
//! more than one container of a pod asks GPUs, [`Allocation::containers`] says
//! which of the pod's GPUs each one gets (positions in [`Allocation::gpus`],
//! from [`crate::containers::assign`]). With one such container the list is
//! empty and that container gets every GPU, as before the list existed.
//!
//! The list is left out of the JSON when empty, so the format keeps
//! [`VERSION`] 1: annotations written before it decode and verify unchanged (the
//! signed payload is the same bytes), and a scheduler writes it only for pods
//! that an older agent could not serve correctly anyway: such an agent refuses
//! the unknown field (fail closed) instead of handing every container every GPU.
//! A new version number would buy nothing but refusing old annotations too.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::request::Isolation;

/// The pod annotation that holds the scheduler's decision.
pub const ANNOTATION: &str = "tessera.io/allocation";
/// Current version of the annotation format.
pub const VERSION: u32 = 1;

/// One pod's placement as written by the scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allocation {
    /// Format version, [`VERSION`].
    pub version: u32,
    /// UID of the pod the decision is for (guards against a copied annotation).
    pub pod_uid: String,
    /// `namespace/name` of the pod, for humans and logs.
    pub pod: String,
    /// Node the pod was placed on.
    pub node: String,
    /// Policy that made the decision.
    pub policy: String,
    /// How the GPUs are shared.
    pub isolation: Isolation,
    /// The GPUs (or GPU shares, or MIG instances) given to the pod.
    pub gpus: Vec<AllocatedGpu>,
    /// Which of `gpus` each container gets, when more than one container asks GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerGrant>,
    /// Base64 HMAC-SHA256 of the canonical payload (everything but this field).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
}

/// One GPU (or share of one, or MIG slice of one) in an [`Allocation`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllocatedGpu {
    /// Index of the GPU on its node (NVML index).
    pub index: u32,
    /// UUID of the physical GPU (`GPU-…`), when the inventory knows it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// GPU memory granted, in MiB.
    pub memory_mib: u64,
    /// Compute granted, in per-mille of the GPU (1000 = all of it).
    pub cores_milli: u32,
    /// The MIG instance, when the grant is a MIG slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigGrant>,
}

/// The GPUs one container of the pod gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerGrant {
    /// The container's name in the pod spec.
    pub name: String,
    /// Positions in [`Allocation::gpus`].
    pub gpus: Vec<u32>,
}

/// A MIG GPU instance: its profile and where it sits on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigGrant {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice of the placement.
    pub start: u8,
    /// Memory slices of the placement.
    pub size: u8,
    /// UUID of the MIG device (`MIG-…`) when it exists already.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// The scheduler planned this instance: the node agent creates it (GPU instance
    /// and compute instance at exactly `start`) before handing it out. Left out of
    /// the JSON when false, so annotations of existing instances keep their bytes and
    /// signatures; an agent that predates the field refuses it (fail closed).
    #[serde(default, skip_serializing_if = "is_false")]
    pub create: bool,
    /// The GPU must first be switched into MIG mode (it is idle: nothing runs on it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub enable_mig_mode: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Why an annotation value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocationError {
    #[error("allocation annotation is not valid JSON for this format: {0}")]
    Malformed(String),
    #[error("allocation annotation has version {found}, this build understands {VERSION}")]
    Version { found: u32 },
    #[error("allocation annotation is not signed by the scheduler")]
    Unsigned,
    #[error("allocation annotation signature does not match: it was not written by the scheduler")]
    BadSignature,
    #[error("allocation annotation is for pod UID {found}, not {expected}")]
    WrongPod { expected: String, found: String },
    #[error("allocation annotation is for node {found}, not {expected}")]
    WrongNode { expected: String, found: String },
    #[error("allocation annotation grants no GPU")]
    Empty,
    #[error("allocation annotation's container list is inconsistent: {0}")]
    BadContainers(String),
}

type HmacSha256 = Hmac<Sha256>;

/// The keys a signed annotation is checked against: [`KeyRing`], or one bare key
/// (`&[u8]`, `Vec<u8>`, `b"…"`).
pub trait VerifyingKeys {
    /// Every key that verifies, the signing key first.
    fn verifying_keys(&self) -> Vec<&[u8]>;
}

impl VerifyingKeys for [u8] {
    fn verifying_keys(&self) -> Vec<&[u8]> {
        vec![self]
    }
}

impl VerifyingKeys for Vec<u8> {
    fn verifying_keys(&self) -> Vec<&[u8]> {
        vec![self.as_slice()]
    }
}

impl<const N: usize> VerifyingKeys for [u8; N] {
    fn verifying_keys(&self) -> Vec<&[u8]> {
        vec![self.as_slice()]
    }
}

/// The scheduler's signing key and the keys that only verify.
///
/// Rotating the key must not orphan running grants: an annotation signed with
/// the old key has to keep verifying, on the node agent (or the container's
/// next `Allocate` is refused) and in the scheduler (or it stops counting the
/// pod's GPUs and grants them again). So the old key stays as a verify-only
/// key until every pod it signed for has ended; a new key can likewise be
/// handed to the agents as verify-only before the scheduler signs with it.
/// The scheduler signs with [`KeyRing::signing`] only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeyRing {
    signing: Vec<u8>,
    verify_only: Vec<Vec<u8>>,
}

impl KeyRing {
    /// A ring with one key that signs and verifies.
    pub fn new(signing: Vec<u8>) -> KeyRing {
        KeyRing {
            signing,
            verify_only: Vec::new(),
        }
    }

    /// Adds keys that verify but never sign (empty ones are dropped).
    pub fn with_verify_only(mut self, keys: impl IntoIterator<Item = Vec<u8>>) -> KeyRing {
        self.verify_only
            .extend(keys.into_iter().filter(|k| !k.is_empty()));
        self
    }

    /// The key new annotations are signed with.
    pub fn signing(&self) -> &[u8] {
        &self.signing
    }

    /// How many keys verify (the signing key included).
    pub fn len(&self) -> usize {
        usize::from(!self.signing.is_empty()) + self.verify_only.len()
    }

    /// No key at all (a read-only tool that decodes without verifying).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Vec<u8>> for KeyRing {
    fn from(signing: Vec<u8>) -> KeyRing {
        KeyRing::new(signing)
    }
}

/// Never prints key bytes (they end up in logs).
impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KeyRing {{ signing: <{} bytes>, verify_only: {} key(s) }}",
            self.signing.len(),
            self.verify_only.len()
        )
    }
}

impl VerifyingKeys for KeyRing {
    fn verifying_keys(&self) -> Vec<&[u8]> {
        std::iter::once(self.signing.as_slice())
            .filter(|k| !k.is_empty())
            .chain(self.verify_only.iter().map(Vec::as_slice))
            .collect()
    }
}

impl Allocation {
    /// The bytes the signature covers: the JSON of the allocation without its signature.
    fn canonical_payload(&self) -> Vec<u8> {
        let mut unsigned = self.clone();
        unsigned.signature.clear();
        // Serialising a plain struct of strings and integers cannot fail.
        serde_json::to_vec(&unsigned).unwrap_or_default()
    }

    fn mac(&self, key: &[u8]) -> HmacSha256 {
        // HMAC accepts keys of any length; `new_from_slice` only fails for fixed-size MACs.
        let mut mac = HmacSha256::new_from_slice(key)
            .unwrap_or_else(|_| unreachable!("HMAC-SHA256 takes keys of any length"));
        mac.update(&self.canonical_payload());
        mac
    }

    /// Signs the allocation with `key` and returns the annotation value.
    pub fn encode_signed(&self, key: &[u8]) -> String {
        let mut signed = self.clone();
        signed.signature =
            base64::engine::general_purpose::STANDARD.encode(self.mac(key).finalize().into_bytes());
        serde_json::to_string(&signed).unwrap_or_default()
    }

    /// Parses an annotation value without checking who wrote it (for display only).
    pub fn decode_unverified(value: &str) -> Result<Allocation, AllocationError> {
        let allocation: Allocation =
            serde_json::from_str(value).map_err(|e| AllocationError::Malformed(e.to_string()))?;
        if allocation.version != VERSION {
            return Err(AllocationError::Version {
                found: allocation.version,
            });
        }
        Ok(allocation)
    }

    /// Parses an annotation value and checks that the scheduler wrote it for this
    /// pod on this node, signed with any of `keys`.
    pub fn decode_verified<K: VerifyingKeys + ?Sized>(
        value: &str,
        keys: &K,
        pod_uid: &str,
        node: &str,
    ) -> Result<Allocation, AllocationError> {
        let allocation = Self::decode_unverified(value)?;
        if allocation.signature.is_empty() {
            return Err(AllocationError::Unsigned);
        }
        let given = base64::engine::general_purpose::STANDARD
            .decode(&allocation.signature)
            .map_err(|_| AllocationError::BadSignature)?;
        // `verify_slice` compares in constant time; trying each key in turn leaks
        // only which position matched, not the key.
        let signed_by_one = keys
            .verifying_keys()
            .into_iter()
            .any(|key| allocation.mac(key).verify_slice(&given).is_ok());
        if !signed_by_one {
            return Err(AllocationError::BadSignature);
        }
        if allocation.pod_uid != pod_uid {
            return Err(AllocationError::WrongPod {
                expected: pod_uid.to_string(),
                found: allocation.pod_uid,
            });
        }
        if allocation.node != node {
            return Err(AllocationError::WrongNode {
                expected: node.to_string(),
                found: allocation.node,
            });
        }
        if allocation.gpus.is_empty() {
            return Err(AllocationError::Empty);
        }
        allocation.check_containers()?;
        Ok(allocation)
    }

    fn check_containers(&self) -> Result<(), AllocationError> {
        let mut names = std::collections::BTreeSet::new();
        for c in &self.containers {
            if !names.insert(c.name.as_str()) {
                return Err(AllocationError::BadContainers(format!(
                    "container {} is listed twice",
                    c.name
                )));
            }
            if c.gpus.is_empty() {
                return Err(AllocationError::BadContainers(format!(
                    "container {} is given no GPU",
                    c.name
                )));
            }
            if let Some(p) = c.gpus.iter().find(|p| **p as usize >= self.gpus.len()) {
                return Err(AllocationError::BadContainers(format!(
                    "container {} is given GPU position {p}, the pod has {} GPUs",
                    c.name,
                    self.gpus.len()
                )));
            }
        }
        Ok(())
    }

    /// The GPUs container `name` gets: its share of [`Allocation::gpus`] by the
    /// container list, `None` when the list does not name it. With an empty
    /// list the one GPU container gets them all.
    pub fn gpus_of(&self, name: &str) -> Option<Vec<&AllocatedGpu>> {
        if self.containers.is_empty() {
            return Some(self.gpus.iter().collect());
        }
        let grant = self.containers.iter().find(|c| c.name == name)?;
        grant
            .gpus
            .iter()
            .map(|p| self.gpus.get(*p as usize))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Allocation {
        Allocation {
            version: VERSION,
            pod_uid: "uid-1".into(),
            pod: "ml/train-0".into(),
            node: "gpu-node-1".into(),
            policy: "tessera".into(),
            isolation: Isolation::Mps,
            gpus: vec![AllocatedGpu {
                index: 3,
                uuid: "GPU-aaaa".into(),
                memory_mib: 16_000,
                cores_milli: 400,
                mig: None,
            }],
            containers: Vec::new(),
            signature: String::new(),
        }
    }

    /// Written and signed by the format before `containers` existed.
    const BEFORE_CONTAINERS: &str = r#"{"version":1,"podUid":"uid-1","pod":"ml/train-0","node":"gpu-node-1","policy":"tessera","isolation":"mps","gpus":[{"index":3,"uuid":"GPU-aaaa","memoryMib":16000,"coresMilli":400}],"signature":"FZDASkDxr00YChq1xWxsAhgoBBXKCtWZTyf34y3Oc50="}"#;

    #[test]
    fn annotations_without_containers_still_verify() {
        let back = Allocation::decode_verified(BEFORE_CONTAINERS, b"secret", "uid-1", "gpu-node-1")
            .unwrap();
        assert_eq!(back.gpus, sample().gpus);
        assert!(back.containers.is_empty());
        // Re-encoding an allocation without containers gives the same bytes.
        assert_eq!(sample().encode_signed(b"secret"), BEFORE_CONTAINERS);
        assert_eq!(back.gpus_of("anything").map(|g| g.len()), Some(1));
    }

    #[test]
    fn container_grants_are_signed_and_checked() {
        let mut a = sample();
        a.gpus.push(AllocatedGpu {
            index: 4,
            uuid: "GPU-bbbb".into(),
            ..a.gpus[0].clone()
        });
        a.containers = vec![
            ContainerGrant {
                name: "init".into(),
                gpus: vec![0, 1],
            },
            ContainerGrant {
                name: "main".into(),
                gpus: vec![1],
            },
        ];
        let value = a.encode_signed(b"secret");
        assert!(
            value.contains(r#""containers":[{"name":"init","gpus":[0,1]}"#),
            "{value}"
        );
        let back = Allocation::decode_verified(&value, b"secret", "uid-1", "gpu-node-1").unwrap();
        let main: Vec<&str> = back
            .gpus_of("main")
            .unwrap()
            .iter()
            .map(|g| g.uuid.as_str())
            .collect();
        assert_eq!(main, ["GPU-bbbb"]);
        assert!(back.gpus_of("sidecar").is_none());
        // Moving a container to another GPU breaks the signature.
        let moved = value.replace(r#""name":"main","gpus":[1]"#, r#""name":"main","gpus":[0]"#);
        assert_eq!(
            Allocation::decode_verified(&moved, b"secret", "uid-1", "gpu-node-1"),
            Err(AllocationError::BadSignature)
        );
        // Positions past the list, duplicates and empty grants are refused even when signed.
        for (grants, words) in [
            (vec![("main", vec![2])], "position 2"),
            (vec![("main", vec![0]), ("main", vec![1])], "listed twice"),
            (vec![("main", vec![])], "no GPU"),
        ] {
            a.containers = grants
                .into_iter()
                .map(|(n, g)| ContainerGrant {
                    name: n.into(),
                    gpus: g,
                })
                .collect();
            let e = Allocation::decode_verified(
                &a.encode_signed(b"secret"),
                b"secret",
                "uid-1",
                "gpu-node-1",
            )
            .unwrap_err();
            assert!(e.to_string().contains(words), "{e}");
        }
    }

    #[test]
    fn planned_mig_instances_are_signed_and_old_grants_keep_their_bytes() {
        let mut a = sample();
        a.isolation = Isolation::Mig;
        a.gpus[0].mig = Some(MigGrant {
            profile: "3g.40gb".into(),
            start: 4,
            size: 4,
            uuid: String::new(),
            create: false,
            enable_mig_mode: false,
        });
        // An existing instance writes neither flag: older agents read it unchanged.
        let existing = a.encode_signed(b"secret");
        assert!(!existing.contains("create") && !existing.contains("enableMigMode"));
        a.gpus[0].mig.as_mut().unwrap().create = true;
        a.gpus[0].mig.as_mut().unwrap().enable_mig_mode = true;
        let planned = a.encode_signed(b"secret");
        assert!(
            planned.contains(r#""create":true,"enableMigMode":true"#),
            "{planned}"
        );
        let back = Allocation::decode_verified(&planned, b"secret", "uid-1", "gpu-node-1").unwrap();
        assert!(back.gpus[0].mig.as_ref().unwrap().create);
        // Dropping the plan from a signed annotation breaks the signature.
        let dropped = planned.replace(r#","create":true"#, "");
        assert_eq!(
            Allocation::decode_verified(&dropped, b"secret", "uid-1", "gpu-node-1"),
            Err(AllocationError::BadSignature)
        );
    }

    #[test]
    fn a_grant_signed_with_the_old_key_verifies_after_rotation_and_a_forged_one_does_not() {
        let old_key = b"old-signing-key-0123".to_vec();
        let new_key = b"new-signing-key-4567".to_vec();
        let running = sample().encode_signed(&old_key);
        // After the rotation the scheduler signs with the new key and keeps the
        // old one to verify the grants it signed before.
        let rotated = KeyRing::new(new_key.clone()).with_verify_only([old_key.clone()]);
        assert_eq!(rotated.len(), 2);
        assert_eq!(rotated.signing(), new_key.as_slice());
        let back = Allocation::decode_verified(&running, &rotated, "uid-1", "gpu-node-1").unwrap();
        assert_eq!(back.gpus, sample().gpus);
        let fresh = sample().encode_signed(rotated.signing());
        assert!(Allocation::decode_verified(&fresh, &rotated, "uid-1", "gpu-node-1").is_ok());
        // A key no ring holds verifies nothing, nor does an edit under an old signature.
        let forged = sample().encode_signed(b"a-guessed-key-000000");
        assert_eq!(
            Allocation::decode_verified(&forged, &rotated, "uid-1", "gpu-node-1"),
            Err(AllocationError::BadSignature)
        );
        let tampered = running.replace("\"coresMilli\":400", "\"coresMilli\":1000");
        assert_ne!(tampered, running);
        assert_eq!(
            Allocation::decode_verified(&tampered, &rotated, "uid-1", "gpu-node-1"),
            Err(AllocationError::BadSignature)
        );
        // Once the old key is dropped from the ring, its grants no longer verify.
        let dropped = KeyRing::new(new_key);
        assert_eq!(
            Allocation::decode_verified(&running, &dropped, "uid-1", "gpu-node-1"),
            Err(AllocationError::BadSignature)
        );
        // Key bytes never reach a log line.
        assert!(!format!("{rotated:?}").contains("signing-key"));
    }

    #[test]
    fn signed_round_trip() {
        let value = sample().encode_signed(b"secret");
        let back = Allocation::decode_verified(&value, b"secret", "uid-1", "gpu-node-1").unwrap();
        assert_eq!(back.gpus, sample().gpus);
        assert!(!back.signature.is_empty());
    }

    #[test]
    fn forged_or_foreign_decisions_are_refused() {
        let value = sample().encode_signed(b"secret");
        assert_eq!(
            Allocation::decode_verified(&value, b"other-key", "uid-1", "gpu-node-1"),
            Err(AllocationError::BadSignature)
        );
        assert!(matches!(
            Allocation::decode_verified(&value, b"secret", "uid-2", "gpu-node-1"),
            Err(AllocationError::WrongPod { .. })
        ));
        assert!(matches!(
            Allocation::decode_verified(&value, b"secret", "uid-1", "gpu-node-2"),
            Err(AllocationError::WrongNode { .. })
        ));
        // A user edits the grant but keeps the old signature.
        let tampered = value.replace("\"coresMilli\":400", "\"coresMilli\":1000");
        assert_eq!(
            Allocation::decode_verified(&tampered, b"secret", "uid-1", "gpu-node-1"),
            Err(AllocationError::BadSignature)
        );
        let unsigned = serde_json::to_string(&sample()).unwrap();
        assert_eq!(
            Allocation::decode_verified(&unsigned, b"secret", "uid-1", "gpu-node-1"),
            Err(AllocationError::Unsigned)
        );
        assert!(matches!(
            Allocation::decode_verified("{not json", b"secret", "uid-1", "gpu-node-1"),
            Err(AllocationError::Malformed(_))
        ));
    }
}
