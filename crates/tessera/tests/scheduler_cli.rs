//! `tessera scheduler` and `tessera estimator` refuse bad configuration with
//! exit code 64 and a message naming the setting, before binding or
//! connecting to anything.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tessera");

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run tessera");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_rate_limits_and_gpu_equivalents_are_refused_by_name() {
    let (code, err) = run(&["scheduler", "--kube-api-qps=-1"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("kube-api-qps"), "{err}");
    let (code, err) = run(&["scheduler", "--kube-api-qps", "10", "--kube-api-burst", "0"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("kube-api-burst"), "{err}");
    let dir = std::env::temp_dir().join(format!("tessera-sched-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    let (code, err) = run(&[
        "scheduler",
        "--identity",
        "test-0",
        "--signing-key-file",
        key.to_str().unwrap(),
        "--gpu-equivalents",
        "Z9=1",
    ]);
    assert_eq!(code, 64, "{err}");
    assert!(
        err.contains("gpu-equivalents") && err.contains("Z9"),
        "{err}"
    );
}

/// `tessera estimator`: each bad flag is named.
#[test]
fn bad_estimator_flags_are_refused_by_name_with_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    let key = key.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--signing-key-file", key], "cluster-name"),
        (&["--cluster-name", "m1"], "signing-key-file"),
        (
            &[
                "--cluster-name",
                "m1",
                "--signing-key-file",
                key,
                "--tls-cert",
                "c.pem",
            ],
            "tls-key",
        ),
        (
            &[
                "--cluster-name",
                "m1",
                "--signing-key-file",
                key,
                "--listen",
                "nowhere",
            ],
            "listen",
        ),
        (
            &[
                "--cluster-name",
                "m1",
                "--signing-key-file",
                key,
                "--policy",
                "nope",
            ],
            "policy",
        ),
        (
            &[
                "--cluster-name",
                "m1",
                "--signing-key-file",
                key,
                "--gpu-equivalents",
                "Z9=1",
            ],
            "gpu-equivalents",
        ),
    ];
    for (args, flag) in cases {
        let args = [&["estimator"][..], args].concat();
        let (code, err) = run(&args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(err.contains(&format!("{flag}:")), "{args:?}: {err}");
    }
}

/// `tessera kueue-admission`: each bad flag is named, exit 64, before it
/// connects to anything.
#[test]
fn bad_kueue_admission_flags_are_refused_by_name_with_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    let key = key.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&[], "signing-key-file"),
        (&["--signing-key-file", key, "--interval", "0"], "interval"),
        (
            &["--signing-key-file", key, "--health-listen", "nowhere"],
            "health-listen",
        ),
        (&["--signing-key-file", key, "--policy", "nope"], "policy"),
        (
            &["--signing-key-file", key, "--gpu-equivalents", "Z9=1"],
            "gpu-equivalents",
        ),
    ];
    for (args, flag) in cases {
        let args = [&["kueue-admission"][..], args].concat();
        let (code, err) = run(&args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(err.contains(&format!("{flag}:")), "{args:?}: {err}");
    }
}
