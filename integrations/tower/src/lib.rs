//! quotalease as a [`tower::Layer`](tower_layer::Layer), for axum, tonic and any
//! tower-based HTTP server.
//!
//! One `Limiter::acquire_async(key, cost)` per request. Every response gets the
//! `RateLimit-Policy` and `RateLimit` headers of the decision; a denied request
//! never reaches the inner service:
//!
//! - HTTP ([`Http`], the default): status 429, `Retry-After` (whole seconds),
//!   the body of every quotalease middleware (RFC 9457 problem details,
//!   `application/problem+json`, with `retry_after_ms`), or your own response
//!   with [`RateLimitLayer::on_denied`];
//! - gRPC ([`Grpc`], [`RateLimitLayer::grpc`]): a trailers-only response with
//!   status `RESOURCE_EXHAUSTED` (8), the retry delay as a `google.rpc.RetryInfo`
//!   detail in `grpc-status-details-bin` (what `tonic_types::StatusExt` and
//!   other gRPC libraries read), and as metadata `retry-after` (seconds) and
//!   `grpc-retry-pushback-ms` (milliseconds, gRPC's retry pushback).
//!
//! The key function sees the request's [`Parts`] (method, URI, headers,
//! extensions such as axum's `ConnectInfo`). A key longer than the engine's 512
//! bytes is limited under [`quotalease::http_key`] (its SHA-256), as in every
//! quotalease middleware. A limiter error (an empty key, a closed limiter) is
//! answered by the responder's [`Respond::failed`]: 500, or gRPC `INTERNAL`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use quotalease::Limiter;
//! use quotalease_tower::RateLimitLayer;
//!
//! let limiter = Arc::new(Limiter::builder().rate("100/min").build().unwrap());
//! let layer = RateLimitLayer::new(limiter, |parts: &http::request::Parts| {
//!     parts
//!         .headers
//!         .get("x-api-key")
//!         .and_then(|v| v.to_str().ok())
//!         .unwrap_or("anonymous")
//!         .to_owned()
//! })
//! .skip(|parts| parts.uri.path() == "/healthz");
//! // axum: Router::new().route(...).layer(layer)
//! // tonic: Server::builder().layer(layer.grpc()).add_service(...)
//! ```
//!
//! # Concurrency
//!
//! [`ConcurrencyLayer`] limits the requests of a key in flight at once instead
//! of its rate: each request takes a permit (`Limiter::acquire_concurrent_async`;
//! the limiter needs its `concurrency`, or a tier's `"N concurrent"`, else every
//! request is a limiter error), held until the response *body* ends (its
//! [`PermitBody`] gives the permit back with its last frame, or when it is
//! dropped: a client that goes away frees it too). A streaming response (a
//! download, server-sent events, a gRPC server stream) keeps its permit while
//! it streams. An inner service's error or panic, or a request dropped before
//! its response, drops the permit with the request's future, which releases
//! it. A request past the limit is answered by the same responder (429 with
//! the problem body, or `RESOURCE_EXHAUSTED` with the retry info) with
//! `Retry-After` and no RateLimit headers, which describe rates; an admitted
//! response gets no headers of the layer's. It has the key, [`skip`](ConcurrencyLayer::skip),
//! [`tier`](ConcurrencyLayer::tier) and responder settings of
//! [`RateLimitLayer`], and no `cost` or `wait`, which do not apply to a
//! permit:
//!
//! ```
//! use std::sync::Arc;
//! use quotalease::Limiter;
//! use quotalease_tower::ConcurrencyLayer;
//!
//! let limiter = Arc::new(Limiter::builder().rate("100/s").concurrency(2).build().unwrap());
//! // At most 2 requests of a key at once; a route's own key sets it apart.
//! let layer = ConcurrencyLayer::new(limiter, |parts: &http::request::Parts| {
//!     let who = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or("anonymous");
//!     format!("{who}:{}", parts.uri.path())
//! });
//! # let _ = layer;
//! ```
//!
//! For a rate and a concurrency limit both, stack the two layers, the rate one
//! outside (it answers first): `.layer(concurrency).layer(rate)` in axum,
//! whose last `.layer` is the outermost.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use quotalease::{http_key, Decision, Limiter, Permit};
use tower_layer::Layer;
use tower_service::Service;

