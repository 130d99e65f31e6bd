//! The layer in front of a real axum server on 127.0.0.1:0, driven by raw
//! HTTP/1.1 requests over a TcpStream (no HTTP client library in between);
//! ConcurrencyLayer there, with handlers held at gates (no sleeps), and
//! around a service called directly for errors, panics and dropped requests.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::extract::Extension;
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::{Response, StatusCode};
use http_body::Frame;
use quotalease::{Decision, Limiter};
use quotalease_tower::{ConcurrencyLayer, RateLimitLayer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

/// One request on its own connection (`Connection: close`), read to the end.
async fn request(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn api_key(parts: &Parts) -> String {
    parts
        .headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned()
}

fn limiter(limit: u64) -> Arc<Limiter> {
    Arc::new(Limiter::builder().limit(limit).window_ms(60_000).build().unwrap())
}

/// Serve `layer` in front of `/` (echoes the decision's remaining tokens) and
/// `/healthz`, counting the calls that reach a handler.
async fn serve<L>(layer: L) -> (std::net::SocketAddr, Arc<AtomicUsize>)
where
    L: tower_layer::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower_service::Service<axum::extract::Request, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower_service::Service<axum::extract::Request>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower_service::Service<axum::extract::Request>>::Future: Send + 'static,
{
    let hits = Arc::new(AtomicUsize::new(0));
    let (h1, h2) = (hits.clone(), hits.clone());
    let app = Router::new()
        .route(
            "/",
            get(move |Extension(d): Extension<Decision>| async move {
                h1.fetch_add(1, Ordering::SeqCst);
                format!("remaining={}", d.remaining)
            }),
        )
        .route(
            "/healthz",
            get(move || async move {
                h2.fetch_add(1, Ordering::SeqCst);
                "ok"
            }),
        )
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, hits)
}

#[tokio::test]
async fn admits_then_answers_429_with_retry_after() {
    let layer = RateLimitLayer::new(limiter(2), api_key);
    let (addr, hits) = serve(layer).await;

    for left in [1, 0] {
        let r = request(addr, "/", &[("x-api-key", "alice")]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, format!("remaining={left}"));
        assert_eq!(r.headers["ratelimit-policy"], "\"default\";q=2;w=60");
        assert!(r.headers["ratelimit"].starts_with(&format!("\"default\";r={left};t=")));
        assert!(!r.headers.contains_key("retry-after"));
    }
    let r = request(addr, "/", &[("x-api-key", "alice")]).await;
    assert_eq!(r.status, 429);
    // The body of every quotalease middleware (Python's, Node's and Go's bytes too).
    assert_eq!(r.headers["content-type"], "application/problem+json");
    let ms = r
        .body
        .rsplit_once("\"retry_after_ms\":")
        .and_then(|(_, n)| n.strip_suffix('}'))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no retry_after_ms: {}", r.body));
    assert!(ms > 0, "{}", r.body);
    assert_eq!(
        r.body,
        format!(
            "{{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\
             \"detail\":\"rate limit exceeded\",\"retry_after_ms\":{ms}}}"
        )
    );
    let retry: u64 = r.headers["retry-after"].parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert!(r.headers["ratelimit"].starts_with("\"default\";r=0;"));
    assert_eq!(hits.load(Ordering::SeqCst), 2, "a denied request reached the handler");

    // Another key has its own budget.
    let r = request(addr, "/", &[("x-api-key", "bob")]).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn skip_passes_unlimited_without_headers() {
    let layer = RateLimitLayer::new(limiter(1), api_key).skip(|p| p.uri.path() == "/healthz");
    let (addr, hits) = serve(layer).await;
    assert_eq!(request(addr, "/", &[]).await.status, 200);
    assert_eq!(request(addr, "/", &[]).await.status, 429);
    for _ in 0..3 {
        let r = request(addr, "/healthz", &[]).await;
        assert_eq!(r.status, 200);
        assert!(!r.headers.contains_key("ratelimit"));
    }
    assert_eq!(hits.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn cost_comes_from_the_request() {
    let layer = RateLimitLayer::new(limiter(5), api_key).cost_fn(|p| {
        p.headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    });
    let (addr, _) = serve(layer).await;
    let r = request(addr, "/", &[("x-cost", "3")]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "remaining=2"));
    assert_eq!(request(addr, "/", &[("x-cost", "3")]).await.status, 429);
    let r = request(addr, "/", &[("x-cost", "2")]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "remaining=0"));

    // A fixed cost.
    let (addr, _) = serve(RateLimitLayer::new(limiter(5), api_key).cost(5)).await;
    assert_eq!(request(addr, "/", &[]).await.status, 200);
    assert_eq!(request(addr, "/", &[]).await.status, 429);
}

#[tokio::test]
async fn custom_denial_keeps_the_headers() {
    let layer = RateLimitLayer::new(limiter(1), api_key).on_denied(|parts: &Parts, d: &Decision| {
        let mut res = Response::new(axum::body::Body::from(format!(
            "{{\"path\":\"{}\",\"retry_ms\":{}}}",
            parts.uri.path(),
            d.retry_after_ms
        )));
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        res
    });
    let (addr, _) = serve(layer).await;
    assert_eq!(request(addr, "/", &[]).await.status, 200);
    let r = request(addr, "/", &[]).await;
    assert_eq!(r.status, 503);
    assert!(r.body.starts_with("{\"path\":\"/\",\"retry_ms\":"), "{}", r.body);
    assert!(r.headers.contains_key("retry-after"));
    assert!(r.headers.contains_key("ratelimit-policy"));
}

#[tokio::test]
async fn a_limiter_error_is_a_500_and_long_keys_are_hashed() {
    // An empty key is the engine's InvalidKey: the request is refused, not passed on.
    let (addr, hits) = serve(RateLimitLayer::new(limiter(5), |_: &Parts| String::new())).await;
    let r = request(addr, "/", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    // A key over 512 bytes is limited under its sha256 key, never an error.
    let lim = limiter(1);
    let long = "k".repeat(2000);
    let long2 = long.clone();
    let (addr, _) = serve(RateLimitLayer::new(lim.clone(), move |_: &Parts| long2.clone())).await;
    assert_eq!(request(addr, "/", &[]).await.status, 200);
    assert_eq!(request(addr, "/", &[]).await.status, 429);
    let seen = lim.inspect(&quotalease::http_key(&long)).unwrap();
    assert_eq!((seen.admitted, seen.denied), (1, 1));
}

#[tokio::test]
async fn the_tier_comes_from_the_request_and_two_rules_show_in_the_headers() {
    let limiter = Arc::new(
        Limiter::builder()
            .tier("free", "1/min")
            .tier("pro", "3/s, 4/min")
            .default_tier("free")
            .build()
            .unwrap(),
    );
    let layer = RateLimitLayer::new(limiter, api_key)
        .tier_fn(|p| p.headers.get("x-plan").and_then(|v| v.to_str().ok()).map(str::to_owned));
    let (addr, _) = serve(layer).await;
    let pro = [("x-api-key", "p"), ("x-plan", "pro")];
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(request(addr, "/", &pro).await.status);
        }
        v
    };
    assert_eq!(statuses, [200, 200, 200, 429], "3/s binds first");
    let r = request(addr, "/", &pro).await;
    assert_eq!(r.headers["ratelimit-policy"], "\"1s\";q=3;w=1, \"1min\";q=4;w=60");
    assert!(r.headers["ratelimit"].starts_with("\"1s\";r=0;"), "{:?}", r.headers);
    // no plan header: the default tier (1/min)
    let free = [("x-api-key", "f")];
    assert_eq!(request(addr, "/", &free).await.status, 200);
    assert_eq!(request(addr, "/", &free).await.status, 429);
    // an unknown tier is a limiter error: 500, not an unlimited request
    let r = request(addr, "/", &[("x-api-key", "g"), ("x-plan", "gold")]).await;
    assert_eq!(r.status, 500, "{}", r.body);
}

#[tokio::test]
async fn wait_serves_a_request_after_the_refill_and_shadow_passes_without_headers() {
    let refill = Arc::new(
        Limiter::builder()
            .limit(2)
            .window_ms(1_000)
            .lease_size(1)
            .build()
            .unwrap(),
    );
    let layer = RateLimitLayer::new(refill, api_key).wait(std::time::Duration::from_secs(30));
    let (addr, hits) = serve(layer).await;
    for _ in 0..3 {
        assert_eq!(
            request(addr, "/", &[]).await.status,
            200,
            "the third waits for the refill"
        );
    }
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    let shadow = Arc::new(
        Limiter::builder()
            .limit(1)
            .window_ms(60_000)
            .shadow(true)
            .build()
            .unwrap(),
    );
    let (addr, _) = serve(RateLimitLayer::new(shadow.clone(), api_key)).await;
    assert!(request(addr, "/", &[]).await.headers.contains_key("ratelimit"));
    let r = request(addr, "/", &[]).await;
    assert_eq!(r.status, 200);
    assert!(!r.headers.contains_key("ratelimit"), "{:?}", r.headers);
    assert_eq!(shadow.metrics().shadow_denied, 1);
}

// --- ConcurrencyLayer: a permit per request in flight ------------------------

/// Per path: `enter` / `entered` (the handler announces itself) and `open` /
/// `wait` (the test lets it return). `Notify::notify_one` keeps the signal
/// when nobody waits yet, so the order of the two sides does not matter.
#[derive(Default)]
struct Gates {
    slots: Mutex<HashMap<String, Arc<(Notify, Notify)>>>,
}

impl Gates {
    fn slot(&self, path: &str) -> Arc<(Notify, Notify)> {
        self.slots.lock().unwrap().entry(path.to_owned()).or_default().clone()
    }
    fn enter(&self, path: &str) {
        self.slot(path).0.notify_one();
    }
    async fn entered(&self, path: &str) {
        self.slot(path).0.notified().await;
    }
    fn open(&self, path: &str) {
        self.slot(path).1.notify_one();
    }
    async fn wait(&self, path: &str) {
        self.slot(path).1.notified().await;
    }
}

/// A body of two frames: "first\n" at once, "end\n" once `gate` resolves.
struct Streaming {
    first: Option<&'static str>,
    gate: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl http_body::Body for Streaming {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(first.as_bytes())))));
        }
        match self.gate.as_mut() {
            Some(gate) => {
                if gate.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.gate = None;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"end\n")))))
            }
            None => Poll::Ready(None),
        }
    }
}

