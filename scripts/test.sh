#!/usr/bin/env bash
# The test command: installs what the tests need (ZooKeeper, Curator, openssl, kubectl, helm,
# kazoo, umoci, skopeo, docker-registry, shellcheck, actionlint, PostgreSQL, cosign, cargo-auditable,
# cargo-cyclonedx), builds and starts the real Kubernetes control plane (scripts/k8s.sh: kube-apiserver,
# etcd, controller-manager, scheduler and a kwok node; built once per version and cached), then
# format, lint and every test of the workspace against real components: every test that needs
# Kubernetes runs on that control plane. ZKLOCK_TEST_KUBECONFIG names another cluster instead.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/zookeeper.sh install
TOOLS_WITH_HELM=1 TOOLS_WITH_IMAGE=1 scripts/tools.sh >/dev/null

# A one-off build gains nothing from incremental caches (2.6 GB of a test build's 11 GB).
export CARGO_INCREMENTAL=0

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

if [[ -z ${ZKLOCK_TEST_KUBECONFIG:-} ]]; then
  # One control plane for the whole run, stopped when this script ends (or is killed: the
  # control plane watches this process).
  k8s_dir=$(mktemp -d /tmp/zklock-test-k8s.XXXXXX)
  trap 'scripts/k8s.sh down "$k8s_dir" >/dev/null 2>&1 || true' EXIT
  kubeconfig=$(ZKLOCK_K8S_WATCH_PID=$$ scripts/k8s.sh up "$k8s_dir" | sed -n 's/^KUBECONFIG=//p')
  export ZKLOCK_TEST_KUBECONFIG=$kubeconfig
fi

# Every wait inside the tests has its own deadline; this one bounds the whole run, so that a
# hang nobody foresaw fails with a message well inside CI's 90 minutes instead of running into it.
deadline=${ZKLOCK_TEST_TIMEOUT:-60m}
status=0
# Built with cargo auditable, as the released binaries are: the binary carries the list of
# crates it was built from, which tests/repository/supply_chain.rs reads back (docs/verify.md).
auditable=.tools/bin/cargo-auditable
"$auditable" auditable build --workspace --all-targets
timeout --kill-after=30s "$deadline" "$auditable" auditable test --workspace || status=$?
if [[ $status -eq 124 || $status -eq 137 ]]; then
  echo "FAILED: the test run did not finish within $deadline: a test hangs (see the last test named above)" >&2
fi
exit "$status"
