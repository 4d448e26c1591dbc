//! The `kubectl-tessera` binary as a user runs it: a kubeconfig pointing at a
//! loopback API server (canned v1 list responses over plain HTTP), and, where
//! kubectl is installed, kubectl itself finding and running the plugin.
//! Under `CI=true` a missing kubectl is a failure (`.ci/run` installs Debian's
//! `kubernetes-client`); elsewhere those steps are skipped with a note.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-tessera");

/// `{"kind":KIND,"items":[…]}` for each list path the plugin reads.
fn answer(path: &str) -> (u16, String) {
    let alloc = r#"{\"version\":1,\"podUid\":\"u1\",\"pod\":\"ml/infer\",\"node\":\"gpu-a\",\"policy\":\"tessera\",\"isolation\":\"mps\",\"gpus\":[{\"index\":0,\"uuid\":\"GPU-a0\",\"memoryMib\":40960,\"coresMilli\":500}]}"#;
    let pod = format!(
        r#"{{"metadata":{{"name":"infer","namespace":"ml","uid":"u1","annotations":{{"tessera.io/allocation":"{alloc}"}}}},
            "spec":{{"nodeName":"gpu-a","containers":[{{"name":"main","resources":{{"requests":{{"tessera.io/gpu":"1","tessera.io/gpu-milli":"500"}}}}}}]}},
            "status":{{"phase":"Running"}}}}"#
    );
    let list = |kind: &str, items: &str| {
        format!(
            r#"{{"kind":"{kind}","apiVersion":"v1","metadata":{{"resourceVersion":"9"}},"items":[{items}]}}"#
        )
    };
    match path {
        "/api/v1/nodes" => (
            200,
            list(
                "NodeList",
                r#"{"metadata":{"name":"gpu-a"},"status":{"allocatable":{"cpu":"32","memory":"128Gi","pods":"110"},"conditions":[{"type":"Ready","status":"True"}]}}"#,
            ),
        ),
        "/apis/tessera.io/v1alpha1/gpunodes" => (
            200,
            list(
                "GpuNodeList",
                r#"{"apiVersion":"tessera.io/v1alpha1","kind":"GpuNode","metadata":{"name":"gpu-a"},"spec":{"nodeName":"gpu-a","gpus":[{"index":0,"uuid":"GPU-a0","model":"A100-80GB","memoryMiB":81920}]}}"#,
            ),
        ),
        "/api/v1/pods" | "/api/v1/namespaces/ml/pods" => (200, list("PodList", &pod)),
        "/api/v1/namespaces/other/pods" => (200, list("PodList", "")),
        _ => (
            404,
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#
                .to_string(),
        ),
    }
}

/// Serves [`answer`] on a loopback port until the test process ends; returns the port.
fn serve() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("bound").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(match stream.try_clone() {
                Ok(s) => s,
                Err(_) => continue,
            });
            let mut first = String::new();
            if reader.read_line(&mut first).is_err() {
                continue;
            }
            // Drain the headers (GET has no body).
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let target = first.split_whitespace().nth(1).unwrap_or("/");
            let path = target.split('?').next().unwrap_or(target);
            let (status, body) = answer(path);
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.flush();
            let _ = stream.read(&mut [0u8; 1]);
        }
    });
    port
}

fn kubeconfig(dir: &Path, port: u16) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: ml\n\
clusters:\n- name: local\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\n\
users:\n- name: u\n  user: {{token: t}}\n\
contexts:\n- name: ml\n  context: {{cluster: local, user: u, namespace: ml}}\n\
- name: other\n  context: {{cluster: local, user: u, namespace: other}}\n"
        ),
    )
    .expect("kubeconfig written");
    path
}

fn run(cmd: &mut Command) -> (String, String, i32) {
    let out = cmd.output().expect("the command runs");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

#[test]
fn the_binary_honours_kubeconfig_context_and_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(dir.path(), serve());
    let cfg = cfg.to_str().unwrap();
    let (out, err, code) = run(Command::new(BIN).args(["--kubeconfig", cfg, "top"]));
    assert_eq!(code, 0, "{err}");
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..5],
        ["gpu-a", "A100-80GB", "1", "500m", "50%"],
        "{out}"
    );

    let (out, err, code) = run(Command::new(BIN).args(["--kubeconfig", cfg, "pods"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("infer") && out.contains("0:500m/40960Mi"),
        "{out}"
    );
    // The context "other" has its own namespace, empty of GPU pods; -n overrides it.
    let (out, _, _) =
        run(Command::new(BIN).args(["--kubeconfig", cfg, "--context", "other", "pods"]));
    assert_eq!(out, "No GPU pods found.\n");
    let (out, _, _) = run(Command::new(BIN).args([
        "--kubeconfig",
        cfg,
        "--context",
        "other",
        "pods",
        "-n",
        "ml",
    ]));
    assert!(out.contains("infer"), "{out}");
    // Bad flags and an unknown context are clear errors, not panics.
    let (_, err, code) = run(Command::new(BIN).args(["top", "-o", "yaml"]));
    assert_eq!(code, 2, "{err}");
    let (_, err, code) =
        run(Command::new(BIN).args(["--kubeconfig", cfg, "--context", "nope", "top"]));
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: kubeconfig:") && err.contains("nope"),
        "{err}"
    );
}

/// kubectl finds `kubectl-tessera` on PATH and runs it as `kubectl tessera`.
#[test]
fn kubectl_finds_and_runs_the_plugin() {
    let Some(kubectl) = which("kubectl") else {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "kubectl is missing under CI (install Debian's kubernetes-client)"
        );
        eprintln!("skipping: no kubectl on PATH");
        return;
    };
    // A directory holding only the plugin (a link to the built binary): cargo's
    // own directory also holds `kubectl-tessera.d`, which kubectl warns about.
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(BIN, plugins.path().join("kubectl-tessera")).unwrap();
    let bin_dir = plugins.path();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(dir.path(), serve());
    let (out, err, code) = run(Command::new(&kubectl)
        .args(["plugin", "list"])
        .env("PATH", &path)
        .env("KUBECONFIG", &cfg));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("{}/kubectl-tessera", bin_dir.display())),
        "{out}{err}"
    );
    let (out, err, code) = run(Command::new(&kubectl)
        .args(["tessera", "pods", "-A"])
        .env("PATH", &path)
        .env("KUBECONFIG", &cfg));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("NAMESPACE") && out.contains("0:500m/40960Mi"),
        "{out}"
    );
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
