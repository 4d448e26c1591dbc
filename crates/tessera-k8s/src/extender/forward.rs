//! A follower forwards `bind` to the leader, so that kube-scheduler may call
//! any synced replica (through a Service whose readiness is "synced", the same
//! readiness the admission webhook needs) and no bind fails for having reached
//! a follower (issue 31).
//!
//! Why forwarding, not a leader-only Service: a pod has one Ready condition for
//! all its ports, so the extender's Service and the webhook's cannot select
//! different replicas by readiness; tying readiness to leadership would take the
//! webhook off every follower. A leader label on the pod (Patroni's way) leaves
//! a window after each failover in which kube-proxy still sends binds to the old
//! leader. Forwarding keeps one writer (the leader, fenced by its Lease) and
//! makes the hop invisible to kube-scheduler.
//!
//! - **Where**: the elected leader writes its `--advertise-url` (its ops port)
//!   on the Lease ([`crate::leader::PEER_ANNOTATION`]) in the same update that
//!   takes or renews it; followers read it with every Lease read.
//! - **Waiting**: with no live leader (the Lease of a killed one has not lapsed
//!   yet) or an unreachable one, a bind waits, retrying, as long as a failover
//!   can take ([`Peers::with_lease`]: the Lease's duration plus two reads, 19 s
//!   with the defaults; kube-scheduler's extender `httpTimeout` must be longer,
//!   30 s in docs/kubernetes.md's "Existing kube-scheduler"), and binds itself if this replica takes
//!   over meanwhile, also while a forwarded call is still unanswered: a leader
//!   that hangs (its socket accepts, nothing answers) would otherwise hold the
//!   bind for the whole wait and fail it (issue 41, defect 12;
//!   [`crate::leader::Leadership::moved_from`]). A fixed wait shorter than the Lease failed every bind that
//!   arrived in the first seconds after a leader crashed. Retrying is safe: the Binding carries the
//!   pod's UID and resourceVersion as preconditions, so the API server binds a
//!   pod once whatever reaches it twice.
//! - **Authentication**: the hop goes to the leader's ops port (plain HTTP,
//!   reachable by every replica whatever the extender's TLS), so each forwarded
//!   body is signed: HMAC-SHA256 over the time, path and body, with a key
//!   derived from the allocation signing key that every replica holds already
//!   (whoever holds that key can already write grants the node agents honour;
//!   the derivation keeps the two uses apart). The leader refuses a missing or
//!   wrong MAC, or a time more than [`MAX_SKEW_S`] away from its clock. A
//!   replayed bind within that window can only repeat a bind that was asked
//!   already, and the API's preconditions make that a no-op.
//! - **No loops**: the forwarded call goes to [`PEER_BIND_PATH`], which never
//!   forwards again; a replica that no longer leads answers it 503 and the
//!   follower retries at the endpoint the Lease names next.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use hmac::{Hmac, Mac};
use http::{HeaderMap, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::Sha256;

/// Where a leader takes forwarded binds (on its ops port).
pub const PEER_BIND_PATH: &str = "/peer/bind";
/// Unix seconds at which the follower signed the call.
pub const TIME_HEADER: &str = "x-tessera-peer-time";
/// Hex HMAC-SHA256 of `time \n path \n body`.
pub const MAC_HEADER: &str = "x-tessera-peer-mac";
/// Largest difference between the signer's clock and ours.
pub const MAX_SKEW_S: u64 = 30;
/// Longest a bind waits for a leader to take it when no Lease is known
/// (the default Lease's 15 s plus two 2 s reads; see [`Peers::with_lease`]).
pub const FORWARD_WAIT: Duration = Duration::from_secs(19);
/// Largest forwarded answer read back.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

type HmacSha256 = Hmac<Sha256>;

/// What a forwarded call came back with.
#[derive(Debug)]
pub enum Forwarded {
    /// The leader's answer (an `ExtenderBindingResult` body).
    Answered(Bytes),
    /// The replica no longer leads: ask the next one.
    NotLeader,
}

/// Signs and sends forwarded calls, and checks those that arrive.
#[derive(Clone)]
pub struct Peers {
    key: Arc<[u8]>,
    client: Client<HttpConnector, Body>,
    wait: Duration,
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Peers {
    /// Peers keyed by a derivation of the allocation signing key.
    pub fn new(signing_key: &[u8]) -> Peers {
        let mut derive = HmacSha256::new_from_slice(signing_key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        derive.update(b"tessera peer forwarding v1");
        let key: Arc<[u8]> = Arc::from(derive.finalize().into_bytes().as_slice());
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Peers {
            key,
            client,
            wait: FORWARD_WAIT,
        }
    }

    /// Waits for a leader as long as a failover under this Lease can take: a
    /// crashed leader's Lease lapses `duration` after its last renewal, a
    /// follower sees that at its next read (`retry_period` later) and takes it
    /// with one more write.
    pub fn with_lease(mut self, duration: Duration, retry_period: Duration) -> Peers {
        self.wait = duration + 2 * retry_period;
        self
    }

    /// How long a bind waits for a leader to take it.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    fn mac(&self, time_s: u64, path: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(time_s.to_string().as_bytes());
        mac.update(b"\n");
        mac.update(path.as_bytes());
        mac.update(b"\n");
        mac.update(body);
        mac
    }

    /// Whether a forwarded call is signed by a replica, recently.
    pub fn verify(&self, headers: &HeaderMap, path: &str, body: &[u8]) -> Result<(), String> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| format!("missing header {name}"))
        };
        let time_s: u64 = header(TIME_HEADER)?
            .parse()
            .map_err(|_| format!("{TIME_HEADER} is not Unix seconds"))?;
        if now_s().abs_diff(time_s) > MAX_SKEW_S {
            return Err(format!(
                "{TIME_HEADER} is more than {MAX_SKEW_S} s from this replica's clock"
            ));
        }
        let given = unhex(header(MAC_HEADER)?).ok_or_else(|| format!("{MAC_HEADER} is not hex"))?;
        self.mac(time_s, path, body)
            .verify_slice(&given)
            .map_err(|_| format!("{MAC_HEADER} does not match (another signing key?)"))
    }

    /// The headers that sign a call of `path` with `body` now.
    pub fn sign(&self, path: &str, body: &[u8]) -> [(&'static str, String); 2] {
        let time_s = now_s();
        let mac = hex(&self.mac(time_s, path, body).finalize().into_bytes());
        [(TIME_HEADER, time_s.to_string()), (MAC_HEADER, mac)]
    }

    /// Sends `body` to the leader at `endpoint` (`http://HOST:PORT`), within `limit`.
    pub async fn forward(
        &self,
        endpoint: &str,
        body: &Bytes,
        limit: Duration,
    ) -> Result<Forwarded, String> {
        let time_s = now_s();
        let mac = hex(&self
            .mac(time_s, PEER_BIND_PATH, body)
            .finalize()
            .into_bytes());
        let request = Request::post(format!("{endpoint}{PEER_BIND_PATH}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(TIME_HEADER, time_s.to_string())
            .header(MAC_HEADER, mac)
            .body(Body::from(body.clone()))
            .map_err(|e| format!("{endpoint}: {e}"))?;
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("{endpoint}: {e}"))?;
            let status = response.status();
            let answer = axum::body::to_bytes(Body::new(response.into_body()), MAX_ANSWER_BYTES)
                .await
                .map_err(|e| format!("{endpoint}: reading the answer: {e}"))?;
            match status {
                StatusCode::OK => Ok(Forwarded::Answered(answer)),
                StatusCode::SERVICE_UNAVAILABLE => Ok(Forwarded::NotLeader),
                other => Err(format!(
                    "{endpoint} answered {other}: {}",
                    String::from_utf8_lossy(&answer).trim()
                )),
            }
        };
        tokio::time::timeout(limit, call)
            .await
            .map_err(|_| format!("{endpoint}: no answer within {} ms", limit.as_millis()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(p: &Peers, time_s: u64, body: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(TIME_HEADER, time_s.to_string().parse().unwrap());
        let mac = hex(&p.mac(time_s, PEER_BIND_PATH, body).finalize().into_bytes());
        h.insert(MAC_HEADER, mac.parse().unwrap());
        h
    }

    #[tokio::test]
    async fn only_a_recent_call_signed_with_the_same_key_is_taken() {
        let ours = Peers::new(b"the-shared-signing-key");
        let body = br#"{"PodName":"p"}"#;
        let h = signed(&ours, now_s(), body);
        assert_eq!(ours.verify(&h, PEER_BIND_PATH, body), Ok(()));
        // Another body, another path, another key, an old time, no headers: refused.
        assert!(ours.verify(&h, PEER_BIND_PATH, b"{}").is_err());
        assert!(ours.verify(&h, "/bind", body).is_err());
        let theirs = Peers::new(b"some-other-signing-key");
        assert!(theirs.verify(&h, PEER_BIND_PATH, body).is_err());
        let old = signed(&ours, now_s() - MAX_SKEW_S - 5, body);
        let e = ours.verify(&old, PEER_BIND_PATH, body).unwrap_err();
        assert!(e.contains("clock"), "{e}");
        let e = ours
            .verify(&HeaderMap::new(), PEER_BIND_PATH, body)
            .unwrap_err();
        assert!(e.contains("missing header"), "{e}");
    }
}
