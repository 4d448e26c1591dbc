//! `tessera scheduler` refuses bad configuration with exit code 64 and a
//! message naming the setting, before connecting to anything.

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
