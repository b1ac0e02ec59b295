#!/usr/bin/env bash
# Shared helpers for scripts/*: logging, fatal errors, bounded waits and timed steps.
# Sourced, never executed; the caller sets `set -euo pipefail`.

# Repository root, whatever the caller's working directory is.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export REPO_ROOT

# Colour only on a terminal, and never when NO_COLOR is set (CI logs are read as text).
if [[ -t 2 && -z "${NO_COLOR:-}" ]]; then
  C_BLUE=$'\033[1;34m' C_YELLOW=$'\033[1;33m' C_RED=$'\033[1;31m' C_OFF=$'\033[0m'
else
  C_BLUE="" C_YELLOW="" C_RED="" C_OFF=""
fi

log() { printf '==> %s\n' "$*" >&2; }
warn() { printf '%sWARNING:%s %s\n' "$C_YELLOW" "$C_OFF" "$*" >&2; }
die() {
  printf '%sERROR:%s %s\n' "$C_RED" "$C_OFF" "$*" >&2
  exit 1
}

need_root() {
  [[ "$(id -u)" -eq 0 ]] || die "$1 needs root (apt-get, dockerd, debootstrap); run it as root, e.g. in CI."
}

# wait_for SECONDS DESCRIPTION CMD...: poll CMD once a second until it succeeds or SECONDS pass.
wait_for() {
  local limit="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      warn "timed out after ${limit}s waiting for ${what}"
      return 1
    fi
    sleep 1
  done
}

# Timed steps: `run_step NAME CMD...` announces the step, runs it, records its wall time,
# and stops the whole run at the first failure (fail fast) naming the step. The caller's EXIT
# trap prints the summary (print_summary), also when a step dies half-way.
STEP_NAMES=()
STEP_TIMES=()
STEP_RESULTS=()
CURRENT_STEP=""
CURRENT_STEP_START=0

# stop_process PID NAME SECONDS: SIGTERM, a bounded wait, then SIGKILL.
stop_process() {
  local pid="$1" name="$2" grace="$3"
  kill -0 "$pid" 2>/dev/null || return 0
  log "stopping ${name} (pid ${pid})"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + grace))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    warn "${name} (pid ${pid}) did not stop within ${grace}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

run_step() {
  local name="$1"
  shift
  local rc=0
  CURRENT_STEP="$name"
  CURRENT_STEP_START=$SECONDS
  printf '\n%s===== [%s] %s =====%s\n' "$C_BLUE" "$(date +%H:%M:%S)" "$name" "$C_OFF" >&2
  "$@" || rc=$?
  STEP_NAMES+=("$name")
  STEP_TIMES+=("$((SECONDS - CURRENT_STEP_START))")
  CURRENT_STEP=""
  if ((rc == 0)); then
    STEP_RESULTS+=("ok")
  else
    STEP_RESULTS+=("FAILED (exit ${rc})")
    die "step '${name}' failed (exit ${rc}); its output is above."
  fi
}

# Record a step that was deliberately not run, so the summary says so.
skip_step() {
  STEP_NAMES+=("$1")
  STEP_TIMES+=("0")
  STEP_RESULTS+=("SKIPPED: $2")
  warn "SKIPPED $1: $2"
}

print_summary() {
  local i total=0
  if [[ -n "$CURRENT_STEP" ]]; then
    # A step that died (exit inside it) never got recorded by run_step.
    STEP_NAMES+=("$CURRENT_STEP")
    STEP_TIMES+=("$((SECONDS - CURRENT_STEP_START))")
    STEP_RESULTS+=("FAILED (aborted)")
    CURRENT_STEP=""
  fi
  printf '\n===== timing summary =====\n' >&2
  for i in "${!STEP_NAMES[@]}"; do
    printf '%6ss  %-42s %s\n' "${STEP_TIMES[$i]}" "${STEP_NAMES[$i]}" "${STEP_RESULTS[$i]}" >&2
    total=$((total + STEP_TIMES[i]))
  done
  printf '%6ss  %s\n' "$total" "total" >&2
}
