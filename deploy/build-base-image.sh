#!/usr/bin/env bash
# Build a Debian 12 (bookworm) base image with Python 3.11 without any container registry:
# debootstrap a root file system from the Debian mirror apt already uses, then `docker import`
# it. The images of docker-compose.yml build FROM it with BASE_IMAGE=<tag>.
#
#   sudo deploy/build-base-image.sh [TAG]        (default tag: gradvault-base:bookworm)
#
# Needs root, debootstrap and a running Docker engine. MIRROR overrides the mirror; without
# it and without a Debian source in apt's configuration it stops, asking for MIRROR
# (deploy/apt-mirror.sh reads the sources).
# CA certificates added to this machine (/usr/local/share/ca-certificates, e.g. those of a
# TLS-inspecting proxy) are copied into the image, so pip and apt inside builds trust them.
set -euo pipefail

tag="${1:-gradvault-base:bookworm}"

# the Debian archive of this machine's own apt sources (APT_DIR, default /etc/apt), unless
# MIRROR names one
MIRROR="${MIRROR:-$(bash "$(dirname "$0")/apt-mirror.sh" "${APT_DIR:-/etc/apt}")}" || exit 1

rootfs=$(mktemp -d /tmp/gradvault-base.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

echo "debootstrap bookworm from $MIRROR into $rootfs"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 || { tail -n 20 "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"

shopt -s nullglob
extra_cas=(/usr/local/share/ca-certificates/*.crt)
if ((${#extra_cas[@]})); then
    cp "${extra_cas[@]}" "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
fi
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin

tar -C "$rootfs" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    - "$tag" >/dev/null
echo "built $tag ($(docker run --rm "$tag" python3 --version))"
