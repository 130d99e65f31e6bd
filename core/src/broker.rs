//! The broker: ONE tokio runtime per process (one named worker thread,
//! created on first use, created again in a forked child, never at import),
//! and ONE connection per Redis backend per process, shared by every limiter.
//!
//! Each backend ([`Target`]: its URL and round-trip bound) has one batch
//! loop that owns its connection: calls from every limiter of the process
//! queue on one channel and go out together in pipelined round trips. The
//! loop knows nothing of limiters: a call carries its own callback. One
//! ticker refreshes every registered limiter ([`Tick`]) for lease-TTL
//! maintenance. See docs/design.md, "The broker".

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::runtime::Runtime;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::{Error, Result};
use crate::fork;
pub(crate) use crate::ledger::TICK;
use crate::url::BackendSpec;
use crate::wire::{Call, Done};

/// The longest time between two sweeps of a limiter's maintenance: the
/// ticker sweeps at its first tick a `Tuning::sweep_ms` after the last
/// sweep. (Tests on manual clocks run the maintenance this often, as the
/// ticker would.)
pub fn longest_sweep_gap_ms(cfg: &crate::Config) -> u64 {
    cfg.tuning.sweep_ms(cfg.lease_ttl_ms) + TICK.as_millis() as u64
}

/// A Redis backend: one connection per distinct target in a process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Target {
    pub spec: BackendSpec,
    /// Bound on every round trip (and on connecting).
    pub timeout_ms: u64,
    /// Which traffic: leases, or the policy store's (its own batch loop and
    /// connection, so a slow store call never holds a lease call up).
    pub lane: Lane,
}

/// The two kinds of traffic to one backend, each on its own connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    Leases,
    Policies,
}

/// Something the ticker calls every [`TICK`] while it lives.
pub(crate) trait Tick: Send + Sync {
    fn tick(&self);
}

/// A call and its callback, as queued for a batch loop.
pub(crate) type Job = (Call, Done);

/// A backend's batch loop, spawned on the broker's runtime for each new
/// target: the authority's (the broker knows no connection type).
pub(crate) type Serve = fn(Target, UnboundedReceiver<Job>) -> BoxFuture;
pub(crate) type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The process-wide runtime with its backend loops and ticker.
pub(crate) struct Broker {
    /// Fork generation the runtime's threads belong to.
    gen: u64,
    rt: Runtime,
    loops: Mutex<HashMap<Target, UnboundedSender<Job>>>,
    tickers: Arc<Mutex<Vec<Weak<dyn Tick>>>>,
}

/// A limiter's handle on one backend loop.
pub(crate) struct Link {
    pub broker: Arc<Broker>,
    tx: UnboundedSender<Job>,
}

static BROKER: Mutex<Option<Arc<Broker>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process' broker, started on first use (and again after a fork).
pub(crate) fn get() -> Result<Arc<Broker>> {
    let gen = fork::generation();
    let mut slot = lock(&BROKER);
    if let Some(b) = slot.as_ref() {
        if b.gen == gen {
            return Ok(b.clone());
        }
        // Inherited across fork(): its threads do not exist in this process,
        // so it must be forgotten, never shut down.
        std::mem::forget(slot.take());
    }
    let b = Arc::new(Broker::start(gen)?);
    *slot = Some(b.clone());
    Ok(b)
}

/// A link to `target`'s batch loop on the current broker (started with
/// `serve` when there is none).
pub(crate) fn link(target: &Target, serve: Serve) -> Result<Link> {
    let broker = get()?;
    let tx = broker.loop_for(target, serve);
    Ok(Link { broker, tx })
}

impl Link {
    /// False once a fork made this link's runtime unusable.
    pub fn is_current(&self) -> bool {
        self.broker.gen == fork::current()
    }

    /// Queue a call; `Err` gives the callback back when the loop is gone.
    pub fn send(&self, call: Call, done: Done) -> std::result::Result<(), Done> {
        self.tx.send((call, done)).map_err(|e| e.0 .1)
    }
}

impl Broker {
    fn start(gen: u64) -> Result<Broker> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("quotalease-broker")
            .enable_all()
            .build()
            .map_err(|e| Error::Backend(format!("cannot start the broker runtime: {e}")))?;
        let tickers: Arc<Mutex<Vec<Weak<dyn Tick>>>> = Arc::default();
        rt.spawn(ticker(tickers.clone()));
        Ok(Broker {
            gen,
            rt,
            loops: Mutex::new(HashMap::new()),
            tickers,
        })
    }

    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// Tick `t` every [`TICK`] for as long as it lives.
    pub fn register(&self, t: Weak<dyn Tick>) {
        lock(&self.tickers).push(t);
    }

    /// Connections (batch loops) open in this process, for tests and `inspect`.
    pub fn backends(&self) -> usize {
        lock(&self.loops).len()
    }

    fn loop_for(&self, target: &Target, serve: Serve) -> UnboundedSender<Job> {
        let mut loops = lock(&self.loops);
        if let Some(tx) = loops.get(target) {
            if !tx.is_closed() {
                return tx.clone();
            }
        }
        let (tx, rx) = unbounded_channel();
        self.rt.spawn(serve(target.clone(), rx));
        loops.insert(target.clone(), tx.clone());
        tx
    }
}

/// Process-wide broker facts, for tests and diagnostics.
pub fn connections_open() -> usize {
    lock(&BROKER)
        .as_ref()
        .filter(|b| b.gen == fork::current())
        .map_or(0, |b| b.backends())
}

async fn ticker(tickers: Arc<Mutex<Vec<Weak<dyn Tick>>>>) {
    let mut iv = tokio::time::interval(TICK);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        iv.tick().await;
        let live: Vec<Arc<dyn Tick>> = {
            let mut t = lock(&tickers);
            t.retain(|w| w.strong_count() > 0);
            t.iter().filter_map(Weak::upgrade).collect()
        };
        for t in live {
            t.tick();
        }
    }
}
