//! What the commands that talk to the Kubernetes API share: which cluster and identity
//! (`--kubeconfig`, `--context`, else KUBECONFIG or the in-cluster config, as kubectl does),
//! and how they print (`-o`).

/// The cluster to talk to.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ApiArgs {
    /// The kubeconfig file (default: KUBECONFIG, ~/.kube/config, or the in-cluster config)
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (default: its current context)
    #[arg(long)]
    pub context: Option<String>,
}

impl ApiArgs {
    pub async fn config(&self) -> Result<kube::Config, String> {
        let options = kube::config::KubeConfigOptions { context: self.context.clone(), ..Default::default() };
        let no_api = |e: &dyn std::fmt::Display| {
            format!("no Kubernetes API: {e} (give --kubeconfig or set KUBECONFIG, or run in a cluster)")
        };
        match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| format!("cannot read the kubeconfig {}: {e}", path.display()))?;
                kube::Config::from_custom_kubeconfig(file, &options).await.map_err(|e| no_api(&e))
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options).await.map_err(|e| no_api(&e)),
            (None, None) => kube::Config::infer().await.map_err(|e| no_api(&e)),
        }
    }

    pub async fn client(&self) -> Result<kube::Client, String> {
        let config = self.config().await?;
        Ok(zklock::client::builder(config).map_err(|e| format!("no Kubernetes API: {e}"))?.build())
    }
}

/// How a command prints what it read.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Columns, as kubectl get prints them
    #[default]
    Table,
    Json,
    Yaml,
}

/// Rows as `kubectl get` prints tables: each column as wide as its widest cell, three spaces
/// apart, `empty` (a line of its own) when there is only the header (pure).
pub fn columns(rows: &[Vec<String>], empty: &str) -> String {
    let width = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..width).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or_default()).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    if rows.len() <= 1 {
        out.push_str(empty);
        out.push('\n');
    }
    out
}
