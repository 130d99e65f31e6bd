//! The Redis authority's connection: runs the scripts of `lua/` for the
//! broker's batches, one pipelined round trip per batch on a server (or
//! concurrent calls routed by slot on a cluster), through Sentinel when the
//! URL says so.
//!
//! A key's state lives under `{prefix}:{<key>}` (hash-tagged so Redis Cluster
//! keeps it in one slot). Adaptive leasing keeps it as the ledger's hash and
//! a sorted set of expiries (`crate::ledger`, `lua/ledger.lua`); fixed leases
//! as a string `"c t w ..."` (credit units of 1/`w` token, refill accounted
//! up to `t`, the window `w`; `lua/lease.lua`, `lua/give_back.lua` after
//! `lua/prelude.lua`), written with its expiry by one `SET ... PX`. Time is
//! Redis `TIME` (one clock for the fleet) unless the caller passes `now`
//! (manual clocks in deterministic tests). A missing key reads as a full
//! bucket, so idle keys vanish without changing any answer.

use std::time::Duration;

use crate::wire::Back;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, Script, Value};

mod failure;
mod sentinel;
mod store;

use failure::{connect_err, err_text, one_line};
use sentinel::{sentinel_client, Watch, SENTINEL_CHECK};

use super::{Call, Reply};
use crate::bucket::Grant;
use crate::config::{tls_files, BackendSpec};
use crate::guard::Seen;
use crate::wire::{misconfigured, silence, unsent};

const PRELUDE: &str = include_str!("lua/prelude.lua");
const LEASE: &str = include_str!("lua/lease.lua");
const GIVE_BACK: &str = include_str!("lua/give_back.lua");
const POLICY_POLL: &str = include_str!("lua/policy_poll.lua");
const POLICY_WRITE: &str = include_str!("lua/policy_write.lua");
const CHECK: &str = include_str!("lua/check.lua");

/// A script's text and its SHA1 (for EVALSHA).
#[derive(Clone)]
struct Lua {
    code: String,
    sha: String,
}

impl Lua {
    fn new(parts: &[&str]) -> Self {
        let code = parts.concat();
        let sha = Script::new(&code).get_hash().to_string();
        Lua { code, sha }
    }
}

struct Scripts {
    lease: Lua,
    give_back: Lua,
    ledger: Lua,
    policy_poll: Lua,
    policy_write: Lua,
    check: Lua,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            lease: Lua::new(&[PRELUDE, LEASE]),
            give_back: Lua::new(&[PRELUDE, GIVE_BACK]),
            ledger: Lua::new(&[crate::ledger::SCRIPT]),
            policy_poll: Lua::new(&[POLICY_POLL]),
            policy_write: Lua::new(&[POLICY_WRITE]),
            check: Lua::new(&[CHECK]),
        }
    }
}

enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// One connection to one Redis backend (a server, a cluster, or the primary
/// the sentinels of `redis+sentinel://` name), owned by
/// the broker's batch loop for that backend.
pub(crate) struct Connection {
    spec: BackendSpec,
    timeout: Duration,
    scripts: Scripts,
    conn: Option<Conn>,
    /// `redis+sentinel://`: asks the sentinels for the primary on every
    /// (re)connect; kept across reconnects for its connections to them.
    sentinel: Option<SentinelClient>,
    /// `redis+sentinel://`: the primary `conn` is connected to, and when to
    /// ask the sentinels again whether it still is the primary.
    watch: Watch,
}

/// One tick of the runtime's timer: what a call past its deadline waits
/// more (see [`within`]). Not a tuning: the smallest wait that parks the
/// worker.
const LATE_TICK: Duration = Duration::from_millis(1);

