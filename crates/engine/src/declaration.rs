//! Permits across clusters, the data (docs/design.md: permits every cluster agrees on): what
//! each cluster's `ClusterLock` declares, as node names in `<shared>/permits/<lock>`, and the
//! limit they add up to. Pure; [`super::permits`] keeps them in ZooKeeper.
//!
//! Every cluster decides grants in the one shared queue by itself, so each must grant with the
//! same limit: the one every declaration allows, the smallest (see
//! [`crate::recipe::Limit::meet`]). A declaration is an ephemeral node of the declaring leader's
//! session, named `<cluster>.<limit>.<session>`: one listing of the directory tells every
//! declaration (no read per node), a changed limit is a new name (one children watch sees it),
//! and a cluster whose operators are gone declares nothing (its nodes in the queue went with
//! the same session).

use std::sync::Arc;

use tokio::sync::Notify;

use crate::recipe::Limit;

/// What one listing of a lock's declarations says: this cluster's own nodes (their names), and
/// the other clusters' declarations. A node whose name cannot be read (by hand, or by another
/// version) counts as declaring the front of the queue only, under its own name: ignored, it
/// could be a smaller limit that every cluster must keep to.
pub(super) fn read_listing<'a>(children: &'a [String], cluster: &str) -> (Vec<&'a str>, Vec<Declaration>) {
    let mut ours = vec![];
    let mut others = vec![];
    for name in children {
        match parse(name) {
            Some((theirs, _, _)) if theirs == cluster => ours.push(name.as_str()),
            Some((theirs, limit, _)) => others.push(Declaration { cluster: theirs.to_string(), limit }),
            None => others.push(Declaration { cluster: name.clone(), limit: Limit::FRONT_ONLY }),
        }
    }
    others.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    (ours, others)
}

/// One cluster's declaration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declaration {
    pub cluster: String,
    pub limit: Limit,
}

/// A declaration node's name.
pub(super) fn node_name(cluster: &str, limit: Limit, session_id: i64) -> String {
    // The session's bits, unsigned: a name never starts a second '-'-separated number.
    format!("{cluster}.{limit}.{:016x}", session_id as u64)
}

/// What a declaration node's name says: cluster, limit, session. `None` for a name not made by
/// [`node_name`] (nobody else writes here; such a node is ignored, not obeyed).
pub(super) fn parse(name: &str) -> Option<(&str, Limit, i64)> {
    let mut parts = name.split('.');
    let (cluster, limit, session) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || cluster.is_empty() || session.len() != 16 {
        return None;
    }
    let session = u64::from_str_radix(session, 16).ok()? as i64;
    Some((cluster, limit.parse().ok()?, session))
}

/// A shared `ClusterLock` this engine follows: its own declaration and the others'.
pub(super) struct Declared {
    /// What this cluster's `ClusterLock` says; `None` while this cluster has none.
    pub own: Option<Limit>,
    /// The other clusters' declarations, as last read after our own was in place; `None` until
    /// then.
    pub others: Option<Vec<Declaration>>,
    /// Tells the follower that `own` changed.
    pub wake: Arc<Notify>,
}

impl Declared {
    pub fn new(own: Option<Limit>) -> Self {
        Declared { own, others: None, wake: Arc::new(Notify::new()) }
    }

    /// The limit to decide with: where every declaration meets; the front only while the other
    /// clusters' are not known (a smaller one may stand); a mutex when nobody declares any.
    pub fn limit(&self) -> Limit {
        let Some(others) = &self.others else { return Limit::FRONT_ONLY };
        self.own.into_iter().chain(others.iter().map(|d| d.limit)).reduce(Limit::meet).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_cluster_limit_and_session() {
        let three = Limit::from_permits(Some(3));
        let name = node_name("eu-1", three, -2);
        assert_eq!(name, "eu-1.3.fffffffffffffffe");
        assert_eq!(parse(&name), Some(("eu-1", three, -2)));
        assert_eq!(parse(&node_name("us-2", Limit::Mutex, 0x1234)), Some(("us-2", Limit::Mutex, 0x1234)));
        for odd in ["eu-1.3", "eu-1.0.0000000000001234", "eu-1.3.12", ".3.0000000000001234", "a.b.c.d", "x.3.zz"] {
            assert_eq!(parse(odd), None, "{odd}");
        }
    }

    #[test]
    fn a_declaration_that_cannot_be_read_counts_as_the_front_only() {
        let three = Limit::Permits(3.try_into().unwrap());
        let children =
            [node_name("eu-1", three, 1), node_name("us-2", three, 2), "us-3.lots.00000000000000ff".to_string()];
        let (ours, others) = read_listing(&children, "eu-1");
        assert_eq!(ours, [children[0].as_str()]);
        let mut declared = Declared::new(Some(three));
        declared.others = Some(others);
        assert_eq!(declared.limit(), Limit::FRONT_ONLY, "an unreadable declaration may be the smallest");
        let (_, others) = read_listing(&children[..2], "eu-1");
        declared.others = Some(others);
        assert_eq!(declared.limit(), three);
    }

    #[test]
    fn the_limit_is_where_every_declaration_meets() {
        let permits = |n| Limit::from_permits(Some(n));
        let declared = |own, others: Option<Vec<Limit>>| Declared {
            own,
            others: others.map(|o| o.into_iter().map(|limit| Declaration { cluster: "x".into(), limit }).collect()),
            wake: Arc::default(),
        };
        assert_eq!(declared(Some(permits(3)), None).limit(), Limit::FRONT_ONLY, "the others not read yet");
        assert_eq!(declared(Some(permits(3)), Some(vec![])).limit(), permits(3));
        assert_eq!(declared(Some(permits(3)), Some(vec![permits(2), permits(5)])).limit(), permits(2));
        assert_eq!(declared(None, Some(vec![permits(4)])).limit(), permits(4), "no ClusterLock here: theirs");
        assert_eq!(declared(None, Some(vec![])).limit(), Limit::Mutex);
        assert_eq!(declared(Some(Limit::Mutex), Some(vec![Limit::Mutex])).limit(), Limit::Mutex);
        assert_eq!(declared(Some(Limit::Mutex), Some(vec![permits(4)])).limit(), Limit::FRONT_ONLY);
    }
}
