//! The Redis connection when the crate is built without its `redis`
//! feature: config validation refuses every Redis URL first, so no call ever
//! reaches it; if one did, it would fail with an error, never panic.

use std::time::Duration;

use super::{Call, Reply};
use crate::config::BackendSpec;

const NO_REDIS: &str = "this build of quotalease has no Redis support (enable the `redis` feature)";

pub(crate) struct Connection;

impl Connection {
    pub fn new(_spec: BackendSpec, _timeout: Duration) -> Self {
        Connection
    }

    pub fn reset(&mut self) {}

    pub async fn run_batch(&mut self, calls: &[Call]) -> Vec<Result<Reply, String>> {
        calls.iter().map(|_| Err(NO_REDIS.to_string())).collect()
    }
}
