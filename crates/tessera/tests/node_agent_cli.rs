//! `tessera node-agent --mig-create / --mig-destroy` as an operator (and
//! `scripts/gpu-smoke.sh`) runs them, on the fake backend: the same backend calls
//! the agent makes for a planned MIG decision, with NVML's refusals named.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tessera");

const GPUS: &str = r#"
driverVersion: "550.54.15"
gpus:
  - uuid: GPU-00000000-0000-0000-0000-000000000000
    product: NVIDIA A100-SXM4-80GB
    mig:
      enabled: true
      instances:
        - { uuid: MIG-11111111-1111-1111-1111-111111111111, profile: 1g.10gb, start: 0 }
  - uuid: GPU-00000000-0000-0000-0000-000000000001
    product: NVIDIA A100-SXM4-80GB
"#;

fn run(args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpus.yaml");
    std::fs::write(&config, GPUS).unwrap();
    let out = Command::new(BIN)
        .args(["node-agent", "--backend", "fake", "--fake-config"])
        .arg(&config)
        .args(["--metrics-addr", "off"])
        .args(args)
        .output()
        .expect("run tessera");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn mig_create_makes_the_planned_instance_and_prints_it() {
    // By index: a 3g.40gb at memory slice 4 beside the 1g.10gb at 0.
    let (code, out, err) = run(&["--mig-create", "0:3g.40gb@4"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["gpu"], "GPU-00000000-0000-0000-0000-000000000000");
    assert_eq!(v["created"]["profile"], "3g.40gb");
    assert_eq!(v["created"]["start"], 4);
    assert!(
        v["created"]["uuid"].as_str().unwrap().starts_with("MIG-"),
        "{out}"
    );
}

#[test]
fn refused_mig_changes_name_nvmls_error_and_exit_1() {
    // 3g.40gb may start at 0 or 4 only.
    let (code, out, err) = run(&[
        "--mig-create",
        "GPU-00000000-0000-0000-0000-000000000000:3g.40gb@2",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("NVML_ERROR_INVALID_ARGUMENT"), "{err}");
    assert!(out.is_empty(), "{out}");
    // Overlaps the existing 1g.10gb at slice 0.
    let (code, _, err) = run(&["--mig-create", "0:4g.40gb@0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("NVML_ERROR_INSUFFICIENT_RESOURCES"), "{err}");
    // GPU 1 is not in MIG mode.
    let (code, _, err) = run(&["--mig-create", "1:1g.10gb@0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("MIG"), "{err}");
    // An instance the GPU does not have.
    let (code, _, err) = run(&["--mig-destroy", "0:MIG-nope"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("MIG-nope"), "{err}");
    // The existing one goes.
    let (code, out, err) = run(&[
        "--mig-destroy",
        "0:MIG-11111111-1111-1111-1111-111111111111",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"destroyed\""), "{out}");
}

#[test]
fn malformed_mig_arguments_are_bad_input() {
    for (flag, arg, says) in [
        ("--mig-create", "0-3g.40gb", "expected GPU:PROFILE@START"),
        ("--mig-create", "0:3g.40gb", "expected GPU:PROFILE@START"),
        ("--mig-create", "0:3g.40gb@x", "not a memory slice"),
        ("--mig-create", "7:3g.40gb@0", "no GPU \"7\""),
        ("--mig-destroy", "MIG-1", "expected GPU:MIG-UUID"),
    ] {
        let (code, _, err) = run(&[flag, arg]);
        assert_eq!(code, 2, "{flag} {arg}: {err}");
        assert!(err.contains(says), "{flag} {arg}: {err}");
    }
}
