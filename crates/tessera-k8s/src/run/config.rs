//! The scheduler's configuration: as given (flags or a file, every field
//! optional) and validated (every field checked, files read, nothing bound).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tessera_core::policy::{self, PolicyArgs};

use crate::leader::{LeaseConfig, LeaseRole};
use crate::tls::{self, TlsError};
use crate::webhook::{self, WebhookConfig};

/// Extender (behind kube-scheduler) or standalone (our own `schedulerName`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Extender,
    Standalone,
}

/// Configuration as given (flags or file): every field optional.
#[derive(Debug, Clone, Default)]
pub struct RawConfig {
    pub mode: Option<String>,
    /// The extender's verbs (loopback by default: kube-scheduler runs in the same pod).
    pub listen: Option<String>,
    /// Health, readiness and metrics.
    pub metrics_listen: Option<String>,
    pub policy: Option<String>,
    pub signing_key_file: Option<PathBuf>,
    /// A directory whose `verify*` files are keys that verify allocation
    /// annotations but never sign (a rotation's previous or next key): a Secret
    /// mounted whole, `key` signing, `verify-<when>` verifying.
    pub verify_key_dir: Option<PathBuf>,
    pub scheduler_name: Option<String>,
    /// More `schedulerName`s whose pods the extender judges and binds (a
    /// kube-scheduler profile other than `scheduler_name` wired to Tessera).
    pub serve_scheduler_names: Vec<String>,
    pub leader_elect: Option<bool>,
    /// `elect` (compete for the Lease) or `follow` (lead while kube-scheduler in
    /// this pod holds its Lease); default: follow in extender mode on loopback,
    /// elect otherwise (standalone, or an extender a remote kube-scheduler calls).
    pub lease_role: Option<String>,
    /// client-go's LeaseDuration / RenewDeadline / RetryPeriod (15 s / 10 s / 2 s).
    pub lease_duration: Option<Duration>,
    pub renew_deadline: Option<Duration>,
    pub retry_period: Option<Duration>,
    pub lease_namespace: Option<String>,
    pub lease_name: Option<String>,
    pub identity: Option<String>,
    /// Where the other replicas reach this one's ops port (`http://POD_IP:9090`)
    /// to forward the verbs only the leader may run (extender mode, `elect`).
    pub advertise_url: Option<String>,
    /// TLS for the extender's verbs: server certificate and key, and the CA
    /// whose client certificates are accepted (all three, or none and loopback).
    pub extender_cert: Option<PathBuf>,
    pub extender_key: Option<PathBuf>,
    pub extender_client_ca: Option<PathBuf>,
    pub webhook_listen: Option<String>,
    pub webhook_cert: Option<PathBuf>,
    pub webhook_key: Option<PathBuf>,
    pub webhook_set_scheduler_name: Option<bool>,
    /// Tolerations the webhook adds to the pods it hands to Tessera, each
    /// `KEY[=VALUE]:EFFECT` (the taint that keeps stock pods off Tessera's nodes).
    pub pod_tolerations: Vec<String>,
    pub allocation_writers: Vec<String>,
    /// How GPU models count against queue quotas: `MODEL=FACTOR`, comma
    /// separated (`H100-80GB=1,A100-80GB=0.6,T4=0.1`); unnamed models count 1.
    pub gpu_equivalents: Option<String>,
    /// Fair order by usage blended with its time-decayed mean: the half-life
    /// (off when unset) and the weight of the mean (0..=1, default 0.5).
    pub queue_usage_half_life: Option<Duration>,
    pub queue_usage_weight: Option<f64>,
    /// Allocate pods' DRA ResourceClaims (`resource.k8s.io/v1`) in standalone mode.
    pub dra: Option<bool>,
    /// How long a GpuNode whose agent heartbeats may stay unchanged before its
    /// node takes no new pods (default [`crate::mirror::INVENTORY_TTL`]).
    pub gpunode_ttl: Option<Duration>,
    /// Pods of workloads Kueue admitted pass the `GpuQueue` quota gate (still
    /// counted in usage): Kueue's ClusterQueue holds their quota
    /// (`--trust-kueue-admission`; see [`crate::kueue`]).
    pub trust_kueue_admission: Option<bool>,
}