type KeyFn = dyn Fn(&Parts) -> String + Send + Sync;
type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
type SkipFn = dyn Fn(&Parts) -> bool + Send + Sync;
type TierFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// How a denied request and a limiter error are answered.
///
/// [`Http`] and [`Grpc`] are the built-in ones; implement it for your own.
/// The `RateLimit-Policy`, `RateLimit` and (when denied) `Retry-After` headers
/// are added to whatever `denied` returns ([`ConcurrencyLayer`]: `Retry-After`
/// only).
pub trait Respond<B>: Send + Sync + 'static {
    /// The response to a denied request.
    fn denied(&self, parts: &Parts, decision: &Decision) -> Response<B>;
    /// The response when the limiter returned an error (the request is not
    /// passed on).
    fn failed(&self, parts: &Parts, error: &quotalease::Error) -> Response<B>;
}

/// HTTP answers: 429 with the body of every quotalease middleware (Python,
/// Express, Go), RFC 9457 problem details as `application/problem+json`:
/// `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit exceeded","retry_after_ms":N}`;
/// 500 on a limiter error.
#[derive(Clone, Copy, Debug, Default)]
pub struct Http;

impl<B: From<String>> Respond<B> for Http {
    fn denied(&self, _parts: &Parts, decision: &Decision) -> Response<B> {
        let body = format!(
            "{{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\
             \"detail\":\"rate limit exceeded\",\"retry_after_ms\":{}}}",
            decision.retry_after_ms
        );
        let mut res = Response::new(B::from(body));
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        res.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        res
    }

