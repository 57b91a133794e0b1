#!/usr/bin/env bash
# Writes krew's plugin manifest for `kubectl zklock` from the release archives in DIR (their
# sha256 files, as scripts/archive.sh writes them): one platform per archive found.
#
#   scripts/krew.sh --version X.Y.Z --base-url URL DIR > zklock.yaml
#
# URL is where the archives are downloaded from (the GitHub release's). Used by the release
# workflow; tests/repository/release_archives.rs installs the plugin with krew from it.
set -euo pipefail
die() { echo "krew.sh: $*" >&2; exit 1; }

version="" base="" dir=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --version) version="$2"; shift 2 ;;
        --base-url) base="$2"; shift 2 ;;
        -*) die "unknown flag $1" ;;
        *) dir="$1"; shift ;;
    esac
done
[[ -n "$version" && -n "$base" && -n "$dir" ]] || die "usage: krew.sh --version X.Y.Z --base-url URL DIR"

platforms=""
for sha in "$dir"/zklock-"$version"-*-*.tar.gz.sha256; do
    [[ -e "$sha" ]] || die "no zklock-$version-OS-ARCH.tar.gz.sha256 in $dir"
    file="$(basename "$sha" .sha256)"
    platform="${file#zklock-"$version"-}"
    platform="${platform%.tar.gz}"
    os="${platform%-*}"
    arch="${platform#*-}"
    platforms+="
    - selector:
        matchLabels:
          os: $os
          arch: $arch
      uri: $base/$file
      sha256: $(cut -d' ' -f1 "$sha")
      files:
        - from: zklock-$version-$os-$arch/zklock
          to: .
        - from: zklock-$version-$os-$arch/LICENSE
          to: .
      bin: zklock"
done

cat <<MANIFEST
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: zklock
spec:
  version: v$version
  homepage: https://github.com/zklock/zklock
  shortDescription: Take, queue and diagnose ZooKeeper-backed zklock locks
  description: |
    Claims, queues and revocations of zklock locks (LockClaims the zklock operator backs with
    ZooKeeper), commands run while a lock is held, and a check that says why a claim waits.
  platforms:${platforms}
MANIFEST