/// A configuration field that is wrong, by name.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
    #[error("{field}: {source}")]
    Tls {
        field: &'static str,
        source: TlsError,
    },
}

fn invalid(field: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        problem: problem.into(),
    }
}

/// The webhook's resolved settings.
#[derive(Clone)]
pub struct WebhookServe {
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ServerConfig>,
    pub config: Arc<WebhookConfig>,
}

/// Validated, immutable configuration.
#[derive(Clone)]
pub struct Config {
    pub mode: Mode,
    pub listen: SocketAddr,
    /// Client-authenticated TLS on `listen` (required unless it is loopback).
    pub extender_tls: Option<Arc<rustls::ServerConfig>>,
    pub metrics_listen: SocketAddr,
    pub policy: String,
    pub signing_key: Vec<u8>,
    /// Keys that verify annotations but never sign (see [`read_verify_keys`]).
    pub verify_keys: Vec<Vec<u8>>,
    pub scheduler_name: String,
    /// Every `schedulerName` whose pods are judged and bound (`scheduler_name` first).
    pub scheduler_names: Vec<String>,
    /// `None`: no election, this replica always leads.
    pub lease: Option<LeaseConfig>,
    pub webhook: Option<WebhookServe>,
    /// GPU-equivalent factors for queue quotas.
    pub gpu_equivalents: tessera_core::queue::GpuEquivalents,
    /// Time-decayed usage in the fair order: half-life and weight.
    pub usage_history: Option<(Duration, f64)>,
    /// Standalone mode allocates pods' DRA ResourceClaims (`--dra`).
    pub dra: bool,
    /// Staleness TTL of heartbeating GpuNodes (`--gpunode-ttl`).
    pub gpunode_ttl: Duration,
    /// `--trust-kueue-admission`.
    pub trust_kueue_admission: bool,
}

