//! A real control plane on loopback: etcd, kube-apiserver and, when asked,
//! kube-scheduler and kube-controller-manager, from the folder `TESSERA_E2E_BIN`
//! names (envtest's `KUBEBUILDER_ASSETS`, plus the two controllers). Every
//! process this starts is stopped by PID when the [`ControlPlane`] drops, also
//! when a scenario panics; their logs are printed then.

use std::collections::BTreeMap;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The binaries a control plane is built from.
pub const BINARIES: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
];

/// The folder of binaries and the Kubernetes version they report.
#[derive(Clone, Debug)]
pub struct Env {
    pub bin: PathBuf,
    pub minor: u32,
    pub version: String,
}

/// The suite's environment, or `None` after printing why this test does not
/// run (no `TESSERA_E2E_BIN`). A folder that is named but incomplete is an
/// error: someone asked for the suite.
pub fn env_or_skip(test: &str) -> Option<Env> {
    let Some(dir) = std::env::var_os("TESSERA_E2E_BIN") else {
        // Straight to the process's stderr, past the test harness's capture, so
        // that `cargo test --workspace` shows it for a passing test too.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "e2e {test}: did not run: TESSERA_E2E_BIN is not set (a folder holding {}; docs/kubernetes.md, section 8b)",
            BINARIES.join(", ")
        );
        return None;
    };
    let bin = PathBuf::from(dir);
    for b in BINARIES {
        let p = bin.join(b);
        assert!(
            p.is_file(),
            "TESSERA_E2E_BIN={}: {b} is missing",
            bin.display()
        );
    }
    let out = Command::new(bin.join("kube-apiserver"))
        .arg("--version")
        .output()
        .expect("kube-apiserver --version runs");
    let version = String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("Kubernetes ")
        .to_string();
    let minor = version
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("kube-apiserver --version said {version:?}"));
    println!("e2e {test}: Kubernetes {version} from {}", bin.display());
    Some(Env {
        bin,
        minor,
        version,
    })
}

/// Who talks to the API server: each has a static token and its own
/// kubeconfig. Tessera's identities are the chart's service accounts, so the
/// chart's RBAC is what they are allowed (no cluster-admin).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Identity {
    Admin,
    Scheduler,
    NodeAgent,
    /// The DRA driver's service account (`<release>-node-agent-dra`).
    NodeAgentDra,
    KubeScheduler,
    ControllerManager,
}

impl Identity {
    const ALL: [Identity; 6] = [
        Identity::Admin,
        Identity::Scheduler,
        Identity::NodeAgent,
        Identity::NodeAgentDra,
        Identity::KubeScheduler,
        Identity::ControllerManager,
    ];

    fn user(self) -> (&'static str, &'static str) {
        match self {
            Identity::Admin => ("e2e-admin", "system:masters"),
            Identity::Scheduler => (
                "system:serviceaccount:tessera-system:tessera-scheduler",
                "system:serviceaccounts,system:serviceaccounts:tessera-system",
            ),
            Identity::NodeAgent => (
                "system:serviceaccount:tessera-system:tessera-node-agent",
                "system:serviceaccounts,system:serviceaccounts:tessera-system",
            ),
            Identity::NodeAgentDra => (
                "system:serviceaccount:tessera-system:tessera-node-agent-dra",
                "system:serviceaccounts,system:serviceaccounts:tessera-system",
            ),
            Identity::KubeScheduler => ("system:kube-scheduler", ""),
            Identity::ControllerManager => ("system:kube-controller-manager", ""),
        }
    }

    fn file(self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

/// What to start beside etcd and kube-apiserver.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// kube-scheduler with this KubeSchedulerConfiguration (YAML, without its
    /// `clientConnection`, which is filled in) and identity.
    pub kube_scheduler: Option<(String, Identity)>,
    /// kube-controller-manager (the resourceclaim, garbage-collector and other
    /// controllers; never node-lifecycle, which would taint kubelet-less nodes).
    pub controller_manager: bool,
    /// `--feature-gates` for every component.
    pub feature_gates: Vec<String>,
}

pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
    /// Killed on purpose by [`ControlPlane::kill`] (not a crash).
    pub killed: bool,
}

pub struct ControlPlane {
    pub env: Env,
    pub dir: tempfile::TempDir,
    pub url: String,
    procs: Vec<Proc>,
    tokens: BTreeMap<Identity, String>,
}

