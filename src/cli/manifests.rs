//! `zklock crd`, `zklock admin epoch-policy`, `fencing-policy`, `finalizer-policy` and `gate-policy`: the manifests the chart
//! installs, for installs without it.

/// The CRDs as YAML on stdout, or one file each in `dir`.
pub fn crd(dir: Option<std::path::PathBuf>) -> Result<u8, String> {
    match dir {
        None => print!("{}", zklock::api::crd_yaml()),
        Some(dir) => {
            for (file, yaml) in zklock::api::crds() {
                let path = dir.join(file);
                std::fs::write(&path, yaml).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
        }
    }
    Ok(0)
}

/// The leader epoch's admission policy and its binding.
pub fn epoch_policy(param_namespace: &str, namespaces: &[String], name: &str) -> Result<u8, String> {
    use zklock::api::epoch_policy::{epoch_policy, epoch_policy_binding};
    let policy = serde_yaml::to_string(&epoch_policy(name)).map_err(|e| e.to_string())?;
    let binding = epoch_policy_binding(name, name, name, param_namespace, namespaces);
    let binding = serde_yaml::to_string(&binding).map_err(|e| e.to_string())?;
    print!("{policy}---\n{binding}");
    Ok(0)
}

/// The fencing admission policies (for Locks and ClusterLocks) and their bindings.
pub fn fencing_policy(param_namespace: &str, namespaces: &[String], name: &str) -> Result<u8, String> {
    let (policies, bindings) = zklock::api::fencing_policy::fencing_policies(name, name, param_namespace, namespaces);
    let mut documents = vec![];
    for policy in &policies {
        documents.push(serde_yaml::to_string(policy).map_err(|e| e.to_string())?);
    }
    for binding in &bindings {
        documents.push(serde_yaml::to_string(binding).map_err(|e| e.to_string())?);
    }
    print!("{}", documents.join("---\n"));
    Ok(0)
}

/// The finalizer's admission policy and its binding.
pub fn finalizer_policy(namespaces: &[String], name: &str) -> Result<u8, String> {
    use zklock::api::finalizer_policy::{finalizer_policy, finalizer_policy_binding};
    let policy = serde_yaml::to_string(&finalizer_policy(name)).map_err(|e| e.to_string())?;
    let binding =
        serde_yaml::to_string(&finalizer_policy_binding(name, name, namespaces)).map_err(|e| e.to_string())?;
    print!("{policy}---\n{binding}");
    Ok(0)
}

/// The gate's admission policy and its binding.
pub fn gate_policy(namespaces: &[String], name: &str) -> Result<u8, String> {
    use zklock::api::gate_policy::{gate_policy, gate_policy_binding};
    let policy = serde_yaml::to_string(&gate_policy(name)).map_err(|e| e.to_string())?;
    let binding = serde_yaml::to_string(&gate_policy_binding(name, name, namespaces)).map_err(|e| e.to_string())?;
    print!("{policy}---\n{binding}");
    Ok(0)
}
