#!/usr/bin/env bash
# Run a binary from a Debian package WITHOUT installing the package:
#
#   bash scripts/debian-tool.sh PACKAGE BINARY [ARGS...]
#   bash scripts/debian-tool.sh prometheus promtool check rules monitoring/prometheus/sglang-alerts.yml
#
# The package's .deb is fetched with `apt-get download` (signature-checked by apt, from the machine's
# Debian sources) and unpacked with `dpkg-deb -x` into .cache/debian-tools/PACKAGE/ (once; later calls
# use the unpacked copy). Nothing is installed, so no service starts: installing `prometheus` would
# start a Prometheus server listening on every interface, and `prometheus-node-exporter` another one.
# Used for promtool (the alert rules' checks and unit tests, scripts/test) and for node_exporter
# (scripts/record-metrics.sh). BINARY is looked up in the package's usr/bin and usr/sbin.
set -euo pipefail
# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

(($# >= 2)) || die "usage: bash scripts/debian-tool.sh PACKAGE BINARY [ARGS...]"
pkg="$1" binary="$2"
shift 2
[[ "$pkg" =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || die "not a Debian package name: '${pkg}'"
[[ "$binary" =~ ^[A-Za-z0-9._-]+$ ]] || die "not a binary name: '${binary}'"

cache="${REPO_ROOT}/.cache/debian-tools/${pkg}"
mkdir -p "${REPO_ROOT}/.cache/debian-tools"
# A fetch that fails half-way leaves no staging directory behind (exec below replaces the shell, so
# the trap only ever runs on a failure).
staging=""
trap 'if [[ -n "$staging" ]]; then rm -rf "$staging"; fi' EXIT

unpack() {
  # Fetch and unpack under a lock (parallel test workers may ask at once), into a staging directory
  # renamed into place only when complete, so a stopped run never leaves half a package behind.
  [[ -f "${cache}/.unpacked" ]] && return 0
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
    die "apt-get and dpkg-deb are needed to fetch ${pkg} (a Debian machine)"
  staging="$(mktemp -d "${REPO_ROOT}/.cache/debian-tools/.${pkg}.XXXXXX")"
  log "fetching Debian's ${pkg} (apt-get download; not installed) into ${cache}"
  # apt's sandbox user cannot write into a root-owned staging directory: download as the caller.
  if ! (cd "$staging" && timeout 300 apt-get download -qq -o APT::Sandbox::User=root "$pkg" >"${staging}/apt.log" 2>&1); then
    # A fresh machine may have no package lists yet: refresh them once and retry.
    log "apt-get download ${pkg} failed; apt-get update, then again"
    timeout 600 apt-get update -qq >>"${staging}/apt.log" 2>&1 || true
    (cd "$staging" && timeout 300 apt-get download -qq -o APT::Sandbox::User=root "$pkg" >>"${staging}/apt.log" 2>&1) || {
      tail -n 20 "${staging}/apt.log" >&2
      die "apt-get download ${pkg} failed (the machine's Debian sources must offer it; Debian 12 has it)"
    }
  fi
  local deb
  deb="$(find "$staging" -maxdepth 1 -name "${pkg}_*.deb" -print -quit)"
  [[ -n "$deb" ]] || die "apt-get download ${pkg} left no ${pkg}_*.deb"
  dpkg-deb -x "$deb" "${staging}/root"
  basename "$deb" >"${staging}/root/.unpacked"
  rm -rf "$cache"
  mv "${staging}/root" "$cache"
  rm -rf "$staging"
  staging=""
}

exec 9>"${REPO_ROOT}/.cache/debian-tools/.lock"
timeout 900 flock 9 || die "timed out waiting for the lock on .cache/debian-tools"
unpack
exec 9>&-

for dir in usr/bin usr/sbin bin sbin; do
  if [[ -x "${cache}/${dir}/${binary}" ]]; then
    exec "${cache}/${dir}/${binary}" "$@"
  fi
done
die "${pkg} ($(cat "${cache}/.unpacked")) has no ${binary} in usr/bin or usr/sbin"
