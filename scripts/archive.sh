#!/usr/bin/env bash
# The CLI's release archive for one platform: the binary, `kubectl-zklock` (a copy of it: kubectl
# runs it as the plugin, and its help then says `kubectl zklock`; a copy, since krew refuses
# archives with links in them), shell completions, man pages, LICENSE and README.md; beside it
# the archive's sha256 file.
#
#   scripts/archive.sh --binary PATH --version X.Y.Z --os linux|darwin --arch amd64|arm64 OUTDIR
#
# The completions and man pages come from a binary that runs here (--host-binary, default the
# binary itself): an archive for another platform carries the same pages. Used by the release
# workflow; tests/repository/release_archives.rs installs an archive made by it with krew.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "archive.sh: $*" >&2; exit 1; }

binary="" host_binary="" version="" os="" arch="" out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --host-binary) host_binary="$2"; shift 2 ;;
        --version) version="$2"; shift 2 ;;
        --os) os="$2"; shift 2 ;;
        --arch) arch="$2"; shift 2 ;;
        -*) die "unknown flag $1" ;;
        *) out="$1"; shift ;;
    esac
done
[[ -n "$binary" && -n "$version" && -n "$os" && -n "$arch" && -n "$out" ]] \
    || die "usage: archive.sh --binary PATH --version X.Y.Z --os linux|darwin --arch amd64|arm64 OUTDIR"
[[ -x "$binary" ]] || die "$binary is no executable"
host_binary="${host_binary:-$binary}"
case "$os" in linux | darwin) ;; *) die "--os: linux or darwin, not $os" ;; esac
case "$arch" in amd64 | arm64) ;; *) die "--arch: amd64 or arm64, not $arch" ;; esac

name="zklock-$version-$os-$arch"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
dir="$stage/$name"
mkdir -p "$dir/completions" "$dir/man/man1"
cp "$binary" "$dir/zklock"
chmod 0755 "$dir/zklock"
cp "$dir/zklock" "$dir/kubectl-zklock"
"$host_binary" completion bash >"$dir/completions/zklock.bash"
"$host_binary" completion zsh >"$dir/completions/_zklock"
"$host_binary" completion fish >"$dir/completions/zklock.fish"
"$host_binary" admin man --dir "$dir/man/man1"
cp "$root/LICENSE" "$root/README.md" "$dir/"

mkdir -p "$out"
archive="$(cd "$out" && pwd)/$name.tar.gz"
# Reproducible: fixed order, owner and times.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='@0' -C "$stage" -czf "$archive" "$name"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "$archive"
