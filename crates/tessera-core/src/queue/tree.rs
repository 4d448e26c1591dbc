//! The queue tree: who is entitled to what.
//!
//! Each queue has a *guaranteed* quota (what it gets whenever it asks), an
//! optional *limit* (what it may never exceed, borrowing included), a *weight*
//! for dividing what others leave unused, and two switches: whether it lends
//! its unused guarantee to others and whether it borrows from them. Leaves hold
//! pods; inner queues group teams (a department over its teams) and bound them.
//! The root is implicit: the whole cluster.

use serde::{Deserialize, Serialize};

use super::{QueueId, Resources};

/// One queue as configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    pub name: String,
    /// The parent queue's name; `None` for a top-level queue.
    #[serde(default)]
    pub parent: Option<String>,
    /// Always available to this queue when it has demand.
    #[serde(default)]
    pub guaranteed: Resources,
    /// Never exceeded, borrowing included; `None` = no limit beyond the parent's.
    #[serde(default)]
    pub limit: Option<Resources>,
    /// Share of what is left over after guarantees (relative to siblings).
    #[serde(default = "one")]
    pub weight: u32,
    /// Its unused guarantee may be used by others (and reclaimed when it returns).
    #[serde(default = "yes")]
    pub lend: bool,
    /// It may go beyond its guarantee when others leave capacity unused.
    #[serde(default = "yes")]
    pub borrow: bool,
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}

impl QueueSpec {
    /// A top-level queue with a guarantee, weight 1, lending and borrowing.
    pub fn new(name: impl Into<String>, guaranteed: Resources) -> QueueSpec {
        QueueSpec {
            name: name.into(),
            parent: None,
            guaranteed,
            limit: None,
            weight: 1,
            lend: true,
            borrow: true,
        }
    }
}

/// Why a queue configuration was refused. Each names the queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("queue {0:?} is defined twice")]
    Duplicate(String),
    #[error("queue {queue:?}: parent {parent:?} is not a queue")]
    UnknownParent { queue: String, parent: String },
    #[error("queue {0:?}: its parents form a cycle")]
    Cycle(String),
    #[error("queue {0:?}: weight must be at least 1")]
    ZeroWeight(String),
    #[error("queue {0:?}: the guarantee is above the limit")]
    GuaranteeAboveLimit(String),
    #[error("queue {0:?}: its children's guarantees add up to more than its own")]
    ChildrenOverGuarantee(String),
    #[error("queue name must not be empty")]
    EmptyName,
    #[error("at most {max} queues are supported, got {got}")]
    TooMany { max: usize, got: usize },
}

/// A validated tree of queues, parents before children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTree {
    specs: Vec<QueueSpec>,
    parent: Vec<Option<QueueId>>,
    children: Vec<Vec<QueueId>>,
    top: Vec<QueueId>,
}

