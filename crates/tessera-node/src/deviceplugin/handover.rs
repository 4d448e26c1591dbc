//! How a container is told which GPUs it may use: the device-list strategies
//! of NVIDIA's device plugin (`deviceListStrategy`, protocols.md §2.6).
//!
//! The kubelet applies the pod spec's own environment after the plugin's, so a
//! GPU list in `NVIDIA_VISIBLE_DEVICES` (`envvar`) can be overridden by the pod
//! itself: a pod that sets `NVIDIA_VISIBLE_DEVICES=all` reaches every GPU of
//! the node. The other strategies put the list where a pod spec cannot reach:
//!
//! - `volume-mounts` (the default): `NVIDIA_VISIBLE_DEVICES` names the
//!   directory `/var/run/nvidia-container-devices`, and each device is a mount
//!   of `/dev/null` at `/var/run/nvidia-container-devices/<id>`. The NVIDIA
//!   container toolkit reads the list from the mounts when configured with
//!   `accept-nvidia-visible-devices-as-volume-mounts = true` and
//!   `accept-nvidia-visible-devices-envvar-when-unprivileged = false`; the
//!   second setting is what makes a pod's own `NVIDIA_VISIBLE_DEVICES` ignored.
//! - `cdi-cri`: the devices go in `ContainerAllocateResponse.cdi_devices` as
//!   fully-qualified CDI names `nvidia.com/gpu=<id>` (protocols.md §2.3, §2.6),
//!   which the kubelet passes to the runtime in the CRI `CDIDevices` field. The
//!   node's CDI spec must name devices by UUID (`nvidia-ctk cdi generate
//!   --device-name-strategy=uuid`; its default vendor and class are
//!   `nvidia.com` and `gpu`). With CDI alone the agent also sets
//!   `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's generated CDI specs do, so an
//!   image's built-in `NVIDIA_VISIBLE_DEVICES=all` gives nothing by the
//!   environment path.
//! - `envvar`: `NVIDIA_VISIBLE_DEVICES=<id>,<id>`, as before; only safe where
//!   pods cannot set their own environment.
//!
//! IDs are GPU UUIDs (`GPU-…`) or, for MIG, the instance's UUID (`MIG-…`).
//! Several strategies may be combined (`volume-mounts,cdi-cri`).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::proto::deviceplugin as pb;

/// The directory `NVIDIA_VISIBLE_DEVICES` names under `volume-mounts`.
pub const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// What each device mount is a bind of.
pub const VOLUME_MOUNTS_HOST_PATH: &str = "/dev/null";
/// The CDI kind (`vendor/class`) of NVIDIA's generated CDI spec.
pub const CDI_KIND: &str = "nvidia.com/gpu";

/// One way of handing devices to a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceListStrategy {
    Envvar,
    VolumeMounts,
    CdiCri,
}

impl DeviceListStrategy {
    pub fn name(self) -> &'static str {
        match self {
            DeviceListStrategy::Envvar => "envvar",
            DeviceListStrategy::VolumeMounts => "volume-mounts",
            DeviceListStrategy::CdiCri => "cdi-cri",
        }
    }
}

/// The strategies in use (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceList(BTreeSet<DeviceListStrategy>);

impl Default for DeviceList {
    fn default() -> Self {
        DeviceList([DeviceListStrategy::VolumeMounts].into())
    }
}

/// A device-list setting that is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "device list strategy {0:?} is not one of envvar, volume-mounts, cdi-cri (a comma-separated list of them)"
)]
pub struct UnknownStrategy(pub String);

impl FromStr for DeviceList {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut set = BTreeSet::new();
        for part in s.split(',').map(str::trim) {
            set.insert(match part {
                "envvar" => DeviceListStrategy::Envvar,
                "volume-mounts" => DeviceListStrategy::VolumeMounts,
                "cdi-cri" => DeviceListStrategy::CdiCri,
                _ => return Err(UnknownStrategy(part.to_string())),
            });
        }
        Ok(DeviceList(set))
    }
}

impl fmt::Display for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|s| s.name()).collect();
        f.write_str(&names.join(","))
    }
}

impl DeviceList {
    pub fn includes(&self, s: DeviceListStrategy) -> bool {
        self.0.contains(&s)
    }

    /// Puts `ids` into `resp` by every strategy in use.
    pub fn hand_over(&self, ids: &[String], resp: &mut pb::ContainerAllocateResponse) {
        let visible = if self.includes(DeviceListStrategy::VolumeMounts) {
            for id in ids {
                resp.mounts.push(pb::Mount {
                    container_path: format!("{VOLUME_MOUNTS_ROOT}/{id}"),
                    host_path: VOLUME_MOUNTS_HOST_PATH.into(),
                    read_only: true,
                });
            }
            VOLUME_MOUNTS_ROOT.to_string()
        } else if self.includes(DeviceListStrategy::Envvar) {
            ids.join(",")
        } else {
            "void".to_string()
        };
        resp.envs.insert("NVIDIA_VISIBLE_DEVICES".into(), visible);
        if self.includes(DeviceListStrategy::CdiCri) {
            resp.cdi_devices.extend(ids.iter().map(|id| pb::CdiDevice {
                name: format!("{CDI_KIND}={id}"),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(strategies: &str, ids: &[&str]) -> pb::ContainerAllocateResponse {
        let list: DeviceList = strategies.parse().unwrap();
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        let mut resp = pb::ContainerAllocateResponse::default();
        list.hand_over(&ids, &mut resp);
        resp
    }

    fn mounts(r: &pb::ContainerAllocateResponse) -> Vec<(&str, &str)> {
        r.mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect()
    }

    fn cdi(r: &pb::ContainerAllocateResponse) -> Vec<&str> {
        r.cdi_devices.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn each_strategy_hands_over_the_devices_its_way() {
        let ids = ["GPU-a", "MIG-b"];
        let r = response("envvar", &ids);
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,MIG-b");
        assert!(r.mounts.is_empty() && r.cdi_devices.is_empty());

        let r = response("volume-mounts", &ids);
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], VOLUME_MOUNTS_ROOT);
        assert_eq!(
            mounts(&r),
            [
                ("/dev/null", "/var/run/nvidia-container-devices/GPU-a"),
                ("/dev/null", "/var/run/nvidia-container-devices/MIG-b")
            ]
        );
        assert!(r.cdi_devices.is_empty());

        let r = response("cdi-cri", &ids);
        assert_eq!(cdi(&r), ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=MIG-b"]);
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "void");
        assert!(r.mounts.is_empty());

        let r = response("cdi-cri, volume-mounts", &ids);
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], VOLUME_MOUNTS_ROOT);
        assert_eq!((r.mounts.len(), r.cdi_devices.len()), (2, 2));
    }

    #[test]
    fn settings_parse_and_print() {
        assert_eq!(DeviceList::default().to_string(), "volume-mounts");
        let both: DeviceList = "volume-mounts,cdi-cri".parse().unwrap();
        assert_eq!(both.to_string(), "volume-mounts,cdi-cri");
        let e = "volume-mount".parse::<DeviceList>().unwrap_err();
        assert!(e.to_string().contains("\"volume-mount\""), "{e}");
        assert!("".parse::<DeviceList>().is_err());
    }
}
