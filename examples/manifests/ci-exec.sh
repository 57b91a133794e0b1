#!/usr/bin/env bash
# A CI deployment step that runs only while it holds a cluster-wide lock: one pipeline deploys
# at a time, the others queue (give up after 30 minutes: exit 75).
#
#   KUBECONFIG=... examples/manifests/ci-exec.sh ./deploy.sh production
#
# The CI identity needs on lockclaims in the namespace: create, get, list, watch, delete
# (see ci-role.yaml). The deploy script sees ZKLOCK_FENCING_TOKEN, to pass on to whatever it
# writes; if the lock is revoked it gets SIGTERM (and zklock exits 76), if it is lost, 77.
set -euo pipefail
exec zklock exec deploy-production --namespace ci --timeout 30m -- "$@"
