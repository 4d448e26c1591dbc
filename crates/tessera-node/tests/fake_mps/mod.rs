//! A shell script standing in for `nvidia-cuda-mps-control`: with `-f` it serves
//! a control FIFO in the pipe directory, as the real daemon serves its pipe, and
//! records its environment, its PID and every command; without arguments it
//! sends its stdin to that FIFO, as the real client does.
#![allow(dead_code)] // each test binary uses its own part

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const FAKE_CONTROL: &str = r#"#!/bin/sh
set -u
if [ "${1:-}" = "-f" ]; then
  env | grep -E '^(CUDA_VISIBLE_DEVICES|CUDA_MPS_PIPE_DIRECTORY)=' | sort > "$CUDA_MPS_LOG_DIRECTORY/env"
  echo $$ > "$CUDA_MPS_LOG_DIRECTORY/pid"
  mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control" || exit 1
  while :; do
    while read -r cmd; do
      echo "$cmd" >> "$CUDA_MPS_LOG_DIRECTORY/commands"
      if [ "$cmd" = quit ]; then rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
    done < "$CUDA_MPS_PIPE_DIRECTORY/control"
  done
fi
cat > "$CUDA_MPS_PIPE_DIRECTORY/control"
"#;

pub fn write_script(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("fake-mps-control");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}
