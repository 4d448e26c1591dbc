//! The kube client Tessera talks to the API server with.
//!
//! kube-rs's own client speaks HTTP/1.1 only, so every request in flight holds
//! a TLS connection of its own: during a burst of binds Tessera held 70–142
//! connections to the API server (issue 10), each a TLS handshake. client-go
//! multiplexes everything over one HTTP/2 connection. This client keeps kube-rs's
//! layers (base URI, authentication with token refresh and exec plugins,
//! impersonation headers, retry of 429/503/504 GETs) on hyper's pooled client
//! with HTTP/2 offered by ALPN (HTTP/1.1 where the server declines), and
//! HTTP/2 keep-alive pings as client-go's health check (30 s idle, 15 s
//! timeout) in place of a read timeout, so a dead connection is found even
//! while a watch waits. A proxied connection (`proxy_url`) keeps kube-rs's own
//! HTTP/1.1 stack. Requests can be rate limited client-side like client-go's
//! ([`ratelimit`]: qps and burst; `tessera scheduler --kube-api-qps/--kube-api-burst`).

use std::time::Duration;

use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

pub mod ratelimit;
use ratelimit::{Bucket, RateLimit, RateLimitLayer};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Idle time before an HTTP/2 ping, and how long to wait for its answer.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client from the in-cluster service account or the local kubeconfig
/// (no client-side rate limit).
pub async fn connect() -> Result<kube::Client, kube::Error> {
    connect_limited(None).await
}

/// [`connect`] with `limit` (`None`: no client-side limit).
pub async fn connect_limited(limit: Option<RateLimit>) -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    from_config_limited(config, limit)
}

/// A client for `config`, multiplexing over HTTP/2 where the server offers it (no rate limit).
pub fn from_config(config: kube::Config) -> Result<kube::Client, kube::Error> {
    from_config_limited(config, None)
}

/// [`from_config`] with a client-side rate limit.
pub fn from_config_limited(
    config: kube::Config,
    limit: Option<RateLimit>,
) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    http.set_nodelay(true);
    let mut tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = config.tls_server_name.clone() {
        let name = rustls::pki_types::ServerName::try_from(name)
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        tls = tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = tls.enable_http1().enable_http2().wrap_connector(http);
    let hyper = HyperClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .pool_timer(TokioTimer::new())
        .build::<_, kube::client::Body>(https);
    let service = ServiceBuilder::new()
        .option_layer(limit.map(|l| RateLimitLayer(Bucket::new(l))))
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}
