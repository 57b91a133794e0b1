//! Who may change zklock's nodes: with credentials, nodes that other clients made open (or an
//! earlier zklock made without credentials, or with contenders since removed) are closed to
//! what they should not do. Below everything that writes nodes: it needs the session's client
//! and the configuration only.

use std::time::Duration;

use zookeeper_client as zk;

use super::config::Contenders;
use super::retry;

/// With credentials, makes sure that nobody is granted on `path` more than `wanted` grants them,
/// and that those `wanted` names are granted what it gives them: `wanted` replaces an ACL that
/// lets the world (or, with listed contenders, an identity not listed; or an identity of
/// zklock's own that was rotated out) do more, or that misses one of ours (a new credential,
/// a contender listed since). A directory made by another client, or by an earlier zklock
/// without credentials, may be open to all.
pub(super) async fn protect(client: &zk::Client, config: &super::ZkConfig, path: &str, wanted: &[zk::Acl]) {
    if config.digest_auth.is_none() {
        return;
    }
    let Ok((current, stat)) = retry::idempotent(|| client.get_acl(path)).await else { return };
    protect_read(client, config, path, wanted, &current, &stat).await;
}

/// [`protect`] with the ACL and stat already read. Answers false where the ACL still wants a
/// change that may succeed later (changed meanwhile, the connection lost): a walk that met one
/// is not whole. A node whose ACL is not ours to change (NoAuth: nothing zklock made, or made
/// under an identity it no longer has) is left to its owner, as before.
async fn protect_read(
    client: &zk::Client,
    config: &super::ZkConfig,
    path: &str,
    wanted: &[zk::Acl],
    current: &[zk::Acl],
    stat: &zk::Stat,
) -> bool {
    if !needs_change(current, wanted, config) {
        return true;
    }
    match retry::idempotent(|| client.set_acl(path, &zk::Acls::new(wanted), Some(stat.aversion))).await {
        Ok(_) => {
            tracing::info!(path, "protected against other ZooKeeper clients");
            true
        }
        Err(e @ (zk::Error::NoAuth | zk::Error::NoNode)) => {
            tracing::warn!(path, error = %e, "could not protect the node against other clients");
            true
        }
        // Changed meanwhile (looked at again by the next walk), or the session's end.
        Err(e) => {
            tracing::warn!(path, error = %e, "could not protect the node against other clients");
            false
        }
    }
}

/// Whether `acls` let this engine write (data, children, ACL) where they stand: our identity, or
/// the world, has every permission. Where clusters sharing a root use other credentials, the
/// first one's ACLs shut the others out of every directory it made.
pub(super) fn lets_us_write(acls: &[zk::Acl], config: &super::ZkConfig) -> bool {
    let ours: Vec<String> =
        config.digest_auth.iter().chain(&config.previous_auth).map(|a| super::digest_id(a)).collect();
    acls.iter().any(|a| {
        a.permission() == zk::Permission::ALL
            && ((a.scheme() == "world" && a.id() == "anyone")
                || (a.scheme() == "digest" && ours.iter().any(|o| o == a.id())))
    })
}

/// Whether `current` must be replaced by `wanted` (see [`protect`]).
fn needs_change(current: &[zk::Acl], wanted: &[zk::Acl], config: &super::ZkConfig) -> bool {
    let listed = matches!(config.contenders, Contenders::Listed(_));
    grants_more(current, wanted, listed) || misses(current, wanted) || rotated_out(current, wanted)
}

/// Whether an identity or the world `wanted` names is granted less by `current`.
fn misses(current: &[zk::Acl], wanted: &[zk::Acl]) -> bool {
    wanted.iter().any(|w| {
        let granted = current
            .iter()
            .filter(|c| c.scheme() == w.scheme() && c.id() == w.id())
            .fold(zk::Permission::NONE, |all, c| all | c.permission());
        !granted.has(w.permission())
    })
}

/// Whether `current` lets a digest identity that `wanted` does not name change the ACL: only
/// zklock's own identity holds ADMIN on its nodes (contenders create and delete at most), so
/// such an identity is one of zklock's that was rotated out.
fn rotated_out(current: &[zk::Acl], wanted: &[zk::Acl]) -> bool {
    current.iter().any(|c| {
        c.scheme() == "digest"
            && c.permission().has(zk::Permission::ADMIN)
            && !wanted.iter().any(|w| w.scheme() == "digest" && w.id() == c.id())
    })
}

