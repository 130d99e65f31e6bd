//! The layer in front of a real tonic server (the gRPC health service of
//! tonic-health) on 127.0.0.1:0, called by tonic's own client; and
//! ConcurrencyLayer there, with the health service's `Watch` stream as a call
//! that stays in flight until the test ends it.

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use quotalease::Limiter;
use quotalease_tower::{ConcurrencyLayer, RateLimitLayer};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus as Wire;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::ServingStatus;
use tonic_types::StatusExt;

/// gRPC calls are limited per method here: the key is the request path.
fn method(parts: &Parts) -> String {
    parts.uri.path().to_owned()
}

async fn serve(layer: RateLimitLayer<quotalease_tower::Grpc>) -> String {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap()
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn resource_exhausted_carries_retry_info() {
    let limiter = Arc::new(Limiter::builder().limit(2).window_ms(60_000).build().unwrap());
    let url = serve(RateLimitLayer::new(limiter.clone(), method).grpc()).await;
    let mut client = HealthClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());

    for left in [1, 0] {
        let res = client
            .check(HealthCheckRequest { service: String::new() })
            .await
            .unwrap();
        let md = res.metadata();
        assert_eq!(md.get("ratelimit-policy").unwrap(), "\"default\";q=2;w=60");
        let rl = md.get("ratelimit").unwrap().to_str().unwrap();
        assert!(rl.starts_with(&format!("\"default\";r={left};")), "{rl}");
    }

    let status = client
        .check(HealthCheckRequest { service: String::new() })
        .await
        .expect_err("the third call in the window is refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().starts_with("rate limit exceeded; retry after "),
        "{}",
        status.message()
    );
    let md = status.metadata();
    let pushback: u64 = md
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60_000).contains(&pushback), "{pushback}");
    let retry_after: u64 = md.get("retry-after").unwrap().to_str().unwrap().parse().unwrap();
    assert_eq!(retry_after, pushback.div_ceil(1000));
    // The standard detail, decoded by tonic-types.
    let info = status.get_details_retry_info().expect("a google.rpc.RetryInfo detail");
    assert_eq!(info.retry_delay, Some(Duration::from_millis(pushback)));

    let seen = limiter.inspect("/grpc.health.v1.Health/Check").unwrap();
    assert_eq!((seen.admitted, seen.denied), (2, 1));
}

#[tokio::test]
async fn skipped_methods_and_limiter_errors() {
    let limiter = Arc::new(Limiter::builder().limit(1).window_ms(60_000).build().unwrap());
    // Every call gets the empty key (a limiter error) except skipped ones.
    let layer = RateLimitLayer::new(limiter, |_: &Parts| String::new())
        .skip(|p| p.headers.get("x-internal").is_some())
        .grpc();
    let url = serve(layer).await;
    let mut client = HealthClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());

    let status = client
        .check(HealthCheckRequest { service: String::new() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(status.message(), "rate limiter error");

    for _ in 0..3 {
        let mut req = tonic::Request::new(HealthCheckRequest { service: String::new() });
        req.metadata_mut().insert("x-internal", "1".parse().unwrap());
        let res = client.check(req).await.unwrap();
        assert!(res.metadata().get("ratelimit").is_none());
    }
}

/// A concurrency limit of one call per caller (`x-api-key`) in front of the
/// health service: a `Watch` server stream holds its permit while it streams,
/// and gives it back when it ends (the reporter forgets its service).
#[tokio::test]
async fn concurrency_a_server_stream_holds_its_permit_until_it_ends() {
    let limiter = Arc::new(Limiter::builder().limit(1000).concurrency(1).build().unwrap());
    let layer = ConcurrencyLayer::new(limiter, |p: &Parts| {
        p.headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("anonymous")
            .to_owned()
    })
    .grpc();
    let (mut reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("svc", ServingStatus::Serving).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap()
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);

    let mut watch = client
        .watch(HealthCheckRequest { service: "svc".into() })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().expect("the current status");
    assert_eq!(first.status, Wire::Serving as i32);

    // The stream is open: another call of the caller is refused before it starts.
    let status = client
        .check(HealthCheckRequest { service: "svc".into() })
        .await
        .expect_err("one call at a time");
    assert_eq!(status.code(), Code::ResourceExhausted);
    let md = status.metadata();
    assert_eq!(md.get("retry-after").unwrap(), "1");
    assert!(md.get("ratelimit").is_none() && md.get("ratelimit-policy").is_none());
    let info = status.get_details_retry_info().expect("a google.rpc.RetryInfo detail");
    // A permit denial stays local for `recheck_ms` (250) from when it was
    // decided: the delay counts down from there (249 when a millisecond
    // passed between deciding and answering, as it did on a loaded CI).
    let delay = info.retry_delay.expect("a delay");
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_millis(250),
        "{delay:?}"
    );

    // Another caller has its own permit.
    let mut other = tonic::Request::new(HealthCheckRequest { service: "svc".into() });
    other.metadata_mut().insert("x-api-key", "other".parse().unwrap());
    client.check(other).await.unwrap();

    // The stream ends (its last frame, the trailers, gives the permit back).
    reporter.clear_service_status("svc").await;
    assert!(watch.message().await.unwrap().is_none());
    let res = client
        .check(HealthCheckRequest { service: String::new() })
        .await
        .unwrap();
    assert!(res.metadata().get("ratelimit").is_none());
}
