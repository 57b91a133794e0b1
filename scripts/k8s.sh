#!/usr/bin/env bash
# The real Kubernetes control plane the tests, the benchmark and `demo.sh --real` run on:
# kube-apiserver, kube-controller-manager and kube-scheduler from k8s.io/kubernetes, etcd from
# go.etcd.io/etcd/server/v3 and kwok (one fake node, so that bound pods run and Job pods
# complete), each built from the Go module proxy at the versions tools/*/go.mod pin (go.sum
# committed: the build is checked). On loopback only, RBAC on, the default admission plugins on.
#
#   scripts/k8s.sh build        build the binaries once per pinned version (cached in
#                               $ZKLOCK_K8S_CACHE, default ~/.cache/zklock/k8s/<version>)
#   scripts/k8s.sh up [DIR]     build if needed, start everything with its data in DIR (default
#                               /tmp/zklock-k8s), wait until it serves, print KUBECONFIG=<path>
#   scripts/k8s.sh down [DIR]   stop exactly what `up` started (by PID) and remove DIR
#   scripts/k8s.sh env [DIR]    print `export KUBECONFIG=<path>` of a running control plane
#   scripts/k8s.sh status [DIR] print what runs
#
# Options (environment): ZKLOCK_K8S_VERSION (another Kubernetes version of tools/k8s-v*, e.g.
# v1.34.4), ZKLOCK_K8S_CACHE (where binaries are kept), ZKLOCK_K8S_WATCH_PID (up:
# everything is stopped and DIR removed once that process has gone; the test kit sets it),
# ZKLOCK_K8S_COMPACTION (etcd compaction interval kube-apiserver asks for, default 30s, so
# that a watch from an old revision really gets 410 Gone in a test; 5m in a default cluster),
# ZKLOCK_K8S_PROFILING=true (serve kube-apiserver's /debug/pprof, to see where its CPU goes:
# `curl --cert pki/admin.crt --key pki/admin.key --cacert pki/ca.crt \
#  https://127.0.0.1:<port>/debug/pprof/profile?seconds=10 >cpu.prof; go tool pprof -top cpu.prof`).
# A failure says which component failed and where its log is, and leaves nothing running.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/tools"
# The version the test command runs on; ZKLOCK_K8S_VERSION picks another one of the version
# matrix, whose module is tools/k8s-<version> (scripts/matrix.sh runs the end-to-end suite on it).
DEFAULT_K8S_VERSION=v1.36.3
K8S_VERSION=${ZKLOCK_K8S_VERSION:-$DEFAULT_K8S_VERSION}
if [[ $K8S_VERSION == "$DEFAULT_K8S_VERSION" ]]; then
  k8s_module="$tools/k8s"
else
  k8s_module="$tools/k8s-$K8S_VERSION"
fi
DEFAULT_DIR=/tmp/zklock-k8s
# Change it when the way the binaries are built changes (flags, stages): the cache key includes it.
BUILD_RECIPE=1

die() { echo "k8s.sh: $*" >&2; exit 1; }
say() { echo "k8s.sh: $*" >&2; }

# The cache key: the Kubernetes version and a hash of everything that pins the build.
cache_dir() {
  local pins
  pins=$(cat "$k8s_module"/go.mod "$k8s_module"/go.sum "$tools"/etcd/go.mod "$tools"/etcd/go.sum \
    "$tools"/etcd/main.go "$tools"/kwok/go.mod "$tools"/kwok/go.sum <(echo "$BUILD_RECIPE") | sha256sum | cut -c1-12)
  echo "${ZKLOCK_K8S_CACHE:-$HOME/.cache/zklock/k8s}/$K8S_VERSION-$pins"
}

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok)

