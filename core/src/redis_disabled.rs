//! Stand-in for the Redis authority when the crate is built without its
//! `redis` feature: config validation refuses every Redis URL first, so these
//! methods are unreachable in practice and answer with an error if called.

use std::time::Duration;

use crate::bucket::{Grant, Policy};
use crate::config::BackendSpec;

const NO_REDIS: &str = "this build of quotalease has no Redis support (enable the `redis` feature)";

pub(crate) type RawBucket = (Option<u64>, Option<u64>, Option<u64>, i64);

// Built by the broker, never read without Redis.
#[allow(dead_code)]
pub(crate) struct LeaseCall {
    pub key: String,
    pub policy: Policy,
    pub want: u64,
    pub need: u64,
}

#[allow(dead_code)]
pub(crate) struct GiveBackCall {
    pub key: String,
    pub policy: Policy,
    pub tokens: u64,
}

pub(crate) struct RedisAuthority;

impl RedisAuthority {
    pub fn new(_spec: BackendSpec, _prefix: &str, _timeout: Duration) -> Self {
        RedisAuthority
    }

    pub fn reset(&mut self) {}

    pub async fn lease_batch(
        &mut self,
        _calls: &[LeaseCall],
        _now: Option<u64>,
    ) -> Result<Vec<Result<Grant, String>>, String> {
        Err(NO_REDIS.into())
    }

    pub async fn give_back_batch(
        &mut self,
        _calls: &[GiveBackCall],
        _now: Option<u64>,
    ) -> Result<Vec<Result<u64, String>>, String> {
        Err(NO_REDIS.into())
    }

    pub async fn inspect(&mut self, _key: &str) -> Result<RawBucket, String> {
        Err(NO_REDIS.into())
    }
}
