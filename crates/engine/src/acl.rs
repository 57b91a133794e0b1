//! Who may change zklock's nodes: with credentials, nodes that other clients made open (or an
//! earlier zklock made without credentials) are closed to the world's writes. Below everything
//! that writes nodes: it needs the session's client and the configuration only.

use zookeeper_client as zk;

use super::retry;

/// With credentials, makes sure that nobody but our identity can write `path`'s data or change
/// its ACL (a directory made by another client, or by an earlier zklock without credentials,
/// may be open to all): `acls` replace an ACL that lets the world write or administer it.
pub(super) async fn protect(client: &zk::Client, config: &super::ZkConfig, path: &str, acls: zk::Acls<'_>) {
    if config.digest_auth.is_none() {
        return;
    }
    let Ok((current, stat)) = retry::idempotent(|| client.get_acl(path)).await else { return };
    let open = current.iter().any(|acl| {
        acl.scheme() == "world"
            && (acl.permission().has(zk::Permission::WRITE) || acl.permission().has(zk::Permission::ADMIN))
    });
    if !open {
        return;
    }
    match retry::idempotent(|| client.set_acl(path, &acls, Some(stat.aversion))).await {
        Ok(_) => tracing::info!(path, "protected against writes by other ZooKeeper clients"),
        // Changed meanwhile (by whoever: it is looked at again next time), or not ours to change.
        Err(e) => tracing::warn!(path, error = %e, "could not protect the node against other clients' writes"),
    }
}