build() {
  local out; out=$(cache_dir)
  local missing=0 b
  for b in "${BINARIES[@]}"; do [[ -x $out/$b ]] || missing=1; done
  [[ $missing -eq 0 ]] && { echo "$out"; return 0; }
  command -v go >/dev/null || die "go not found: the control plane is built from Go modules (install Go 1.26)"
  mkdir -p "$out"
  local log="$out/build.log"
  : >"$log"
  # Checked against the committed go.sum (the checksum database is not reachable from here).
  export GOSUMDB=off GOFLAGS="-mod=readonly -trimpath"
  [[ -f $k8s_module/go.mod ]] || die "no module for Kubernetes $K8S_VERSION: the versions are $DEFAULT_K8S_VERSION and $(cd "$tools" && ls -d k8s-v* | sed 's/^k8s-//' | tr '\n' ' ')"
  local minor; minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor
    -X k8s.io/component-base/version.gitTreeState=clean"
  local started=$SECONDS
  step() { # what dir output packages... (output: a directory ending in /, or a file)
    local what=$1 dir=$2 output=$3; shift 3
    say "building $what (first time only: several minutes on two cores; log $log)"
    if ! (cd "$dir" && go build -ldflags "$ldflags" -o "$output" "$@") >>"$log" 2>&1; then
      tail -n 20 "$log" >&2
      die "building $what failed (is the Go module proxy reachable? see $log)"
    fi
  }
  step "kube-apiserver, kube-controller-manager, kube-scheduler ($K8S_VERSION)" "$k8s_module" "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
  step "etcd" "$tools/etcd" "$out/etcd" .
  step "kwok" "$tools/kwok" "$out/" sigs.k8s.io/kwok/cmd/kwok
  # kwok's stages (what its fake kubelet does to nodes and pods), from the pinned module.
  local kwok_src
  kwok_src=$(cd "$tools/kwok" && go mod download -json sigs.k8s.io/kwok | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cat "$kwok_src"/kustomize/stage/node/fast/node-initialize.yaml \
    <(echo "---") "$kwok_src"/kustomize/stage/pod/fast/pod-ready.yaml \
    <(echo "---") "$kwok_src"/kustomize/stage/pod/fast/pod-complete.yaml \
    <(echo "---") "$kwok_src"/kustomize/stage/pod/fast/pod-delete.yaml >"$out/kwok-stages.yaml"
  for b in "${BINARIES[@]}"; do [[ -x $out/$b ]] || die "the build made no $b (see $log)"; done
  say "built in $((SECONDS - started)) s into $out"
  echo "$out"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Certificates as a cluster's own PKI has them: a CA, the API server's serving certificate for
# its loopback address and in-cluster names, client certificates, the service-account keys.
make_pki() {
  local pki=$1
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=zklock-test-ca" 2>/dev/null
    cat >server.ext <<EXT
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EXT
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 3650 \
      -extfile server.ext 2>/dev/null
    echo "extendedKeyUsage=clientAuth" >client.ext
    client() { # name CN O
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2/O=$3" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 \
        -extfile client.ext 2>/dev/null
    }
    client admin admin system:masters
    client controller-manager system:kube-controller-manager system:masters
    client scheduler system:kube-scheduler system:masters
    client kwok kwok-controller system:masters
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  ) || die "openssl could not make the certificates in $pki (install openssl)"
}

kubeconfig() { # file server name
  local pki=$DIR/pki
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: zklock-test
  cluster:
    server: $2
    certificate-authority: $pki/ca.crt
users:
- name: $3
  user:
    client-certificate: $pki/$3.crt
    client-key: $pki/$3.key
contexts:
- name: zklock-test
  context: {cluster: zklock-test, user: $3, namespace: default}
current-context: zklock-test
KC
}

# One HTTPS request to the API server as its admin (Python's standard library: a fresh machine
# may have no curl). Prints the body; fails on an HTTP error. api PATH [METHOD BODY]
api() {
  python3 - "$DIR/pki" "$(cat "$DIR/apiserver.port")" "$@" <<'PY'
import ssl, sys, urllib.request
pki, port, path = sys.argv[1:4]
method = sys.argv[4] if len(sys.argv) > 4 else "GET"
body = sys.argv[5].encode() if len(sys.argv) > 5 else None
context = ssl.create_default_context(cafile=f"{pki}/ca.crt")
context.load_cert_chain(f"{pki}/admin.crt", f"{pki}/admin.key")
request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=body, method=method,
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, context=context, timeout=5) as answer:
    sys.stdout.write(answer.read().decode())
PY
}

http_ok() { # url
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1"
}

start() { # name args...
  local name=$1; shift
  "$@" >"$DIR/logs/$name.log" 2>&1 &
  echo "$! $name" >>"$DIR/pids"
}

# The PID of the component started last under that name.
pid_of() { # name
  awk -v n="$1" '$2 == n {print $1}' "$DIR/pids" | tail -n 1
}

alive_or_die() { # name
  kill -0 "$(pid_of "$1")" 2>/dev/null || fail "$1 exited during start-up"
}

