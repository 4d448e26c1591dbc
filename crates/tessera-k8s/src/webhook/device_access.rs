//! Ways a container could reach GPUs it was not granted, found in a pod spec.
//!
//! The node agent hands a container its GPUs as environment variables
//! (`NVIDIA_VISIBLE_DEVICES`, the `CUDA_MPS_*` limits, `TESSERA_*`), and the
//! kubelet applies the pod's own `env` after the device plugin's: a pod that
//! sets one of them itself overrides its grant. The container toolkit can also
//! read the device list from mounts under `/var/run/nvidia-container-devices`
//! (the volume-mount strategy), which a pod could fake with any volume.
//!
//! `envFrom` imports every key of a ConfigMap or Secret, whose keys the pod
//! spec does not show. An `envFrom` is refused unless its `prefix` guarantees
//! that no imported name can be one of those below (`APP_` is fine, `CUDA_` or
//! no prefix is not): that rule is exact and keeps the common, prefixed use.
//!
//! `NVIDIA_DRIVER_CAPABILITIES` and `NVIDIA_REQUIRE_*` are left alone: they
//! choose which driver libraries are mounted, not which GPUs. The checks cover
//! the spec only; a process can still change `CUDA_*` variables for itself,
//! which is why the device boundary is `NVIDIA_VISIBLE_DEVICES` read by the
//! toolkit, and why the toolkit must ignore it in unprivileged containers
//! (`accept-nvidia-visible-devices-envvar-when-unprivileged = false`) on nodes
//! where pods that ask for no GPU could set it too.

use std::fmt;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, PodSpec, VolumeMount};

/// A variable a pod may not set itself, and why.
struct Reserved {
    /// The name, or the start of the names when `prefix`.
    name: &'static str,
    prefix: bool,
    why: &'static str,
}

const RESERVED: &[Reserved] = &[
    Reserved {
        name: "NVIDIA_VISIBLE_DEVICES",
        prefix: false,
        why: "it chooses the GPUs the container toolkit gives the container",
    },
    Reserved {
        name: "CUDA_VISIBLE_DEVICES",
        prefix: false,
        why: "it renumbers the granted GPUs, which the per-GPU MPS limits are indexed by",
    },
    Reserved {
        name: "NVIDIA_MIG_CONFIG_DEVICES",
        prefix: false,
        why: "it grants the right to reconfigure MIG on the GPU",
    },
    Reserved {
        name: "NVIDIA_MIG_MONITOR_DEVICES",
        prefix: false,
        why: "it grants the right to monitor every MIG instance on the GPU",
    },
    Reserved {
        name: "NVIDIA_IMEX_CHANNELS",
        prefix: false,
        why: "it chooses the IMEX channels the container toolkit gives the container",
    },
    Reserved {
        name: "CUDA_MPS_",
        prefix: true,
        why: "the node agent sets the MPS server and the pod's compute and memory limits",
    },
    Reserved {
        name: "TESSERA_",
        prefix: true,
        why: "the node agent sets them from the pod's grant",
    },
];

/// Where the container toolkit looks for a device list given as volume mounts.
const DEVICE_LIST_MOUNT: [&str; 3] = ["var", "run", "nvidia-container-devices"];

fn reserved(name: &str) -> Option<&'static Reserved> {
    RESERVED.iter().find(|r| {
        if r.prefix {
            name.starts_with(r.name)
        } else {
            name == r.name
        }
    })
}

/// The first reserved name that `prefix` followed by any key could spell.
fn reachable_with_prefix(prefix: &str) -> Option<&'static Reserved> {
    RESERVED
        .iter()
        .find(|r| r.name.starts_with(prefix) || (r.prefix && prefix.starts_with(r.name)))
}

/// Which list of the pod spec a container is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    App,
    Ephemeral,
}

/// A container named as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    pub kind: ContainerKind,
    pub name: String,
}

impl fmt::Display for ContainerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ContainerKind::Init => "init container",
            ContainerKind::App => "container",
            ContainerKind::Ephemeral => "ephemeral container",
        };
        write!(f, "{kind} {:?}", self.name)
    }
}

