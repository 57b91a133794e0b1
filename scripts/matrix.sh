#!/usr/bin/env bash
# The end-to-end suites on another Kubernetes version of the matrix (docs/development.md):
#   scripts/matrix.sh v1.34.4 [-- cargo test filters...]
#   scripts/matrix.sh v1.37.2
# Builds that version's control plane once (cached, as scripts/k8s.sh does the test command's
# v1.36.3), starts it, and runs every suite that talks to Kubernetes on it: tests/operator,
# tests/chart and tests/api_assumptions (the control planes tests start of their own are of the
# same version). The ZooKeeper-only suites and the chaos run do not depend on the version; the
# test command runs them. Prints one line per suite, and exits non-zero if one failed.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: scripts/matrix.sh VERSION [-- cargo test filters...]  (versions: $(ls -d tools/k8s-v* | sed 's|tools/k8s-||' | tr '\n' ' '))" >&2; exit 2; }
version=$1; shift
[[ ${1:-} == "--" ]] && shift
export ZKLOCK_K8S_VERSION=$version

scripts/zookeeper.sh install
TOOLS_WITH_HELM=1 TOOLS_WITH_IMAGE=1 scripts/tools.sh >/dev/null
export CARGO_INCREMENTAL=0

k8s_dir=$(mktemp -d /tmp/zklock-matrix-k8s.XXXXXX)
trap 'scripts/k8s.sh down "$k8s_dir" >/dev/null 2>&1 || true' EXIT
kubeconfig=$(ZKLOCK_K8S_WATCH_PID=$$ scripts/k8s.sh up "$k8s_dir" | sed -n 's/^KUBECONFIG=//p')
export ZKLOCK_TEST_KUBECONFIG=$kubeconfig

status=0
for suite in api_assumptions operator chart; do
  if timeout --kill-after=30s "${ZKLOCK_TEST_TIMEOUT:-40m}" cargo test --test "$suite" -- "$@"; then
    echo "matrix $version: $suite passed"
  else
    echo "matrix $version: $suite FAILED" >&2
    status=1
  fi
done
exit "$status"
