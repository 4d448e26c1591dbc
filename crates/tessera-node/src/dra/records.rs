//! What the driver set up for prepared claims, kept in a file so that an agent
//! restart between `NodePrepareResources` and `NodeUnprepareResources` neither
//! leaks nor wrongly destroys anything: the MIG instances it created (and for
//! which claims), and the GPU sets whose MPS control daemon a claim's shares use.
//!
//! The rules live here, pure; [`load`] and [`save`] are the only I/O. Like the
//! device-plugin planner's state file ([`crate::migplan`]), the file is written
//! whole (temporary file, rename), an unreadable one is replaced rather than
//! stopping the agent, and an instance is destroyed only by its UUID and only
//! once the GPU shows it still there with the recorded profile and start: an
//! instance the driver did not create is never in the file, so never touched.
//!
//! Every prepared claim is also recorded by UID with its namespace and name
//! ([`PreparedClaim`]), so that a claim whose `NodeUnprepareResources` never
//! comes can be looked up and released ([`super::sweep`]). Files written before
//! that field existed still load (it defaults to empty): their claims are then
//! known by UID only, and never swept.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::occupancy::Hold;
use crate::backend::GpuInfo;

/// The file's contents.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Records {
    /// MIG instances the driver created at prepare.
    #[serde(default)]
    pub instances: Vec<OwnedInstance>,
    /// Per claim UID: the GPUs (UUIDs, sorted) whose MPS daemon its shares use.
    #[serde(default)]
    pub mps: BTreeMap<String, Vec<String>>,
    /// Per claim UID: who the prepared claim is and which devices it was given.
    #[serde(default)]
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// A claim prepared on this node, as the kubelet named it.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    #[serde(default)]
    pub namespace: String,
    /// Empty in a record that lacks it: such a claim cannot be looked up.
    #[serde(default)]
    pub name: String,
    /// The names of the devices of this node's pool it was prepared with.
    #[serde(default)]
    pub devices: Vec<String>,
    /// What each device holds of its GPU ([`super::occupancy`]); empty in a
    /// record written before it was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<Hold>,
}

/// A MIG instance the driver created, and the claims that use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedInstance {
    /// The MIG device's UUID.
    pub uuid: String,
    /// Its GPU's UUID.
    pub gpu: String,
    pub profile: String,
    pub start: u8,
    /// UIDs of the prepared claims using it; it is destroyed when the last goes.
    pub claims: BTreeSet<String>,
}

/// What to do with an owned instance no claim uses any more, given the GPUs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposal {
    /// It is there as created: destroy it.
    Destroy,
    /// Its GPU no longer has it (destroyed by hand, a reboot): forget the record.
    Gone,
    /// Its GPU is not listed: keep the record and say so; never destroy on a guess.
    Unknown,
}

impl Records {
    /// Records an instance created for `claim`.
    pub fn created(&mut self, uuid: &str, gpu: &str, profile: &str, start: u8, claim: &str) {
        self.instances.push(OwnedInstance {
            uuid: uuid.to_string(),
            gpu: gpu.to_string(),
            profile: profile.to_string(),
            start,
            claims: BTreeSet::from([claim.to_string()]),
        });
    }

    /// Whether the driver created the instance `mig_uuid`.
    pub fn owns(&self, mig_uuid: &str) -> bool {
        self.instances.iter().any(|i| i.uuid == mig_uuid)
    }

    /// Notes that `claim` uses the instance `mig_uuid`, if the driver owns it (an
    /// instance it did not create is none of its business).
    pub fn hold(&mut self, mig_uuid: &str, claim: &str) {
        if let Some(i) = self.instances.iter_mut().find(|i| i.uuid == mig_uuid) {
            i.claims.insert(claim.to_string());
        }
    }

    /// Unprepare of `claim`: it stops using every instance another claim still
    /// uses; the instances only it uses are returned, to be destroyed and then
    /// [`Records::forget`]-ed. They keep the claim until then, so a failed
    /// destruction is tried again when the kubelet repeats the unprepare.
    pub fn release(&mut self, claim: &str) -> Vec<OwnedInstance> {
        let mut last = Vec::new();
        for i in &mut self.instances {
            if !i.claims.contains(claim) {
                continue;
            }
            if i.claims.len() == 1 {
                last.push(i.clone());
            } else {
                i.claims.remove(claim);
            }
        }
        last
    }

    /// Drops the record of instance `mig_uuid` (destroyed, or gone).
    pub fn forget(&mut self, mig_uuid: &str) {
        self.instances.retain(|i| i.uuid != mig_uuid);
    }

    /// The GPU sets whose MPS daemons prepared claims use.
    pub fn mps_sets(&self) -> BTreeSet<Vec<String>> {
        self.mps.values().cloned().collect()
    }

    /// The UIDs of every claim something is recorded for: prepared, holding an
    /// instance or using an MPS daemon (older files know some by UID only).
    pub fn claim_uids(&self) -> BTreeSet<String> {
        let mut uids: BTreeSet<String> = self.claims.keys().cloned().collect();
        uids.extend(self.mps.keys().cloned());
        for i in &self.instances {
            uids.extend(i.claims.iter().cloned());
        }
        uids
    }
}