/// How many nodes the takeover walk reads and changes at once: a root holds a directory per
/// lock, and one at a time (two round trips each) a walk over 100,000 of them kept a term from
/// starting for minutes.
const WALK_CONCURRENCY: usize = 32;

/// How long a term's start waits for the takeover walk. A walk cut short is not wrong, only
/// unfinished: what it did not reach keeps its earlier ACL (a write there under a rotated-out
/// identity fails, and says so), and the root's ACL, set only after a whole walk, makes the next
/// term walk again.
const WALK_DEADLINE: Duration = Duration::from_secs(60);

/// After a change of credentials (a new identity, a previous one added or dropped, contenders
/// listed or no longer): every persistent node of the root (and of the shared root) is given
/// the ACL its kind wants, so that nothing made under a rotated identity locks the operator
/// out, or lets the rotated identity in. The root's own ACL tells whether anything changed since
/// the last walk: it is set last, and only after a walk that reached every node, so that a walk
/// cut short (by its deadline, an error, a crash) is done again by the next term.
pub(super) async fn take_over(client: &zk::Client, config: &super::ZkConfig, layout: &super::Layout) {
    if config.digest_auth.is_none() {
        return;
    }
    for root in std::iter::once(layout.root()).chain(layout.shared_root()) {
        let Ok((current, stat)) = retry::idempotent(|| client.get_acl(root)).await else { continue };
        let wanted = config.parent_acls();
        if !needs_change(&current, &wanted, config) {
            continue;
        }
        tracing::info!(root, "the ZooKeeper credentials changed: taking every node of the root over");
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(WALK_DEADLINE, walk_below(client, config, layout, root)).await {
            Ok(Walked { nodes, whole: true }) => {
                protect_read(client, config, root, &wanted, &current, &stat).await;
                tracing::info!(
                    root,
                    nodes,
                    seconds = started.elapsed().as_secs_f64(),
                    "took every node of the root over"
                );
            }
            Ok(Walked { nodes, whole: false }) => {
                tracing::warn!(
                    root,
                    nodes,
                    "some nodes of the root could not be taken over; the next term tries again"
                );
            }
            Err(_) => tracing::warn!(
                root,
                deadline = ?WALK_DEADLINE,
                "taking the root's nodes over did not end in time; this term starts, and the next one walks again"
            ),
        }
    }
}

/// What a walk did: how many nodes it looked at, and whether it reached every one.
struct Walked {
    nodes: usize,
    whole: bool,
}

/// What each node below a root is, for its ACL.
fn wanted_for(config: &super::ZkConfig, layout: &super::Layout, path: &str) -> (Vec<zk::Acl>, bool) {
    let under = |parent: &str, depth: usize| {
        path.strip_prefix(parent)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|rest| rest.split('/').count() == depth)
    };
    let directory = under(&layout.locks(), 2) || under(&layout.cluster_locks(), 1);
    let leaf = [layout.id(), layout.epoch(), layout.token_base()].iter().any(|p| p == path);
    match (directory, leaf) {
        (true, _) => (config.directory_acls(), false),
        (_, true) => (config.node_acls(), false),
        // Parents: the root's subdirectories, each namespace's, the permits'.
        _ => (config.parent_acls(), true),
    }
}

/// Every persistent node below `root`, level by level, [`WALK_CONCURRENCY`] at a time: parents
/// listed, then each child's ACL read and, where its kind wants another, replaced.
async fn walk_below(client: &zk::Client, config: &super::ZkConfig, layout: &super::Layout, root: &str) -> Walked {
    use futures::stream::{self, StreamExt};
    let mut walked = Walked { nodes: 0, whole: true };
    let mut parents = vec![root.to_string()];
    while !parents.is_empty() {
        let listed: Vec<Option<Vec<String>>> = stream::iter(&parents)
            .map(|parent| async move {
                let children = match retry::idempotent(|| client.list_children(parent)).await {
                    Ok(children) => children,
                    // Gone meanwhile (an empty lock directory reaped): nothing below it.
                    Err(zk::Error::NoNode) => vec![],
                    Err(_) => return None,
                };
                Some(children.into_iter().map(|child| format!("{parent}/{child}")).collect::<Vec<_>>())
            })
            .buffer_unordered(WALK_CONCURRENCY)
            .collect()
            .await;
        walked.whole &= listed.iter().all(Option::is_some);
        let children: Vec<String> = listed.into_iter().flatten().flatten().collect();
        walked.nodes += children.len();
        let taken: Vec<Result<Option<String>, ()>> = stream::iter(children)
            .map(|path| async move {
                let (current, stat) = match retry::idempotent(|| client.get_acl(&path)).await {
                    Ok(read) => read,
                    // Gone meanwhile (a lock's directory reaped): nothing to take over.
                    Err(zk::Error::NoNode) => return Ok(None),
                    Err(_) => return Err(()),
                };
                // Ephemeral nodes go with their session, and a new term makes its own anew.
                if stat.ephemeral_owner != 0 {
                    return Ok(None);
                }
                let (wanted, parent) = wanted_for(config, layout, &path);
                if !protect_read(client, config, &path, &wanted, &current, &stat).await {
                    return Err(());
                }
                Ok(parent.then_some(path))
            })
            .buffer_unordered(WALK_CONCURRENCY)
            .collect()
            .await;
        walked.whole &= taken.iter().all(Result::is_ok);
        parents = taken.into_iter().filter_map(|t| t.ok().flatten()).collect();
    }
    walked
}