impl RawConfig {
    /// Checks every field; reads the signing key and the TLS files. Binds nothing.
    pub fn resolve(self) -> Result<Config, ConfigError> {
        let mode = match self.mode.as_deref().unwrap_or("extender") {
            "extender" => Mode::Extender,
            "standalone" => Mode::Standalone,
            other => {
                return Err(invalid(
                    "mode",
                    format!("{other:?} is not extender or standalone"),
                ));
            }
        };
        let listen_s = self.listen.unwrap_or_else(|| "127.0.0.1:8888".into());
        let listen: SocketAddr = listen_s
            .parse()
            .map_err(|e| invalid("listen", format!("{listen_s:?}: {e}")))?;
        let extender_tls = match (
            self.extender_cert,
            self.extender_key,
            self.extender_client_ca,
        ) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca)) => Some(
                tls::server_config(&cert, &key, Some(&ca)).map_err(|source| ConfigError::Tls {
                    field: "extender-cert",
                    source,
                })?,
            ),
            _ => {
                return Err(invalid(
                    "extender-cert",
                    "TLS for the extender needs all of --extender-cert, --extender-key and \
                     --extender-client-ca: without client certificates anyone who reaches \
                     the port could bind pods",
                ));
            }
        };
        let dra = self.dra.unwrap_or(false);
        if dra && mode != Mode::Standalone {
            return Err(invalid(
                "dra",
                "--dra needs --mode standalone: in extender mode kube-scheduler's own DRA plugin allocates claims",
            ));
        }
        if extender_tls.is_some() && mode == Mode::Standalone {
            return Err(invalid(
                "extender-cert",
                "standalone mode serves no extender verbs",
            ));
        }
        if extender_tls.is_none() && mode == Mode::Extender && !listen.ip().is_loopback() {
            return Err(invalid(
                "listen",
                format!(
                    "{listen} is reachable from other hosts, but the extender's verbs bind \
                     pods: listen on 127.0.0.1 (kube-scheduler in the same pod) or give \
                     --extender-cert, --extender-key and --extender-client-ca, and set \
                     kube-scheduler's extender tlsConfig (certFile, keyFile, caFile)"
                ),
            ));
        }
        let metrics_s = self.metrics_listen.unwrap_or_else(|| "0.0.0.0:9090".into());
        let metrics_listen: SocketAddr = metrics_s
            .parse()
            .map_err(|e| invalid("metrics-listen", format!("{metrics_s:?}: {e}")))?;
        if metrics_listen == listen && listen.port() != 0 {
            return Err(invalid(
                "metrics-listen",
                format!("{metrics_s} is also --listen; use two ports"),
            ));
        }
        let policy = self.policy.unwrap_or_else(|| "tessera".into());
        policy::by_name(&policy, &PolicyArgs::default())
            .map_err(|e| invalid("policy", e.to_string()))?;
        let key_path = self.signing_key_file.ok_or_else(|| {
            invalid(
                "signing-key-file",
                "is required (the Secret shared with the node agents)",
            )
        })?;
        let signing_key = std::fs::read(&key_path)
            .map_err(|e| invalid("signing-key-file", format!("{}: {e}", key_path.display())))?;
        let signing_key = trim_ascii(&signing_key).to_vec();
        if signing_key.len() < 16 {
            return Err(invalid(
                "signing-key-file",
                format!(
                    "{}: key has {} bytes, at least 16 are needed",
                    key_path.display(),
                    signing_key.len()
                ),
            ));
        }
        let verify_keys = match &self.verify_key_dir {
            Some(dir) => read_verify_keys(dir)
                .map_err(|e| invalid("verify-key-dir", e.to_string()))?
                .into_iter()
                .map(|(_, k)| k)
                .collect(),
            None => Vec::new(),
        };
        let scheduler_name = self.scheduler_name.unwrap_or_else(|| "tessera".into());
        if scheduler_name.is_empty() {
            return Err(invalid("scheduler-name", "must not be empty"));
        }
        let lease = if self.leader_elect.unwrap_or(true) {
            let identity = self.identity.filter(|s| !s.is_empty()).ok_or_else(|| {
                invalid(
                    "identity",
                    "is required with leader election (use the pod name)",
                )
            })?;
            // `follow` means "the kube-scheduler in this pod calls me on
            // loopback"; an extender listening beyond loopback is called by a
            // kube-scheduler elsewhere, whose Lease never names this pod: it
            // would never lead, never bind and never preempt, silently.
            let remote = mode == Mode::Extender && !listen.ip().is_loopback();
            let role = match self.lease_role.as_deref() {
                None => match mode {
                    Mode::Extender if !remote => LeaseRole::Follow,
                    Mode::Extender | Mode::Standalone => LeaseRole::Elect,
                },
                Some("elect") => LeaseRole::Elect,
                Some("follow") if remote => {
                    return Err(invalid(
                        "lease-role",
                        format!(
                            "follow leads while the kube-scheduler in this pod holds its Lease, \
                             but --listen={listen} is for a kube-scheduler outside the pod: use \
                             --lease-role=elect (and --advertise-url, so that followers forward \
                             binds to the leader)"
                        ),
                    ));
                }
                Some("follow") => LeaseRole::Follow,
                Some(other) => {
                    return Err(invalid(
                        "lease-role",
                        format!("{other:?} is not elect or follow"),
                    ));
                }
            };
            let mut lease = LeaseConfig::new(
                &self
                    .lease_namespace
                    .unwrap_or_else(|| "tessera-system".into()),
                &self
                    .lease_name
                    .unwrap_or_else(|| "tessera-scheduler".into()),
                &identity,
                role,
            );
            lease.duration = self.lease_duration.unwrap_or(lease.duration);
            lease.renew_deadline = self.renew_deadline.unwrap_or(lease.renew_deadline);
            lease.retry_period = self.retry_period.unwrap_or(lease.retry_period);
            lease.advertise = match self.advertise_url {
                None => None,
                Some(url) => {
                    if mode != Mode::Extender || role != LeaseRole::Elect {
                        return Err(invalid(
                            "advertise-url",
                            "is for extender mode with --lease-role=elect (followers forward \
                             binds to the leader it names)",
                        ));
                    }
                    Some(peer_url(&url).map_err(|e| invalid("advertise-url", e))?)
                }
            };
            if lease.renew_deadline >= lease.duration || lease.retry_period >= lease.renew_deadline
            {
                return Err(invalid(
                    "lease-duration",
                    "needs retry period < renew deadline < lease duration (fencing depends on it)",
                ));
            }
            Some(lease)
        } else {
            None
        };
        let tolerated_taints = self
            .pod_tolerations
            .iter()
            .map(|t| webhook::toleration::parse_taint(t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("pod-toleration", e.to_string()))?;
        if !tolerated_taints.is_empty() && self.webhook_set_scheduler_name != Some(true) {
            return Err(invalid(
                "pod-toleration",
                "only the mutating webhook adds tolerations: needs --webhook-set-scheduler-name",
            ));
        }
        let webhook = match (self.webhook_listen, self.webhook_cert, self.webhook_key) {
            (None, None, None) => None,
            (listen, Some(cert), Some(key)) => {
                let l = listen.unwrap_or_else(|| "0.0.0.0:8443".into());
                let addr: SocketAddr = l
                    .parse()
                    .map_err(|e| invalid("webhook-listen", format!("{l:?}: {e}")))?;
                Some(WebhookServe {
                    addr,
                    tls: webhook::tls_config(&cert, &key).map_err(|source| ConfigError::Tls {
                        field: "webhook-cert",
                        source,
                    })?,
                    config: Arc::new(WebhookConfig {
                        // Always known, so the webhook checks every pod we will place;
                        // set on pods only when asked.
                        scheduler_name: Some(scheduler_name.clone()),
                        served_scheduler_names: self.serve_scheduler_names.clone(),
                        set_scheduler_name: self.webhook_set_scheduler_name.unwrap_or(false),
                        allocation_writers: self.allocation_writers,
                        catalog: Default::default(),
                        tolerated_taints,
                        // Given the API client once it exists (run), with --dra.
                        claims_client: None,
                    }),
                })
            }
            _ => {
                return Err(invalid(
                    "webhook-cert",
                    "the webhook needs both --webhook-cert and --webhook-key",
                ));
            }
        };
        let gpu_equivalents = match self.gpu_equivalents.as_deref() {
            None => tessera_core::queue::GpuEquivalents::uniform(),
            Some(text) => parse_gpu_equivalents(text).map_err(|e| invalid("gpu-equivalents", e))?,
        };
        let usage_history = match (self.queue_usage_half_life, self.queue_usage_weight) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(invalid(
                    "queue-usage-weight",
                    "needs --queue-usage-half-life",
                ));
            }
            (Some(h), w) => {
                let w = w.unwrap_or(0.5);
                if h.is_zero() {
                    return Err(invalid("queue-usage-half-life", "must be more than 0"));
                }
                if !(w.is_finite() && (0.0..=1.0).contains(&w)) {
                    return Err(invalid(
                        "queue-usage-weight",
                        format!("{w} is not between 0 and 1"),
                    ));
                }
                Some((h, w))
            }
        };
        let gpunode_ttl = self.gpunode_ttl.unwrap_or(crate::mirror::INVENTORY_TTL);
        // Shorter than the agents' heartbeat period, every live node would be
        // blocked between two heartbeats.
        let period = tessera_api::gpunode::HEARTBEAT_PERIOD;
        if gpunode_ttl <= period {
            return Err(invalid(
                "gpunode-ttl",
                format!(
                    "{}s is not longer than the node agents' heartbeat period ({}s)",
                    gpunode_ttl.as_secs(),
                    period.as_secs()
                ),
            ));
        }
        let mut scheduler_names = vec![scheduler_name.clone()];
        for n in self.serve_scheduler_names {
            if !scheduler_names.contains(&n) {
                scheduler_names.push(n);
            }
        }
        Ok(Config {
            mode,
            listen,
            extender_tls,
            metrics_listen,
            policy,
            signing_key,
            verify_keys,
            scheduler_name,
            scheduler_names,
            lease,
            webhook,
            gpu_equivalents,
            usage_history,
            dra,
            gpunode_ttl,
            trust_kueue_admission: self.trust_kueue_admission.unwrap_or(false),
        })
    }
}

