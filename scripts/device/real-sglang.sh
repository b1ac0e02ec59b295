#!/bin/bash
# A real sglang on a real GPU: the rendered unit's launch, the readiness gate, the endpoint suite, the doctor
# and the memory planner meet sglang 0.5.17 serving a tiny Llama on the device machine's H200.
#
#   scripts/device/real-sglang.sh prepare     here: build the sglang bundle (build-sglang-bundle.sh), render
#                                             inventory/device with a throwaway API key, validate the flags
#                                             (the lane's parser); everything lands in .cache/real-sglang/
#   scripts/device/real-sglang.sh device      on the device machine, through the run tool:
#       run(command="bash scripts/device/real-sglang.sh device",
#           carry=[".cache/real-sglang/bundle", ".cache/real-sglang/render"], timeout_s=600)
#
# On the device (no systemd, no package index, root): unpack the bundle to /opt/sglang-bundle (the unit's
# PYTHONPATH), install the unit's helpers (gpufacts.py, sglang_launcher.py) where the role puts them and the
# rendered 0600 env file at the unit's EnvironmentFile=, make the tiny checkpoint and train a copy on the GPU
# (train_tiny_llama.py), validate the rendered argv with the serving sglang's own parser (validate_unit.py),
# then per inventory host, one after another: start the unit with run_unit.py (ExecStartPre=, ExecStart=,
# Environment=, EnvironmentFile= read from the unit file), the readiness gate's own code
# (python3 -m sglang_deploy_host.serving.endpoint wait-ready), and for
#   h200            (trained)    sglang-deploy verify --endpoint (all must pass); with REAL_SGLANG_BENCH=1
#                                also sglang-deploy bench --endpoint (bench_serving from the bundle)
#   h200-untrained  (untrained)  sglang-deploy verify --endpoint (the correctness gate must fail)
#   h200-wrong-kv   (trained, --kv-cache-dtype fp8_e5m2: a deliberately wrong launch)  the probes' answers
#   (h200, h200-untrained and h200-wrong-kv record every probe's answer, finish reason and verdict:
#    answers.json, kept as tests/fixtures/gate/ evidence)
#   h200-mem070/092              nothing more: their logs are the planner comparison's other points
#   (REAL_SGLANG_HOSTS="h200" runs only the hosts it names: the bench run of 2026-12-01 04:21 did that)
# and sglang-deploy doctor on every server log (no finding expected). Results: $OUT/results.tar.gz (logs,
# suite output, GPU memory readings, summary.txt), $OUT/summary.txt, $OUT/tiny-llama-trained.tar.gz.
# Every step is bounded so the results are packed before the call's 10 minutes end. Then, here:
#   tar -xzf results.tar.gz -C DIR && python scripts/device/planner_vs_sglang.py DIR   (planner vs sglang)
# The run of 2026-12-01 and what it showed: tests/fixtures/real-sglang/README.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# REAL_SGLANG_HOSTS="h200 h200-untrained" (a subset, in this order) leaves the others out of a run.
read -r -a HOSTS <<< "${REAL_SGLANG_HOSTS:-h200 h200-untrained h200-wrong-kv h200-mem070 h200-mem092}"
wanted() { local h; for h in "${HOSTS[@]}"; do [ "$h" = "$1" ] && return 0; done; return 1; }

# ---------------------------------------------------------------------------------------------------------
# shellcheck source=scripts/device/lib.sh
source "$ROOT/scripts/device/lib.sh"

make_checkpoints() {
  local models=/var/lib/sglang/models
  PYTHONPATH=$BUNDLE_DIR/site python3 "$ROOT/scripts/device/make_tiny_llama.py" "$models/tiny-llama-untrained" || return 1
  PYTHONPATH=$BUNDLE_DIR/site:"$ROOT/module_utils" python3 "$ROOT/scripts/device/train_tiny_llama.py" \
    "$models/tiny-llama-untrained" "$models/tiny-llama-trained" --seconds 60
  local rc=$?
  tar -C "$models" -czf "$OUT/tiny-llama-trained.tar.gz" tiny-llama-trained
  cp "$models/tiny-llama-trained/train_report.json" "$R/" 2>/dev/null
  return $rc
}

models_card() {  # the served model list, as the suite reads it (no secret in it)
  PYTHONPATH="$ROOT/module_utils" python3 - "$URL" "$ENV_FILE" > "$R/$1/v1-models.json" <<'EOF'
import json, sys
from sglang_deploy_host.serving import endpoint, systemd, unit_flags
key = systemd.env_file_values(open(sys.argv[2]).read()).get(unit_flags.API_KEY_ENV, "")
print(json.dumps(endpoint.Endpoint(sys.argv[1], api_key=key).get("/v1/models").json(), indent=2))
EOF
}