/// A free port on loopback (bound, then released for the process to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl ControlPlane {
    pub async fn start(env: &Env, opts: Options) -> Result<ControlPlane> {
        // kube-rs's TLS (the workspace builds rustls with ring only).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::Builder::new().prefix("tessera-e2e-").tempdir()?;
        let mut plane = ControlPlane {
            env: env.clone(),
            url: String::new(),
            procs: Vec::new(),
            tokens: BTreeMap::new(),
            dir,
        };
        plane.write_credentials()?;
        let d = plane.dir.path().to_path_buf();

        let (client_port, peer_port) = (free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        plane.spawn(
            "etcd",
            Command::new(env.bin.join("etcd")).args([
                "--name=e2e",
                &format!("--data-dir={}", d.join("etcd").display()),
                &format!("--listen-client-urls={etcd_url}"),
                &format!("--advertise-client-urls={etcd_url}"),
                &format!("--listen-peer-urls={peer}"),
                &format!("--initial-advertise-peer-urls={peer}"),
                &format!("--initial-cluster=e2e={peer}"),
                "--unsafe-no-fsync",
            ]),
        )?;

        let port = free_port();
        plane.url = format!("https://127.0.0.1:{port}");
        let gates = opts.feature_gates.join(",");
        let mut api = Command::new(env.bin.join("kube-apiserver"));
        api.args([
            &format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            &format!("--secure-port={port}"),
            "--endpoint-reconciler-type=none",
            &format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--authorization-mode=Node,RBAC",
            &format!("--service-account-key-file={}", d.join("sa.pub").display()),
            &format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ),
            "--service-account-issuer=https://kubernetes.default.svc",
            &format!("--cert-dir={}", d.join("certs").display()),
            "--service-cluster-ip-range=10.96.0.0/16",
            // No kubelets: nodes are created Ready by the suite (no not-ready
            // taint at creation), and pods need no service-account token.
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        ]);
        if !gates.is_empty() {
            api.arg(format!("--feature-gates={gates}"));
        }
        if env.minor >= 34 {
            api.arg("--runtime-config=resource.k8s.io/v1=true");
        }
        plane.spawn("kube-apiserver", &mut api)?;
        plane.wait_ready().await?;
        for id in Identity::ALL {
            plane.write_kubeconfig(id)?;
        }

        if let Some((config, who)) = opts.kube_scheduler {
            plane.start_kube_scheduler(&config, who, &gates)?;
        }
        if opts.controller_manager {
            let kc = plane.kubeconfig(Identity::ControllerManager);
            let mut kcm = Command::new(env.bin.join("kube-controller-manager"));
            kcm.args([
                &format!("--kubeconfig={}", kc.display()),
                "--use-service-account-credentials=true",
                "--controllers=*,-node-lifecycle-controller,-cloud-node-lifecycle-controller,-service-lb-controller",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                &format!("--secure-port={}", free_port()),
                &format!(
                    "--service-account-private-key-file={}",
                    d.join("sa.key").display()
                ),
                &format!("--root-ca-file={}", d.join("certs/apiserver.crt").display()),
            ]);
            if !gates.is_empty() {
                kcm.arg(format!("--feature-gates={gates}"));
            }
            plane.spawn("kube-controller-manager", &mut kcm)?;
        }
        Ok(plane)
    }

    /// Starts (or restarts) kube-scheduler with `config` as `who`.
    pub fn start_kube_scheduler(&mut self, config: &str, who: Identity, gates: &str) -> Result<()> {
        let kc = self.kubeconfig(who);
        let path = self.dir.path().join("kube-scheduler-config.yaml");
        let full = format!(
            "{}\nclientConnection:\n  kubeconfig: {}\n",
            config.trim_end(),
            kc.display()
        );
        fs::write(&path, full)?;
        let mut ks = Command::new(self.env.bin.join("kube-scheduler"));
        ks.args([
            &format!("--config={}", path.display()),
            "--bind-address=127.0.0.1",
            &format!("--secure-port={}", free_port()),
            &format!("--authentication-kubeconfig={}", kc.display()),
            &format!("--authorization-kubeconfig={}", kc.display()),
            "-v=2",
        ]);
        if !gates.is_empty() {
            ks.arg(format!("--feature-gates={gates}"));
        }
        self.spawn("kube-scheduler", &mut ks)?;
        Ok(())
    }

    fn write_credentials(&mut self) -> Result<()> {
        let d = self.dir.path();
        let key = d.join("sa.key");
        run(Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048"))?;
        run(Command::new("openssl")
            .args(["rsa", "-pubout", "-in"])
            .arg(&key)
            .arg("-out")
            .arg(d.join("sa.pub")))?;
        let mut csv = String::new();
        for (i, id) in Identity::ALL.iter().enumerate() {
            let token = format!("e2e-{}-{:016x}", id.file(), rand_u64() ^ i as u64);
            let (user, groups) = id.user();
            csv.push_str(&format!("{token},{user},uid-{},\"{groups}\"\n", id.file()));
            self.tokens.insert(*id, token);
        }
        fs::write(d.join("tokens.csv"), csv)?;
        Ok(())
    }

    fn write_kubeconfig(&self, id: Identity) -> Result<()> {
        let ca = self.dir.path().join("certs/apiserver.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: {}\n  user:\n    token: {}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {}\ncurrent-context: e2e\n",
            self.url,
            ca.display(),
            id.file(),
            self.tokens[&id],
            id.file()
        );
        fs::write(self.kubeconfig(id), text)?;
        Ok(())
    }

    /// The kubeconfig file of `id`.
    pub fn kubeconfig(&self, id: Identity) -> PathBuf {
        self.dir.path().join(format!("{}.kubeconfig", id.file()))
    }

    /// A kube-rs client as `id`.
    pub async fn client(&self, id: Identity) -> Result<Client> {
        let kc = Kubeconfig::read_from(self.kubeconfig(id))?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    async fn wait_ready(&self) -> Result<()> {
        let start = Instant::now();
        let ca = self.dir.path().join("certs/apiserver.crt");
        loop {
            if start.elapsed() > Duration::from_secs(90) {
                bail!("kube-apiserver not ready within 90 s");
            }
            let out = Command::new("curl")
                .args(["-sf", "--max-time", "2", "--cacert"])
                .arg(&ca)
                .arg("-H")
                .arg(format!(
                    "Authorization: Bearer {}",
                    self.tokens[&Identity::Admin]
                ))
                .arg(format!("{}/readyz", self.url))
                .output();
            if let Ok(o) = out
                && o.status.success()
            {
                println!(
                    "kube-apiserver ready after {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            self.check_alive()?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// An error naming the first started process that has exited.
    pub fn check_alive(&self) -> Result<()> {
        for p in self.procs.iter().filter(|p| !p.killed) {
            let gone = fs::read_to_string(format!("/proc/{}/stat", p.child.id()))
                .map(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
                .unwrap_or(true);
            if gone {
                bail!("{} exited; log {}", p.name, p.log.display());
            }
        }
        Ok(())
    }

    /// Starts `cmd` with its output in `<dir>/<name>.log`; stopped on drop.
    pub fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<u32> {
        let n = self
            .procs
            .iter()
            .filter(|p| p.name.starts_with(name))
            .count();
        let log = self.dir.path().join(format!("{name}-{n}.log"));
        let out = fs::File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let pid = child.id();
        self.procs.push(Proc {
            name: name.to_string(),
            child,
            log,
            killed: false,
        });
        Ok(pid)
    }

    /// `kill -9` of every live process named `name`; returns how many.
    pub fn kill(&mut self, name: &str) -> usize {
        let mut n = 0;
        for p in self.procs.iter_mut().filter(|p| p.name == name) {
            p.killed = true;
            if p.child.try_wait().ok().flatten().is_none() {
                let _ = p.child.kill();
                let _ = p.child.wait();
                n += 1;
            }
        }
        n
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to every live process named
    /// `name` with kill(1); returns how many got it. `STOP` freezes a process
    /// the way a hung node or a long pause does: its sockets stay open and the
    /// kernel still accepts connections on them, but nothing answers.
    pub fn signal(&mut self, name: &str, signal: &str) -> usize {
        let mut n = 0;
        for p in self.procs.iter_mut().filter(|p| p.name == name) {
            if p.child.try_wait().ok().flatten().is_some() {
                continue;
            }
            let sent = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(p.child.id().to_string())
                .status()
                .is_ok_and(|s| s.success());
            n += usize::from(sent);
        }
        n
    }

    /// `kubectl` as the admin, with `stdin`; its stdout, or an error with stderr.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        use std::io::Write;
        let mut cmd = Command::new(self.env.bin.join("kubectl"));
        cmd.arg(format!(
            "--kubeconfig={}",
            self.kubeconfig(Identity::Admin).display()
        ))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        if let Some(text) = stdin {
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply` of one object (server-side validation only: on 1.36 on
    /// two cores client-side validation can time out while OpenAPI warms up).
    pub fn apply(&self, object: &serde_json::Value) -> Result<String> {
        self.kubectl(
            &["apply", "--validate=false", "-f", "-"],
            Some(&object.to_string()),
        )
    }

    /// `kubectl create` of one object (as [`ControlPlane::apply`]).
    pub fn create(&self, object: &serde_json::Value) -> Result<String> {
        self.kubectl(
            &["create", "--validate=false", "-f", "-"],
            Some(&object.to_string()),
        )
    }

    /// The chart's CRDs, namespace, service accounts and RBAC (rendered by
    /// `scripts/render-chart.sh` with `values`), applied as the admin. Nothing
    /// else of the chart: there are no kubelets to run its pods.
    pub fn install_chart_rbac(&self, values: &serde_json::Value) -> Result<()> {
        let root = repo_root();
        let crds = root.join("deploy/helm/tessera/crds");
        self.kubectl(
            &[
                "apply",
                "--validate=false",
                "-f",
                &crds.display().to_string(),
            ],
            None,
        )?;
        self.kubectl(&["create", "namespace", "tessera-system"], None)?;
        let manifest = render_chart_text(values)?;
        let keep = [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ];
        let docs: Vec<&str> = manifest
            .split("\n---")
            .filter(|doc| {
                doc.lines()
                    .find_map(|l| l.strip_prefix("kind: "))
                    .is_some_and(|k| keep.contains(&k.trim()))
            })
            .collect();
        if docs.is_empty() {
            bail!("the chart rendered no RBAC");
        }
        self.kubectl(
            &["apply", "--validate=false", "-f", "-"],
            Some(&docs.join("\n---\n")),
        )?;
        Ok(())
    }

    /// The chart rendered with `values` (`scripts/render-chart.sh`), one JSON
    /// value per document.
    pub fn render_chart(&self, values: &serde_json::Value) -> Result<Vec<serde_json::Value>> {
        render_chart_text(values)?
            .split("\n---")
            .filter(|doc| doc.lines().any(|l| l.starts_with("kind: ")))
            .map(|doc| {
                serde_saphyr::from_str::<serde_json::Value>(doc)
                    .with_context(|| format!("a rendered document does not read:\n{doc}"))
            })
            .collect()
    }

    /// How many processes named `name...` were started.
    pub fn count(&self, name: &str) -> usize {
        self.procs
            .iter()
            .filter(|p| p.name.starts_with(name))
            .count()
    }

    /// The log of the newest process named `name`.
    pub fn log(&self, name: &str) -> String {
        self.procs
            .iter()
            .rev()
            .find(|p| p.name == name)
            .and_then(|p| fs::read_to_string(&p.log).ok())
            .unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        for p in self.procs.iter_mut().rev() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        if panicking || std::env::var_os("TESSERA_E2E_LOGS").is_some() {
            for p in &self.procs {
                let text = fs::read_to_string(&p.log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(40)..];
                eprintln!(
                    "---- {} ({}), last {} lines",
                    p.name,
                    p.log.display(),
                    tail.len()
                );
                for l in tail {
                    eprintln!("{l}");
                }
            }
        }
        if panicking && std::env::var_os("TESSERA_E2E_KEEP").is_some() {
            let kept = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap()).keep();
            eprintln!("kept {}", kept.display());
        }
    }
}

/// The repository's root (this crate is `crates/tessera-e2e`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(anyhow!(
            "{:?}: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

/// `scripts/render-chart.sh` with `values`: the chart's manifest.
fn render_chart_text(values: &serde_json::Value) -> Result<String> {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/render-chart.sh"))
        .arg(values.to_string())
        .output()?;
    if !out.status.success() {
        bail!("render-chart.sh: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}
