//! What zklock writes into a contender's znode, and how a revocation request written there (by
//! us or by another ZooKeeper client) is recognised; and what it writes into a lock directory.

use serde::{Deserialize, Serialize};

use crate::recipe::Mode;

/// Raw request some clients write to ask a holder to let go (the ZooKeeper recipe's wording).
const RAW_UNLOCK: &[u8] = b"unlock";
/// What Apache Curator's `Revoker.attemptRevoke` writes into the holder's node.
const CURATOR_REVOKE: &[u8] = b"__REVOKE__";

/// The JSON in every contender node zklock creates. Readable by anybody who lists the queue
/// (`zkCli get`), so it says who the contender is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeData {
    /// Always "zklock": tells our nodes' data from anybody else's.
    pub owner: String,
    pub id: String,
    pub mode: Mode,
    /// Free text naming the contender, e.g. the claim `namespace/name`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoke: Option<RevokeRequest>,
    /// The contender's ticket (the zxid of its first enqueue) on a node re-created after a new
    /// session; a first node's ticket is its own czxid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<i64>,
    /// The id of the root whose zklock made the node (see [`super::root::id`]): the same for
    /// every installation that serves that root in turn (replicas, terms, a rollout), another
    /// for the operators of another root (another cluster sharing the lock). Absent in nodes of
    /// earlier releases and of engines that serve no root. Nodes of another root look exactly
    /// like ours by name: this is what tells them apart, so that re-anchoring deletes only its
    /// own root's nodes of earlier sessions (see [`NodeData::owned_by`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
}

pub const OWNER: &str = "zklock";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevokeRequest {
    pub reason: String,
}

impl NodeData {
    pub fn new(id: &str, mode: Mode, description: &str) -> Self {
        NodeData {
            owner: OWNER.into(),
            id: id.into(),
            mode,
            description: description.into(),
            revoke: None,
            ticket: None,
            root: None,
        }
    }

    pub fn with_root(mut self, root: Option<String>) -> Self {
        self.root = root;
        self
    }

    /// Whether a node with this data may be taken for one of root `mine`'s own (to be
    /// re-created or deleted): one that names no root was made by an earlier release or an
    /// engine without a root; one that names another root is not ours, whatever its name says.
    pub fn owned_by(data: &[u8], mine: Option<&str>) -> bool {
        match serde_json::from_slice::<NodeData>(data.trim_ascii()) {
            Ok(node) => node.root.is_none() || node.root.as_deref() == mine,
            // Not our JSON: a stranger's data under one of our names; not ours to delete.
            Err(_) => data.trim_ascii().is_empty(),
        }
    }

    pub fn with_ticket(mut self, ticket: Option<i64>) -> Self {
        self.ticket = ticket;
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // Serialising a struct of strings and a unit enum cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The revocation request carried by a node's data, if any: our JSON `revoke` field, the raw
/// `unlock` of the ZooKeeper recipe, or Curator's `__REVOKE__`.
pub fn revoke_request(data: &[u8]) -> Option<String> {
    let trimmed = data.trim_ascii();
    if trimmed == RAW_UNLOCK {
        return Some("unlock requested by another ZooKeeper client".into());
    }
    if trimmed == CURATOR_REVOKE {
        return Some("revocation requested by an Apache Curator client".into());
    }
    let parsed: NodeData = serde_json::from_slice(trimmed).ok()?;
    parsed.revoke.map(|r| r.reason)
}

/// The data to write into a node to ask its holder to let go. Our own nodes keep their
/// description and gain a `revoke` field; other nodes get Curator's marker, which Curator
/// holders understand and which we recognise too.
pub fn with_revoke_request(current: &[u8], reason: &str) -> Vec<u8> {
    match serde_json::from_slice::<NodeData>(current) {
        Ok(mut ours) if ours.owner == OWNER => {
            ours.revoke = Some(RevokeRequest { reason: reason.into() });
            ours.to_bytes()
        }
        _ => CURATOR_REVOKE.to_vec(),
    }
}

/// The lock directory's own data: `0` in a directory only zklock has used, `-1` once a foreign
/// node was seen there.
///
/// A number, because kazoo's `Semaphore` reads the data of its directory as its count of leases
/// and refuses to acquire when it differs from its own ("Inconsistent max leases: 0, expected:
/// 3"), and no lease count can be 0 or -1 and still grant anything. kazoo's semaphore counts
/// children, then creates its lease: a check and a write that nothing of ours can make atomic,
/// so it cannot share a queue with the claims soundly; a directory zklock made refuses it.
/// (Earlier releases wrote `{"foreignSeen":…}`, still read.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirMarker {
    pub foreign_seen: bool,
}

/// The data a lock directory is made with: only zklock has used it.
pub const CLEAN_DIRECTORY: &[u8] = b"0";
const FOREIGN_DIRECTORY: &[u8] = b"-1";

/// The earlier releases' marker.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonMarker {
    #[serde(default)]
    foreign_seen: bool,
}