/// What to do with `owned` given the GPUs as listed now.
pub fn disposal(owned: &OwnedInstance, gpus: &[GpuInfo]) -> Disposal {
    let Some(gpu) = gpus.iter().find(|g| g.uuid == owned.gpu) else {
        return Disposal::Unknown;
    };
    let there = gpu.mig_enabled
        && gpu.mig_instances.iter().any(|m| {
            m.uuid == owned.uuid && m.profile == owned.profile && m.start == Some(owned.start)
        });
    if there {
        Disposal::Destroy
    } else {
        Disposal::Gone
    }
}

/// Why the records could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("cannot read the DRA state file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the DRA state file {path} is not valid: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("cannot write the DRA state file {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// The records in `path`; none when the file does not exist.
pub fn load(path: &Path) -> Result<Records, RecordsError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Records::default()),
        Err(source) => {
            return Err(RecordsError::Read {
                path: path.display().to_string(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes).map_err(|source| RecordsError::Parse {
        path: path.display().to_string(),
        source,
    })
}

/// Writes `records` to `path` whole: a crash leaves the old file or the new one.
pub fn save(path: &Path, records: &Records) -> Result<(), RecordsError> {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(records)?)?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|source| RecordsError::Write {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MigInstance;

    fn gpu(instances: &[(&str, &str, u8)]) -> GpuInfo {
        let fake = crate::backend::fake::Fake::from_yaml(
            "gpus:\n  - { uuid: GPU-a, product: NVIDIA A100-SXM4-80GB }\n",
            "t",
        )
        .unwrap();
        let mut g = crate::backend::GpuBackend::discover(&fake)
            .unwrap()
            .remove(0);
        g.mig_enabled = true;
        g.mig_instances = instances
            .iter()
            .map(|(u, p, s)| MigInstance {
                uuid: u.to_string(),
                profile: p.to_string(),
                start: Some(*s),
                memory_mib: 1,
                sm_count: None,
            })
            .collect();
        g
    }

    /// The last claim of an instance gets it back to destroy; one of several
    /// only leaves; an instance the driver did not create is never recorded.
    #[test]
    fn the_last_claim_releases_an_instance() {
        let mut r = Records::default();
        r.created("MIG-x", "GPU-a", "1g.10gb", 0, "c1");
        r.hold("MIG-x", "c2");
        r.hold("MIG-foreign", "c1");
        assert!(!r.owns("MIG-foreign"));
        assert!(r.release("c1").is_empty(), "c2 still uses it");
        let last = r.release("c2");
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].uuid, "MIG-x");
        // Kept until destroyed, so a repeated unprepare tries again.
        assert_eq!(r.release("c2").len(), 1);
        r.forget("MIG-x");
        assert!(r.instances.is_empty());
    }

    /// Destroyed only when the GPU shows it as recorded: same UUID, profile and
    /// start; gone when the GPU lacks it; unknown when the GPU is not listed.
    #[test]
    fn disposal_needs_the_instance_as_recorded() {
        let mut r = Records::default();
        r.created("MIG-x", "GPU-a", "1g.10gb", 0, "c1");
        let owned = &r.instances[0];
        assert_eq!(
            disposal(owned, &[gpu(&[("MIG-x", "1g.10gb", 0)])]),
            Disposal::Destroy
        );
        // Another instance at the same place (someone re-created it): not ours.
        assert_eq!(
            disposal(owned, &[gpu(&[("MIG-y", "1g.10gb", 0)])]),
            Disposal::Gone
        );
        assert_eq!(
            disposal(owned, &[gpu(&[("MIG-x", "1g.10gb", 1)])]),
            Disposal::Gone
        );
        assert_eq!(disposal(owned, &[]), Disposal::Unknown);
    }

    /// A file written before claims were recorded by name still loads; its
    /// claims are known by UID alone.
    #[test]
    fn an_older_file_without_claims_loads_and_lists_its_uids() {
        let old = br#"{"instances": [{"uuid": "MIG-x", "gpu": "GPU-a", "profile": "1g.10gb",
            "start": 0, "claims": ["c1"]}], "mps": {"c2": ["GPU-a"]}}"#;
        let r: Records = serde_json::from_slice(old).unwrap();
        assert!(r.claims.is_empty());
        assert_eq!(r.claim_uids(), BTreeSet::from(["c1".into(), "c2".into()]));
        // A claim entry without a name loads too (and is never swept).
        let r: Records = serde_json::from_slice(br#"{"claims": {"c3": {}}}"#).unwrap();
        assert_eq!(r.claims["c3"], PreparedClaim::default());
    }

    #[test]
    fn records_round_trip_and_a_bad_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/dra.json");
        assert_eq!(load(&path).unwrap(), Records::default());
        let mut r = Records::default();
        r.created("MIG-x", "GPU-a", "1g.10gb", 0, "c1");
        r.mps.insert("c2".into(), vec!["GPU-a".into()]);
        r.claims.insert(
            "c1".into(),
            PreparedClaim {
                namespace: "ml".into(),
                name: "train".into(),
                devices: vec!["gpu-0-mig-1g10gb-0".into()],
                holds: Vec::new(),
            },
        );
        save(&path, &r).unwrap();
        assert_eq!(load(&path).unwrap(), r);
        std::fs::write(&path, b"{ nope").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("state/dra.json"), "{e}");
    }
}
