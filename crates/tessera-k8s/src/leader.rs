//! Leader election on a coordination Lease: two replicas run, only the leader binds.
//!
//! Both replicas keep a mirror and answer `filter`/`prioritize`, so a failover
//! needs no warm-up; `bind` and the standalone loop check [`Leadership`]. The
//! readiness probe reports not-ready on a follower, so the Service sends
//! kube-scheduler to the leader.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube_lease_manager::LeaseManagerBuilder;

/// Whether this replica leads now (shared, cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Leadership(Arc<AtomicBool>);

impl Leadership {
    /// A flag that says "leader" from the start (single replica, tests).
    pub fn always() -> Leadership {
        let l = Leadership::default();
        l.set(true);
        l
    }

    pub fn is_leader(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub fn set(&self, leader: bool) {
        self.0.store(leader, Ordering::Release);
    }
}

/// Where the Lease lives and how long it lasts.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    pub duration: Duration,
    pub grace: Duration,
}

/// Why leader election stopped.
#[derive(Debug, thiserror::Error)]
#[error("leader election on Lease {namespace}/{name}: {message}")]
pub struct LeaderError {
    pub namespace: String,
    pub name: String,
    pub message: String,
}

/// Takes part in the election until `shutdown` resolves, keeping `flag` current.
/// On shutdown the lease is released so the other replica takes over at once.
pub async fn run(
    client: kube::Client,
    config: LeaseConfig,
    flag: Leadership,
    shutdown: impl Future<Output = ()>,
) -> Result<(), LeaderError> {
    let err = |message: String| LeaderError {
        namespace: config.namespace.clone(),
        name: config.name.clone(),
        message,
    };
    let manager = LeaseManagerBuilder::new(client, &config.name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        // The builder keeps the field manager of its random default identity;
        // name ours after this replica, as the crate documents.
        .with_field_manager(format!("kube-lease-manager-{}", config.identity))
        .with_duration(config.duration.as_secs())
        .with_grace(config.grace.as_secs())
        .build()
        .await
        .map_err(|e| err(e.to_string()))?;
    let (mut channel, task) = manager.watch().await;
    flag.set(*channel.borrow_and_update());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            changed = channel.changed() => {
                if changed.is_err() {
                    flag.set(false);
                    break;
                }
                let leading = *channel.borrow_and_update();
                tracing::info!(leading, identity = %config.identity, "leadership changed");
                flag.set(leading);
            }
        }
    }
    flag.set(false);
    drop(channel);
    match task.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(err(e.to_string())),
        Err(e) => Err(err(e.to_string())),
    }
}