/// An advertised peer URL: `http://HOST:PORT` (the ops port; no path).
fn peer_url(text: &str) -> Result<String, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.port_u16().is_none() {
        return Err(format!(
            "{text:?} must be http://HOST:PORT (this replica's --metrics-listen port)"
        ));
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err(format!("{text:?} must have no path"));
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    Ok(format!("http://{authority}"))
}

/// The flags a command keeping a read-only mirror of the cluster (`tessera
/// estimator`, `tessera kueue-admission`) shares with the scheduler, every
/// field optional: they mean what they mean to the scheduler and are checked
/// by its rules ([`RawConfig::resolve`]).
#[derive(Debug, Clone, Default)]
pub struct RawMirrorConfig {
    pub policy: Option<String>,
    pub signing_key_file: Option<PathBuf>,
    pub verify_key_dir: Option<PathBuf>,
    pub gpu_equivalents: Option<String>,
}

/// [`RawMirrorConfig`] checked, its key files read.
#[derive(Clone)]
pub struct MirrorConfig {
    pub policy: String,
    pub signing_key: Vec<u8>,
    pub verify_keys: Vec<Vec<u8>>,
    pub gpu_equivalents: tessera_core::queue::GpuEquivalents,
}

impl RawMirrorConfig {
    /// Checks the policy and the GPU-equivalents and reads the key files.
    pub fn resolve(self) -> Result<MirrorConfig, ConfigError> {
        let base = RawConfig {
            policy: self.policy,
            signing_key_file: self.signing_key_file,
            verify_key_dir: self.verify_key_dir,
            gpu_equivalents: self.gpu_equivalents,
            leader_elect: Some(false),
            ..RawConfig::default()
        }
        .resolve()?;
        Ok(MirrorConfig {
            policy: base.policy,
            signing_key: base.signing_key,
            verify_keys: base.verify_keys,
            gpu_equivalents: base.gpu_equivalents,
        })
    }
}

