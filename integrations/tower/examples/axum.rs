//! An axum server limited by quotalease: 100 requests per minute per API key
//! (or per client address without one), `/healthz` unlimited.
//!
//! ```sh
//! cargo run -p quotalease-tower --example axum
//! # a fleet: every instance on the same Redis
//! QUOTALEASE_URL=redis://127.0.0.1:6379 PORT=3001 cargo run -p quotalease-tower --example axum
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Extension};
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use quotalease::{Decision, Limiter};
use quotalease_tower::RateLimitLayer;

/// The API key, else the client's address.
fn key(parts: &Parts) -> String {
    if let Some(k) = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return format!("key:{k}");
    }
    match parts.extensions.get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(addr)) => format!("ip:{}", addr.ip()),
        None => "unknown".to_owned(),
    }
}

#[tokio::main]
async fn main() {
    let url = std::env::var("QUOTALEASE_URL").unwrap_or_else(|_| "memory://".to_owned());
    let limiter = Arc::new(
        Limiter::builder()
            .url(&url)
            .rate("100/min")
            .build()
            .unwrap_or_else(|e| panic!("limiter: {e}")),
    );
    let layer = RateLimitLayer::new(limiter.clone(), key).skip(|p| p.uri.path() == "/healthz");
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<Decision>| async move { format!("hello; {} left\n", d.remaining) }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(layer);

    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    println!(
        "listening on http://{} (limiter {:?})",
        listener.local_addr().unwrap(),
        limiter
    );
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .unwrap();
    // Give leased tokens back.
    let _ = limiter.close();
}
