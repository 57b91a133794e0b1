#!/usr/bin/env bash
# Gate a CI deployment step on a cluster-wide lock: only one pipeline deploys at a time.
#   examples/manifests/ci-gate.sh NAMESPACE LOCK -- COMMAND...
# Takes the lock (waiting for it), runs COMMAND, and releases the lock whatever happens.
set -euo pipefail
ns=$1 lock=$2; shift 2; [[ ${1:-} == -- ]] && shift
claim="ci-${lock}-$(date +%s)-$$"
release() { kubectl -n "$ns" delete lockclaim "$claim" --ignore-not-found --wait=false >/dev/null; }
trap release EXIT
kubectl -n "$ns" apply -f - >/dev/null <<CLAIM
apiVersion: zklock.io/v1alpha1
kind: LockClaim
metadata:
  name: $claim
spec:
  lockName: $lock
  acquireTimeoutSeconds: 1800
CLAIM
echo "waiting for lock $lock ($claim)"
kubectl -n "$ns" wait --for=condition=Held "lockclaim/$claim" --timeout=30m
echo "holding lock $lock; fencing token $(kubectl -n "$ns" get lockclaim "$claim" -o jsonpath='{.status.fencingToken}')"
"$@"
