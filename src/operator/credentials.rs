//! ZooKeeper credentials the operator makes once (`--zk-auth-secret`, the chart's
//! `zookeeper.auth.generate`): a Secret beside the Lease holding the operator's digest
//! credentials (key `operator`) and those of listed contenders (key `contender`).
//!
//! Why the operator and not the chart: a chart that renders random credentials gives new ones at
//! every render where `lookup` answers nothing (`helm template`, Argo CD, Flux's post-renderers),
//! and new credentials lock the operator out of every node the earlier ones made. Made here, a
//! render holds no secret at all, so two renders are the same bytes. The Secret is created, never
//! replaced: of two replicas starting at once one creates it and the other reads it (409), and a
//! Secret that lacks a key or holds something else stops the operator with what to fix, since
//! writing new credentials over old ones is exactly the lockout this avoids.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::Api;

/// The Secret's keys.
pub const OPERATOR_KEY: &str = "operator";
pub const CONTENDER_KEY: &str = "contender";

/// How long each API call may take before the start fails (and the pod is restarted).
const DEADLINE: Duration = Duration::from_secs(10);

/// Digest credentials `USER:PASS` (without the `digest:` scheme) for the operator and for the
/// clients listed as contenders.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub operator: String,
    pub contender: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials { .. }")
    }
}

impl Credentials {
    /// New credentials from the operating system's random source: 256 bits per password.
    pub fn generate() -> Result<Self, String> {
        let password = || -> Result<String, String> {
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes).map_err(|e| format!("no random bytes for new credentials: {e}"))?;
            Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
        };
        Ok(Self { operator: format!("zklock:{}", password()?), contender: format!("contender:{}", password()?) })
    }

    /// The Secret's data, as `digest:USER:PASS` per key (what `--zk-auth-file` and Curator's
    /// `CURATOR_AUTH` read).
    pub fn data(&self) -> BTreeMap<String, ByteString> {
        [(OPERATOR_KEY, &self.operator), (CONTENDER_KEY, &self.contender)]
            .into_iter()
            .map(|(key, value)| (key.to_string(), ByteString(format!("digest:{value}").into_bytes())))
            .collect()
    }

    /// What a Secret holds; an error names the key to fix.
    pub fn from_secret(secret: &Secret, what: &str) -> Result<Self, String> {
        let data = secret.data.clone().unwrap_or_default();
        let key = |key: &str| -> Result<String, String> {
            let value = data.get(key).ok_or_else(|| {
                format!(
                    "{what} has no key {key:?}; the operator never writes over a Secret it did not make whole \
                     (new credentials would lock it out of every node the old ones made): add the key \
                     (digest:USER:PASS), or delete the Secret if no ZooKeeper node was made with it"
                )
            })?;
            let text = std::str::from_utf8(&value.0).map_err(|_| format!("{what}: key {key:?} is not UTF-8"))?;
            super::args::parse_digest(text).map_err(|e| format!("{what}: key {key:?}: {e}"))
        };
        Ok(Self { operator: key(OPERATOR_KEY)?, contender: key(CONTENDER_KEY)? })
    }
}

/// The credentials in Secret `name` of `namespace`, made (once, at random) when it is missing.
pub async fn get_or_make(client: &kube::Client, namespace: &str, name: &str) -> Result<Credentials, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("Secret {namespace}/{name}");
    if let Some(secret) = within(&format!("reading {what}"), api.get_opt(name)).await? {
        return Credentials::from_secret(&secret, &what);
    }
    let made = Credentials::generate()?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { "app.kubernetes.io/managed-by": "zklock", "app.kubernetes.io/component": "zookeeper-credentials" },
            "annotations": {
                "zklock.io/note": "made once by the zklock operator; kept across upgrades and uninstalls \
                                   (new credentials would lock it out of its ZooKeeper nodes)"
            },
        },
        "type": "Opaque",
    }))
    .map_err(|e| format!("{what}: {e}"))?;
    let secret = Secret { data: Some(made.data()), ..secret };
    match tokio::time::timeout(DEADLINE, api.create(&PostParams::default(), &secret)).await {
        // Another replica made it first: theirs are the credentials.
        Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
            let secret = within(&format!("reading {what}"), api.get(name)).await?;
            Credentials::from_secret(&secret, &what)
        }
        answer => {
            described(&format!("creating {what}"), answer)?;
            tracing::info!(secret = %what, "made the ZooKeeper credentials");
            Ok(made)
        }
    }
}

async fn within<T>(what: &str, call: impl std::future::Future<Output = kube::Result<T>>) -> Result<T, String> {
    described(what, tokio::time::timeout(DEADLINE, call).await)
}

fn described<T>(what: &str, answer: Result<kube::Result<T>, tokio::time::error::Elapsed>) -> Result<T, String> {
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(kube::Error::Api(status))) => {
            Err(format!("{what}: {} ({}){}", status.message, status.code, rbac_hint(status.code)))
        }
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {DEADLINE:?}")),
    }
}

fn rbac_hint(code: u16) -> &'static str {
    if code == 403 {
        "; the operator needs get and create on this Secret (the chart's Role <release>-zookeeper-credentials grants \
         them with zookeeper.auth.generate)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_credentials_read_back_from_their_secret() {
        let made = Credentials::generate().unwrap();
        assert!(made.operator.starts_with("zklock:") && made.operator.len() == "zklock:".len() + 64);
        assert_ne!(made, Credentials::generate().unwrap(), "two draws gave the same credentials");
        let secret = Secret { data: Some(made.data()), ..Default::default() };
        assert_eq!(Credentials::from_secret(&secret, "s").unwrap(), made);
        assert!(!format!("{made:?}").contains(&made.operator), "Debug must not print a password");
    }

    #[test]
    fn a_secret_without_a_key_is_refused_with_what_to_fix() {
        let mut data = Credentials::generate().unwrap().data();
        data.remove(CONTENDER_KEY);
        let secret = Secret { data: Some(data), ..Default::default() };
        let e = Credentials::from_secret(&secret, "Secret ns/s").unwrap_err();
        assert!(e.contains("no key \"contender\"") && e.contains("add the key"), "{e}");
        let mut data = Credentials::generate().unwrap().data();
        data.insert(OPERATOR_KEY.into(), ByteString(b"plain".to_vec()));
        let e = Credentials::from_secret(&Secret { data: Some(data), ..Default::default() }, "s").unwrap_err();
        assert!(e.contains("expected digest:USER:PASS"), "{e}");
    }
}
