#!/usr/bin/env bash
# Bring up a real single-node Kubernetes 1.20 on this machine, everything on 127.0.0.1:
# etcd (Debian), kube-apiserver, kube-controller-manager, kube-scheduler and a kubelet
# driving the local dockerd through dockershim (binaries from build.sh).
#
#   tests/cluster/up.sh [STATE_DIR]    # prints the kubeconfig path when the node is Ready
#   tests/cluster/down.sh [STATE_DIR]  # stops every daemon by the PID recorded here
#
# Needs root (the kubelet mounts and talks to dockerd). Pods should use hostNetwork and
# imagePullPolicy Never/IfNotPresent (no CNI, no registry).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
STATE="${1:-${FIBER_K8S_STATE:-/tmp/fibercore-k8s}}"
BIN="$("$here/build.sh")"
PAUSE_IMAGE="fibercore-test/pause:3.2"
mkdir -p "$STATE"/{etcd,certs,kubelet,varlog,logs,run}
cd "$STATE"
if [ -f pids ] && [ -s pids ]; then
  echo "up.sh: $STATE already has a cluster (pids); run down.sh first" >&2
  exit 1
fi
: > pids
start() {  # start NAME CMD...: in the background, own session, output in logs/NAME.log, pid recorded
  local name="$1"; shift
  setsid "$@" > "logs/$name.log" 2>&1 &
  echo "$name $!" >> pids
}
wait_for() {  # wait_for WHAT SECONDS CMD...
  local what="$1" secs="$2"; shift 2
  for _ in $(seq 1 $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "up.sh: $what not ready after ${secs}s; see $STATE/logs" >&2
  return 1
}

# The pause image (pod sandbox), built once.
if ! docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1; then
  mkdir -p pause-root
  gcc -O2 -static -o pause-root/pause "$here/pause.c"
  tar -C pause-root -c . | docker import --change 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
fi

# Credentials: a service-account key pair and a static admin token.
[ -f certs/sa.key ] || openssl genrsa -out certs/sa.key 2048 2>/dev/null
[ -f certs/sa.pub ] || openssl rsa -in certs/sa.key -pubout -out certs/sa.pub 2>/dev/null
[ -f certs/token ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > certs/token
TOKEN="$(cat certs/token)"
echo "$TOKEN,admin,1,system:masters" > certs/tokens.csv

start etcd etcd --data-dir "$STATE/etcd" --name fiber-test \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster fiber-test=http://127.0.0.1:2380
wait_for etcd 30 curl -fsS http://127.0.0.1:2379/health

start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=6443 --insecure-port=0 \
  --cert-dir="$STATE/certs" --token-auth-file="$STATE/certs/tokens.csv" --authorization-mode=AlwaysAllow \
  --service-account-key-file="$STATE/certs/sa.pub" --service-account-signing-key-file="$STATE/certs/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.96.0.0/24 \
  --disable-admission-plugins=ServiceAccount --allow-privileged=true \
  --kubelet-preferred-address-types=Hostname
wait_for kube-apiserver 90 test -f "$STATE/certs/apiserver.crt"
cat > kubeconfig <<KC
apiVersion: v1
kind: Config
clusters:
- name: fiber-test
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: $STATE/certs/apiserver.crt
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: fiber-test
  context: {cluster: fiber-test, user: admin, namespace: default}
current-context: fiber-test
KC
wait_for kube-apiserver 90 curl -fsS --cacert certs/apiserver.crt -H "Authorization: Bearer $TOKEN" https://127.0.0.1:6443/readyz

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$STATE/kubeconfig" \
  --leader-elect=false --port=0 --secure-port=10257 --bind-address=127.0.0.1 \
  --service-account-private-key-file="$STATE/certs/sa.key" --root-ca-file="$STATE/certs/apiserver.crt" \
  --controllers='*,-serviceaccount-token'
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$STATE/kubeconfig" --leader-elect=false --port=0 \
  --bind-address=127.0.0.1

# The kubelet in its own mount namespace: /var/log/pods is hard-coded, keep it in $STATE.
start kubelet unshare -m --propagation private sh -c "mount --bind '$STATE/varlog' /var/log && exec '$BIN/kubelet' \
  --kubeconfig='$STATE/kubeconfig' --container-runtime=docker --docker-endpoint=unix:///var/run/docker.sock \
  --container-runtime-endpoint='unix://$STATE/run/dockershim.sock' \
  --experimental-dockershim-root-directory='$STATE/kubelet/dockershim' --root-dir='$STATE/kubelet' \
  --cert-dir='$STATE/kubelet/pki' --volume-plugin-dir='$STATE/kubelet/plugins' \
  --seccomp-profile-root='$STATE/kubelet/seccomp' --pod-infra-container-image=$PAUSE_IMAGE \
  --hostname-override=localhost --address=127.0.0.1 --read-only-port=0 --healthz-bind-address=127.0.0.1 \
  --cgroup-driver=cgroupfs --cgroups-per-qos=false --enforce-node-allocatable= --fail-swap-on=false \
  --make-iptables-util-chains=false --hairpin-mode=none --image-gc-high-threshold=100 \
  --image-gc-low-threshold=99 --eviction-hard='memory.available<10Mi' --anonymous-auth=true \
  --authorization-mode=AlwaysAllow"

kubectl_() { curl -fsS --cacert certs/apiserver.crt -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:6443$1"; }
node_ready() {
  kubectl_ /api/v1/nodes/localhost | jq -e '(.status.conditions[] | select(.type=="Ready") | .status=="True")
    and ((.spec.taints // []) | length == 0)' >/dev/null
}
wait_for "the node" 120 node_ready
echo "$STATE/kubeconfig"
