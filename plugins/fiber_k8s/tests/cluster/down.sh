#!/usr/bin/env bash
# Stop the cluster up.sh started: each daemon by the PID recorded in STATE/pids (kubelet
# first, etcd last), then remove the pod containers the kubelet left on dockerd.
set -uo pipefail
STATE="${1:-${FIBER_K8S_STATE:-/tmp/fibercore-k8s}}"
[ -f "$STATE/pids" ] || exit 0
tac "$STATE/pids" | while read -r name pid; do
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
done
: > "$STATE/pids"
# Pod and sandbox containers carry dockershim's labels; only ours exist on this dockerd.
ids="$(docker ps -aq --filter label=io.kubernetes.docker.type 2>/dev/null)"
[ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
rm -rf "$STATE/etcd"