fail() {
  local why=$1
  local component=${why%% *}
  say "$why; see $DIR/logs/$component.log"
  [[ -f $DIR/logs/$component.log ]] && tail -n 5 "$DIR/logs/$component.log" | sed 's/^/    /' >&2
  stop_all
  # Nothing is left running; the logs stay, for the message above.
  find "$DIR" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
  exit 1
}

wait_for() { # component seconds what command...
  local component=$1 seconds=$2 what=$3; shift 3
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    alive_or_die "$component"
    [[ $SECONDS -lt $deadline ]] || fail "$component: no $what within ${seconds}s"
    sleep 0.2
  done
}

stop_all() {
  [[ -f $DIR/pids ]] || return 0
  local pid name
  # Last started first: kwok and the controllers before the API server, etcd last.
  tac "$DIR/pids" | while read -r pid name; do
    kill "$pid" 2>/dev/null || true
  done
  for _ in $(seq 1 50); do
    local alive=0
    while read -r pid name; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$DIR/pids"
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  while read -r pid name; do kill -9 "$pid" 2>/dev/null || true; done <"$DIR/pids"
  rm -f "$DIR/pids"
}

# Whether any process `up` recorded in DIR still runs (a PID file left by a machine that
# restarted names nothing, or somebody else's process: the command line must match too).
any_alive() {
  local pid name
  while read -r pid name; do
    kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$name" && return 0
  done <"$DIR/pids"
  return 1
}

up() {
  if [[ -f $DIR/pids ]]; then
    any_alive && die "a control plane already runs in $DIR (scripts/k8s.sh down $DIR first)"
    say "nothing of the control plane recorded in $DIR runs any more: starting afresh"
  fi
  local bin; bin=$(build)
  local started=$SECONDS
  rm -rf "$DIR"
  mkdir -p "$DIR/logs" "$DIR/etcd"
  make_pki "$DIR/pki"
  local etcd_port peer_port api_port kwok_port
  etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port); kwok_port=$(free_port)
  echo "$api_port" >"$DIR/apiserver.port"
  local server="https://127.0.0.1:$api_port"
  kubeconfig "$DIR/kubeconfig" "$server" admin
  kubeconfig "$DIR/controller-manager.kubeconfig" "$server" controller-manager
  kubeconfig "$DIR/scheduler.kubeconfig" "$server" scheduler
  kubeconfig "$DIR/kwok.kubeconfig" "$server" kwok

  # etcd with its default fsync, as in a real cluster.
  start etcd "$bin/etcd" --name zklock-test --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "zklock-test=http://127.0.0.1:$peer_port" --listen-metrics-urls "" --log-level warn
  wait_for etcd 30 "health answer" http_ok "http://127.0.0.1:$etcd_port/health"

  local pki=$DIR/pki
  start kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" --etcd-compaction-interval "${ZKLOCK_K8S_COMPACTION:-30s}" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --cert-dir "$DIR/apiserver-certs" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode RBAC --allow-privileged=true --profiling="${ZKLOCK_K8S_PROFILING:-false}" \
    --endpoint-reconciler-type none
  wait_for kube-apiserver 60 "/readyz" api /readyz

  # No node IPAM and no cloud provider here; a controller that this version no longer has (1.37
  # dropped cloud-node-lifecycle) must not be named, so its own list decides.
  local controllers='*,-node-ipam-controller'
  if "$bin/kube-controller-manager" --help 2>&1 | grep -q 'cloud-node-lifecycle-controller'; then
    controllers="$controllers,-cloud-node-lifecycle-controller"
  fi
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --use-service-account-credentials=false --controllers "$controllers"
  start kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$DIR/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false
  local kwok=("$bin/kwok" --kubeconfig "$DIR/kwok.kubeconfig" --config "$bin/kwok-stages.yaml"
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake
    --server-address "127.0.0.1:$kwok_port" --node-ip 127.0.0.1)
  start kwok "${kwok[@]}"

  # The fake node: no taint, so every test pod may be placed on it.
  api /api/v1/nodes POST '{
    "apiVersion": "v1", "kind": "Node",
    "metadata": {"name": "kwok-node-0", "annotations": {"kwok.x-k8s.io/node": "fake"},
                 "labels": {"kubernetes.io/hostname": "kwok-node-0", "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64", "type": "kwok"}},
    "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
               "capacity": {"cpu": "64", "memory": "256Gi", "pods": "1000"}}
  }' >/dev/null || fail "kube-apiserver refused the fake node"
  wait_for kube-controller-manager 60 "default ServiceAccount" api /api/v1/namespaces/default/serviceaccounts/default
  # kwok v0.8's node controller can die of its own race at start-up ("concurrent map writes"):
  # started again, twice at most, before the control plane is given up.
  local kwok_starts=1 deadline=$((SECONDS + 60))
  until node_ready >/dev/null 2>&1; do
    if ! kill -0 "$(pid_of kwok)" 2>/dev/null; then
      [[ $kwok_starts -lt 3 ]] || fail "kwok exited during start-up ($kwok_starts times)"
      say "kwok exited during start-up ($(grep -m1 'fatal error' "$DIR/logs/kwok.log" || echo 'see its log')); starting it again"
      mv "$DIR/logs/kwok.log" "$DIR/logs/kwok.$kwok_starts.log"
      kwok_starts=$((kwok_starts + 1))
      start kwok "${kwok[@]}"
      deadline=$((SECONDS + 60))
    fi
    [[ $SECONDS -lt $deadline ]] || fail "kwok: no Ready node within 60s"
    sleep 0.2
  done
  alive_or_die kube-scheduler

  # kube-apiserver stops the informer of a built-in parameter kind for good once no binding names
  # that kind for a moment (kubernetes/kubernetes#130887): from then on every binding with a
  # ConfigMap parameter denies with "no params found", until a restart. Tests install and remove
  # the epoch policy's bindings all the time; this policy and binding, which match nothing, keep
  # ConfigMap parameters bound for the control plane's life, as any cluster with one such policy
  # installed is. (The operator names the bug when it meets it: docs/operations.md.)
  api /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies POST '{
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "zklock-test-configmap-params"},
    "spec": {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
             "matchConstraints": {"resourceRules": [{"apiGroups": ["zklock-test.invalid"], "apiVersions": ["v1"],
                                                     "operations": ["CREATE"], "resources": ["nothing"]}]},
             "validations": [{"expression": "true"}]}
  }' >/dev/null || fail "kube-apiserver refused the policy that keeps ConfigMap parameters bound"
  api /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings POST '{
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": "zklock-test-configmap-params"},
    "spec": {"policyName": "zklock-test-configmap-params", "validationActions": ["Deny"],
             "paramRef": {"name": "nothing", "namespace": "default", "parameterNotFoundAction": "Allow"}}
  }' >/dev/null || fail "kube-apiserver refused the binding that keeps ConfigMap parameters bound"

  if [[ -n ${ZKLOCK_K8S_WATCH_PID:-} ]]; then
    # Stops the control plane once the process that asked for it has gone (a test run that
    # was killed, say), so that nothing is left running.
    nohup bash -c 'while kill -0 "$1" 2>/dev/null && [[ -f "$2/pids" ]]; do sleep 1; done; "$3" down "$2" >/dev/null 2>&1' \
      _ "$ZKLOCK_K8S_WATCH_PID" "$DIR" "$root/scripts/k8s.sh" >/dev/null 2>&1 &
  fi
  say "up in $((SECONDS - started)) s: kube-apiserver $K8S_VERSION at $server, logs in $DIR/logs"
  echo "KUBECONFIG=$DIR/kubeconfig"
}

