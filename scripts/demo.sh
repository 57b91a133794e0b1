#!/usr/bin/env bash
# zklock on this machine, no cluster needed: a real ZooKeeper, the real Kubernetes control plane
# of scripts/k8s.sh (kube-apiserver, etcd, controller-manager, scheduler, a kwok node; built from
# Go modules the first time, about 4 minutes on a two-core machine, cached after), the operator
# with the leader epoch's admission policy, and the real kubectl.
#
#   scripts/demo.sh          install what is missing, start everything, and walk through two
#                            "jobs" (shell scripts) gated on one lock with kubectl wait
#   scripts/demo.sh down     stop exactly what `scripts/demo.sh` started
#
# While it runs:  KUBECONFIG=.demo/kubeconfig .tools/bin/kubectl get lockclaims -A
#
# The tests run it as written (tests/repository/demo.rs), with two settings a user need not set:
#   ZKLOCK_DEMO_STATE   where its state is kept (default .demo)
#   ZKLOCK_DEMO_BINARY  a zklock binary already built, instead of building one
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
state=${ZKLOCK_DEMO_STATE:-$root/.demo}
kubectl=$root/.tools/bin/kubectl
zklock=${ZKLOCK_DEMO_BINARY:-$root/target/release/zklock}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
stamp() { date +%H:%M:%S.%3N; }
say() { printf '%s  %s\n' "$(stamp)" "$*"; }

down() {
  local pid
  if [[ -f $state/k8s/pids ]]; then
    scripts/k8s.sh down "$state/k8s" >/dev/null && say "stopped the control plane"
  fi
  for name in operator; do
    if [[ -f $state/$name.pid ]]; then
      pid=$(cat "$state/$name.pid")
      kill "$pid" 2>/dev/null && say "stopped $name (pid $pid)" || true
      rm -f "$state/$name.pid"
    fi
  done
  if [[ -d $state/zookeeper ]]; then
    ZKLOCK_ZK_DIR=$state/zookeeper scripts/zookeeper.sh stop >/dev/null && say "stopped zookeeper"
  fi
  # Only a directory the demo made (ZKLOCK_DEMO_STATE may name any).
  if [[ -f $state/.zklock-demo ]]; then
    rm -rf "$state"
  fi
}

wait_for() { # what, command...
  local what=$1; shift
  for _ in $(seq 1 300); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "demo: $what did not come up; logs are in $state" >&2
  exit 1
}

up() {
  if [[ -f $state/operator.pid ]]; then
    echo "demo: already running (scripts/demo.sh down stops it)" >&2
    exit 1
  fi
  if [[ -e $state && ! -f $state/.zklock-demo && -n $(ls -A "$state" 2>/dev/null) ]]; then
    echo "demo: $state exists and is not the demo's; give ZKLOCK_DEMO_STATE an empty or new directory" >&2
    exit 1
  fi
  mkdir -p "$state"
  touch "$state/.zklock-demo"
  local building=" and building zklock"
  [[ -z ${ZKLOCK_DEMO_BINARY:-} ]] || building=""
  say "installing what is missing (ZooKeeper, kubectl)$building"
  scripts/zookeeper.sh install
  scripts/tools.sh >/dev/null
  if [[ -z ${ZKLOCK_DEMO_BINARY:-} ]]; then
    cargo build --quiet --release -p zklock
  fi

  local zk_port metrics_port
  zk_port=$(free_port); metrics_port=$(free_port)
  ZKLOCK_ZK_DIR=$state/zookeeper scripts/zookeeper.sh start standalone "$zk_port" | sed "s/^/$(stamp)  /"

  say "starting the control plane (the first run builds it from Go modules: about 4 minutes)"
  local kubeconfig
  kubeconfig=$(scripts/k8s.sh up "$state/k8s" | sed -n 's/^KUBECONFIG=//p')
  cp "$kubeconfig" "$state/kubeconfig"
  export KUBECONFIG=$state/kubeconfig
  say "the control plane is up ($("$kubectl" version -o json | python3 -c 'import json,sys; print("kube-apiserver", json.load(sys.stdin)["serverVersion"]["gitVersion"])'))"
  "$kubectl" apply -f crds/ >/dev/null
  # The operator keeps its leader epoch in its lease namespace (here: default).
  "$zklock" admin epoch-policy --param-namespace default | "$kubectl" apply -f - >/dev/null
  say "applied the LockClaim and Lock CRDs, and the leader epoch's admission policy"
  "$zklock" run --zk-connect "127.0.0.1:$zk_port/zklock-demo" --epoch-param=zklock-leader-epoch \
    --metrics-addr "127.0.0.1:$metrics_port" >"$state/operator.log" 2>&1 &
  echo $! >"$state/operator.pid"
  wait_for "the operator" python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$metrics_port/readyz')"
  say "operator ready (metrics on http://127.0.0.1:$metrics_port/metrics)"

  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n' | "$kubectl" apply -f - >/dev/null
  "$kubectl" -n demo apply -f examples/manifests/shared-locks.yaml >/dev/null
  "$kubectl" -n demo wait --for=condition=Held lockclaim/report-reader-1 lockclaim/report-reader-2 --timeout=30s >/dev/null
  say "examples/manifests/shared-locks.yaml: two readers hold 'sales-tables' together; the writer waits:"
  "$kubectl" -n demo get lockclaims

  echo
  say "two jobs gated on lock 'db-migrations' with kubectl wait --for=condition=Held:"
  job() { # name seconds
    local name=$1 seconds=$2
    "$kubectl" -n demo apply -f - >/dev/null <<CLAIM
apiVersion: zklock.io/v1alpha1
kind: LockClaim
metadata:
  name: $name
spec:
  lockName: db-migrations
CLAIM
    say "$name: claimed the lock, waiting"
    "$kubectl" -n demo wait --for=condition=Held "lockclaim/$name" --timeout=60s >/dev/null
    say "$name: Held (fencing token $("$kubectl" -n demo get lockclaim "$name" -o jsonpath='{.status.fencingToken}')), working for ${seconds}s"
    sleep "$seconds"
    say "$name: done; deleting its claim releases the lock"
    "$kubectl" -n demo delete lockclaim "$name" >/dev/null
  }
  job job-a 3 &
  local a=$!
  sleep 0.5
  job job-b 2 &
  local b=$!
  sleep 1
  say "while job-a works:"
  "$kubectl" -n demo get lockclaims job-a job-b
  # Each job's own status: one that failed fails the demo.
  wait "$a"
  wait "$b"
  echo
  say "all done. Everything keeps running; try:"
  echo "    export KUBECONFIG=$state/kubeconfig"
  echo "    $kubectl -n demo get lockclaims"
  echo "    $kubectl -n demo annotate lockclaim report-reader-1 zklock.io/revoke=demo"
  echo "    scripts/demo.sh down"
}

case ${1:-up} in
  up) up ;;
  down) down ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
