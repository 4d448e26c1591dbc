//! What the agent's own Node says it may do, from one watch of that Node.
//!
//! Today one setting: the `tessera.io/mig-dynamic` label
//! ([`tessera_core::fit::mig_layout::LABEL_MIG_DYNAMIC`]), which the scheduler
//! reads to plan new MIG instances on the node. The agent reads the same label
//! to advertise the MIG profiles it may create there
//! ([`crate::deviceplugin::NodeView::creatable`]), so one label, set by the
//! operator, governs both sides. Until the Node has been read the setting is
//! [`MigDynamic::Off`]: only instances that exist are advertised, as without the
//! label. The watch (field selector `metadata.name=<node>`, from the API
//! server's watch cache) is one per agent, like the pod watch.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tessera_core::fit::mig_layout::{LABEL_MIG_DYNAMIC, MigDynamic};
use tokio::sync::watch;

/// The setting a Node's labels say.
pub fn mig_dynamic_of(node: &Node) -> MigDynamic {
    MigDynamic::from_label(
        node.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_MIG_DYNAMIC))
            .map(String::as_str),
    )
}

/// Starts watching `node` (on the current tokio runtime); the receiver follows
/// its `tessera.io/mig-dynamic` label. The watch ends when every receiver is
/// dropped and the next event arrives.
pub fn watch_mig_dynamic(client: kube::Client, node: &str) -> watch::Receiver<MigDynamic> {
    let api: Api<Node> = Api::all(client);
    let config = crate::pods::watch_cache_config(&format!("metadata.name={node}"));
    let (tx, rx) = watch::channel(MigDynamic::Off);
    let node = node.to_string();
    let stream = watcher(api, config).default_backoff().applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(n) => {
                    let now = mig_dynamic_of(&n);
                    let changed = tx.send_if_modified(|cur| std::mem::replace(cur, now) != now);
                    if changed {
                        tracing::info!(node = %node, mig_dynamic = ?now, "MIG setting of the node");
                    }
                }
                Err(e) => tracing::warn!(node = %node, error = %e, "node watch failed; retrying"),
            }
            if tx.is_closed() {
                break;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_is_read_as_the_scheduler_reads_it() {
        let node = |v: Option<&str>| Node {
            metadata: kube::api::ObjectMeta {
                labels: v.map(|v| [(LABEL_MIG_DYNAMIC.to_string(), v.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(mig_dynamic_of(&node(None)), MigDynamic::Off);
        assert_eq!(
            mig_dynamic_of(&node(Some("instances"))),
            MigDynamic::Instances
        );
        assert_eq!(mig_dynamic_of(&node(Some(" mode "))), MigDynamic::Mode);
        // A typo allows nothing.
        assert_eq!(mig_dynamic_of(&node(Some("Mode"))), MigDynamic::Off);
    }
}
