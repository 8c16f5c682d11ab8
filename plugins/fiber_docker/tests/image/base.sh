#!/usr/bin/env bash
# Print the name of a local Debian bookworm base image with python3 and venv, making it
# first if needed (there is no registry to pull python:3.11-slim from on these machines).
# Recipe: debootstrap --variant=minbase into a temporary folder, then `docker import`.
# The tag carries a hash of this script, so a changed recipe makes a new image.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tag="fibercore-test/base:bookworm-$(sha256sum "$here/base.sh" | cut -c1-12)"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag"
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q debootstrap >&2
  else
    echo "base.sh: debootstrap is missing (apt-get install debootstrap, as root)" >&2
    exit 1
  fi
fi
# The Debian mirror this machine already uses (deb822 sources or the classic list).
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror="$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)"
fi
rootfs="$(mktemp -d /tmp/fiber-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
echo "base.sh: debootstrap bookworm into $rootfs (about a minute)" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$rootfs" ${mirror:+"$mirror"} >&2
tar -C "$rootfs" --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*' \
    --exclude='./usr/share/doc/*' --exclude='./usr/share/man/*' --exclude='./usr/share/locale/*' \
    --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -c . \
  | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$tag" >&2
echo "$tag"