impl MirrorConfig {
    /// An empty mirror deciding with the policy, verifying grants with the
    /// keys and weighing quotas with the GPU-equivalents.
    pub fn mirror(&self) -> crate::mirror::Mirror {
        let policy = policy::by_name(&self.policy, &PolicyArgs::default())
            .unwrap_or_else(|_| unreachable!("policy validated in resolve"));
        let keys = tessera_core::allocation::KeyRing::new(self.signing_key.clone())
            .with_verify_only(self.verify_keys.clone());
        let mut m = crate::mirror::Mirror::new(policy, keys);
        m.set_gpu_equivalents(self.gpu_equivalents.clone());
        m
    }
}

/// `MODEL=FACTOR,…` (e.g. `H100-80GB=1,A100-80GB=0.6,T4=0.1`) against the
/// built-in catalog; models not named count 1. Errors name the item.
pub fn parse_gpu_equivalents(text: &str) -> Result<tessera_core::queue::GpuEquivalents, String> {
    let mut pairs = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (model, factor) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not MODEL=FACTOR"))?;
        let factor: f64 = factor
            .trim()
            .parse()
            .map_err(|_| format!("{item:?}: {factor:?} is not a number"))?;
        pairs.push((model.trim().to_string(), factor));
    }
    tessera_core::queue::GpuEquivalents::from_factors(
        &tessera_core::model::Catalog::default(),
        pairs.iter().map(|(m, f)| (m.as_str(), *f)),
        1.0,
    )
    .map_err(|e| e.to_string())
}

/// Why a verification key directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum VerifyKeyError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: key has {len} bytes, at least 16 are needed", path.display())]
    Short { path: PathBuf, len: usize },
}

