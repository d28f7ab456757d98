//! The README's first example: three calls a minute for one user, against
//! the Redis server at $REDIS_URL (default redis://127.0.0.1:6379/).
use std::time::Duration;

use xcloak_client::{Limiter, Request};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let conn = xcloak_client::redis::Client::open(url)?
        .get_connection_manager()
        .await?;
    let limiter = Limiter::new(conn);
    // At most 3 calls per minute for user 42: the fourth is refused.
    let request = Request::new("user:42", Duration::from_secs(60), 3);
    for _ in 0..4 {
        let d = limiter.allow(&request).await?;
        println!(
            "allowed={} remaining={} retry_after={:?} via={:?}",
            d.allowed, d.remaining, d.retry_after, d.via
        );
    }
    Ok(())
}
