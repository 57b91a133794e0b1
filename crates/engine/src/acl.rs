//! Who may change zklock's nodes: with credentials, nodes that other clients made open (or an
//! earlier zklock made without credentials, or with contenders since removed) are closed to
//! what they should not do. Below everything that writes nodes: it needs the session's client
//! and the configuration only.

use zookeeper_client as zk;

use super::config::Contenders;
use super::retry;

/// With credentials, makes sure that nobody is granted on `path` more than `wanted` grants them:
/// `wanted` replaces an ACL that lets the world (or, with listed contenders, an identity not
/// listed) do more. A directory made by another client, or by an earlier zklock without
/// credentials, may be open to all.
pub(super) async fn protect(client: &zk::Client, config: &super::ZkConfig, path: &str, wanted: &[zk::Acl]) {
    if config.digest_auth.is_none() {
        return;
    }
    let Ok((current, stat)) = retry::idempotent(|| client.get_acl(path)).await else { return };
    let listed = matches!(config.contenders, Contenders::Listed(_));
    if !grants_more(&current, wanted, listed) {
        return;
    }
    match retry::idempotent(|| client.set_acl(path, &zk::Acls::new(wanted), Some(stat.aversion))).await {
        Ok(_) => tracing::info!(path, "protected against other ZooKeeper clients"),
        // Changed meanwhile (by whoever: it is looked at again next time), or not ours to change.
        Err(e) => tracing::warn!(path, error = %e, "could not protect the node against other clients"),
    }
}

/// Whether `acls` let this engine write (data, children, ACL) where they stand: our identity, or
/// the world, has every permission. Where clusters sharing a root use other credentials, the
/// first one's ACLs shut the others out of every directory it made.
pub(super) fn lets_us_write(acls: &[zk::Acl], config: &super::ZkConfig) -> bool {
    let ours = config.digest_auth.as_deref().map(super::digest_id);
    acls.iter().any(|a| {
        a.permission() == zk::Permission::ALL
            && ((a.scheme() == "world" && a.id() == "anyone")
                || (a.scheme() == "digest" && ours.as_deref() == Some(a.id())))
    })
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
}
