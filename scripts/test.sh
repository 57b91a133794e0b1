#!/usr/bin/env bash
# The test command: installs what the tests need (ZooKeeper, kubectl, helm), then format, lint
# and every test of the workspace against real components (ZooKeeper, Curator, kube-sandbox,
# kubectl, helm; the chart's tests are tests/chart.rs and tests/chart_rbac.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/zookeeper.sh install
TOOLS_WITH_HELM=1 scripts/tools.sh >/dev/null

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