/// One way a container could choose its own GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Breach {
    /// `env` sets a reserved variable.
    Env {
        container: ContainerRef,
        name: String,
        why: &'static str,
    },
    /// `envFrom` could import a reserved variable.
    EnvFrom {
        container: ContainerRef,
        /// `configMap "x"` or `secret "x"`.
        source: String,
        prefix: String,
        /// The reserved name (or `PREFIX_*`) it could produce.
        could_set: String,
    },
    /// A volume is mounted where the toolkit reads a device list.
    DeviceListMount {
        container: ContainerRef,
        path: String,
    },
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Breach::Env {
                container,
                name,
                why,
            } => write!(f, "{container} sets {name} ({why})"),
            Breach::EnvFrom {
                container,
                source,
                prefix,
                could_set,
            } => {
                let prefix = if prefix.is_empty() {
                    "without a prefix".to_string()
                } else {
                    format!("with prefix {prefix:?}")
                };
                write!(
                    f,
                    "{container} imports envFrom {source} {prefix}, which could set {could_set}; \
                     give it a prefix no GPU variable starts with (e.g. APP_) or list the variables under env"
                )
            }
            Breach::DeviceListMount { container, path } => write!(
                f,
                "{container} mounts a volume at {path}, where the container toolkit reads the list of GPUs to give"
            ),
        }
    }
}

/// Every breach in the pod spec, in container order.
pub fn breaches(spec: &PodSpec) -> Vec<Breach> {
    let mut out = Vec::new();
    let of = |kind, name: &str| ContainerRef {
        kind,
        name: name.to_string(),
    };
    for c in spec.init_containers.iter().flatten() {
        check(
            &of(ContainerKind::Init, &c.name),
            c.env.as_deref(),
            c.env_from.as_deref(),
            c.volume_mounts.as_deref(),
            &mut out,
        );
    }
    for c in &spec.containers {
        check(
            &of(ContainerKind::App, &c.name),
            c.env.as_deref(),
            c.env_from.as_deref(),
            c.volume_mounts.as_deref(),
            &mut out,
        );
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        check(
            &of(ContainerKind::Ephemeral, &c.name),
            c.env.as_deref(),
            c.env_from.as_deref(),
            c.volume_mounts.as_deref(),
            &mut out,
        );
    }
    out
}

fn check(
    container: &ContainerRef,
    env: Option<&[EnvVar]>,
    env_from: Option<&[EnvFromSource]>,
    mounts: Option<&[VolumeMount]>,
    out: &mut Vec<Breach>,
) {
    for var in env.into_iter().flatten() {
        if let Some(r) = reserved(&var.name) {
            out.push(Breach::Env {
                container: container.clone(),
                name: var.name.clone(),
                why: r.why,
            });
        }
    }
    for from in env_from.into_iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = reachable_with_prefix(&prefix) {
            let source = match (&from.config_map_ref, &from.secret_ref) {
                (Some(cm), _) => format!("configMap {:?}", cm.name),
                (None, Some(s)) => format!("secret {:?}", s.name),
                (None, None) => "(no source)".to_string(),
            };
            out.push(Breach::EnvFrom {
                container: container.clone(),
                source,
                prefix,
                could_set: if r.prefix {
                    format!("{}*", r.name)
                } else {
                    r.name.to_string()
                },
            });
        }
    }
    for m in mounts.into_iter().flatten() {
        if is_device_list_path(&m.mount_path) {
            out.push(Breach::DeviceListMount {
                container: container.clone(),
                path: m.mount_path.clone(),
            });
        }
    }
}