node_ready() {
  api /api/v1/nodes/kwok-node-0 | python3 -c '
import json, sys
node = json.load(sys.stdin)
ready = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
sys.exit(0 if ready and ready[0]["status"] == "True" else 1)'
}

down() {
  if [[ ! -f $DIR/pids ]]; then
    rm -rf "$DIR"
    echo "nothing to stop in $DIR"
    return 0
  fi
  stop_all
  rm -rf "$DIR"
  echo "stopped"
}

status() {
  [[ -f $DIR/pids ]] || { echo "not running ($DIR)"; return 0; }
  local pid name
  while read -r pid name; do
    if kill -0 "$pid" 2>/dev/null; then echo "$name: running (pid $pid)"; else echo "$name: exited (see $DIR/logs/$name.log)"; fi
  done <"$DIR/pids"
  echo "KUBECONFIG=$DIR/kubeconfig"
}

cmd=${1:-}
DIR=${2:-$DEFAULT_DIR}
case $cmd in
  build) build >/dev/null ;;
  up) up ;;
  down) down ;;
  env) [[ -f $DIR/pids ]] || die "no control plane runs in $DIR (scripts/k8s.sh up)"; echo "export KUBECONFIG=$DIR/kubeconfig" ;;
  status) status ;;
  *) sed -n '2,21p' "$0"; exit 2 ;;
esac
