#!/usr/bin/env bash
# Build the Debian 12 systemd image that the molecule scenarios run in, without any container
# registry (none is reachable here): debootstrap a minimal bookworm from the machine's own
# Debian mirror, tune it to boot systemd inside Docker, and `docker import` it.
#
# Usage: scripts/build-test-image.sh [--force]
#   SGLANG_DEPLOY_TEST_IMAGE  image tag (default sglang-deploy/debian-systemd:bookworm)
#   DEBIAN_MIRROR  mirror URL; default: read from this machine's apt sources at run time
# Needs root, debootstrap and a running Docker engine (scripts/test provides both).
set -euo pipefail
# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

TEST_IMAGE="${SGLANG_DEPLOY_TEST_IMAGE:-sglang-deploy/debian-systemd:bookworm}"
SUITE=bookworm
# Bump when the image recipe below changes, so existing images are rebuilt.
IMAGE_RECIPE=1
force=0
[[ "${1:-}" == "--force" ]] && force=1

if ((force == 0)) &&
  [[ "$(docker image inspect --format '{{ index .Config.Labels "org.sglang-deploy.recipe" }}' "$TEST_IMAGE" 2>/dev/null)" == "$IMAGE_RECIPE" ]]; then
  log "test image ${TEST_IMAGE} (recipe ${IMAGE_RECIPE}) already exists; skipping (--force rebuilds)"
  exit 0
fi
need_root "debootstrap"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"

# The Debian mirror this machine already uses: first `URIs:` of a deb822 stanza whose Suites
# include $SUITE, else the first matching `deb` line. Never hard-coded in the repo.
apt_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    awk -v suite="$SUITE" '
      BEGIN { RS = ""; FS = "\n" }
      {
        uris = ""; ok = 0; deb = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/)   { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uris = u[1] }
          if ($i ~ /^Types:/ && $i ~ /(^|[ \t])deb([ \t]|$)/) deb = 1
          if ($i ~ /^Suites:/) { n = split($i, s, /[ \t]+/); for (j = 2; j <= n; j++) if (s[j] == suite) ok = 1 }
        }
        if (uris != "" && ok && deb) { print uris; exit }
      }' "$f"
  done
  local lists=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] && lists+=("$f")
  done
  ((${#lists[@]})) || return 0
  cat "${lists[@]}" |
    awk -v suite="$SUITE" '$1 == "deb" {
      for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /=/ && $i !~ /\]$/) break
      if ($(i + 1) == suite) { print $i; exit } }'
}
mirror="${DEBIAN_MIRROR:-}"
[[ -n "$mirror" ]] || mirror="$(apt_mirror | sed -n 1p)"
[[ -n "$mirror" ]] || die "no Debian ${SUITE} mirror found in /etc/apt/sources*; set DEBIAN_MIRROR=<url>"

work="${REPO_ROOT}/.cache/test-image"
rootfs="${work}/rootfs"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

log "debootstrap ${SUITE} (minbase + systemd) from the configured apt mirror (~1 min)"
timeout 900 debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,python3,sudo,ca-certificates \
  "$SUITE" "$rootfs" "$mirror" >"${work}/debootstrap.log" 2>&1 || {
  tail -n 30 "${work}/debootstrap.log" >&2
  tail -n 30 "${rootfs}/debootstrap/debootstrap.log" >&2 2>/dev/null || true
  die "debootstrap failed (mirror from apt sources; override with DEBIAN_MIRROR=)"
}

log "tuning the root filesystem for systemd in a container"
# Units that need real hardware, a console or kernel privileges a container lacks fail at boot
# and turn `systemctl is-system-running` into "degraded"; timers would race the tests for apt.
masked=(
  systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket
  systemd-udev-trigger.service systemd-udev-settle.service systemd-hwdb-update.service
  getty.target getty@tty1.service console-getty.service serial-getty@.service
  systemd-logind.service systemd-firstboot.service systemd-remount-fs.service
  systemd-modules-load.service systemd-sysctl.service systemd-machine-id-commit.service
  systemd-journald-audit.socket systemd-pstore.service systemd-binfmt.service
  dev-hugepages.mount dev-mqueue.mount sys-kernel-config.mount sys-kernel-debug.mount
  sys-kernel-tracing.mount sys-fs-fuse-connections.mount proc-sys-fs-binfmt_misc.automount
  apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer
)
for unit in "${masked[@]}"; do
  ln -sfn /dev/null "${rootfs}/etc/systemd/system/${unit}"
done

# machine-id policy: empty in the image, so systemd makes a fresh one at each container boot
# (no two instances share an id); D-Bus reads the same file.
: >"${rootfs}/etc/machine-id"
rm -f "${rootfs}/var/lib/dbus/machine-id"
ln -sfn /etc/machine-id "${rootfs}/var/lib/dbus/machine-id"

# Boot to multi-user (no graphical/rescue prompts), journal in memory only (fast, no disk growth).
ln -sfn /lib/systemd/system/multi-user.target "${rootfs}/etc/systemd/system/default.target"
mkdir -p "${rootfs}/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n' >"${rootfs}/etc/systemd/journald.conf.d/container.conf"

# Same apt sources as this machine (the roles under test install packages from there).
if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
  rm -f "${rootfs}/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/*.sources "${rootfs}/etc/apt/sources.list.d/"
elif [[ -f /etc/apt/sources.list ]]; then
  cp /etc/apt/sources.list "${rootfs}/etc/apt/sources.list"
fi
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
  >"${rootfs}/etc/apt/apt.conf.d/90-test-image"
# Keep the image small: no cached .debs, no docs a test would never read.
rm -rf "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/lib/apt/lists/* \
  "${rootfs}"/usr/share/doc/* "${rootfs}"/usr/share/man/*

log "docker import ${TEST_IMAGE}"
# `docker import --change` takes no STOPSIGNAL: the molecule platforms set stop_signal SIGRTMIN+3.
tar --numeric-owner --xattrs -C "$rootfs" -c . |
  docker import \
    --change 'ENV container=docker' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/sbin/init"]' \
    --change "LABEL org.sglang-deploy.recipe=${IMAGE_RECIPE}" \
    --change "LABEL org.sglang-deploy.suite=${SUITE}" \
    --message "debootstrap ${SUITE} minbase + systemd (scripts/build-test-image.sh)" \
    - "$TEST_IMAGE" >/dev/null
log "built ${TEST_IMAGE} ($(docker image inspect --format '{{.Size}}' "$TEST_IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