/// `tokio::time::timeout`, except that a reply which had arrived by the
/// deadline is never called late. After a stall (a process starved of CPU)
/// the worker sees the socket readable and the deadline passed in the same
/// turn; the task woken last runs first (tokio's LIFO slot), so the
/// timeout could win over a connection task holding the reply. Past the
/// deadline the call gets one timer tick more: the worker parks, the
/// connection task runs and hands the reply over.
pub(crate) async fn within<F: std::future::Future>(limit: Duration, fut: F) -> Result<F::Output, ()> {
    tokio::pin!(fut);
    if let Ok(v) = tokio::time::timeout(limit, &mut fut).await {
        return Ok(v);
    }
    tokio::time::timeout(LATE_TICK, fut).await.map_err(|_| ())
}

/// Send every command at once on `conn` and gather the replies, each in its
/// command's place, until all are in or the server has been silent for
/// `timeout` (then `true`, and the missing replies are `None`).
async fn replies_of<C: ConnectionLike + Clone>(
    conn: &C,
    cmds: &[Cmd],
    timeout: Duration,
) -> (Vec<Option<redis::RedisResult<Value>>>, bool) {
    let mut pending: FuturesUnordered<_> = cmds
        .iter()
        .enumerate()
        .map(|(k, cmd)| {
            let mut c = conn.clone();
            async move { (k, c.req_packed_command(cmd).await) }
        })
        .collect();
    let mut replies: Vec<Option<redis::RedisResult<Value>>> = (0..cmds.len()).map(|_| None).collect();
    while !pending.is_empty() {
        match within(timeout, pending.next()).await {
            Ok(Some((k, r))) => replies[k] = Some(r),
            Ok(None) => break,
            Err(()) => return (replies, true),
        }
    }
    (replies, false)
}

/// Whether `conn` is known to be closed: its connection task ended when it
/// read the server closing the socket (a restart, a failover, Redis'
/// `timeout` on an idle client, a proxy). A batch sent on it would fail
/// unwritten, and the broker could not tell it from one lost in flight:
/// each call's rate paused, the circuit opened, and after a restart empty
/// a holder whose rate had run on reported none (the learning authority
/// then gave it nothing for `learn_ms`: one of ten limiters idle for 7 s in
/// `adaptive_bench … restart`). Polled once, a `TIME` fails at once on such
/// a connection, before anything is written; on an open one it is queued
/// and dropped at once, and the task skips a request whose caller has gone
/// (or, if it was already writing, the server answers a `TIME`: read-only,
/// and in docs/redis.md's ACL rule, where `PING` is not). The batch's own
/// calls are never queued on a closed connection, nor sent twice.
async fn closed(conn: &MultiplexedConnection) -> bool {
    let mut c = conn.clone();
    let time = redis::cmd("TIME");
    let mut probe = c.req_packed_command(&time);
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(matches!(
            probe.as_mut().poll(cx),
            std::task::Poll::Ready(Err(ref e)) if e.is_connection_dropped()
        ))
    })
    .await
}

impl Connection {
    pub fn new(spec: BackendSpec, timeout: Duration) -> Self {
        Connection {
            spec,
            timeout,
            scripts: Scripts::new(),
            conn: None,
            sentinel: None,
            watch: Watch::default(),
        }
    }

    /// Forget the connection (the next call reconnects).
    pub fn reset(&mut self) {
        self.conn = None;
    }

