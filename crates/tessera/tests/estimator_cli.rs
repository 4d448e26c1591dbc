//! `tessera estimator` refuses bad configuration with exit code 64 and a
//! message naming the flag, before binding or connecting to anything.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tessera");

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .arg("estimator")
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
fn bad_flags_are_refused_by_name_with_exit_64() {
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
        let (code, err) = run(args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(err.contains(&format!("{flag}:")), "{args:?}: {err}");
    }
}
