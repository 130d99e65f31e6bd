//! Shared by the CLI's integration tests: the built `quotalease` binary and
//! real redis-server processes from the project's harness script.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Run `quotalease args...`; returns (exit code, stdout, stderr).
pub fn quotalease(args: &[&str]) -> (i32, String, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_quotalease"))
        .args(args)
        .output()
        .expect("run the quotalease binary");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "quotalease {args:?} panicked:\n{stderr}");
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

fn redisctl(args: &[&str]) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/harness/redisctl");
    // This suite's own state dir, so no other suite's stop-all touches our servers.
    let state = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("quotalease-cli-harness");
    let out = Command::new(&script)
        .args(args)
        .env("QUOTALEASE_HARNESS_STATE", &state)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "redisctl {args:?} failed: {}\n(is redis-server installed? `make test` installs it)",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A real redis-server on a free loopback port, stopped on drop.
pub struct RedisServer {
    pub port: u16,
}

impl RedisServer {
    pub fn start() -> Self {
        let port = redisctl(&["start"]).parse().expect("redisctl start prints a port");
        RedisServer { port }
    }
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        redisctl(&["stop", &self.port.to_string()]);
    }
}