/// The verify-only keys in `dir`: every file whose name starts with `verify`
/// (`verify-2026-06`, …), in name order, each trimmed of surrounding ASCII
/// whitespace and at least 16 bytes long. Hidden entries (a mounted Secret's
/// `..data` links) are skipped; symbolic links are followed. The scheduler and
/// the node agent both read keys this way.
pub fn read_verify_keys(dir: &std::path::Path) -> Result<Vec<(PathBuf, Vec<u8>)>, VerifyKeyError> {
    let read_err = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| VerifyKeyError::Read { path, source }
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err(dir))? {
        let entry = entry.map_err(read_err(dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("verify") && !name.starts_with('.') {
            paths.push(entry.path());
        }
    }
    paths.sort();
    let mut keys = Vec::new();
    for path in paths {
        if !std::fs::metadata(&path).map_err(read_err(&path))?.is_file() {
            continue;
        }
        let raw = std::fs::read(&path).map_err(read_err(&path))?;
        let key = trim_ascii(&raw).to_vec();
        if key.len() < 16 {
            return Err(VerifyKeyError::Short {
                path,
                len: key.len(),
            });
        }
        keys.push((path, key));
    }
    Ok(keys)
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_file(content: &[u8]) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let p = dir.path.join("key");
        std::fs::write(&p, content).unwrap();
        (dir, p)
    }

    mod tempdir {
        pub struct Dir {
            pub path: std::path::PathBuf,
        }
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "tessera-k8s-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir { path }
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.path);
            }
        }
    }

    fn raw(key: PathBuf) -> RawConfig {
        RawConfig {
            signing_key_file: Some(key),
            identity: Some("pod-0".into()),
            ..RawConfig::default()
        }
    }

    #[test]
    fn verify_keys_come_from_the_verify_files_of_a_mounted_secret() {
        let err = |r: RawConfig| match r.resolve() {
            Err(e) => e.to_string(),
            Ok(_) => panic!("expected an error"),
        };
        let (dir, key) = key_file(b"0123456789abcdef0123\n");
        // A Secret volume: files are links into a hidden timestamped directory.
        let data = dir.path.join("..2026_12_03_08_00_00.1");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("verify-2026-06"), b"old-key-0123456789ab\n").unwrap();
        std::fs::write(data.join("verify-2026-12"), b"next-key-0123456789a").unwrap();
        std::fs::write(data.join("notes"), b"not a key").unwrap();
        std::os::unix::fs::symlink(data.join("verify-2026-06"), dir.path.join("verify-2026-06"))
            .unwrap();
        std::os::unix::fs::symlink(data.join("verify-2026-12"), dir.path.join("verify-2026-12"))
            .unwrap();
        std::os::unix::fs::symlink(data.join("notes"), dir.path.join("notes")).unwrap();
        let c = RawConfig {
            verify_key_dir: Some(dir.path.clone()),
            ..raw(key.clone())
        }
        .resolve()
        .unwrap();
        assert_eq!(c.signing_key, b"0123456789abcdef0123");
        assert_eq!(
            c.verify_keys,
            [
                b"old-key-0123456789ab".to_vec(),
                b"next-key-0123456789a".to_vec()
            ]
        );
        // Without the flag: no verify-only key.
        assert!(raw(key.clone()).resolve().unwrap().verify_keys.is_empty());
        // A short verify key is refused, naming the file.
        std::fs::write(data.join("verify-2026-12"), b"short").unwrap();
        let e = err(RawConfig {
            verify_key_dir: Some(dir.path.clone()),
            ..raw(key.clone())
        });
        assert!(e.starts_with("verify-key-dir: "), "{e}");
        assert!(e.contains("verify-2026-12: key has 5 bytes"), "{e}");
        // A directory that is not there is refused too.
        let e = err(RawConfig {
            verify_key_dir: Some(dir.path.join("missing")),
            ..raw(key)
        });
        assert!(e.starts_with("verify-key-dir: "), "{e}");
    }

    /// The GpuNode staleness TTL: three heartbeat periods by default; one not
    /// longer than a period (every live node blocked between heartbeats) is refused.
    #[test]
    fn gpunode_ttl_defaults_and_must_exceed_the_heartbeat_period() {
        let (_d, key) = key_file(b"0123456789abcdef0123\n");
        assert_eq!(
            raw(key.clone()).resolve().unwrap().gpunode_ttl,
            Duration::from_secs(180)
        );
        let with = |s| RawConfig {
            gpunode_ttl: Some(Duration::from_secs(s)),
            ..raw(key.clone())
        };
        assert_eq!(
            with(300).resolve().unwrap().gpunode_ttl,
            Duration::from_secs(300)
        );
        let Err(e) = with(60).resolve() else {
            panic!("a TTL of one heartbeat period is refused")
        };
        assert!(e.to_string().starts_with("gpunode-ttl: 60s"), "{e}");
    }

    #[test]
    fn defaults_resolve() {
        let (_d, key) = key_file(b"0123456789abcdef0123\n");
        let c = raw(key).resolve().unwrap();
        assert_eq!(c.mode, Mode::Extender);
        assert_eq!(c.signing_key, b"0123456789abcdef0123");
        // Finding 16: the extender's verbs are not reachable from the network by default.
        assert_eq!(c.listen.to_string(), "127.0.0.1:8888");
        assert_eq!(c.metrics_listen.to_string(), "0.0.0.0:9090");
        assert_eq!(c.scheduler_names, ["tessera"]);
        let lease = c.lease.unwrap();
        assert_eq!(lease.name, "tessera-scheduler");
        assert_eq!(
            lease.role,
            LeaseRole::Follow,
            "extender mode follows kube-scheduler"
        );
        assert!(c.webhook.is_none());
    }

    #[test]
    fn advertise_url_is_for_elected_extenders_and_names_a_port() {
        let (_d, key) = key_file(b"0123456789abcdef0123");
        let with = |role: &str, url: &str| {
            let mut r = raw(key.clone());
            r.lease_role = Some(role.into());
            r.advertise_url = Some(url.into());
            r.resolve()
        };
        let c = with("elect", "http://10.0.0.7:9090/").unwrap();
        assert_eq!(
            c.lease.unwrap().advertise.as_deref(),
            Some("http://10.0.0.7:9090")
        );
        let e = |r: Result<Config, ConfigError>| r.err().map(|e| e.to_string()).unwrap();
        assert!(e(with("follow", "http://10.0.0.7:9090")).starts_with("advertise-url: is for"));
        assert!(e(with("elect", "https://10.0.0.7:9090")).contains("must be http://HOST:PORT"));
        assert!(e(with("elect", "http://10.0.0.7")).contains("must be http://HOST:PORT"));
        assert!(e(with("elect", "http://10.0.0.7:9090/x")).contains("no path"));
    }

    #[test]
    fn bad_fields_are_named() {
        let (_d, key) = key_file(b"0123456789abcdef0123");
        let err = |r: RawConfig| match r.resolve() {
            Err(e) => e.to_string(),
            Ok(_) => panic!("expected an error"),
        };
        let mut r = raw(key.clone());
        r.mode = Some("sideways".into());
        assert!(err(r).starts_with("mode: \"sideways\""));
        let mut r = raw(key.clone());
        r.policy = Some("best".into());
        assert!(err(r).starts_with("policy: unknown policy"));
        let mut r = raw(key.clone());
        r.listen = Some("nowhere".into());
        assert!(err(r).starts_with("listen:"));
        let mut r = raw(key.clone());
        r.identity = None;
        assert!(err(r).starts_with("identity:"));
        let mut r = raw(key.clone());
        r.webhook_cert = Some("/nonexistent/cert.pem".into());
        assert!(err(r).contains("both --webhook-cert and --webhook-key"));
        let mut r = raw(key.clone());
        r.lease_role = Some("boss".into());
        assert!(err(r).starts_with("lease-role: \"boss\""));
        let mut r = raw(key.clone());
        r.renew_deadline = Some(Duration::from_secs(20));
        assert!(err(r).contains("renew deadline < lease duration"));
        let mut r = raw(key.clone());
        r.metrics_listen = Some("127.0.0.1:8888".into());
        assert!(err(r).starts_with("metrics-listen:"));
        let mut r = raw(key.clone());
        r.webhook_set_scheduler_name = Some(true);
        r.pod_tolerations = vec!["tessera.io/managed=true:Never".into()];
        let e = err(r);
        assert!(
            e.starts_with("pod-toleration:") && e.contains("\"Never\""),
            "{e}"
        );
        let mut r = raw(key.clone());
        r.pod_tolerations = vec!["tessera.io/managed=true:NoSchedule".into()];
        assert!(err(r).contains("needs --webhook-set-scheduler-name"));
        let mut r = raw(key);
        r.webhook_cert = Some("/nonexistent/cert.pem".into());
        r.webhook_key = Some("/nonexistent/key.pem".into());
        assert!(err(r).contains("/nonexistent/cert.pem"));
        let (_d2, short) = key_file(b"short");
        assert!(err(raw(short)).contains("at least 16"));
    }

    #[test]
    fn the_verbs_leave_loopback_only_with_client_certificates() {
        let (_d, key) = key_file(b"0123456789abcdef0123");
        let err = |r: RawConfig| match r.resolve() {
            Err(e) => e.to_string(),
            Ok(_) => panic!("expected an error"),
        };
        for open in ["0.0.0.0:8888", "10.0.0.7:8888", "[::]:8888"] {
            let mut r = raw(key.clone());
            r.listen = Some(open.into());
            let e = err(r);
            assert!(
                e.starts_with("listen:") && e.contains("--extender-client-ca"),
                "{e}"
            );
        }
        // Standalone serves no verbs: its listen address is not used.
        let mut r = raw(key.clone());
        r.mode = Some("standalone".into());
        r.listen = Some("0.0.0.0:8888".into());
        assert!(r.resolve().is_ok());
        // Server TLS without client certificates is still open to anyone.
        let mut r = raw(key.clone());
        r.listen = Some("0.0.0.0:8888".into());
        r.extender_cert = Some("/etc/tls/tls.crt".into());
        r.extender_key = Some("/etc/tls/tls.key".into());
        assert!(err(r).contains("all of --extender-cert, --extender-key and --extender-client-ca"));
        // All three given: the files are read and named when missing.
        let mut r = raw(key.clone());
        r.listen = Some("0.0.0.0:8888".into());
        r.extender_cert = Some("/nonexistent/tls.crt".into());
        r.extender_key = Some("/nonexistent/tls.key".into());
        r.extender_client_ca = Some("/nonexistent/ca.crt".into());
        let e = err(r);
        assert!(
            e.starts_with("extender-cert: reading /nonexistent/tls.crt"),
            "{e}"
        );
        let mut r = raw(key);
        r.mode = Some("standalone".into());
        r.extender_cert = Some("/nonexistent/tls.crt".into());
        r.extender_key = Some("/nonexistent/tls.key".into());
        r.extender_client_ca = Some("/nonexistent/ca.crt".into());
        assert!(err(r).starts_with("extender-cert:"));
        assert!(err(RawConfig::default()).starts_with("signing-key-file: is required"));
    }

    #[test]
    fn dra_is_off_by_default_and_only_for_standalone_mode() {
        let (_dir, key) = key_file(b"0123456789abcdef0123\n");
        let raw = || raw(key.clone());
        assert!(!raw().resolve().map(|c| c.dra).unwrap_or(true));
        let mut r = raw();
        r.dra = Some(true);
        match r.resolve() {
            Err(e) => assert!(
                e.to_string()
                    .starts_with("dra: --dra needs --mode standalone"),
                "{e}"
            ),
            Ok(_) => panic!("--dra in extender mode must be refused"),
        }
        let mut r = raw();
        r.dra = Some(true);
        r.mode = Some("standalone".into());
        assert!(r.resolve().map(|c| c.dra).unwrap_or(false));
    }
}
