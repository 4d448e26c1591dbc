//! Client-side rate limiting as client-go does it (kube-scheduler's
//! `--kube-api-qps` / `--kube-api-burst`, 50 and 100 by default): a token
//! bucket holding up to `burst` tokens, refilled at `qps` a second; a request
//! waits for a token instead of failing. It protects the API server from a
//! scheduler that decides far faster than the server can take writes.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tower::{Layer, Service};

/// Requests per second and the burst above it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub qps: f64,
    pub burst: u32,
}

impl RateLimit {
    /// kube-scheduler's defaults.
    pub const KUBE_SCHEDULER: RateLimit = RateLimit {
        qps: 50.0,
        burst: 100,
    };
}

/// The shared bucket.
#[derive(Debug)]
pub struct Bucket {
    limit: RateLimit,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(limit: RateLimit) -> Arc<Bucket> {
        Arc::new(Bucket {
            limit,
            state: Mutex::new((f64::from(limit.burst.max(1)), Instant::now())),
        })
    }

    /// Waits until a token is free and takes it.
    pub async fn take(&self) {
        let qps = self.limit.qps.max(f64::MIN_POSITIVE);
        let burst = f64::from(self.limit.burst.max(1));
        let mut s = self.state.lock().await;
        let now = Instant::now();
        let refill = now.saturating_duration_since(s.1).as_secs_f64() * qps;
        s.0 = (s.0 + refill).min(burst);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            return;
        }
        // Waiting under the lock keeps the order of arrival (FIFO, as client-go's limiter).
        let wait = Duration::from_secs_f64((1.0 - s.0) / qps);
        tokio::time::sleep(wait).await;
        s.0 = 0.0;
        s.1 = Instant::now();
    }
}

/// A tower layer that takes a token before each request.
#[derive(Debug, Clone)]
pub struct RateLimitLayer(pub Arc<Bucket>);

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<Bucket>,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        // The service polled ready is the one that is called (tower's contract);
        // a fresh clone takes its place for the next request.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let bucket = self.bucket.clone();
        Box::pin(async move {
            bucket.take().await;
            ready.call(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On tokio's paused clock (virtual time, not wall time): a burst of 10 goes
    /// at once, then 50 a second: 110 requests take (110 − 10) / 50 = 2 s.
    #[tokio::test(start_paused = true)]
    async fn a_burst_then_qps() {
        let b = Bucket::new(RateLimit {
            qps: 50.0,
            burst: 10,
        });
        let start = Instant::now();
        for _ in 0..10 {
            b.take().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is free");
        for _ in 0..100 {
            b.take().await;
        }
        let took = start.elapsed().as_secs_f64();
        assert!((took - 2.0).abs() < 0.05, "{took} s");
        // Idle refills up to the burst, not beyond.
        tokio::time::advance(Duration::from_secs(10)).await;
        let t = Instant::now();
        for _ in 0..10 {
            b.take().await;
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
        b.take().await;
        assert!(t.elapsed() >= Duration::from_millis(19));
    }
}
