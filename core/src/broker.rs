//! The broker: an internal tokio runtime (created lazily, named threads) that
//! sends lease and give-back requests to Redis in pipelined batches, keeps the
//! coarse clock fresh and runs lease-TTL maintenance.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::bucket::{Grant, Policy};
use crate::entry::Entry;
use crate::error::{Error, Result};
use crate::limiter::Inner;
use crate::redis_authority::RedisAuthority;

/// Most requests sent in one pipelined round trip.
const MAX_BATCH: usize = 512;
/// How often the coarse clock is refreshed.
const TICK: Duration = Duration::from_millis(10);

/// Where the answer to a lease request goes when a caller waits for it
/// itself (exact mode) instead of the tokens going to the key's local lease.
pub(crate) enum Reply {
    Sync(std::sync::mpsc::SyncSender<Result<Grant, String>>),
    Async(tokio::sync::oneshot::Sender<Result<Grant, String>>),
}

impl Reply {
    pub fn send(self, r: Result<Grant, String>) {
        match self {
            Reply::Sync(tx) => {
                let _ = tx.try_send(r);
            }
            Reply::Async(tx) => {
                let _ = tx.send(r);
            }
        }
    }
}

pub(crate) enum Job {
    Lease {
        entry: Arc<Entry>,
        want: u64,
        need: u64,
        reply: Option<Reply>,
    },
    GiveBack {
        key: String,
        policy: Policy,
        tokens: u64,
    },
}

pub(crate) struct Broker {
    rt: Option<Runtime>,
    tx: Option<UnboundedSender<Job>>,
}

impl Broker {
    /// Start the runtime and its tasks for `inner`.
    pub fn start(inner: &Arc<Inner>) -> Result<Broker> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("quotalease-broker")
            .enable_all()
            .build()
            .map_err(|e| Error::Backend(format!("cannot start the broker runtime: {e}")))?;
        let tx = inner.redis_spec().map(|spec| {
            let (tx, mut rx) = unbounded_channel::<Job>();
            let weak = Arc::downgrade(inner);
            let mut auth = RedisAuthority::new(
                spec.clone(),
                &inner.r.cfg.key_prefix,
                Duration::from_millis(inner.r.cfg.backend_timeout_ms),
            );
            rt.spawn(async move {
                let mut batch = Vec::new();
                while let Some(job) = rx.recv().await {
                    batch.push(job);
                    while batch.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(j) => batch.push(j),
                            Err(_) => break,
                        }
                    }
                    let Some(inner) = weak.upgrade() else { break };
                    let n = batch.len() as u64;
                    // Every round trip inside is bounded; this outer bound
                    // guarantees the loop itself can never stall on one batch.
                    let guard = Duration::from_millis(inner.r.cfg.backend_timeout_ms * 4 + 1_000);
                    let run = inner.run_batch(&mut auth, std::mem::take(&mut batch));
                    if tokio::time::timeout(guard, run).await.is_err() {
                        tracing::error!("quotalease: a backend batch did not finish in {guard:?}; abandoned");
                        auth.reset();
                        inner.abandon_batch(n);
                    }
                }
            });
            tx
        });
        if !inner.clock.is_manual() {
            rt.spawn(ticker(Arc::downgrade(inner)));
        }
        Ok(Broker { rt: Some(rt), tx })
    }

    /// Queue a job for the batch loop. False when there is no Redis backend
    /// or the loop is gone.
    pub fn send(&self, job: Job) -> std::result::Result<(), Job> {
        match &self.tx {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    pub fn runtime(&self) -> &Runtime {
        self.rt.as_ref().expect("the runtime lives as long as the broker")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            // Never blocks, so it is safe from any thread, even inside an async context.
            rt.shutdown_background();
        }
    }
}

async fn ticker(weak: Weak<Inner>) {
    let mut iv = tokio::time::interval(TICK);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_sweep = 0u64;
    loop {
        iv.tick().await;
        let Some(inner) = weak.upgrade() else { break };
        let now = inner.clock.precise();
        if now.saturating_sub(last_sweep) >= inner.sweep_every_ms() {
            last_sweep = now;
            inner.maintain_at(now);
        }
    }
}