impl QueueTree {
    pub fn new(specs: Vec<QueueSpec>) -> Result<QueueTree, TreeError> {
        if specs.len() > usize::from(u16::MAX) {
            return Err(TreeError::TooMany {
                max: usize::from(u16::MAX),
                got: specs.len(),
            });
        }
        let mut by_name = std::collections::HashMap::new();
        for (i, s) in specs.iter().enumerate() {
            if s.name.trim().is_empty() {
                return Err(TreeError::EmptyName);
            }
            if by_name.insert(s.name.as_str(), i).is_some() {
                return Err(TreeError::Duplicate(s.name.clone()));
            }
            if s.weight == 0 {
                return Err(TreeError::ZeroWeight(s.name.clone()));
            }
            if s.limit.is_some_and(|l| !s.guaranteed.fits_within(&l)) {
                return Err(TreeError::GuaranteeAboveLimit(s.name.clone()));
            }
        }
        let mut parent_idx = Vec::with_capacity(specs.len());
        for s in &specs {
            parent_idx.push(match &s.parent {
                None => None,
                Some(p) => {
                    Some(
                        *by_name
                            .get(p.as_str())
                            .ok_or_else(|| TreeError::UnknownParent {
                                queue: s.name.clone(),
                                parent: p.clone(),
                            })?,
                    )
                }
            });
        }
        for (i, s) in specs.iter().enumerate() {
            let mut at = parent_idx[i];
            for _ in 0..specs.len() {
                match at {
                    None => break,
                    Some(j) if j == i => return Err(TreeError::Cycle(s.name.clone())),
                    Some(j) => at = parent_idx[j],
                }
            }
            if at.is_some() {
                return Err(TreeError::Cycle(s.name.clone()));
            }
        }
        // Order parents before children (a stable topological order by depth).
        let depth = |mut i: usize| {
            let mut d = 0;
            while let Some(p) = parent_idx[i] {
                d += 1;
                i = p;
            }
            d
        };
        let mut order: Vec<usize> = (0..specs.len()).collect();
        order.sort_by_key(|&i| depth(i));
        let mut new_id = vec![0usize; specs.len()];
        for (new, &old) in order.iter().enumerate() {
            new_id[old] = new;
        }
        let parent: Vec<Option<QueueId>> = order
            .iter()
            .map(|&old| parent_idx[old].map(|p| QueueId(new_id[p] as u16)))
            .collect();
        let mut specs_sorted: Vec<Option<QueueSpec>> = specs.into_iter().map(Some).collect();
        let specs: Vec<QueueSpec> = order
            .iter()
            .map(|&old| specs_sorted[old].take().expect("each index once"))
            .collect();
        let mut children = vec![Vec::new(); specs.len()];
        let mut top = Vec::new();
        for (i, p) in parent.iter().enumerate() {
            match p {
                Some(p) => children[usize::from(p.0)].push(QueueId(i as u16)),
                None => top.push(QueueId(i as u16)),
            }
        }
        for (i, kids) in children.iter().enumerate() {
            if kids.is_empty() {
                continue;
            }
            let sum = kids.iter().fold(Resources::ZERO, |a, k| {
                a + specs[usize::from(k.0)].guaranteed
            });
            if !sum.fits_within(&specs[i].guaranteed) {
                return Err(TreeError::ChildrenOverGuarantee(specs[i].name.clone()));
            }
        }
        Ok(QueueTree {
            specs,
            parent,
            children,
            top,
        })
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }
    pub fn ids(&self) -> impl Iterator<Item = QueueId> + '_ {
        (0..self.specs.len()).map(|i| QueueId(i as u16))
    }
    pub fn spec(&self, id: QueueId) -> &QueueSpec {
        &self.specs[usize::from(id.0)]
    }
    pub fn id(&self, name: &str) -> Option<QueueId> {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .map(|i| QueueId(i as u16))
    }
    pub fn parent(&self, id: QueueId) -> Option<QueueId> {
        self.parent[usize::from(id.0)]
    }
    pub fn children(&self, id: QueueId) -> &[QueueId] {
        &self.children[usize::from(id.0)]
    }
    /// Top-level queues (children of the implicit root).
    pub fn top(&self) -> &[QueueId] {
        &self.top
    }
    /// Queues that hold pods (no children).
    pub fn is_leaf(&self, id: QueueId) -> bool {
        self.children(id).is_empty()
    }
    /// `id` and its ancestors, nearest first.
    pub fn path(&self, id: QueueId) -> impl Iterator<Item = QueueId> + '_ {
        std::iter::successors(Some(id), |q| self.parent(*q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, parent: Option<&str>, gpu: u64) -> QueueSpec {
        QueueSpec {
            parent: parent.map(str::to_string),
            ..QueueSpec::new(name, Resources::new(gpu, 0, 0))
        }
    }

    #[test]
    fn parents_come_before_children_and_paths_climb() {
        let t = QueueTree::new(vec![
            q("team-a", Some("research"), 2_000),
            q("research", None, 5_000),
            q("prod", None, 3_000),
        ])
        .unwrap();
        let a = t.id("team-a").unwrap();
        let r = t.id("research").unwrap();
        assert!(r < a, "parent first");
        assert_eq!(t.path(a).collect::<Vec<_>>(), vec![a, r]);
        assert_eq!(t.top().len(), 2);
        assert!(t.is_leaf(a) && !t.is_leaf(r));
    }

    #[test]
    fn bad_trees_are_refused_by_name() {
        let e = QueueTree::new(vec![q("a", Some("b"), 0), q("b", Some("a"), 0)]).unwrap_err();
        assert!(matches!(e, TreeError::Cycle(_)), "{e}");
        let e = QueueTree::new(vec![q("a", Some("zz"), 0)]).unwrap_err();
        assert!(e.to_string().contains("zz"), "{e}");
        let e = QueueTree::new(vec![q("a", None, 0), q("a", None, 0)]).unwrap_err();
        assert_eq!(e, TreeError::Duplicate("a".into()));
        let e = QueueTree::new(vec![q("p", None, 1_000), q("c", Some("p"), 2_000)]).unwrap_err();
        assert_eq!(e, TreeError::ChildrenOverGuarantee("p".into()));
        let mut z = q("z", None, 0);
        z.weight = 0;
        assert!(QueueTree::new(vec![z]).is_err());
        let mut l = q("l", None, 2_000);
        l.limit = Some(Resources::new(1_000, 0, 0));
        assert_eq!(
            QueueTree::new(vec![l]).unwrap_err(),
            TreeError::GuaranteeAboveLimit("l".into())
        );
    }
}