suite() {  # suite HOST: sglang-deploy verify --endpoint against the running server
  SGLANG_API_KEY=$(api_key) bounded 240 bash -c "cd '$ROOT' && PYTHONPATH='$ROOT/src:$ROOT/module_utils:$BUNDLE_DIR/tools' python3 -m sglang_deploy.cli verify --endpoint '$URL' --model '$MODEL'" \
    > "$R/$1/verify.txt" 2>&1
  local rc=$?
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$R/$1/verify.txt" | tail -12
  return $rc
}

answers() {  # answers HOST: every probe's answer, finish reason and verdict (the gate's record), into answers.json
  PYTHONPATH="$ROOT/module_utils:$BUNDLE_DIR/tools" bounded 200 python3 -m sglang_deploy_host.serving.gate --url "$URL" \
    --model "$MODEL" --env-file "$ENV_FILE" --json > "$R/$1/answers.json"
  local rc=$?
  python3 - "$R/$1/answers.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    verdict = "ok" if r["ok"] else "FAILED " + r["reason"][:80]
    print(f"  {r['probe']}: {verdict} {r['answer'][:60]!r}")
EOF
  return $rc
}

bench_step() {
  # The tiny model's context is 2,048 tokens: 1,024 in + 512 out (the command's defaults) fit. The sweep is
  # the default (1,8,16,32,64, topped by the unit's --max-running-requests 64); each step is cut at
  # REAL_SGLANG_BENCH_STEP_S so that a slow one fails alone and the report is still written.
  bench_endpoint h200 "${REAL_SGLANG_BENCH_S:-300}" /var/lib/sglang/models/tiny-llama-trained \
    --input-len 1024 --output-len 512 --step-timeout "${REAL_SGLANG_BENCH_STEP_S:-55}"
  local rc=$?
  mkdir -p "$OUT/bench"
  find "$R/h200/bench" -type f \( -name results.jsonl -o -name report.md -o -name bench.png -o -name sweep.json \) \
    -exec cp {} "$OUT/bench/" \; 2>/dev/null
  cp "$R/h200/bench.txt" "$OUT/bench/" 2>/dev/null
  return $rc
}

finish() {
  for host in "${HOSTS[@]}"; do stop_server "$host" > /dev/null 2>&1; done
  pack_results
}

device() {
  OUT=${OUT:-/tmp/real-sglang-out}; mkdir -p "$OUT"
  R=$(mktemp -d /tmp/real-sglang.XXXX); RENDER="$CACHE/render"
  exec > >(tee "$R/device.log") 2>&1
  trap finish EXIT
  device_facts | tee "$R/device-facts.txt"
  phase unpack-bundle unpack "$CACHE/bundle" || return 1
  phase install-host-files install_host_files h200 || return 1
  phase make-and-train-checkpoint make_checkpoints
  phase validate-with-sglang-0.5.17 validate_units "${HOSTS[@]}"

  if phase "ready h200 (trained)" serve h200 300; then
    models_card h200
    phase "verify h200 (trained): pass" suite h200
    phase "answers h200 (trained)" answers h200
    # sglang-deploy bench (another change's command) only when asked: this run's budget is for the rest.
    [ "${REAL_SGLANG_BENCH:-0}" = 1 ] && phase "bench h200" bench_step
  fi
  stop_server h200
  if wanted h200-untrained && phase "ready h200-untrained" serve h200-untrained 180; then
    phase "verify h200-untrained: gate fails" suite h200-untrained
    phase "answers h200-untrained" answers h200-untrained
  fi
  stop_server h200-untrained
  if wanted h200-wrong-kv && phase "ready h200-wrong-kv" serve h200-wrong-kv 180; then
    phase "answers h200-wrong-kv (fp8_e5m2 KV)" answers h200-wrong-kv
  fi
  stop_server h200-wrong-kv
  for host in h200-mem070 h200-mem092; do
    if ! wanted "$host"; then note "$host: left out (REAL_SGLANG_HOSTS)"
    elif (( $(left) > 120 )); then phase "ready $host" serve "$host" 150; stop_server "$host"
    else note "$host: skipped (budget)"; fi
  done
  phase doctor-on-every-log doctor_all
}

case "${1:-}" in
  prepare) prepare real-sglang.sh ;;
  device) device ;;
  *) echo "usage: $0 prepare|device" >&2; exit 2 ;;
esac
