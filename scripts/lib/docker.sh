#!/usr/bin/env bash
# Docker engine and host packages for the molecule tests.
# CI machines run no systemd and no Docker engine: we install Debian's docker.io and start
# dockerd by hand, with no bridge and no iptables (containers use host networking, so all test
# traffic stays on loopback). We stop dockerd at the end only if we started it.
# Sourced after scripts/lib/common.sh.

DOCKERD_PID=""
DOCKERD_LOG="${DOCKERD_LOG:-${REPO_ROOT}/.cache/dockerd.log}"
DOCKERD_START_TIMEOUT="${DOCKERD_START_TIMEOUT:-90}"
APT_UPDATED=0

# ensure_apt_packages PKG...: install the Debian packages that are missing (apt-get update once).
ensure_apt_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    # shellcheck disable=SC2016 # ${Status} is dpkg-query's format, not a shell variable
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  need_root "installing ${missing[*]}"
  log "apt-get install ${missing[*]}"
  local apt_log="${REPO_ROOT}/.cache/apt.log"
  mkdir -p "${REPO_ROOT}/.cache"
  if ((APT_UPDATED == 0)); then
    timeout 600 apt-get update -qq >"$apt_log" 2>&1 || {
      tail -n 20 "$apt_log" >&2
      die "apt-get update failed; check the machine's apt sources."
    }
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive timeout 1200 \
    apt-get install -y -qq "${missing[@]}" >>"$apt_log" 2>&1 || {
    tail -n 20 "$apt_log" >&2
    die "apt-get install ${missing[*]} failed (log: ${apt_log})."
  }
}

docker_up() { timeout 20 docker info >/dev/null 2>&1; }

# docker_ensure_engine: make `docker info` work, starting dockerd ourselves if needed.
docker_ensure_engine() {
  if docker_up; then
    log "Docker engine already running; using it."
    return 0
  fi
  command -v dockerd >/dev/null 2>&1 || ensure_apt_packages docker.io
  need_root "starting dockerd"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  log "starting dockerd (--bridge=none --iptables=false), log: ${DOCKERD_LOG}"
  # setsid: dockerd must not get the terminal's signals (Ctrl-C is handled by our trap).
  setsid dockerd --bridge=none --iptables=false --ip6tables=false \
    --host=unix:///var/run/docker.sock >"$DOCKERD_LOG" 2>&1 </dev/null &
  DOCKERD_PID=$!
  if ! wait_for "$DOCKERD_START_TIMEOUT" "dockerd to answer" docker_up; then
    tail -n 40 "$DOCKERD_LOG" >&2 || true
    docker_stop_engine
    die "dockerd did not come up within ${DOCKERD_START_TIMEOUT}s (log above: ${DOCKERD_LOG})."
  fi
  log "dockerd up (pid ${DOCKERD_PID}, storage driver $(docker info --format '{{.Driver}}' 2>/dev/null))"
}

# docker_stop_engine: stop dockerd only if this script started it; bounded wait, then SIGKILL.
docker_stop_engine() {
  [[ -n "$DOCKERD_PID" ]] || return 0
  stop_process "$DOCKERD_PID" dockerd 30
  DOCKERD_PID=""
}