/// Serve `layer` in front of: `/boom/{n}` (the handler fails: 500),
/// `/stream/{name}` (a streaming body whose last frame waits at the gate of
/// `/stream/{name}`), and every other path, which waits at its gate after
/// `enter` and answers `done PATH REMAINING` (`-` without a decision). A
/// path starting with `/no` is one a test expects denied: it answers at once,
/// so a wrongly admitted request fails its test instead of hanging it.
async fn serve_gated<L>(layer: L) -> (std::net::SocketAddr, Arc<Gates>)
where
    L: tower_layer::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower_service::Service<axum::extract::Request, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as tower_service::Service<axum::extract::Request>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower_service::Service<axum::extract::Request>>::Future: Send + 'static,
{
    let gates = Arc::new(Gates::default());
    let (g1, g2) = (gates.clone(), gates.clone());
    let app = Router::new()
        .route(
            "/boom/{n}",
            get(|| async { Err::<String, _>((StatusCode::INTERNAL_SERVER_ERROR, "boom")) }),
        )
        .route(
            "/stream/{name}",
            get(move |req: axum::extract::Request| {
                let path = req.uri().path().to_owned();
                let g = g1.clone();
                async move {
                    axum::body::Body::new(Streaming {
                        first: Some("first\n"),
                        gate: Some(Box::pin(async move { g.wait(&path).await })),
                    })
                }
            }),
        )
        .route(
            "/{*path}",
            get(move |req: axum::extract::Request| {
                let g = g2.clone();
                async move {
                    let path = req.uri().path().to_owned();
                    let remaining = req
                        .extensions()
                        .get::<Decision>()
                        .map_or("-".to_owned(), |d| d.remaining.to_string());
                    if !path.starts_with("/no") {
                        g.enter(&path);
                        g.wait(&path).await;
                    }
                    format!("done {path} {remaining}")
                }
            }),
        )
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, gates)
}