    fn failed(&self, _parts: &Parts, _error: &quotalease::Error) -> Response<B> {
        // The error's text stays out of the response: it is the server's business.
        text(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error\n")
    }
}

fn text<B: From<String>>(status: StatusCode, body: &str) -> Response<B> {
    let mut res = Response::new(B::from(body.to_owned()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    res
}

/// gRPC answers: `RESOURCE_EXHAUSTED` with retry info when denied, `INTERNAL`
/// on a limiter error, both as trailers-only responses (HTTP 200, status in
/// the headers), as gRPC servers answer a call they refuse before it starts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Grpc;

/// gRPC status code `RESOURCE_EXHAUSTED`.
pub const GRPC_RESOURCE_EXHAUSTED: i32 = 8;
/// gRPC status code `INTERNAL`.
pub const GRPC_INTERNAL: i32 = 13;

impl<B: Default> Respond<B> for Grpc {
    fn denied(&self, _parts: &Parts, decision: &Decision) -> Response<B> {
        let ms = decision.retry_after_ms.max(1);
        let message = format!("rate limit exceeded; retry after {ms} ms");
        let mut res = grpc_status(GRPC_RESOURCE_EXHAUSTED, &message);
        let details = status_details(GRPC_RESOURCE_EXHAUSTED, &message, ms);
        let h = res.headers_mut();
        h.insert(
            HeaderName::from_static("grpc-status-details-bin"),
            header_value(&base64(&details)),
        );
        h.insert(
            HeaderName::from_static("grpc-retry-pushback-ms"),
            header_value(&ms.to_string()),
        );
        res
    }

    fn failed(&self, _parts: &Parts, _error: &quotalease::Error) -> Response<B> {
        grpc_status(GRPC_INTERNAL, "rate limiter error")
    }
}

fn grpc_status<B: Default>(code: i32, message: &str) -> Response<B> {
    let mut res = Response::new(B::default());
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(HeaderName::from_static("grpc-status"), header_value(&code.to_string()));
    // Printable ASCII without '%' needs no percent-encoding in grpc-message.
    h.insert(HeaderName::from_static("grpc-message"), header_value(message));
    res
}

fn header_value(s: &str) -> HeaderValue {
    // Only ever called with ASCII built here.
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A `google.rpc.Status { code, message, details: [Any(google.rpc.RetryInfo {
/// retry_delay })] }` in protobuf wire format.
fn status_details(code: i32, message: &str, retry_ms: u64) -> Vec<u8> {
    let mut duration = Vec::new();
    let (secs, nanos) = (retry_ms / 1000, (retry_ms % 1000) * 1_000_000);
    if secs > 0 {
        varint_field(&mut duration, 1, secs);
    }
    if nanos > 0 {
        varint_field(&mut duration, 2, nanos);
    }
    let mut retry_info = Vec::new();
    bytes_field(&mut retry_info, 1, &duration);
    let mut any = Vec::new();
    bytes_field(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    bytes_field(&mut any, 2, &retry_info);
    let mut status = Vec::new();
    varint_field(&mut status, 1, code as u64);
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, b: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Standard base64 without padding, as gRPC sends `-bin` metadata.
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk.len();
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=n {
            out.push(A[((v >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// An HTTP responder whose denial response you build; limiter errors are
/// answered as [`Http`] does. Made by [`RateLimitLayer::on_denied`].
#[derive(Clone)]
pub struct OnDenied<F>(F);

impl<F> fmt::Debug for OnDenied<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnDenied(..)")
    }
}

impl<B, F> Respond<B> for OnDenied<F>
where
    B: From<String>,
    F: Fn(&Parts, &Decision) -> Response<B> + Send + Sync + 'static,
{
    fn denied(&self, parts: &Parts, decision: &Decision) -> Response<B> {
        (self.0)(parts, decision)
    }

    fn failed(&self, parts: &Parts, error: &quotalease::Error) -> Response<B> {
        Respond::<B>::failed(&Http, parts, error)
    }
}

struct Shared<R> {
    limiter: Arc<Limiter>,
    key: Arc<KeyFn>,
    cost: Arc<CostFn>,
    skip: Option<Arc<SkipFn>>,
    tier: Option<Arc<TierFn>>,
    /// Wait up to this long for the tokens instead of denying.
    wait: Option<std::time::Duration>,
    respond: R,
}

/// The layer: `RateLimitLayer::new(limiter, key)`, then optionally `.cost(..)`,
/// `.skip(..)`, `.on_denied(..)` or `.grpc()`.
pub struct RateLimitLayer<R = Http> {
    shared: Arc<Shared<R>>,
}

impl<R> Clone for RateLimitLayer<R> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<R> fmt::Debug for RateLimitLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<Http> {
    /// Limit every request under `key(parts)`, cost 1, HTTP answers.
    pub fn new(limiter: Arc<Limiter>, key: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                key: Arc::new(key),
                cost: Arc::new(|_| 1),
                skip: None,
                tier: None,
                wait: None,
                respond: Http,
            }),
        }
    }
}

impl<R> RateLimitLayer<R> {
    fn map<R2>(
        self,
        f: impl FnOnce(&Shared<R>) -> (Option<Arc<CostFn>>, Option<Arc<SkipFn>>, R2),
    ) -> RateLimitLayer<R2> {
        let s = &self.shared;
        let (cost, skip, respond) = f(s);
        RateLimitLayer {
            shared: Arc::new(Shared {
                limiter: s.limiter.clone(),
                key: s.key.clone(),
                cost: cost.unwrap_or_else(|| s.cost.clone()),
                skip: skip.or_else(|| s.skip.clone()),
                tier: s.tier.clone(),
                wait: s.wait,
                respond,
            }),
        }
    }

    /// Every request costs `tokens` (default 1; 0 or above the key's limit is
    /// a limiter error).
    pub fn cost(self, tokens: u64) -> Self
    where
        R: Clone,
    {
        self.cost_fn(move |_| tokens)
    }

    /// The cost of each request, from the request.
    pub fn cost_fn(self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self
    where
        R: Clone,
    {
        let cost: Arc<CostFn> = Arc::new(cost);
        self.map(|s| (Some(cost), None, s.respond.clone()))
    }

    /// Requests for which `skip` returns true pass unlimited (and get no
    /// headers).
    pub fn skip(self, skip: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self
    where
        R: Clone,
    {
        let skip: Arc<SkipFn> = Arc::new(skip);
        self.map(|s| (None, Some(skip), s.respond.clone()))
    }

    /// The plan tier of each request (`None`: the limiter's default tier),
    /// e.g. from an authenticated customer's plan. A key with its own entry
    /// in the policy store keeps it whatever tier is named; an unknown tier
    /// is a limiter error (answered as one: 500 / `INTERNAL`).
    pub fn tier_fn(self, tier: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self
    where
        R: Clone,
    {
        let tier: Arc<TierFn> = Arc::new(tier);
        self.with(|s| s.tier = Some(tier))
    }

    /// Have a request wait up to `wait` for its tokens
    /// (`Limiter::acquire_wait_async`: in arrival order, from the local
    /// lease, a rate grant or the refill) instead of being denied.
    pub fn wait(self, wait: std::time::Duration) -> Self
    where
        R: Clone,
    {
        self.with(|s| s.wait = Some(wait))
    }

    /// The same layer with `change` made to a copy of its settings.
    fn with(self, change: impl FnOnce(&mut Shared<R>)) -> Self
    where
        R: Clone,
    {
        let s = &self.shared;
        let mut next = Shared {
            limiter: s.limiter.clone(),
            key: s.key.clone(),
            cost: s.cost.clone(),
            skip: s.skip.clone(),
            tier: s.tier.clone(),
            wait: s.wait,
            respond: s.respond.clone(),
        };
        change(&mut next);
        RateLimitLayer { shared: Arc::new(next) }
    }

    /// Every request in plan tier `tier`.
    pub fn tier(self, tier: &str) -> Self
    where
        R: Clone,
    {
        let tier = tier.to_string();
        self.tier_fn(move |_| Some(tier.clone()))
    }

    /// Answer denied requests with `f(parts, decision)` (HTTP). The RateLimit
    /// and Retry-After headers are added to its response.
    pub fn on_denied<B, F>(self, f: F) -> RateLimitLayer<OnDenied<F>>
    where
        F: Fn(&Parts, &Decision) -> Response<B> + Send + Sync + 'static,
    {
        self.map(|_| (None, None, OnDenied(f)))
    }

    /// gRPC answers (`RESOURCE_EXHAUSTED` with retry info), for tonic.
    pub fn grpc(self) -> RateLimitLayer<Grpc> {
        self.map(|_| (None, None, Grpc))
    }

    /// Your own [`Respond`] implementation.
    pub fn respond_with<R2>(self, respond: R2) -> RateLimitLayer<R2> {
        self.map(|_| (None, None, respond))
    }
}

impl<S, R> Layer<S> for RateLimitLayer<R> {
    type Service = RateLimit<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another. The decision of an
/// admitted request is in its extensions (`req.extensions().get::<Decision>()`,
/// in axum `Extension<Decision>`).
pub struct RateLimit<S, R = Http> {
    inner: S,
    shared: Arc<Shared<R>>,
}

impl<S: Clone, R> Clone for RateLimit<S, R> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, R> fmt::Debug for RateLimit<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The response future of [`RateLimit`].
pub type ResponseFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

impl<S, R, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: 'static,
    R: Respond<ResB>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The clone that was polled ready serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            if shared.skip.as_ref().is_some_and(|skip| skip(&parts)) {
                return inner.call(Request::from_parts(parts, body)).await;
            }
            let key = (shared.key)(&parts);
            let cost = (shared.cost)(&parts);
            let tier = shared.tier.as_ref().and_then(|t| t(&parts));
            let key = http_key(&key);
            let decided = match shared.wait {
                Some(wait) => {
                    shared
                        .limiter
                        .acquire_wait_async(&key, cost, tier.as_deref(), wait)
                        .await
                }
                None => shared.limiter.acquire_async_with(&key, cost, tier.as_deref()).await,
            };
            let decision = match decided {
                Ok(d) => d,
                Err(err) => return Ok(shared.respond.failed(&parts, &err)),
            };
            let mut res = if decision.allowed {
                let mut req = Request::from_parts(parts, body);
                req.extensions_mut().insert(decision);
                inner.call(req).await?
            } else {
                shared.respond.denied(&parts, &decision)
            };
            set_headers(res.headers_mut(), &decision);
            Ok(res)
        })
    }
}

/// The concurrency layer: `ConcurrencyLayer::new(limiter, key)`, then
/// optionally `.skip(..)`, `.tier(..)` / `.tier_fn(..)`, `.on_denied(..)`,
/// `.grpc()` or `.respond_with(..)`, as on [`RateLimitLayer`]. See the
/// [crate documentation](crate#concurrency).
///
/// It has no `cost` or `wait`: a request takes one permit, and a request
/// past the limit is answered at once. Asking for either does not compile:
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use quotalease_tower::ConcurrencyLayer;
/// # let limiter = Arc::new(quotalease::Limiter::builder().concurrency(2).build().unwrap());
/// let layer = ConcurrencyLayer::new(limiter, |_: &http::request::Parts| "k".to_owned()).cost(2);
/// ```
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use quotalease_tower::ConcurrencyLayer;
/// # let limiter = Arc::new(quotalease::Limiter::builder().concurrency(2).build().unwrap());
/// let layer = ConcurrencyLayer::new(limiter, |_: &http::request::Parts| "k".to_owned())
///     .wait(std::time::Duration::from_secs(1));
/// ```
pub struct ConcurrencyLayer<R = Http> {
    shared: Arc<Shared<R>>,
}

impl<R> Clone for ConcurrencyLayer<R> {
    fn clone(&self) -> Self {
        ConcurrencyLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<R> fmt::Debug for ConcurrencyLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLayer")
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLayer<Http> {
    /// Limit the requests of `key(parts)` in flight at once (the limiter's
    /// `concurrency`, or the `"N concurrent"` of the key's tier), HTTP answers.
    pub fn new(limiter: Arc<Limiter>, key: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        ConcurrencyLayer {
            shared: RateLimitLayer::new(limiter, key).shared,
        }
    }
}

impl<R> ConcurrencyLayer<R> {
    /// The same settings change as on [`RateLimitLayer`].
    fn via<R2>(self, f: impl FnOnce(RateLimitLayer<R>) -> RateLimitLayer<R2>) -> ConcurrencyLayer<R2> {
        ConcurrencyLayer {
            shared: f(RateLimitLayer { shared: self.shared }).shared,
        }
    }

    /// Requests for which `skip` returns true pass unlimited (they take no
    /// permit).
    pub fn skip(self, skip: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self
    where
        R: Clone,
    {
        self.via(|l| l.skip(skip))
    }

    /// The plan tier of each request (`None`: the limiter's default tier):
    /// the tier's `"N concurrent"` sets the key's limit unless the key has a
    /// policy entry of its own. An unknown tier is a limiter error (answered
    /// as one: 500 / `INTERNAL`).
    pub fn tier_fn(self, tier: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self
    where
        R: Clone,
    {
        self.via(|l| l.tier_fn(tier))
    }

    /// Every request in plan tier `tier`.
    pub fn tier(self, tier: &str) -> Self
    where
        R: Clone,
    {
        self.via(|l| l.tier(tier))
    }

    /// Answer denied requests with `f(parts, decision)` (HTTP); the decision
    /// is the permit's (`limit` is the concurrency). `Retry-After` is added to
    /// its response.
    pub fn on_denied<B, F>(self, f: F) -> ConcurrencyLayer<OnDenied<F>>
    where
        F: Fn(&Parts, &Decision) -> Response<B> + Send + Sync + 'static,
    {
        self.via(|l| l.on_denied(f))
    }

    /// gRPC answers (`RESOURCE_EXHAUSTED` with retry info), for tonic.
    pub fn grpc(self) -> ConcurrencyLayer<Grpc> {
        self.via(RateLimitLayer::grpc)
    }

    /// Your own [`Respond`] implementation.
    pub fn respond_with<R2>(self, respond: R2) -> ConcurrencyLayer<R2> {
        self.via(|l| l.respond_with(respond))
    }
}

impl<S, R> Layer<S> for ConcurrencyLayer<R> {
    type Service = ConcurrencyLimit<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`ConcurrencyLayer`] wraps around another. The permit's
/// decision of an admitted request is in its extensions
/// (`req.extensions().get::<Decision>()`: `limit` is the key's concurrency,
/// `remaining` the permits left); its response body is a [`PermitBody`]
/// holding the permit.
pub struct ConcurrencyLimit<S, R = Http> {
    inner: S,
    shared: Arc<Shared<R>>,
}

impl<S: Clone, R> Clone for ConcurrencyLimit<S, R> {
    fn clone(&self) -> Self {
        ConcurrencyLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, R> fmt::Debug for ConcurrencyLimit<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, R, ReqB, ResB> Service<Request<ReqB>> for ConcurrencyLimit<S, R>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: 'static,
    R: Respond<ResB>,
{
    type Response = Response<PermitBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<PermitBody<ResB>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The clone that was polled ready serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            if shared.skip.as_ref().is_some_and(|skip| skip(&parts)) {
                let res = inner.call(Request::from_parts(parts, body)).await?;
                return Ok(res.map(PermitBody::without_permit));
            }
            let key = (shared.key)(&parts);
            let key = http_key(&key);
            let tier = shared.tier.as_ref().and_then(|t| t(&parts));
            let permit = match shared.limiter.acquire_concurrent_async(&key, tier.as_deref()).await {
                Ok(p) => p,
                Err(err) => return Ok(shared.respond.failed(&parts, &err).map(PermitBody::without_permit)),
            };
            let decision = permit.decision();
            if !permit.allowed() {
                let mut res = shared.respond.denied(&parts, &decision);
                // Only Retry-After: the RateLimit fields describe rates.
                for (name, value) in decision.headers() {
                    if name.eq_ignore_ascii_case("retry-after") {
                        res.headers_mut()
                            .insert(http::header::RETRY_AFTER, header_value(&value));
                    }
                }
                return Ok(res.map(PermitBody::without_permit));
            }
            let mut req = Request::from_parts(parts, body);
            req.extensions_mut().insert(decision);
            // An error, a panic or a dropped future drops the permit here,
            // which releases it; else the body takes it.
            let res = inner.call(req).await?;
            Ok(res.map(|body| PermitBody::new(body, permit)))
        })
    }
}

pin_project_lite::pin_project! {
    /// The response body of [`ConcurrencyLimit`]: the inner service's body,
    /// holding the request's permit until the body ends. The permit is
    /// released when the body yields its last frame (or an error), or when
    /// the body is dropped (the server dropped it: the response was written,
    /// or the client went away). A skipped, denied or failed request's body
    /// holds none.
    pub struct PermitBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

impl<B> PermitBody<B> {
    fn new(inner: B, permit: Permit) -> Self {
        PermitBody {
            inner,
            permit: Some(permit),
        }
    }

    fn without_permit(inner: B) -> Self {
        PermitBody { inner, permit: None }
    }

    /// Whether the body still holds a permit (not yet released).
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }

    /// The inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The inner body; the permit, if still held, is released.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> fmt::Debug for PermitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody")
            .field("holds_permit", &self.holds_permit())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => return Poll::Pending,
        };
        // Done, failed, or that was the last frame (trailers always are):
        // release the permit now rather than when the server gets round to
        // dropping the body.
        let last = match &frame {
            Some(Ok(f)) => f.is_trailers() || this.inner.is_end_stream(),
            _ => true,
        };
        if last {
            this.permit.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The decision's `RateLimit-Policy`, `RateLimit` and (when denied)
/// `Retry-After` headers, from [`Decision::headers`].
pub fn set_headers(headers: &mut http::HeaderMap, decision: &Decision) {
    for (name, value) in decision.headers() {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value)) {
            headers.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        // RFC 4648 section 10, without padding.
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain:?}");
        }
    }

    #[test]
    fn varints_follow_protobuf() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        v.clear();
        varint(&mut v, 1);
        assert_eq!(v, [1]);
    }
}
