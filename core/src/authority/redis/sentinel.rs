//! Redis Sentinel for the connection: which primary the sentinels name, and
//! the periodic check that the connected server still is it.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, RedisConnectionInfo};

use super::{within, Connection};
use crate::config::{BackendSpec, SentinelSpec};

/// How often a connection found through Sentinel asks a sentinel whether its
/// server is still the primary. After a failover that leaves the old primary
/// running (`SENTINEL FAILOVER`, a partition), that server keeps accepting
/// writes until the sentinels get round to demoting it (about 10 s with
/// default settings), and those writes are lost when it resyncs: the
/// connection moves to the new primary within this period instead.
pub(super) const SENTINEL_CHECK: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct Watch {
    pub primary: Option<(String, u16)>,
    pub next: Option<tokio::time::Instant>,
    /// A connection to the sentinel that last answered, and its index.
    pub conn: Option<(usize, MultiplexedConnection)>,
    /// The sentinel to ask first when there is no such connection.
    pub from: usize,
}

impl Connection {
    /// `redis+sentinel://`, at most every [`SENTINEL_CHECK`]: drop the
    /// connection when a sentinel names another primary than the one it is
    /// connected to (the next connect then asks the sentinels for it). No
    /// answer within the round-trip bound keeps the connection: the
    /// sentinels being away is no reason to leave a working primary.
    pub(super) async fn check_primary(&mut self) {
        let BackendSpec::Sentinel(spec) = &self.spec else {
            return;
        };
        let now = tokio::time::Instant::now();
        if self.conn.is_none() || self.watch.next.is_some_and(|t| now < t) {
            return;
        }
        self.watch.next = Some(now + SENTINEL_CHECK);
        let ask = ask_sentinels(spec, &mut self.watch.conn, self.watch.from);
        match within(self.timeout, ask).await {
            Ok(Some(named)) if self.watch.primary.as_ref() != Some(&named) => self.conn = None,
            Ok(_) => {}
            // A sentinel that does not answer in time: start from the next
            // one next time, so a black-holed one does not hold up every check.
            Err(_) => {
                self.watch.conn = None;
                self.watch.from += 1;
            }
        }
    }
}

/// The primary a sentinel names for `spec`'s service (`SENTINEL
/// GET-MASTER-ADDR-BY-NAME`), asking each sentinel in turn from the one that
/// answered last (else from `from`); None when none answers.
pub(super) async fn ask_sentinels(
    spec: &SentinelSpec,
    cached: &mut Option<(usize, MultiplexedConnection)>,
    from: usize,
) -> Option<(String, u16)> {
    let n = spec.sentinels.len();
    let first = cached.as_ref().map_or(from % n, |(i, _)| *i);
    for i in (first..first + n).map(|i| i % n) {
        if cached.as_ref().is_none_or(|(c, _)| *c != i) {
            *cached = None;
            let mut info = RedisConnectionInfo::default();
            if let Some(u) = &spec.sentinel_username {
                info = info.set_username(u);
            }
            if let Some(p) = &spec.sentinel_password {
                info = info.set_password(p);
            }
            let Ok(addr) = format!("redis://{}", spec.sentinels[i]).into_connection_info() else {
                continue;
            };
            let Ok(client) = redis::Client::open(addr.set_redis_settings(info)) else {
                continue;
            };
            match client.get_multiplexed_async_connection().await {
                Ok(c) => *cached = Some((i, c)),
                Err(_) => continue,
            }
        }
        let (_, c) = cached.as_mut().expect("a sentinel connection was just set");
        let named: redis::RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&spec.service)
            .query_async(c)
            .await;
        match named {
            Ok(Some(addr)) => return Some(addr),
            _ => *cached = None,
        }
    }
    None
}

/// The client that asks the sentinels for `spec`'s primary.
pub(super) fn sentinel_client(spec: &SentinelSpec) -> redis::RedisResult<SentinelClient> {
    let addrs = spec
        .sentinels
        .iter()
        .map(|hp| Ok(format!("redis://{hp}").into_connection_info()?.addr().clone()))
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let mut b =
        SentinelClientBuilder::new(addrs, &spec.service, SentinelServerType::Master)?.set_client_to_redis_db(spec.db);
    if let Some(u) = &spec.username {
        b = b.set_client_to_redis_username(u);
    }
    if let Some(p) = &spec.password {
        b = b.set_client_to_redis_password(p);
    }
    if spec.resp3 {
        b = b.set_client_to_redis_protocol(redis::ProtocolVersion::RESP3);
    }
    if let Some(u) = &spec.sentinel_username {
        b = b.set_client_to_sentinel_username(u);
    }
    if let Some(p) = &spec.sentinel_password {
        b = b.set_client_to_sentinel_password(p);
    }
    b.build()
}
