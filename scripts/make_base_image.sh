#!/usr/bin/env bash
# Makes the container base image localhost/debian-minbase:bookworm from Debian's
# own packages: `debootstrap --variant=minbase bookworm` into a folder, piped
# into `podman import`. No image registry is needed (none is reachable on the
# machines this project builds on); on a machine that reaches Docker Hub the
# Dockerfile's default base, debian:bookworm-slim, serves instead.
#
#   scripts/make_base_image.sh            prints the image name on stdout
#
# Idempotent and cached: when the image exists nothing is done. Set
# DECODED_BASE_REBUILD=1 to make it again (e.g. for Debian point releases).
# Environment: DECODED_BASE_IMAGE (localhost/debian-minbase:bookworm),
# DEBIAN_MIRROR (http://deb.debian.org/debian). Needs root, debootstrap, podman.
set -euo pipefail
image="${DECODED_BASE_IMAGE:-localhost/debian-minbase:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
log() { echo "make_base_image: $*" >&2; }

if [[ "${DECODED_BASE_REBUILD:-0}" != 1 ]] && podman image exists "$image"; then
  log "$image exists"
  echo "$image"
  exit 0
fi

root="$(mktemp -d /var/tmp/debian-minbase.XXXXXX)"
trap 'rm -rf "$root"' EXIT
start=$SECONDS
log "debootstrap --variant=minbase bookworm from $mirror (a few minutes)"
debootstrap --variant=minbase bookworm "$root" "$mirror" >&2
# The point-release and security updates, as on a Debian host; no recommends,
# and no documentation or apt lists kept (as in Debian's own slim images).
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
SOURCES
cat >"$root/etc/apt/apt.conf.d/90container" <<'APT'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; };
APT
cat >"$root/etc/dpkg/dpkg.cfg.d/90container-nodoc" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
DPKG
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/*/[!c]* "$root"/usr/share/man/* "$root"/usr/share/locale/*
tar --numeric-owner --xattrs -C "$root" -c . |
  podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$image" >&2
log "$image made in $((SECONDS - start)) s"
echo "$image"
