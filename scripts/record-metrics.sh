#!/usr/bin/env bash
# Record the real /metrics pages the monitoring (monitoring/: dashboard, alert rules) is checked
# against (tests/unit/observe/test_monitoring.py: every metric name a query uses must be in a recording).
#
#   bash scripts/record-metrics.sh router          the pinned router, smg (the role's lock), in front of
#                                                  two stand-in workers -> tests/fixtures/router-metrics/
#   bash scripts/record-metrics.sh node-exporter   Debian 12's prometheus-node-exporter (unpacked, not
#                                                  installed) -> tests/fixtures/node-exporter-metrics/
#   bash scripts/record-metrics.sh watchdog        the watchdog's textfile (watchdog.metrics_text of a
#                                                  watchdog that gave up) as that node_exporter's textfile
#                                                  collector serves it -> tests/fixtures/node-exporter-metrics/
#
# Everything listens on 127.0.0.1 (free ports), runs for seconds, and is stopped by its PID. The
# router is the real binary from the pinned wheel (roles/sglang_router/files/locks, installed with
# --require-hashes into .cache/record-metrics/router-venv); the workers are the HTTP stand-in
# (tests/standin/sglang_worker_standin.py), so only the router's page is real here: sglang's own page
# is recorded on a real GPU (tests/fixtures/real-sglang/day2/).
set -euo pipefail
# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "$REPO_ROOT"

WORK="${REPO_ROOT}/.cache/record-metrics"
PIDS=()
cleanup() {
  local pid
  if [[ -n "${router_pid:-}" ]]; then stop_router; fi
  for pid in "${PIDS[@]}"; do stop_process "$pid" "recorded process" 10; done
}

