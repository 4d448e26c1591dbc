//! What the agent's own Node says it may do, from one watch of that Node.
//!
//! Two settings, both node labels the scheduler reads too, so one label set by
//! the operator governs both sides:
//!
//! - `tessera.io/mig-dynamic` ([`tessera_core::fit::mig_layout::LABEL_MIG_DYNAMIC`]):
//!   the scheduler plans new MIG instances on the node, and the agent advertises
//!   the MIG profiles it may create there ([`crate::deviceplugin::NodeView::creatable`]).
//! - `tessera.io/mig-strategy`, else GFD's `nvidia.com/mig.strategy`
//!   ([`tessera_core::model::single`]): under `single` the scheduler grants MIG
//!   instances as whole GPUs, and the agent advertises them as `nvidia.com/gpu`
//!   and `tessera.io/gpu` devices.
//!
//! Until the Node has been read both are off ([`NodeSettings::default`]): only
//! instances that exist are advertised, by profile, as without the labels. The
//! watch (field selector `metadata.name=<node>`, from the API server's watch
//! cache) is one per agent, like the pod watch.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tessera_core::fit::mig_layout::{LABEL_MIG_DYNAMIC, MigDynamic};
use tessera_core::model::single::MigStrategy;
use tokio::sync::watch;

/// What the Node's labels say, as the scheduler reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeSettings {
    pub mig_dynamic: MigDynamic,
    pub mig_strategy: MigStrategy,
}

/// The settings a Node's labels say.
pub fn settings_of(node: &Node) -> NodeSettings {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    NodeSettings {
        mig_dynamic: MigDynamic::from_label(labels.get(LABEL_MIG_DYNAMIC).map(String::as_str)),
        mig_strategy: MigStrategy::of(&labels),
    }
}

/// Starts watching `node` (on the current tokio runtime); the receiver follows
/// its labels ([`settings_of`]). The watch ends when every receiver is dropped
/// and the next event arrives.
pub fn watch_settings(client: kube::Client, node: &str) -> watch::Receiver<NodeSettings> {
    let api: Api<Node> = Api::all(client);
    let config = crate::pods::watch_cache_config(&format!("metadata.name={node}"));
    let (tx, rx) = watch::channel(NodeSettings::default());
    let node = node.to_string();
    let stream = watcher(api, config).default_backoff().applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(n) => {
                    let now = settings_of(&n);
                    let changed = tx.send_if_modified(|cur| std::mem::replace(cur, now) != now);
                    if changed {
                        tracing::info!(
                            node = %node,
                            mig_dynamic = ?now.mig_dynamic,
                            mig_strategy = ?now.mig_strategy,
                            "MIG settings of the node"
                        );
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

    fn node(labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_labels_are_read_as_the_scheduler_reads_them() {
        let dynamic = |v: &str| settings_of(&node(&[(LABEL_MIG_DYNAMIC, v)])).mig_dynamic;
        assert_eq!(settings_of(&node(&[])), NodeSettings::default());
        assert_eq!(dynamic("instances"), MigDynamic::Instances);
        assert_eq!(dynamic(" mode "), MigDynamic::Mode);
        // A typo allows nothing.
        assert_eq!(dynamic("Mode"), MigDynamic::Off);
        let strategy = |l: &[(&str, &str)]| settings_of(&node(l)).mig_strategy;
        assert_eq!(
            strategy(&[("nvidia.com/mig.strategy", "single")]),
            MigStrategy::Single
        );
        assert_eq!(
            strategy(&[
                ("nvidia.com/mig.strategy", "single"),
                ("tessera.io/mig-strategy", "mixed")
            ]),
            MigStrategy::Mixed
        );
        assert_eq!(strategy(&[]), MigStrategy::Mixed);
    }
}
