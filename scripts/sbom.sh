#!/usr/bin/env bash
# Writes the CycloneDX SBOM (JSON, spec 1.5) of the zklock package: every crate its binary is
# built from, at the versions Cargo.lock pins (build dependencies included, dev-dependencies
# not), made by cargo-cyclonedx (scripts/tools.sh installs it):
#   scripts/sbom.sh OUT.json [TARGET]     # TARGET: a target triple (default: this machine's)
# cargo-cyclonedx writes one SBOM beside every workspace member's Cargo.toml; this runs it on a
# copy of the tracked files, so the checkout stays as it was, and keeps the root package's.
# The timestamp is the last commit's (SOURCE_DATE_EPOCH), and the workspace's packages are named by
# paths in the checkout, so one commit gives the same bytes.
# The release workflow attaches it to the release and attests it on the image (docs/verify.md);
# tests/repository/supply_chain.rs checks it against the dependency list inside the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: scripts/sbom.sh OUT.json [TARGET]" >&2; exit 2; }
out=$(realpath -m "$1")
target=${2:-}
cyclonedx=$(command -v cargo-cyclonedx || echo "$PWD/.tools/bin/cargo-cyclonedx")
[[ -x $cyclonedx ]] || { echo "sbom.sh: cargo-cyclonedx not found: run scripts/tools.sh with TOOLS_WITH_IMAGE=1" >&2; exit 1; }

# The physical path (macOS's temporary directories are behind a symlink): the one cargo reports.
work=$(cd "$(mktemp -d)" && pwd -P)
trap 'rm -rf "$work"' EXIT
# The tracked files as they are in the working tree (one deleted meanwhile is left out).
git ls-files -z | while IFS= read -r -d '' f; do if [[ -e $f ]]; then printf '%s\0' "$f"; fi; done \
    | tar --null -T - -cf - | tar -xf - -C "$work"
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
(
    cd "$work"
    SOURCE_DATE_EPOCH=$epoch "$cyclonedx" cyclonedx --quiet --format json --spec-version 1.5 \
        --override-filename zklock.cdx ${target:+--target "$target"}
)
[[ -s $work/zklock.cdx.json ]] || { echo "sbom.sh: cargo-cyclonedx wrote no zklock.cdx.json" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# The workspace's own packages are named by where they were read (bom-ref path+file:///tmp/…):
# by the checkout's root instead, so that the SBOM does not depend on the copy's temporary path.
sed "s|file://$work|file://.|g" "$work/zklock.cdx.json" >"$out"
echo "$out"
