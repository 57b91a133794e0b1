#!/usr/bin/env bash
# The test command: installs what the tests need (ZooKeeper, kubectl, helm, kazoo), then format, lint
# and every test of the workspace against real components (ZooKeeper, Curator, kazoo, kube-sandbox,
# kubectl, helm; the chart's tests are tests/chart.rs and tests/chart_rbac.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/zookeeper.sh install
TOOLS_WITH_HELM=1 scripts/tools.sh >/dev/null

# A one-off build gains nothing from incremental caches (2.6 GB of a test build's 11 GB).
export CARGO_INCREMENTAL=0

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Every wait inside the tests has its own deadline; this one bounds the whole run, so that a
# hang nobody foresaw fails with a message well inside CI's 90 minutes instead of running into it.
status=0
timeout --kill-after=30s "${ZKLOCK_TEST_TIMEOUT:-60m}" cargo test --workspace || status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "FAILED: the test run did not finish within ${ZKLOCK_TEST_TIMEOUT:-60m}: a test hangs (see the last test named above)" >&2
fi
exit "$status"