/// Whether `path`, cleaned the way a runtime would (`//`, `.`, `..`), is at or
/// under the toolkit's device-list directory (`/run/...` too: `/var/run` is a
/// link to it on most images).
fn is_device_list_path(path: &str) -> bool {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.starts_with(&DEVICE_LIST_MOUNT) || parts.starts_with(&DEVICE_LIST_MOUNT[1..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn spec(v: Value) -> PodSpec {
        serde_json::from_value(v).expect("a pod spec")
    }

    fn found(v: Value) -> Vec<String> {
        breaches(&spec(v)).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn reserved_variables_in_env_are_found_in_every_container_list() {
        let got = found(json!({
            "initContainers": [{"name": "setup", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "1"}]}],
            "containers": [{"name": "main", "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"},
                {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"},
                {"name": "TESSERA_GPU_MEMORY_MIB", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"},
                {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"},
                {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
                {"name": "nvidia_visible_devices", "value": "all"}
            ]}],
            "ephemeralContainers": [{"name": "debug", "env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"}]}]
        }));
        let want_starts = [
            "init container \"setup\" sets CUDA_VISIBLE_DEVICES",
            "container \"main\" sets NVIDIA_VISIBLE_DEVICES",
            "container \"main\" sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "container \"main\" sets TESSERA_GPU_MEMORY_MIB",
            "container \"main\" sets NVIDIA_MIG_CONFIG_DEVICES",
            "container \"main\" sets NVIDIA_MIG_MONITOR_DEVICES",
            "ephemeral container \"debug\" sets CUDA_MPS_PIPE_DIRECTORY",
        ];
        assert_eq!(got.len(), want_starts.len(), "{got:#?}");
        for (g, w) in got.iter().zip(want_starts) {
            assert!(g.starts_with(w), "{g:?} should start with {w:?}");
            assert!(g.contains(" ("), "each breach says why: {g}");
        }
    }

    /// A prefix is safe when no reserved name starts with it and it does not
    /// start with a reserved prefix: `prefix + key` can then never be one.
    #[test]
    fn env_from_is_refused_unless_its_prefix_rules_out_gpu_variables() {
        let cases = [
            (None, Some("NVIDIA_VISIBLE_DEVICES")), // no prefix: any key
            (Some(""), Some("NVIDIA_VISIBLE_DEVICES")),
            (Some("N"), Some("NVIDIA_VISIBLE_DEVICES")), // N + "VIDIA_VISIBLE_DEVICES"
            (Some("CUDA_"), Some("CUDA_VISIBLE_DEVICES")),
            (Some("CUDA_MPS"), Some("CUDA_MPS_*")), // + "_PIPE_DIRECTORY"
            (Some("CUDA_MPS_X"), Some("CUDA_MPS_*")), // already inside CUDA_MPS_*
            (Some("TESSERA_APP_"), Some("TESSERA_*")), // already inside TESSERA_*
            (Some("T"), Some("TESSERA_*")),
            (Some("APP_"), None),
            (Some("CUDA_APP_"), None), // no reserved name starts with CUDA_A
            (Some("NVIDIA_DRIVER_"), None),
            (Some("nvidia_"), None), // names are case-sensitive
        ];
        for (prefix, want) in cases {
            let v = json!({"containers": [{"name": "c", "envFrom": [
                {"prefix": prefix, "configMapRef": {"name": "cfg"}}
            ]}]});
            let got = breaches(&spec(v));
            match want {
                None => assert!(got.is_empty(), "{prefix:?}: {got:?}"),
                Some(name) => {
                    assert_eq!(got.len(), 1, "{prefix:?}: {got:?}");
                    let text = got[0].to_string();
                    assert!(
                        text.starts_with("container \"c\" imports envFrom configMap \"cfg\"")
                            && text.contains(&format!("could set {name}"))
                            && text.contains("list the variables under env"),
                        "{prefix:?}: {text}"
                    );
                }
            }
        }
        let got = found(
            json!({"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "s"}}]}]}),
        );
        assert_eq!(got.len(), 1);
        assert!(got[0].contains("secret \"s\" without a prefix"), "{got:?}");
    }

    #[test]
    fn mounts_over_the_toolkit_device_list_are_found() {
        let paths = [
            ("/var/run/nvidia-container-devices/all", true),
            ("/var/run/nvidia-container-devices", true),
            ("//var/./run/nvidia-container-devices/GPU-1", true),
            ("/tmp/../var/run/nvidia-container-devices/0", true),
            ("/run/nvidia-container-devices/all", true),
            ("/var/run/nvidia-container-devices-not/x", false),
            ("/data/var/run/nvidia-container-devices", false),
            ("/var/run/secrets/kubernetes.io/serviceaccount", false),
        ];
        for (path, want) in paths {
            let got = found(json!({"containers": [{"name": "c", "volumeMounts": [
                {"name": "v", "mountPath": path}
            ]}]}));
            assert_eq!(got.len(), usize::from(want), "{path}: {got:?}");
            if want {
                assert!(
                    got[0].contains(path) && got[0].contains("container \"c\""),
                    "{got:?}"
                );
            }
        }
    }

    #[test]
    fn an_ordinary_spec_has_no_breach() {
        let got = found(json!({"containers": [{"name": "c", "image": "x",
            "env": [{"name": "HOME", "value": "/root"}, {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}],
            "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "cfg"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]
        }]}));
        assert!(got.is_empty(), "{got:?}");
    }
}