/// Whether `current` grants the world (and, when contenders are `listed`, any digest identity)
/// a permission `wanted` does not grant it. Other schemes (a foreign client's own `ip` or `x509`
/// entries) are left to their owners.
fn grants_more(current: &[zk::Acl], wanted: &[zk::Acl], listed: bool) -> bool {
    let granted = |scheme: &str, id: &str| {
        wanted
            .iter()
            .filter(|w| w.scheme() == scheme && w.id() == id)
            .fold(zk::Permission::NONE, |all, w| all | w.permission())
    };
    current.iter().any(|acl| {
        let judged = acl.scheme() == "world" || (listed && acl.scheme() == "digest");
        judged && !granted(acl.scheme(), acl.id()).has(acl.permission())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(permission: zk::Permission, scheme: &str, id: &str) -> zk::Acl {
        zk::Acl::new(permission, zk::AuthId::new(scheme, id))
    }

    #[test]
    fn more_than_wanted_is_what_the_world_or_an_unlisted_identity_may_do_beyond_it() {
        use zk::Permission as P;
        let wanted = [acl(P::ALL, "digest", "zklock:h"), acl(P::READ | P::CREATE | P::DELETE, "world", "anyone")];
        assert!(!grants_more(&wanted, &wanted, false), "the wanted ACL itself");
        assert!(grants_more(&[acl(P::ALL, "world", "anyone")], &wanted, false), "open to all (Curator's default)");
        assert!(!grants_more(&[acl(P::READ, "world", "anyone")], &wanted, false), "less is left alone");
        let other = [acl(P::ALL, "digest", "other:h"), acl(P::READ, "world", "anyone")];
        assert!(!grants_more(&other, &wanted, false), "open contenders: other identities are their owners'");

        let closed = [
            acl(P::ALL, "digest", "zklock:h"),
            acl(P::READ | P::CREATE | P::DELETE, "digest", "peer:h"),
            acl(P::READ, "world", "anyone"),
        ];
        assert!(!grants_more(&closed, &closed, true));
        assert!(grants_more(&wanted, &closed, true), "the world may contend where only peers should");
        assert!(grants_more(&other, &closed, true), "an identity no longer listed (a rotated credential)");
        assert!(!grants_more(&[acl(P::ALL, "x509", "CN=a")], &closed, true), "other schemes are not judged");
    }

    #[test]
    fn an_acl_missing_one_of_ours_or_letting_a_rotated_identity_administer_is_changed() {
        use zk::Permission as P;
        let contend = P::READ | P::CREATE | P::DELETE;
        let old = acl(P::ALL, "digest", "zklock:old");
        let wanted = [acl(P::ALL, "digest", "zklock:new"), old.clone(), acl(contend, "world", "anyone")];
        let made_before = [old.clone(), acl(contend, "world", "anyone")];
        assert!(misses(&made_before, &wanted), "the new identity is not named yet");
        assert!(!misses(&wanted, &wanted));
        let after = [acl(P::ALL, "digest", "zklock:new"), acl(contend, "world", "anyone")];
        assert!(rotated_out(&wanted, &after), "the old identity may still change the ACL");
        assert!(!rotated_out(&[acl(contend, "digest", "curator:c")], &after), "a contender administers nothing");
        assert!(!rotated_out(&after, &after));
    }
}
