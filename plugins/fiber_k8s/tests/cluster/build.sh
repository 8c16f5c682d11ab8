#!/usr/bin/env bash
# Build kube-apiserver, kubelet, kube-scheduler and kube-controller-manager from Debian
# bookworm's source package `kubernetes` (1.20.2, with vendor/), with Debian's Go, and
# cache them by version outside the checkout. Prints the directory of the binaries.
#
#   tests/cluster/build.sh            # ~5-10 min the first time on 2 cores, then instant
#   FIBER_K8S_CACHE=/somewhere ...    # cache root (default /var/cache/fibercore-k8s)
#
# Kubernetes 1.20 vendors github.com/modern-go/reflect2 1.0.1, which crashes the binaries
# when built with Go >= 1.18 ("fatal error: fault" in aeshashbody, the API server dies
# within seconds): the vendored copy is replaced by Debian's reflect2 1.0.2.
# The kubelet gets three one-line changes (sed below) so that it runs on a VM that forbids
# negative oom_score_adj and must not have its kernel tunables changed:
#   1. container_manager_linux.go: KernelTunableModify -> KernelTunableWarn (no sysctl writes)
#   2. dockershim/docker_sandbox.go: sandbox OomScoreAdj -998 -> 0
#   3. qos/policy.go: Guaranteed pods' OomScoreAdj -997 -> 0
set -euo pipefail
VERSION=1.20.2
CACHE="${FIBER_K8S_CACHE:-/var/cache/fibercore-k8s}/$VERSION"
BIN="$CACHE/bin"
WANT="kube-apiserver kubelet kube-scheduler kube-controller-manager"
have=1
for b in $WANT; do [ -x "$BIN/$b" ] || have=0; done
if [ "$have" = 1 ]; then echo "$BIN"; exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "build.sh: building Kubernetes needs root on Debian (apt-get golang-go and the source package)" >&2
  exit 1
fi
missing=""
for pkg in golang-go:go etcd-server:etcd rsync:rsync jq:jq; do
  command -v "${pkg#*:}" >/dev/null || missing="$missing ${pkg%%:*}"
done
REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2
[ -f "$REFLECT2/go_above_118.go" ] || missing="$missing golang-github-modern-go-reflect2-dev"
if [ -n "$missing" ]; then
  # policy-rc.d keeps Debian from starting etcd as a service: the tests start their own.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -q --no-install-recommends $missing >&2 || { apt-get update -q >&2; apt-get install -y -q --no-install-recommends $missing >&2; }
  rm -f /usr/sbin/policy-rc.d
fi
work="$CACHE/src"
mkdir -p "$work/apt/parts" "$work/apt/lists/partial"
cd "$work"
if [ ! -d "kubernetes-$VERSION" ]; then
  src_list=/etc/apt/sources.list.d/debian.sources
  if [ -f "$src_list" ]; then
    sed 's/^Types: deb$/Types: deb-src/' "$src_list" > apt/parts/src.sources
  else
    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > apt/parts/src.list
  fi
  O="-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$work/apt/parts -o Dir::State::Lists=$work/apt/lists"
  apt-get $O update -q >&2
  apt-get $O source --download-only kubernetes >&2
  tar xzf kubernetes_*.orig.tar.gz
  cd "kubernetes-$VERSION"
  sed -i 's/b := KernelTunableModify/b := KernelTunableWarn/' pkg/kubelet/cm/container_manager_linux.go
  sed -i 's/defaultSandboxOOMAdj int = -998/defaultSandboxOOMAdj int = 0/' pkg/kubelet/dockershim/docker_sandbox.go
  sed -i 's/guaranteedOOMScoreAdj int = -997/guaranteedOOMScoreAdj int = 0/' pkg/kubelet/qos/policy.go
  grep -q 'b := KernelTunableWarn' pkg/kubelet/cm/container_manager_linux.go
  grep -q 'defaultSandboxOOMAdj int = 0' pkg/kubelet/dockershim/docker_sandbox.go
  grep -q 'guaranteedOOMScoreAdj int = 0' pkg/kubelet/qos/policy.go
  mkdir -p .go/src/k8s.io && ln -sfn ../../.. .go/src/k8s.io/kubernetes
  cd "$work"
fi
cd "kubernetes-$VERSION"
if [ ! -f vendor/github.com/modern-go/reflect2/go_above_118.go ]; then
  rm -rf vendor/github.com/modern-go/reflect2
  mkdir -p vendor/github.com/modern-go/reflect2
  cp "$REFLECT2"/*.go "$REFLECT2"/*.s vendor/github.com/modern-go/reflect2/
fi
echo "build.sh: building $WANT (about 5-10 minutes on 2 cores)" >&2
GOPATH=$PWD/.go CGO_ENABLED=0 GOCACHE="$CACHE/gocache" HOME="$CACHE/home" \
  make WHAT="cmd/kube-apiserver cmd/kubelet cmd/kube-scheduler cmd/kube-controller-manager" >&2
mkdir -p "$BIN"
for b in $WANT; do cp "_output/local/bin/linux/amd64/$b" "$BIN/"; done
echo "$BIN"