/// `GET path` as `user` started on a task, returned once its handler holds
/// the gate; fails at once if the response comes first (denied instead).
async fn in_flight(
    addr: std::net::SocketAddr,
    gates: &Gates,
    path: &str,
    headers: &[(&str, &str)],
) -> tokio::task::JoinHandle<Reply> {
    let owned: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let p = path.to_owned();
    let mut reply = tokio::spawn(async move {
        let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        request(addr, &p, &headers).await
    });
    tokio::select! {
        _ = gates.entered(path) => reply,
        r = &mut reply => {
            let r = r.unwrap();
            panic!("{path} was answered without reaching its handler: {} {}", r.status, r.body)
        }
    }
}

fn concurrency_limiter(n: u64) -> Arc<Limiter> {
    Arc::new(Limiter::builder().limit(1000).concurrency(n).build().unwrap())
}

/// 429 with `Retry-After` (the permit's 250 ms, rounded up), the problem
/// body, and no RateLimit fields, which describe rates.
fn assert_concurrency_denied(r: &Reply) {
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.headers["retry-after"], "1");
    assert!(!r.headers.contains_key("ratelimit"), "{:?}", r.headers);
    assert!(!r.headers.contains_key("ratelimit-policy"), "{:?}", r.headers);
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert!(
        r.body
            .starts_with("{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,"),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn concurrency_admits_n_in_flight_and_answers_429_with_retry_after() {
    let (addr, gates) = serve_gated(ConcurrencyLayer::new(concurrency_limiter(2), api_key)).await;
    let ann = [("x-api-key", "ann")];
    let a = in_flight(addr, &gates, "/a", &ann).await;
    let b = in_flight(addr, &gates, "/b", &ann).await;
    // Two in flight: the third is answered at once.
    assert_concurrency_denied(&request(addr, "/no1", &ann).await);
    // Another key has its own permits.
    gates.open("/bob");
    let bob = request(addr, "/bob", &[("x-api-key", "bob")]).await;
    assert_eq!((bob.status, bob.body.as_str()), (200, "done /bob 1"));
    // One returns: its permit is free again, and the next is denied again.
    gates.open("/a");
    let a = a.await.unwrap();
    assert_eq!(a.status, 200);
    assert!(a.body.starts_with("done /a "), "{}", a.body);
    assert!(!a.headers.contains_key("ratelimit"), "{:?}", a.headers);
    let c = in_flight(addr, &gates, "/c", &ann).await;
    assert_concurrency_denied(&request(addr, "/no2", &ann).await);
    gates.open("/b");
    gates.open("/c");
    assert_eq!((b.await.unwrap().status, c.await.unwrap().status), (200, 200));
    // Both returned: two fit again.
    let d = in_flight(addr, &gates, "/d", &ann).await;
    let e = in_flight(addr, &gates, "/e", &ann).await;
    gates.open("/d");
    gates.open("/e");
    assert_eq!((d.await.unwrap().status, e.await.unwrap().status), (200, 200));
}

#[tokio::test]
async fn concurrency_a_streaming_body_keeps_its_permit_until_it_ends() {
    let (addr, gates) = serve_gated(ConcurrencyLayer::new(concurrency_limiter(1), api_key)).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /stream/s HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    // The head and the first frame arrive; the body is not done.
    let mut raw = Vec::new();
    while !String::from_utf8_lossy(&raw).contains("first\n") {
        let mut buf = [0; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    assert!(raw.starts_with(b"HTTP/1.1 200 "), "{}", String::from_utf8_lossy(&raw));
    // The response head was sent, yet its permit is held while the body streams.
    assert_concurrency_denied(&request(addr, "/no", &[]).await);
    gates.open("/stream/s");
    stream.read_to_end(&mut raw).await.unwrap();
    assert!(String::from_utf8_lossy(&raw).contains("end\n"));
    // The body ended: the permit is free.
    gates.open("/after");
    let r = request(addr, "/after", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "done /after 0"));
}

#[tokio::test]
async fn concurrency_a_failing_handler_frees_its_permit_and_skip_and_on_denied() {
    let layer = ConcurrencyLayer::new(concurrency_limiter(1), api_key)
        .skip(|p| p.uri.path() == "/healthz")
        .on_denied(|parts: &Parts, d: &Decision| {
            let mut res = Response::new(axum::body::Body::from(format!(
                "{{\"path\":\"{}\",\"limit\":{},\"retry_ms\":{}}}",
                parts.uri.path(),
                d.limit,
                d.retry_after_ms
            )));
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            res
        });
    let (addr, gates) = serve_gated(layer).await;
    // Each would be denied if the one before had kept its permit.
    for i in 0..3 {
        let r = request(addr, &format!("/boom/{i}"), &[]).await;
        assert_eq!((r.status, r.body.as_str()), (500, "boom"));
    }
    let held = in_flight(addr, &gates, "/held", &[]).await;
    let r = request(addr, "/no", &[]).await;
    assert_eq!(r.status, 503);
    // (a permit denial stays local `recheck_ms`, 250, from when it was decided)
    let retry: u64 = r
        .body
        .strip_prefix("{\"path\":\"/no\",\"limit\":1,\"retry_ms\":")
        .and_then(|rest| rest.strip_suffix('}'))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{}", r.body));
    assert!((1..=250).contains(&retry), "{}", r.body);
    assert_eq!(r.headers["retry-after"], "1");
    assert!(!r.headers.contains_key("ratelimit"), "{:?}", r.headers);
    // A skipped request takes no permit (and gets no decision).
    let health = in_flight(addr, &gates, "/healthz", &[]).await;
    gates.open("/healthz");
    let health = health.await.unwrap();
    assert_eq!((health.status, health.body.as_str()), (200, "done /healthz -"));
    gates.open("/held");
    assert_eq!(held.await.unwrap().body, "done /held 0");
}

#[tokio::test]
async fn concurrency_the_tier_sets_the_limit_and_errors_are_500() {
    let limiter = Arc::new(
        Limiter::builder()
            .limit(1000)
            .concurrency(3)
            .tier("free", "1000/min, 1 concurrent")
            .build()
            .unwrap(),
    );
    let layer = ConcurrencyLayer::new(limiter.clone(), api_key)
        .tier_fn(|p| p.headers.get("x-plan").and_then(|v| v.to_str().ok()).map(str::to_owned));
    let (addr, gates) = serve_gated(layer).await;
    let free = [("x-api-key", "f"), ("x-plan", "free")];
    let f = in_flight(addr, &gates, "/f1", &free).await;
    assert_concurrency_denied(&request(addr, "/no-f2", &free).await);
    // No tier: the limiter's concurrency (3).
    let none = [("x-api-key", "n")];
    let mut held = Vec::new();
    for path in ["/n1", "/n2", "/n3"] {
        held.push(in_flight(addr, &gates, path, &none).await);
    }
    assert_concurrency_denied(&request(addr, "/no-n4", &none).await);
    for path in ["/f1", "/n1", "/n2", "/n3"] {
        gates.open(path);
    }
    assert_eq!(f.await.unwrap().body, "done /f1 0");
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    // An unknown tier is a limiter error: 500, not an unlimited request.
    let r = request(addr, "/no-g", &[("x-api-key", "g"), ("x-plan", "gold")]).await;
    assert_eq!((r.status, r.body.as_str()), (500, "Internal Server Error\n"));

    // A fixed tier for every request.
    let (addr, gates) = serve_gated(ConcurrencyLayer::new(limiter, api_key).tier("free")).await;
    let held = in_flight(addr, &gates, "/a", &[]).await;
    assert_concurrency_denied(&request(addr, "/no-b", &[]).await);
    gates.open("/a");
    assert_eq!(held.await.unwrap().status, 200);

    // A limiter without concurrency: every request is a limiter error.
    let (addr, _) = serve_gated(ConcurrencyLayer::new(limiter_without_concurrency(), api_key)).await;
    assert_eq!(request(addr, "/no-x", &[]).await.status, 500);
}

fn limiter_without_concurrency() -> Arc<Limiter> {
    limiter(10)
}

/// An inner service called directly (no server): `/error` fails, `/panic`
/// panics, `/hang` announces itself and never answers, anything else is
/// `ok`.
#[derive(Clone)]
struct Inner(Arc<Notify>);

impl tower_service::Service<http::Request<String>> for Inner {
    type Response = Response<String>;
    type Error = &'static str;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, &'static str>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<String>) -> Self::Future {
        let hung = self.0.clone();
        Box::pin(async move {
            match req.uri().path() {
                "/error" => Err("handler failed"),
                "/panic" => panic!("handler panicked"),
                "/hang" => {
                    hung.notify_one();
                    std::future::pending().await
                }
                _ => Ok(Response::new("ok".to_owned())),
            }
        })
    }
}

#[tokio::test]
async fn concurrency_an_inner_error_a_panic_or_a_dropped_request_frees_the_permit() {
    use tower_layer::Layer;
    use tower_service::Service;

    let limiter = concurrency_limiter(1);
    let hung = Arc::new(Notify::new());
    let mut svc = ConcurrencyLayer::new(limiter.clone(), |_: &Parts| "k".to_owned()).layer(Inner(hung.clone()));
    let get = |path: &str| http::Request::get(path).body(String::new()).unwrap();
    // Whether the key's one permit is free: taken and given back at once.
    let free = || {
        let p = limiter.acquire_concurrent("k", None).unwrap();
        p.allowed()
    };

    // The response body holds the permit until it is dropped (or ends).
    let res = svc.call(get("/")).await.unwrap();
    assert!(res.body().holds_permit());
    assert_eq!(res.body().get_ref(), "ok");
    assert!(!free(), "held by the body");
    let denied = svc.call(get("/")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!denied.body().holds_permit());
    drop(res);
    assert!(free(), "released with the body");

    // An inner service's error.
    assert_eq!(svc.call(get("/error")).await.unwrap_err(), "handler failed");
    assert!(free(), "released with the error");

    // A panic: tokio drops the task's future while unwinding, before the
    // JoinHandle hears of it.
    let call = svc.call(get("/panic"));
    assert!(tokio::spawn(call).await.unwrap_err().is_panic());
    assert!(free(), "released by the panic");

    // A request dropped in flight (the client went away, a timeout).
    let task = tokio::spawn(svc.call(get("/hang")));
    hung.notified().await;
    assert!(!free(), "held while in flight");
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(free(), "released when the request was dropped");
}
