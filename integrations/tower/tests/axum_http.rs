//! The layer in front of a real axum server on 127.0.0.1:0, driven by raw
//! HTTP/1.1 requests over a TcpStream (no HTTP client library in between).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::Extension;
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::{Response, StatusCode};
use quotalease::{Decision, Limiter};
use quotalease_tower::RateLimitLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
