//! One Redis backend's batch loop, run on the broker's runtime: drains what
//! limiters queued (up to [`MAX_BATCH`] calls), answers it in one batch on
//! the backend's connection, hands each call's result to its callback.

use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::redis::Connection;
use crate::broker::{BoxFuture, Job, Target};
use crate::redact::Secrets;
use crate::wire::silence;

/// Most calls sent in one batch.
const MAX_BATCH: usize = 512;

/// The [`crate::broker::Serve`] of Redis targets.
pub(crate) fn spawn(target: Target, rx: UnboundedReceiver<Job>) -> BoxFuture {
    Box::pin(serve(target, rx))
}

/// The loop itself (see the module).
async fn serve(target: Target, mut rx: UnboundedReceiver<Job>) {
    let timeout = Duration::from_millis(target.timeout_ms);
    let mut conn = Connection::new(target.spec.clone(), timeout);
    // Errors leave this loop for events, logs and callers' error messages:
    // none may carry the URL's credentials, whatever the redis crate wrote.
    let secrets = Secrets::of(target.spec.urls());
    // Every round trip inside is bounded; this outer bound guarantees the
    // loop itself can never stall on one batch.
    let guard = timeout * 4 + Duration::from_millis(1_000);
    let mut calls = Vec::new();
    let mut dones = Vec::new();
    while let Some((call, done)) = rx.recv().await {
        calls.push(call);
        dones.push(done);
        while calls.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok((c, d)) => {
                    calls.push(c);
                    dones.push(d);
                }
                Err(_) => break,
            }
        }
        match tokio::time::timeout(guard, conn.run_batch(&calls)).await {
            Ok(results) => {
                for (done, r) in dones.drain(..).zip(results) {
                    done(r.map_err(|e| secrets.scrub(&e)));
                }
            }
            Err(_) => {
                tracing::error!("quotalease: a backend batch did not finish in {guard:?}; abandoned");
                conn.reset();
                for done in dones.drain(..) {
                    done(Err(silence(format_args!(
                        "after {} ms: the batch was abandoned",
                        guard.as_millis()
                    ))));
                }
            }
        }
        calls.clear();
    }
}