impl DirMarker {
    /// Empty data is a directory made by an earlier release (or by mkdir of a parent) that no
    /// stranger touched; data that is not a marker was written by somebody else, which counts as
    /// foreign use.
    pub fn parse(data: &[u8]) -> DirMarker {
        let foreign_seen = match data.trim_ascii() {
            b"" | CLEAN_DIRECTORY => false,
            FOREIGN_DIRECTORY => true,
            other => serde_json::from_slice::<JsonMarker>(other).map_or(true, |m| m.foreign_seen),
        };
        DirMarker { foreign_seen }
    }

    pub fn to_bytes(self) -> &'static [u8] {
        if self.foreign_seen {
            FOREIGN_DIRECTORY
        } else {
            CLEAN_DIRECTORY
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_a_roots_own_only_if_its_data_does_not_name_another() {
        let ours = NodeData::new("uid-1", Mode::Exclusive, "").with_root(Some("a".into())).to_bytes();
        let theirs = NodeData::new("uid-2", Mode::Exclusive, "").with_root(Some("b".into())).to_bytes();
        let earlier_release = NodeData::new("uid-3", Mode::Exclusive, "").to_bytes();
        assert!(NodeData::owned_by(&ours, Some("a")));
        assert!(!NodeData::owned_by(&theirs, Some("a")));
        assert!(!NodeData::owned_by(&theirs, None), "an engine without a root deletes no other root's node");
        assert!(NodeData::owned_by(&earlier_release, Some("a")), "earlier releases' nodes");
        assert!(NodeData::owned_by(b"", Some("a")), "empty data: an earlier release's");
        assert!(!NodeData::owned_by(b"10.0.0.7", Some("a")), "a stranger's data under one of our names");
    }

    #[test]
    fn revoke_requests_round_trip_and_foreign_markers_are_recognised() {
        let data = NodeData::new("uid-1", Mode::Shared, "shop/a").to_bytes();
        assert_eq!(revoke_request(&data), None);
        let asked = with_revoke_request(&data, "maintenance");
        assert_eq!(revoke_request(&asked).as_deref(), Some("maintenance"));
        let back: NodeData = serde_json::from_slice(&asked).unwrap();
        assert_eq!((back.id.as_str(), back.description.as_str()), ("uid-1", "shop/a"));

        assert!(revoke_request(b"unlock\n").is_some());
        assert!(revoke_request(b"__REVOKE__").is_some());
        assert_eq!(revoke_request(b"10.0.0.7"), None, "Curator's default data is an address");
        assert_eq!(with_revoke_request(b"10.0.0.7", "x"), b"__REVOKE__".to_vec());
    }

    #[test]
    fn marker_reads_empty_as_ours_and_strangers_data_as_foreign() {
        assert!(!DirMarker::parse(b"").foreign_seen);
        assert!(!DirMarker::parse(b"0").foreign_seen);
        assert!(DirMarker::parse(b"-1").foreign_seen);
        assert!(!DirMarker::parse(br#"{"foreignSeen":false}"#).foreign_seen, "an earlier release's marker");
        assert!(DirMarker::parse(br#"{"foreignSeen":true}"#).foreign_seen);
        assert!(DirMarker::parse(b"10.0.0.7").foreign_seen);
        assert!(DirMarker::parse(b"3").foreign_seen, "a lease count written by a semaphore client");
        for marker in [DirMarker { foreign_seen: false }, DirMarker { foreign_seen: true }] {
            assert_eq!(DirMarker::parse(marker.to_bytes()), marker);
        }
    }
}