# stop_router: SIGTERM to the router's process group (the launcher and smg), as systemd
# stops the unit; a bounded wait, then SIGKILL to the group.
stop_router() {
  local deadline=$((SECONDS + 15))
  kill -TERM -- "-${router_pid}" 2>/dev/null || true
  while kill -0 -- "-${router_pid}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
  kill -KILL -- "-${router_pid}" 2>/dev/null || true
  wait "$router_pid" 2>/dev/null || true
  router_pid=""
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# scrape URL FILE: one bounded GET of a metrics page into FILE.
scrape() {
  curl -fsS -m 10 --max-filesize 4000000 "$1" -o "$2" || die "scraping $1 failed"
}

record_node_exporter() {
  local out="${REPO_ROOT}/tests/fixtures/node-exporter-metrics" port pid
  mkdir -p "$out" "$WORK"
  # node_exporter prints its version on stderr; the fetch's own log line comes first there.
  bash scripts/debian-tool.sh prometheus-node-exporter prometheus-node-exporter --version 2>&1 |
    grep -m1 '^node_exporter, version' >"${out}/version.txt"
  port="$(free_port)"
  bash scripts/debian-tool.sh prometheus-node-exporter prometheus-node-exporter \
    --web.listen-address="127.0.0.1:${port}" >"${WORK}/node-exporter.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_for 30 "node_exporter on 127.0.0.1:${port}" curl -fsS -m 2 -o /dev/null "http://127.0.0.1:${port}/metrics" ||
    die "node_exporter did not answer (log: ${WORK}/node-exporter.log)"
  sleep 2
  scrape "http://127.0.0.1:${port}/metrics" "${out}/metrics.txt"
  stop_process "$pid" node_exporter 10
  log "node_exporter: $(grep -c '^# TYPE' "${out}/metrics.txt") families -> ${out}/metrics.txt"
}

record_watchdog() {
  local out="${REPO_ROOT}/tests/fixtures/node-exporter-metrics" port pid textfiles="${WORK}/textfile"
  mkdir -p "$out" "$textfiles"
  # The file the watchdog writes in its state directory, from its own code: a watchdog that gave up after
  # 3 restarts in the last hour (what the alert SglangWatchdogGivingUp reads).
  PYTHONPATH="${REPO_ROOT}/module_utils" python3 - "${textfiles}/sglang-watchdog.prom" <<'PY'
import sys, time
from sglang_deploy_host import watchdog as wd
from sglang_deploy_host.watch import model as watch_model
now = time.time()
config = watch_model.Config(unit="sglang.service", url="http://127.0.0.1:8000", env_file=None, api_key_env=None,
                   expected_gpus=8, state_file="/dev/null", failures=3, backoff_initial_s=600, backoff_max_s=7200,
                   timeout_s=60, start_grace_s=2400, stable_s=3600, max_restarts_per_hour=3, service_user="sglang")
state = watch_model.State(failures=3, restarts=3, restarts_total=7, restart_times=[now - 3000, now - 1900, now - 700],
                 giving_up_until=now + 600, last_result=watch_model.GIVING_UP)
open(sys.argv[1], "w").write(wd.metrics_text(config, state, now))
PY
  port="$(free_port)"
  bash scripts/debian-tool.sh prometheus-node-exporter prometheus-node-exporter --web.listen-address="127.0.0.1:${port}" \
    --collector.disable-defaults --collector.textfile --collector.textfile.directory="$textfiles" \
    >"${WORK}/node-exporter-textfile.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_for 30 "node_exporter on 127.0.0.1:${port}" curl -fsS -m 2 -o /dev/null "http://127.0.0.1:${port}/metrics" ||
    die "node_exporter did not answer (log: ${WORK}/node-exporter-textfile.log)"
  scrape "http://127.0.0.1:${port}/metrics" "${WORK}/textfile-metrics.txt"
  stop_process "$pid" node_exporter 10
  # node_exporter's own go_*/process_* series are in metrics.txt already: keep the textfile collector's.
  grep -E '^(# (HELP|TYPE) )?(sglang_watchdog_|node_textfile_)' "${WORK}/textfile-metrics.txt" >"${out}/watchdog-textfile.txt"
  grep -q '^node_textfile_scrape_error 0$' "${out}/watchdog-textfile.txt" ||
    die "node_exporter could not read the watchdog's textfile (${out}/watchdog-textfile.txt)"
  log "watchdog textfile: $(grep -c '^sglang_watchdog_' "${out}/watchdog-textfile.txt") series -> ${out}/watchdog-textfile.txt"
}

router_venv() {
  local py lock venv="${WORK}/router-venv"
  py="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  lock="roles/sglang_router/files/locks/smg-py${py}.txt"
  [[ -f "$lock" ]] || die "no router lock for Python ${py} (${lock}); run with Python 3.11 or 3.12"
  if ! cmp -s "$lock" "${venv}/.lock" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    timeout 600 "${venv}/bin/pip" install -q --require-hashes --only-binary=:all: -r "$lock" >"${WORK}/pip.log" 2>&1 ||
      die "installing ${lock} failed (log: ${WORK}/pip.log)"
    cp "$lock" "${venv}/.lock"
  fi
  printf '%s\n' "$venv"
}

# start_worker NAME PORT KEY [STAND-IN FLAGS...]
start_worker() {
  local name="$1" port="$2" key="$3"
  shift 3
  python3 tests/standin/sglang_worker_standin.py --model-path standin/model --served-model-name glm-5 \
    --host 127.0.0.1 --port "$port" --api-key "$key" --enable-metrics "$@" >"${WORK}/${name}.log" 2>&1 &
  PIDS+=("$!")
  eval "${name}_pid=$!"
  wait_for 30 "stand-in ${name}" curl -fsS -m 2 -o /dev/null "http://127.0.0.1:${port}/health" ||
    die "stand-in ${name} did not start (log: ${WORK}/${name}.log)"
}

# start_router VENV PORT METRICS_PORT KEY WORKER_URL... -- EXTRA ROUTER FLAGS...
start_router() {
  local venv="$1" port="$2" mport="$3" key="$4"
  shift 4
  local urls=()
  while (($#)) && [[ "$1" != "--" ]]; do urls+=("$1") && shift; done
  shift
  # The role's launcher: the key from the environment, never in argv; colour codes stripped. It
  # ignores SIGTERM (systemd signals the whole unit), so it runs in a session of its own and is
  # stopped the same way, by its process group (stop_router).
  SGLANG_ROUTER_API_KEY="$key" setsid "${venv}/bin/python3" module_utils/sglang_deploy_host/serving/sglang_launcher.py \
    --module smg.launch_router --strip-ansi --env-flag api-key=SGLANG_ROUTER_API_KEY -- \
    --host 127.0.0.1 --port "$port" --worker-urls "${urls[@]}" \
    --health-check-interval-secs 1 --health-check-timeout-secs 2 --health-failure-threshold 2 \
    --health-success-threshold 1 --health-check-endpoint /health --request-timeout-secs 30 \
    --shutdown-grace-period-secs 2 --prometheus-host 127.0.0.1 --prometheus-port "$mport" --log-level info \
    "$@" >"${WORK}/router.log" 2>&1 &
  router_pid=$!
  wait_for 60 "the router's /readiness" bash -c "curl -fsS -m 2 http://127.0.0.1:${port}/readiness | grep -q ready" ||
    die "the router did not get ready (log: ${WORK}/router.log)"
}

# call ROUTER_URL KEY WHAT PATH BODY: one request through the router, its status logged.
call() {
  local code
  code="$(curl -s -m 30 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $2" \
    -H 'Content-Type: application/json' "$1$4" -d "$5")" || true
  printf '%s %s\n' "$3" "$code" >>"${WORK}/calls.txt"
}

traffic() {
  local r="$1" key="$2" rounds="$3" i
  for ((i = 1; i <= rounds; i++)); do
    call "$r" "$key" generate /generate "{\"text\":\"Say hello ${i}\",\"sampling_params\":{\"max_new_tokens\":16}}"
    call "$r" "$key" chat /v1/chat/completions \
      "{\"model\":\"glm-5\",\"messages\":[{\"role\":\"user\",\"content\":\"What is ${i}+1?\"}],\"max_tokens\":16}"
  done
}

record_router() {
  local out="${REPO_ROOT}/tests/fixtures/router-metrics" venv key pa pb pr pm r
  mkdir -p "$out" "$WORK"
  : >"${WORK}/calls.txt"
  venv="$(router_venv)"
  "${venv}/bin/pip" show smg 2>/dev/null | sed -n 's/^Version: /smg /p' >"${out}/version.txt"
  key="record-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"

  # Run 1: two healthy workers (cache_aware, the role's default policy): idle, after traffic, then
  # worker B killed (the router's health checks mark it down).
  pa="$(free_port)" pb="$(free_port)" pr="$(free_port)" pm="$(free_port)"
  r="http://127.0.0.1:${pr}"
  start_worker wa "$pa" "$key" --standin-tokens-per-s 2000
  start_worker wb "$pb" "$key" --standin-tokens-per-s 2000
  start_router "$venv" "$pr" "$pm" "$key" "http://127.0.0.1:${pa}" "http://127.0.0.1:${pb}" -- --policy cache_aware
  scrape "http://127.0.0.1:${pm}/metrics" "${out}/metrics-idle.txt"
  traffic "$r" "$key" 8
  call "$r" "$key" chat-stream /v1/chat/completions \
    '{"model":"glm-5","messages":[{"role":"user","content":"Stream please"}],"max_tokens":16,"stream":true}'
  call "$r" "$key" completions /v1/completions '{"model":"glm-5","prompt":"Once upon","max_tokens":8}'
  call "$r" "" no-key /generate '{"text":"x"}'
  call "$r" "$key" bad-json /v1/chat/completions '{not json'
  scrape "http://127.0.0.1:${pm}/metrics" "${out}/metrics-after-traffic.txt"
  stop_process "$wb_pid" "stand-in wb" 10
  sleep 5
  traffic "$r" "$key" 3
  scrape "http://127.0.0.1:${pm}/metrics" "${out}/metrics-worker-down.txt"
  stop_router
  stop_process "$wa_pid" "stand-in wa" 10

  # Run 2: worker B fails every generation (round_robin sends it half the requests), a circuit
  # breaker that opens after 2 failures: B's circuit opens; then A is killed too (no worker left).
  pa="$(free_port)" pb="$(free_port)" pr="$(free_port)" pm="$(free_port)"
  r="http://127.0.0.1:${pr}"
  start_worker wa "$pa" "$key"
  start_worker wb "$pb" "$key" --standin-fail-every 1
  start_router "$venv" "$pr" "$pm" "$key" "http://127.0.0.1:${pa}" "http://127.0.0.1:${pb}" -- \
    --policy round_robin --cb-failure-threshold 2 --cb-timeout-duration-secs 120 --retry-max-retries 1
  traffic "$r" "$key" 6
  scrape "http://127.0.0.1:${pm}/metrics" "${out}/metrics-cb-open.txt"
  stop_process "$wa_pid" "stand-in wa" 10
  sleep 4
  traffic "$r" "$key" 2
  scrape "http://127.0.0.1:${pm}/metrics" "${out}/metrics-no-worker.txt"
  stop_router
  stop_process "$wb_pid" "stand-in wb" 10

  cp "${WORK}/calls.txt" "${out}/calls.txt"
  if grep -rqF "$key" "$out"; then die "the API key appears in ${out}"; fi
  log "router: $(cat "${out}"/metrics-*.txt | grep '^# TYPE' | sort -u | wc -l) families -> ${out}"
}

case "${1:-}" in
  router) record_router ;;
  node-exporter) record_node_exporter ;;
  watchdog) record_watchdog ;;
  *) die "usage: bash scripts/record-metrics.sh router|node-exporter|watchdog" ;;
esac
