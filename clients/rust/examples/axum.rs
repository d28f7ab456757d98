//! The README's axum example: 100 requests a minute per client address,
//! served on $ADDR (default 127.0.0.1:3000), counted in the Redis server at
//! $REDIS_URL (default redis://127.0.0.1:6379/).
use std::net::SocketAddr;
use std::time::Duration;

use axum::{error_handling::HandleErrorLayer, http::StatusCode, routing::get, BoxError, Router};
use xcloak_client::tower::{HttpLimit, RateLimitLayer};
use xcloak_client::Limiter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let limiter = Limiter::new(
        xcloak_client::redis::Client::open(url)?
            .get_connection_manager()
            .await?,
    );
    // Keyed by the client's address, from axum's ConnectInfo: no .key(...) needed.
    let limit = RateLimitLayer::new(limiter, [HttpLimit::new(Duration::from_secs(60), 100)])?;
    // The layer's own errors (Redis unreachable, under the default policy) answer 500.
    let answer = |e: BoxError| async move { (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()) };
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer((HandleErrorLayer::new(answer), limit));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{addr}");
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
