//! Shared by the CLI's integration tests: the built `quotalease` binary, and
//! the core's harness wrapper (real redis-server processes).
#![allow(dead_code)]

use std::process::{Command, Output};

#[path = "../../../core/tests/common/mod.rs"]
mod harness;
#[allow(unused_imports)]
pub use harness::*;

/// Run `quotalease args...`; returns (exit code, stdout, stderr).
/// QUOTALEASE_REDIS_URL is removed, so only `--redis` names a Redis.
pub fn quotalease(args: &[&str]) -> (i32, String, String) {
    quotalease_with_env(args, None)
}

/// Run `quotalease args...` with QUOTALEASE_REDIS_URL set to `redis_env`
/// (`None`: removed); returns (exit code, stdout, stderr).
pub fn quotalease_with_env(args: &[&str], redis_env: Option<&str>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quotalease"));
    cmd.args(args);
    match redis_env {
        Some(url) => cmd.env("QUOTALEASE_REDIS_URL", url),
        None => cmd.env_remove("QUOTALEASE_REDIS_URL"),
    };
    let out: Output = cmd.output().expect("run the quotalease binary");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "quotalease {args:?} panicked:\n{stderr}");
    (out.status.code().unwrap_or(-1), stdout, stderr)
}
