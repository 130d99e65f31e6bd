//! Following the shared policy store and the policy file: the store's
//! polls and reads (on the broker's ticker, or at once for `settle()` and
//! a key's first resolution), the file's reload, and the CLI's writes. What
//! they change reaches a key's entries through `resolve` (the parent module).

use std::sync::atomic::Ordering::*;
use std::time::Duration;

use crate::authority::{Call, PolicyOp, PolicyReply, Reply};
use crate::engine::entry::{MARK_DEFAULT, MARK_PINNED};
use crate::engine::{lock, Engine};
use crate::error::{Error, Result};
use crate::policy::file;
use crate::policy::{Assignment, Rules, Tier};

/// Keys asked of the store in one call.
const GET_CHUNK: usize = 500;

impl Engine {
    /// Before a key's first resolution: the store's first poll, and the
    /// key's entry in the store when the store holds key entries. `Some`
    /// names what to wait for (the drivers wait at most `backend_timeout_ms`).
    pub(in crate::engine) fn policy_wait(&self, key: &str) -> Option<Box<dyn Fn() -> bool + Send + Sync + '_>> {
        if self.r.cfg.policy_refresh_ms == 0 || self.r.cfg.mode == crate::Mode::Local || self.circuit.is_open() {
            return None;
        }
        let p = &self.policies;
        if !p.polled.load(Acquire) {
            self.poll_store();
            if !p.polled.load(Acquire) {
                return Some(Box::new(move || p.polled.load(Acquire) || self.closed.load(Acquire)));
            }
        }
        if p.store_keys.load(Acquire) == 0 || self.table.get(key).is_some() || lock(&p.cache).contains_key(key) {
            return None;
        }
        // `true`: a caller that does not wait (try_acquire) gets the entry
        // applied when it lands.
        self.fetch_entries(vec![key.to_string()], true);
        let key = key.to_string();
        if lock(&p.cache).contains_key(&key) {
            return None;
        }
        Some(Box::new(move || {
            lock(&p.cache).contains_key(&key) || self.closed.load(Acquire)
        }))
    }

    /// [`Self::policy_wait`], waited for.
    /// (The first poll, then the key's entry: at most two waits.)
    pub(crate) fn await_policy(&self, key: &str, bound: std::time::Instant) {
        for _ in 0..2 {
            match self.policy_wait(key) {
                Some(ready) => {
                    if !self.wait_blocking(ready, bound) {
                        return;
                    }
                }
                None => return,
            }
        }
    }

    /// [`Self::await_policy`] for the async driver.
    pub(crate) async fn await_policy_async(&self, key: &str, bound: tokio::time::Instant) {
        for _ in 0..2 {
            match self.policy_wait(key) {
                Some(ready) => {
                    if !self.wait_async(ready, bound).await {
                        return;
                    }
                }
                None => return,
            }
        }
    }

    /// Send one call to the policy store (counted in flight, so `settle`
    /// waits for it; not counted as a lease call).
    fn store_send(
        &self,
        op: PolicyOp,
        done: impl FnOnce(&Engine, std::result::Result<PolicyReply, String>) + Send + 'static,
    ) -> bool {
        let Some(me) = self.me.upgrade() else { return false };
        if !self.is_inline() && self.broker().is_err() {
            return false;
        }
        self.pending.fetch_add(1, AcqRel);
        let call = Call::Policy {
            base: String::new(),
            op,
        };
        let sent = self.authority.call(
            call,
            Box::new(move |r| {
                let r = match r {
                    Ok(Reply::Policy(p)) => Ok(p),
                    Ok(other) => Err(format!("unexpected answer from the policy store: {other:?}")),
                    Err(e) => Err(e),
                };
                done(&me, r);
                let _ = me.pending.fetch_update(AcqRel, Acquire, |p| Some(p.saturating_sub(1)));
                me.wake_all();
            }),
        );
        if sent.is_err() {
            self.pending.fetch_sub(1, AcqRel);
        }
        sent.is_ok()
    }

    /// Ask the store what changed (unless a poll is out).
    pub(in crate::engine) fn poll_store(&self) {
        let p = &self.policies;
        if p.polling.swap(true, AcqRel) {
            return;
        }
        p.last_poll.store(self.clock.precise(), Relaxed);
        let since = p.version.load(Acquire);
        let sent = self.store_send(PolicyOp::Poll { since }, |me, r| {
            me.on_poll(r);
            me.policies.polling.store(false, Release);
        });
        if !sent {
            p.polling.store(false, Release);
        }
    }

    fn on_poll(&self, r: std::result::Result<PolicyReply, String>) {
        let p = &self.policies;
        let reply = match r {
            Ok(reply) => reply,
            Err(e) => {
                if !p.unreachable.swap(true, AcqRel) {
                    tracing::warn!(
                        error = %crate::redact_secrets(&e, &self.r.cfg.url),
                        "quotalease: the policy store did not answer; keys keep the policies known (checked again every policy_refresh_ms)"
                    );
                }
                // A first poll that fails must not hold every new key up.
                p.polled.store(true, Release);
                return;
            }
        };
        if p.unreachable.swap(false, AcqRel) {
            tracing::info!("quotalease: the policy store answers again");
        }
        let PolicyReply::Poll {
            version,
            keys,
            tiers,
            changed,
        } = reply
        else {
            return;
        };
        p.store_keys.store(keys, Release);
        let mut tiers_changed = false;
        if let Some(list) = tiers {
            let old = lock(&p.store_tiers).clone();
            let mut next = Vec::with_capacity(list.len());
            for (name, text) in list {
                let parsed = crate::policy::validate_tier_name(&name).and_then(|_| Rules::parse(&text, "tiers"));
                match parsed {
                    Ok(rules) => next.push(Tier { name, rules }),
                    Err(e) => {
                        tracing::error!(tier = %name, error = %e, "quotalease: the policy store holds a malformed tier; keeping its last good definition");
                        if let Some(t) = old.iter().find(|t| t.name == name) {
                            next.push(t.clone());
                        }
                    }
                }
            }
            *lock(&p.store_tiers) = next;
            tiers_changed = p.rebuild();
        }
        let refetch: Vec<String> = match changed {
            Some(keys) => {
                let mut cache = lock(&p.cache);
                keys.into_iter()
                    .filter(|k| {
                        let known = cache.remove(k).is_some();
                        known || self.table.get(k).is_some()
                    })
                    .collect()
            }
            None => {
                lock(&p.cache).clear();
                self.own_keys()
            }
        };
        p.version.store(version, Release);
        if !refetch.is_empty() && keys > 0 {
            self.fetch_entries(refetch, true);
        } else if !refetch.is_empty() {
            // The store holds no key entries: every one asked about has none.
            let mut cache = lock(&p.cache);
            for k in &refetch {
                cache.insert(k.clone(), None);
            }
            drop(cache);
            for k in refetch {
                self.re_resolve(&k);
            }
        }
        if tiers_changed {
            self.re_resolve_all();
        }
        p.polls.fetch_add(1, AcqRel);
        p.polled.store(true, Release);
    }

    /// Ask the store for these keys' entries; `resolve`: apply them to the
    /// keys' entries when they land.
    fn fetch_entries(&self, keys: Vec<String>, resolve: bool) {
        for chunk in keys.chunks(GET_CHUNK) {
            let chunk = chunk.to_vec();
            let asked = chunk.clone();
            self.store_send(PolicyOp::Get { keys: chunk }, move |me, r| {
                let values = match r {
                    Ok(PolicyReply::Values(v)) if v.len() == asked.len() => v,
                    Ok(other) => {
                        tracing::error!("quotalease: unexpected answer from the policy store: {other:?}");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::redact_secrets(&e, &me.r.cfg.url), "quotalease: the policy store did not answer");
                        return;
                    }
                };
                let mut cache = lock(&me.policies.cache);
                if cache.len() + asked.len() > me.r.cfg.max_keys.max(1_000) {
                    cache.clear();
                }
                for (k, v) in asked.iter().zip(values) {
                    let a = match v.map(|t| Assignment::parse(&t).map_err(|e| (t, e))).transpose() {
                        Ok(a) => a,
                        Err((text, e)) => {
                            tracing::error!(key = %k, stored = %text, error = %e, "quotalease: the policy store holds a malformed entry for this key; keeping its last good policy");
                            match cache.get(k) {
                                Some(old) => old.clone(),
                                None => continue,
                            }
                        }
                    };
                    cache.insert(k.clone(), a);
                }
                drop(cache);
                if resolve {
                    for k in &asked {
                        me.re_resolve(k);
                    }
                }
            });
        }
    }

    /// Apply the current policies to `key`'s entry (if any), keeping the tier its calls name.
    fn re_resolve(&self, key: &str) {
        let Some(e) = self.table.get(key) else { return };
        if e.sub {
            return;
        }
        let mark = e.mark.load(Acquire);
        let map = self.policies.tiers.load();
        let tier = (mark != MARK_DEFAULT && mark != MARK_PINNED)
            .then(|| map.name_of(mark).map(str::to_string))
            .flatten();
        match self.resolve(key, tier.as_deref()) {
            Ok(r) => self.apply_rules(&e, key, &r),
            Err(err) => tracing::warn!(key, error = %err, "quotalease: the key keeps its rules"),
        }
    }

    /// Every key this limiter holds an entry of (not the further rules' buckets).
    fn own_keys(&self) -> Vec<String> {
        let guard = self.table.map.pin();
        guard
            .iter()
            .filter(|(_, e)| !e.sub)
            .map(|(k, _)| k.to_string())
            .collect()
    }

    fn re_resolve_all(&self) {
        for k in self.own_keys() {
            self.re_resolve(&k);
        }
    }

    /// The ticker's (and `settle`'s) check of the store and the file.
    pub(in crate::engine) fn refresh_policies(&self, now: u64, force: bool) {
        let every = self.r.cfg.policy_refresh_ms;
        if every == 0 || self.r.cfg.mode == crate::Mode::Local {
            return;
        }
        let due = force || now.saturating_sub(self.policies.last_poll.load(Relaxed)) >= every;
        if !due {
            return;
        }
        self.reload_file();
        self.poll_store();
    }

    /// Re-read the policy file if it changed (a bad file: logged, the last good one kept).
    fn reload_file(&self) {
        let Some(path) = self.r.cfg.policy_file.as_deref() else {
            return;
        };
        let seen = lock(&self.policies.file).as_ref().and_then(|f| f.modified);
        if file::modified(path) == seen {
            return;
        }
        match file::read(path) {
            Ok(f) => {
                if self.r.cfg.default_tier.is_none() {
                    *lock(&self.policies.default_tier) = f.default_tier.clone();
                }
                *lock(&self.policies.file) = Some(f);
                self.policies.rebuild();
                tracing::info!(path, "quotalease: the policy file changed; policies applied");
                self.re_resolve_all();
            }
            Err(e) => {
                // Remember this version as seen, so the error is logged once.
                if let Some(f) = lock(&self.policies.file).as_mut() {
                    f.modified = file::modified(path);
                }
                tracing::error!(path, error = %e, "quotalease: the policy file is malformed; keeping the last good one");
            }
        }
    }

    /// Poll the store now and wait until what it says is applied.
    pub(crate) fn refresh_now(&self) -> Result<()> {
        self.check_open()?;
        if self.r.cfg.policy_refresh_ms == 0 {
            return Err(Error::config(
                "policy_refresh_ms",
                "is 0: this limiter uses no shared policy store",
            ));
        }
        let before = self.policies.polls.load(Acquire);
        let bound = std::time::Instant::now() + Duration::from_millis(self.r.cfg.backend_timeout_ms.max(1_000) * 5);
        // A poll already out may have been sent before the change asked about.
        self.wait_blocking(|| !self.policies.polling.load(Acquire), bound);
        self.reload_file();
        self.poll_store();
        let answered = self.wait_blocking(|| self.policies.polls.load(Acquire) > before, bound);
        if !answered || self.policies.unreachable.load(Acquire) {
            return Err(Error::Backend("the policy store did not answer".into()));
        }
        self.wait_idle(Duration::from_millis(self.r.cfg.backend_timeout_ms.max(1_000) * 5))
    }

    /// One request to the store, waited for (operator calls, not requests).
    pub(crate) fn store_request(&self, op: PolicyOp) -> Result<PolicyReply> {
        self.check_open()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if !self.store_send(op, move |_, r| {
            let _ = tx.send(r);
        }) {
            return Err(Error::Backend("the policy store cannot be reached".into()));
        }
        let bound = Duration::from_millis(self.r.cfg.backend_timeout_ms.max(1_000) * 5);
        match rx.recv_timeout(bound) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(Error::of_backend(
                &crate::redact_secrets(&e, &self.r.cfg.url),
                &self.r.cfg.url,
            )),
            Err(_) => Err(Error::Backend("the policy store did not answer in time".into())),
        }
    }

    /// Add the store's write; this limiter applies it before returning.
    pub(crate) fn store_write(&self, tier: bool, name: &str, value: Option<String>) -> Result<u64> {
        // Checked before writing: a limiter that follows no store does not
        // write one (it would not apply its own change).
        if self.r.cfg.policy_refresh_ms == 0 {
            return Err(Error::config(
                "policy_refresh_ms",
                "is 0: this limiter uses no shared policy store (nothing was written)",
            ));
        }
        let v = match self.store_request(PolicyOp::Set {
            tier,
            name: name.to_string(),
            value,
        })? {
            PolicyReply::Version(v) => v,
            other => {
                return Err(Error::Backend(format!(
                    "unexpected answer from the policy store: {other:?}"
                )))
            }
        };
        self.refresh_now()?;
        Ok(v)
    }
}
