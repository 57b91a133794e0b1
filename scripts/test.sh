#!/usr/bin/env bash
# The test command: installs what the tests need, then format, lint and every test of the
# workspace against real components (ZooKeeper, Curator).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/zookeeper.sh install
scripts/tools.sh >/dev/null

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
