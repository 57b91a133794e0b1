#!/usr/bin/env bash
# Builds the operator's container image without a container daemon, as an OCI image layout,
# with Debian's umoci (installed here if missing):
#   scripts/image.sh [--binary PATH] [--arch amd64|arm64] [--revision SHA] OUT_DIR
# OUT_DIR holds an OCI layout with one image, tagged with the crate's version (`oci:OUT_DIR:0.1.0`
# for skopeo). The image holds the binary (default: a release build made here) at
# /usr/local/bin/zklock, the shared libraries it links (none for a static musl build, the C
# library for a glibc one: `ldd` tells), /etc/passwd and /etc/group with the non-root user 65532,
# /etc/nsswitch.conf, the CA bundle, and the license. It runs as 65532:65532, entrypoint
# `zklock`, command `run`, port 8080 (metrics and probes), with OCI labels (version, revision,
# source, licenses). tests/repository/image.rs builds it from the test build and checks it;
# docs/operations.md says how to load it into kind or k3d, or push it.
set -euo pipefail
cd "$(dirname "$0")/.."

binary="" arch="" revision=""
while [[ $# -gt 1 ]]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --revision) revision=$2; shift 2 ;;
    *) echo "image.sh: unknown option $1 (see the header of scripts/image.sh)" >&2; exit 2 ;;
  esac
done
[[ $# -eq 1 ]] || { echo "usage: scripts/image.sh [--binary PATH] [--arch ARCH] [--revision SHA] OUT_DIR" >&2; exit 2; }
out=$1

if ! command -v umoci >/dev/null; then
  echo "image.sh: installing umoci (Debian)" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq umoci >/dev/null
fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
[[ -n $version ]] || { echo "image.sh: no version in Cargo.toml" >&2; exit 1; }
if [[ -z $binary ]]; then
  cargo build --release --locked -p zklock --bin zklock
  binary=${CARGO_TARGET_DIR:-target}/release/zklock
fi
[[ -x $binary ]] || { echo "image.sh: $binary is not an executable" >&2; exit 1; }
if [[ -z $arch ]]; then
  case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) echo "image.sh: give --arch for $(uname -m)" >&2; exit 2 ;;
  esac
fi
revision=${revision:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot" "$root/usr/share/doc/zklock"
chmod 1777 "$root/tmp"
# The release profile keeps line tables (130+ MB); symbols stay, so backtraces name functions.
strip --strip-debug -o "$root/usr/local/bin/zklock" "$binary"
# A dynamically linked binary brings the libraries it links, at the paths it looks them up.
if ldd "$binary" >/dev/null 2>&1; then
  ldd "$binary" | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
fi
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi
cp LICENSE "$root/usr/share/doc/zklock/"
chown -R 65532:65532 "$root/home/nonroot" 2>/dev/null || true

rm -rf "$out"
umoci init --layout "$out"
umoci new --image "$out:$version"
umoci unpack --rootless --image "$out:$version" "$work/bundle" >/dev/null
cp -a "$root/." "$work/bundle/rootfs/"
umoci repack --image "$out:$version" "$work/bundle"
umoci config --image "$out:$version" \
  --os linux --architecture "$arch" \
  --config.user 65532:65532 \
  --config.entrypoint /usr/local/bin/zklock --config.cmd run \
  --config.workingdir / \
  --config.exposedports 8080/tcp \
  --config.env PATH=/usr/local/bin:/usr/bin:/bin \
  --config.label org.opencontainers.image.title=zklock \
  --config.label "org.opencontainers.image.description=Lease-style locks as Kubernetes custom resources, backed by ZooKeeper" \
  --config.label org.opencontainers.image.version="$version" \
  --config.label org.opencontainers.image.revision="$revision" \
  --config.label org.opencontainers.image.source=https://github.com/zklock/zklock \
  --config.label org.opencontainers.image.licenses=Apache-2.0
umoci gc --layout "$out"
echo "image: oci:$out:$version ($arch, $(du -sh "$out" | cut -f1))" >&2