    async fn connect(&mut self) -> Result<&mut Conn, String> {
        if self.conn.is_none() {
            // rustls needs a process-wide crypto provider for rediss://.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let conn = match &self.spec {
                BackendSpec::Redis(url) => {
                    let client = match tls_files(url)? {
                        None => redis::Client::open(url.as_str()).map_err(|e| err_text(&e))?,
                        Some(files) => redis::Client::build_with_tls(url.as_str(), read_tls_files(&files)?)
                            .map_err(|e| err_text(&e))?,
                    };
                    Conn::Single(
                        client
                            .get_multiplexed_async_connection_with_config(&single_config(self.timeout))
                            .await
                            .map_err(|e| connect_err(&e, ""))?,
                    )
                }
                BackendSpec::Sentinel(spec) => {
                    if self.sentinel.is_none() {
                        self.sentinel = Some(sentinel_client(spec).map_err(|e| err_text(&e))?);
                    }
                    let sentinel = self.sentinel.as_mut().expect("sentinel client was just set");
                    // The sentinels name the primary, and the crate checks
                    // with ROLE that it is one before connecting to it.
                    let client = sentinel
                        .async_get_client()
                        .await
                        .map_err(|e| connect_err(&e, " (via Sentinel)"))?;
                    self.watch.primary = match client.get_connection_info().addr() {
                        redis::ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port)),
                        _ => None,
                    };
                    self.watch.next = Some(tokio::time::Instant::now() + SENTINEL_CHECK);
                    Conn::Single(
                        client
                            .get_multiplexed_async_connection_with_config(&single_config(self.timeout))
                            .await
                            .map_err(|e| connect_err(&e, " (via Sentinel)"))?,
                    )
                }
                BackendSpec::Cluster(nodes) => {
                    let client = redis::cluster::ClusterClient::builder(nodes.clone())
                        .connection_timeout(self.timeout)
                        .response_timeout(self.timeout)
                        .retries(1)
                        .build()
                        .map_err(|e| err_text(&e))?;
                    Conn::Cluster(client.get_async_connection().await.map_err(|e| connect_err(&e, ""))?)
                }
                BackendSpec::Memory(_) => return Err("not a Redis backend".into()),
            };
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("connection was just set"))
    }

    /// Run one script call per index (`build(eval, indices)` makes the
    /// commands), all sent at once: on a server they share the connection
    /// (pipelined on the socket), on a cluster each goes to its key's slot
    /// owner. Results are per call: only the calls that got NOSCRIPT are sent
    /// again, with EVAL (which also caches the script on that node), so no
    /// call ever runs twice.
    ///
    /// The server is presumed gone when it stays silent for the timeout, not
    /// when a batch takes longer: 512 script calls on a CPU-starved server
    /// can take more than 250 ms while every reply comes in order. Calling
    /// that a failure opened the circuit on a healthy Redis, and dropping
    /// the connection made it worse (the next connect waited behind the
    /// calls already queued). A call whose reply did not come is failed.
    /// `Err` means no reply came at all (no call's outcome is known).
    async fn run(
        &mut self,
        n: usize,
        build: impl Fn(bool, &[usize]) -> Vec<Cmd>,
    ) -> Result<Vec<Result<Value, String>>, String> {
        let timeout = self.timeout;
        let mut out: Vec<Option<Result<Value, String>>> = (0..n).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..n).collect();
        let mut use_eval = false;
        let mut probe = true;
        self.check_primary().await;
        while !todo.is_empty() {
            let cmds = build(use_eval, &todo);
            // The whole connection set-up is bounded too: a black-holed or
            // paused server must not stall the broker (and every key behind it).
            // (a connection that cannot be opened before the first send
            // leaves every call of the batch certainly unsent)
            let first = !use_eval;
            let conn = match within(timeout, self.connect()).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) if first => return Err(unsent(e)),
                Ok(Err(e)) => return Err(e),
                Err(()) => {
                    self.conn = None;
                    return Err(silence(format_args!("connecting, after {} ms", timeout.as_millis())));
                }
            };
            // (before the first send only: the new connection, and one that
            // has just answered NOSCRIPT, need no probe; a server that
            // closes every new connection fails the batch as before)
            if std::mem::take(&mut probe) {
                if let Conn::Single(c) = &*conn {
                    if closed(c).await {
                        self.conn = None;
                        continue;
                    }
                }
            }
            let (replies, silent) = match conn {
                Conn::Single(c) => replies_of(c, &cmds, timeout).await,
                Conn::Cluster(c) => replies_of(c, &cmds, timeout).await,
            };
            if silent {
                self.conn = None;
                if replies.iter().all(Option::is_none) {
                    return Err(silence(format_args!("after {} ms", timeout.as_millis())));
                }
            }
            let mut retry = Vec::new();
            for (&idx, reply) in todo.iter().zip(replies) {
                let Some(reply) = reply else {
                    out[idx] = Some(Err(silence(format_args!("after {} ms", timeout.as_millis()))));
                    continue;
                };
                let reply = match reply {
                    Ok(Value::ServerError(e)) => Err(RedisError::from(e)),
                    other => other,
                };
                match reply {
                    Ok(v) => out[idx] = Some(Ok(v)),
                    Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) && !use_eval => {
                        retry.push(idx)
                    }
                    Err(e) => {
                        // A server error leaves the connection usable, but
                        // READONLY means the server is a replica now (a
                        // failover demoted it): reconnect, which through
                        // Sentinel finds the new primary.
                        if !matches!(e.kind(), ErrorKind::Server(_))
                            || e.kind() == ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                        {
                            self.conn = None;
                        }
                        out[idx] = Some(Err(self.reply_err(&e)));
                    }
                }
            }
            todo = retry;
            use_eval = true;
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err("no reply".into())))
            .collect())
    }

    /// A failed reply's text. MOVED on a connection to one server (not a
    /// cluster client, which follows redirections and may still see one
    /// while slots move) means the URL names a cluster node as a server.
    fn reply_err(&self, e: &RedisError) -> String {
        let single = !matches!(self.spec, BackendSpec::Cluster(_));
        if single && (e.kind() == ErrorKind::Server(redis::ServerErrorKind::Moved) || e.code() == Some("MOVED")) {
            return misconfigured(format_args!(
                "a redis:// URL names a node of a Redis Cluster; use redis+cluster:// ({})",
                one_line(e)
            ));
        }
        err_text(e)
    }

    fn script_cmd(call: &ScriptCall, eval: bool) -> Cmd {
        let mut cmd = if eval {
            let mut c = redis::cmd("EVAL");
            c.arg(&call.script.code);
            c
        } else {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&call.script.sha);
            c
        };
        cmd.arg(call.keys.len());
        for k in &call.keys {
            cmd.arg(k);
        }
        for a in &call.args {
            cmd.arg(a);
        }
        cmd
    }

    /// One script call each; per-call results (see [`Self::run`]).
    async fn script_batch(&mut self, calls: &[ScriptCall]) -> Result<Vec<Result<Value, String>>, String> {
        self.run(calls.len(), |eval, idx| {
            idx.iter().map(|&i| Self::script_cmd(&calls[i], eval)).collect()
        })
        .await
    }

    /// Answer a batch of calls, one result per call in order: give-backs
    /// first (tokens returned can serve the leases of the same batch), then
    /// leases in one pipelined round trip, then inspections. When the
    /// give-back round trip itself fails, the leases fail at once rather
    /// than wait out a second timeout.
    pub async fn run_batch(&mut self, calls: &[Call]) -> Vec<Result<Reply, String>> {
        let mut out: Vec<Option<Result<Reply, String>>> = (0..calls.len()).map(|_| None).collect();
        let mut backs: Vec<(usize, ScriptCall)> = Vec::new();
        let mut leases: Vec<(usize, ScriptCall, bool)> = Vec::new();
        let mut inspects = Vec::new();
        let mut store = Vec::new();
        let mut checks = Vec::new();
        let scripts = &self.scripts;
        for (i, c) in calls.iter().enumerate() {
            match c {
                Call::GiveBack {
                    key,
                    policy,
                    tokens,
                    now,
                    holder,
                    adaptive,
                    leaving,
                    seen,
                    what,
                    tuning,
                } => backs.push((
                    i,
                    if *adaptive {
                        let ask = crate::ledger::Ask {
                            holder: *holder,
                            held: *tokens,
                            applied: *seen,
                            tuning: *tuning,
                            ..Default::default()
                        };
                        ScriptCall {
                            script: scripts.ledger.clone(),
                            keys: crate::ledger::keys(key),
                            args: crate::ledger::args(
                                what.ledger_op(*leaving),
                                *policy,
                                now.parts(),
                                &ask,
                                0,
                                0,
                                (0, 0, 0),
                            ),
                        }
                    } else {
                        ScriptCall::new(
                            &scripts.give_back,
                            vec![key.clone()],
                            [policy.limit, policy.window_ms, *tokens, u64::from(*what == Back::Debit)],
                            now.for_script(),
                        )
                    },
                )),
                Call::Lease {
                    key,
                    policy,
                    want,
                    need,
                    now,
                    adaptive,
                    guard,
                } => {
                    let call = match adaptive {
                        None => {
                            let args = [policy.limit, policy.window_ms, *want, *need];
                            let mut call = ScriptCall::new(&scripts.lease, vec![key.clone()], args, now.for_script());
                            // The failover guard's view, always the last four
                            // arguments (the prelude's `guard()` reads them there).
                            call.args.extend(
                                [guard.holders, guard.epoch, guard.version, guard.alive_ms, guard.recent]
                                    .map(|v| v.to_string()),
                            );
                            call
                        }
                        Some(a) => ScriptCall {
                            script: scripts.ledger.clone(),
                            keys: crate::ledger::keys(key),
                            args: crate::ledger::args(
                                "l",
                                *policy,
                                now.parts(),
                                a,
                                *want,
                                *need,
                                (guard.epoch, guard.version, guard.alive_ms),
                            ),
                        },
                    };
                    leases.push((i, call, adaptive.is_some()));
                }
                Call::Inspect { key, .. } => inspects.push((i, key.clone())),
                Call::Policy { base, op } => store.push((i, base.clone(), op.clone())),
                Call::Check { key } => checks.push((
                    i,
                    ScriptCall {
                        script: scripts.check.clone(),
                        keys: vec![key.clone()],
                        args: Vec::new(),
                    },
                )),
            }
        }
        let mut transport: Option<String> = None;
        if !backs.is_empty() {
            let batch: Vec<ScriptCall> = backs.iter().map(|(_, c)| c.clone()).collect();
            match self.script_batch(&batch).await {
                Ok(replies) => {
                    for ((i, _), r) in backs.iter().zip(replies) {
                        out[*i] = Some(r.and_then(|v| {
                            redis::from_redis_value::<u64>(v)
                                .map(|_| Reply::Returned)
                                .map_err(|e| format!("unexpected reply from the give-back script: {e}"))
                        }));
                    }
                }
                Err(e) => {
                    for (i, _) in &backs {
                        out[*i] = Some(Err(e.clone()));
                    }
                    transport = Some(e);
                }
            }
        }
        if !leases.is_empty() {
            let replies = match &transport {
                // (the leases were never sent)
                Some(e) => Err(unsent(e.clone())),
                None => {
                    let batch: Vec<ScriptCall> = leases.iter().map(|(_, c, _)| c.clone()).collect();
                    self.script_batch(&batch).await
                }
            };
            match replies {
                Ok(replies) => {
                    for ((i, _, adaptive), r) in leases.iter().zip(replies) {
                        out[*i] = Some(r.and_then(|v| parse_lease(v, *adaptive)));
                    }
                }
                Err(e) => {
                    for (i, _, _) in &leases {
                        out[*i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        for (i, key) in inspects {
            out[i] = Some(self.inspect(&key).await.map(Reply::Stored));
        }
        for (i, base, op) in store {
            out[i] = Some(self.policy(&base, op).await.map(Reply::Policy));
        }
        for (i, call) in checks {
            let r = self.script_batch(std::slice::from_ref(&call)).await;
            out[i] = Some(
                r.and_then(|mut r| r.pop().unwrap_or_else(|| Err("no reply".into())))
                    .map(|_| Reply::Checked),
            );
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err("no reply".into())))
            .collect()
    }
}

/// A single server's connection settings: connecting bounded. Replies are
/// bounded by the caller's [`within`] (the crate's own response timeout
/// would call a reply late that had arrived).
fn single_config(timeout: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
}

/// The client certificate and trusted CA a `rediss://` URL names, read now
/// (each connect, so a rotated certificate is picked up on reconnect).
fn read_tls_files(files: &crate::config::TlsFiles) -> Result<redis::TlsCertificates, String> {
    let read = |name: &str, path: &str| std::fs::read(path).map_err(|e| format!("cannot read `{name}`: {e}"));
    let client_tls = match (&files.certfile, &files.keyfile) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read("ssl_certfile", cert)?,
            client_key: read("ssl_keyfile", key)?,
        }),
        _ => None,
    };
    let root_cert = match &files.ca_certs {
        Some(ca) => Some(read("ssl_ca_certs", ca)?),
        None => None,
    };
    Ok(redis::TlsCertificates { client_tls, root_cert })
}

