//! The kubeconfig the sandbox hands out: plain HTTP on loopback with a bearer token.

pub fn render(url: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-sandbox
  cluster:
    server: {url}
users:
- name: kube-sandbox
  user:
    token: {token}
contexts:
- name: kube-sandbox
  context:
    cluster: kube-sandbox
    user: kube-sandbox
    namespace: default
current-context: kube-sandbox
preferences: {{}}
"
    )
}
