#!/usr/bin/env bash
# Builds the operator as the container image ships it: a static (musl) release binary, with the
# workspace's release profile and the locked dependencies. The release workflow runs this script
# and gives its binary to scripts/image.sh, so a local run checks exactly what the image ships.
#   scripts/build-static.sh [OUT]      # OUT: where to copy the binary (default: print its path)
# The copy in OUT has its debug info stripped (the release profile keeps line tables: 130+ MB);
# symbols stay, so backtraces still name functions. Measured: ~25 MB, static-pie.
# Needs the musl target (rustup target add <arch>-unknown-linux-musl) and musl-gcc (Debian:
# musl-tools) for aws-lc-rs's C code.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(uname -m)-unknown-linux-musl"
# cargo auditable (scripts/tools.sh installs it): the binary carries the list of crates it was
# built from, for scanners and `rust-audit-info` (docs/verify.md).
auditable=$(command -v cargo-auditable || echo "$PWD/.tools/bin/cargo-auditable")
[[ -x $auditable ]] || { echo "build-static.sh: cargo-auditable not found: cargo install --locked cargo-auditable" >&2; exit 1; }
"$auditable" auditable build --release --locked -p zklock --bin zklock --target "$target"
bin="${CARGO_TARGET_DIR:-target}/$target/release/zklock"
if [[ $# -gt 0 ]]; then
    strip --strip-debug -o "$1" "$bin"
else
    echo "$bin"
fi