/// One script call: its keys and arguments (ARGV), `now` last of the four
/// bucket arguments as every script's prelude expects.
#[derive(Clone)]
struct ScriptCall {
    script: Lua,
    keys: Vec<String>,
    args: Vec<String>,
}

impl ScriptCall {
    fn new(script: &Lua, keys: Vec<String>, bucket: [u64; 4], now: Option<u64>) -> Self {
        let mut args: Vec<String> = bucket.iter().map(u64::to_string).collect();
        args.push(now.map_or(String::new(), |n| n.to_string()));
        ScriptCall {
            script: script.clone(),
            keys,
            args,
        }
    }
}

/// A lease script's reply: `{granted, remaining, wait_ms, epoch, version,
/// alive_ms, lost}`, or the ledger's (see [`crate::ledger::parse`]).
fn parse_lease(v: Value, adaptive: bool) -> Result<Reply, String> {
    let bad = |e: redis::ParsingError| format!("unexpected reply from the lease script: {e}");
    if adaptive {
        let r: Vec<i64> = redis::from_redis_value(v).map_err(bad)?;
        return super::ledger_reply(&r);
    }
    let r: Vec<u64> = redis::from_redis_value(v).map_err(bad)?;
    let &[granted, remaining, wait_ms, epoch, version, alive_ms, lost] = r.as_slice() else {
        return Err(format!("unexpected reply from the lease script: {r:?}"));
    };
    Ok(Reply::Grant(
        Grant {
            granted,
            remaining,
            wait_ms,
        },
        None,
        Seen {
            epoch,
            version,
            alive_ms,
            lost: lost == 1,
        },
    ))
}

/// The ledger's two Redis keys for a bucket key: the state and its expiries
/// (the same hash tag, so one cluster slot).
#[cfg(test)]
mod tests {
    use super::within;
    use std::io::Write;
    use std::time::Duration;

    /// The broker's runtime (one worker) stalls past a call's deadline while
    /// the reply arrives: the call gets its reply, not a timeout. A task
    /// reading a socket stands in for the connection's task.
    #[test]
    fn a_reply_that_arrived_during_a_stall_is_not_late() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        for _ in 0..20 {
            let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            let got = rt.block_on(async move {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let a = tokio::net::UnixStream::from_std(a).unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1];
                    loop {
                        a.readable().await.unwrap();
                        if let Ok(1) = a.try_read(&mut buf) {
                            break;
                        }
                    }
                    let _ = tx.send(buf[0]);
                });
                let call = tokio::spawn(within(Duration::from_millis(20), rx));
                // the reply is written at once; the worker is then blocked
                // well past the deadline (a process starved of CPU)
                tokio::spawn(async move {
                    b.write_all(&[7]).unwrap();
                    std::thread::sleep(Duration::from_millis(60));
                })
                .await
                .unwrap();
                call.await.unwrap()
            });
            assert_eq!(got.map(|r| r.ok()), Ok(Some(7)), "a reply that arrived was called late");
        }
    }
}
