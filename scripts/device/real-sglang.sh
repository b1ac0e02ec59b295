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
# (python3 -m sglang_deploy_host.endpoint wait-ready), and for
#   h200            (trained)    sglang-deploy verify --endpoint (all must pass); with REAL_SGLANG_BENCH=1
#                                also sglang-deploy bench --endpoint (bench_serving from the bundle)
#   h200-untrained  (untrained)  sglang-deploy verify --endpoint (the correctness gate must fail)
#   h200-mem070/092              nothing more: their logs are the planner comparison's other points
#   (REAL_SGLANG_HOSTS="h200" runs only the hosts it names: the bench run of 2026-12-01 04:21 did that)
# and sglang-deploy doctor on every server log (no finding expected). Results: $OUT/results.tar.gz (logs,
# suite output, GPU memory readings, summary.txt), $OUT/summary.txt, $OUT/tiny-llama-trained.tar.gz.
# Every step is bounded so the results are packed before the call's 10 minutes end. Then, here:
#   tar -xzf results.tar.gz -C DIR && python scripts/device/planner_vs_sglang.py DIR   (planner vs sglang)
# The run of 2026-12-01 and what it showed: tests/fixtures/real-sglang/README.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE="$ROOT/.cache/real-sglang"
# REAL_SGLANG_HOSTS="h200 h200-untrained" (a subset, in this order) leaves the others out of a run.
read -r -a HOSTS <<< "${REAL_SGLANG_HOSTS:-h200 h200-untrained h200-mem070 h200-mem092}"
wanted() { local h; for h in "${HOSTS[@]}"; do [ "$h" = "$1" ] && return 0; done; return 1; }

prepare() {
  set -e
  cd "$ROOT"
  bash scripts/device/build-sglang-bundle.sh "$CACHE/bundle"
  # A throwaway key for the device's server: it goes only into the 0600 rendered env files, which travel to
  # the device and are never committed (the launcher masks it in every log line sglang prints).
  local key
  key=$(openssl rand -hex 24)
  rm -rf "$CACHE/render"
  SGLANG_API_KEY="$key" .venv/bin/sglang-deploy render -i inventory/device --out "$CACHE/render"
  SGLANG_API_KEY="$key" .venv/bin/sglang-deploy validate -i inventory/device
  du -sh "$CACHE/bundle" "$CACHE/render"
  echo "prepared: now run on the device: bash scripts/device/real-sglang.sh device"
  echo "          carry: .cache/real-sglang/bundle .cache/real-sglang/render"
}

# ---------------------------------------------------------------------------------------------------------
BUDGET_S=${REAL_SGLANG_BUDGET_S:-560}
left() { echo $((BUDGET_S - SECONDS)); }
# bounded SECONDS CMD...: run CMD with a timeout of at most SECONDS and what the budget leaves (minus 25 s
# for packing the results); 124 when there is no time left for it.
bounded() {
  local want=$1; shift
  local t; t=$(( $(left) - 25 )); (( t > want )) && t=$want
  if (( t < 5 )); then echo "skipped (budget): $*"; return 124; fi
  timeout --kill-after=10 "$t" "$@"
}
note() { echo "$*" | tee -a "$R/summary.txt"; }
phase() {  # phase NAME CMD... : run, time and record one step
  local name=$1; shift
  local t0=$SECONDS rc
  echo "=== $name: $*"
  "$@"; rc=$?
  note "$(printf '%-34s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))"
  return $rc
}

unpack() {
  (cd "$ROOT/.cache/real-sglang/bundle" && sha256sum -c SHA256SUMS) || return 1
  rm -rf /opt/sglang-bundle && mkdir -p /opt/sglang-bundle
  tar -C /opt/sglang-bundle -xJf "$ROOT/.cache/real-sglang/bundle/sglang-site.tar.xz"
}

install_host_files() {
  # What the sglang_server role installs (module sglang_host_files, from the same sources).
  install -d -m 0755 /usr/local/libexec/sglang-deploy /etc/sglang /var/lib/sglang/models
  install -m 0755 "$ROOT"/module_utils/sglang_deploy_host/{gpufacts.py,sglang_launcher.py} /usr/local/libexec/sglang-deploy/
  local env_path
  env_path=$(PYTHONPATH="$ROOT/module_utils" python3 -c 'import sys; from sglang_deploy_host import systemd; print(systemd.directive(open(sys.argv[1]).read(), "EnvironmentFile"))' "$RENDER/h200/sglang.service")
  install -m 0600 "$RENDER/h200/sglang.env" "$env_path"
  mkdir -p "$R/h200"
  PYTHONPATH="$ROOT/module_utils" python3 "$ROOT/scripts/device/run_unit.py" show "$RENDER/h200/sglang.service" > "$R/h200/unit-run.json" || return 1
  ENV_FILE=$env_path
  if [ ! -x /usr/bin/python3 ]; then  # ExecStartPre= runs gpufacts.py (stdlib only) with the system python3
    echo "no /usr/bin/python3 here: linking the image's python3 for ExecStartPre="; ln -s "$(command -v python3)" /usr/bin/python3
  fi
  # The unit's CUDA_HOME (and PATH) name the toolkit where the cuda_toolkit role installs it; sglang,
  # flashinfer and tvm_ffi JIT-compile kernels with its nvcc. Link it there if the image keeps it elsewhere.
  local cuda_home
  cuda_home=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["environment"].get("CUDA_HOME", ""))' "$R/h200/unit-run.json")
  if [ -n "$cuda_home" ] && [ ! -x "$cuda_home/bin/nvcc" ]; then
    local nvcc; nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
    [ -n "$nvcc" ] || { echo "no nvcc on this machine"; return 1; }
    echo "CUDA_HOME=$cuda_home is missing: linking it to $(dirname "$(dirname "$(readlink -f "$nvcc")")")"
    ln -sfn "$(dirname "$(dirname "$(readlink -f "$nvcc")")")" "$cuda_home"
  fi
  "$cuda_home/bin/nvcc" --version | tail -2
}

make_checkpoints() {
  local models=/var/lib/sglang/models
  PYTHONPATH=/opt/sglang-bundle/site python3 "$ROOT/scripts/device/make_tiny_llama.py" "$models/tiny-llama-untrained" || return 1
  PYTHONPATH=/opt/sglang-bundle/site:"$ROOT/module_utils" python3 "$ROOT/scripts/device/train_tiny_llama.py" \
    "$models/tiny-llama-untrained" "$models/tiny-llama-trained" --seconds 60
  local rc=$?
  tar -C "$models" -czf "$OUT/tiny-llama-trained.tar.gz" tiny-llama-trained
  cp "$models/tiny-llama-trained/train_report.json" "$R/" 2>/dev/null
  return $rc
}

gpu_mem() { nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits | head -1; }

# serve HOST: start HOST's unit and wait for the readiness gate; 0 when ready (the server stays up).
serve() {
  local host=$1 unit="$RENDER/$1/sglang.service" dir="$R/$1"
  mkdir -p "$dir"
  echo "before start: $(gpu_mem)" > "$dir/gpu-memory.txt"
  PYTHONPATH="$ROOT/module_utils" python3 "$ROOT/scripts/device/run_unit.py" show "$unit" > "$dir/unit-run.json"
  PYTHONPATH="$ROOT/module_utils" python3 "$ROOT/scripts/device/run_unit.py" start "$unit" \
    --log "$dir/sglang.log" --pid-file "$dir/pid" || return 1
  URL=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$dir/unit-run.json")
  MODEL=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"])' "$dir/unit-run.json")
  # The readiness gate's own code, as the role's sglang_wait_ready runs it (key from the env file); the
  # loop stops it early if the server exits (systemd's unit_state check has no systemd here).
  PYTHONPATH="$ROOT/module_utils" bounded "${2:-300}" python3 -m sglang_deploy_host.endpoint wait-ready \
    --url "$URL" --timeout "${2:-300}" --env-file "$ENV_FILE" --initial-delay 2 --max-delay 5 > "$dir/wait-ready.txt" 2>&1 &
  local gate=$! server; server=$(cat "$dir/pid")
  while kill -0 "$gate" 2>/dev/null; do
    if ! kill -0 "$server" 2>/dev/null; then echo "the server exited before it was ready" >> "$dir/wait-ready.txt"; kill "$gate"; fi
    sleep 1
  done
  wait "$gate"; local rc=$?
  tail -1 "$dir/wait-ready.txt"
  echo "ready: $(gpu_mem)" >> "$dir/gpu-memory.txt"
  return $rc
}

stop_server() {
  local host=$1 dir="$R/$1"
  [ -f "$dir/pid" ] || return 0
  PYTHONPATH="$ROOT/module_utils" python3 "$ROOT/scripts/device/run_unit.py" stop "$RENDER/$host/sglang.service" --pid-file "$dir/pid"
  sleep 2
  echo "after stop: $(gpu_mem)" >> "$dir/gpu-memory.txt"
}

api_key() { PYTHONPATH="$ROOT/module_utils" python3 -c 'import sys; from sglang_deploy_host import endpoint, systemd; print(systemd.env_file_values(open(sys.argv[1]).read())[endpoint.API_KEY_ENV])' "$ENV_FILE"; }
cli() { PYTHONPATH="$ROOT/src:$ROOT/module_utils:/opt/sglang-bundle/tools" python3 -m sglang_deploy.cli "$@"; }

models_card() {  # the served model list, as the suite reads it (no secret in it)
  PYTHONPATH="$ROOT/module_utils" python3 - "$URL" "$ENV_FILE" > "$R/$1/v1-models.json" <<'EOF'
import json, sys
from sglang_deploy_host import endpoint, systemd
key = systemd.env_file_values(open(sys.argv[2]).read()).get(endpoint.API_KEY_ENV, "")
print(json.dumps(endpoint.Endpoint(sys.argv[1], api_key=key).get("/v1/models").json(), indent=2))
EOF
}

suite() {  # suite HOST: sglang-deploy verify --endpoint against the running server
  SGLANG_API_KEY=$(api_key) bounded 240 bash -c "cd '$ROOT' && PYTHONPATH='$ROOT/src:$ROOT/module_utils:/opt/sglang-bundle/tools' python3 -m sglang_deploy.cli verify --endpoint '$URL' --model '$MODEL'" \
    > "$R/$1/verify.txt" 2>&1
  local rc=$?
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$R/$1/verify.txt" | tail -12
  return $rc
}

# sglang-deploy bench --endpoint with bench_serving from the bundle's sglang (the server's own), run by the
# device's python3: the command's own bench_command builds the lane's validator venv from a package index,
# which the device has not. Only that command is swapped (and the report says where bench_serving came
# from); the sweep, the records, the report and the plot are the command's own.
BENCH_WRAPPER='
import dataclasses, importlib.metadata, os, sys
from sglang_deploy import bench, cli
from sglang_deploy.commands import bench as command
SITE = "/opt/sglang-bundle/site"
VERSION = next(d.version for d in importlib.metadata.distributions(name="sglang", path=[SITE]))
os.environ["PYTHONPATH"] = SITE + os.pathsep + os.environ.get("PYTHONPATH", "")  # bench_serving child only
def bench_command(lane):
    code = bench._RUNNER.format(probe=str(bench.validator._PROBE), stand_ins=list(bench.BENCH_STAND_INS),
                                module=bench.host_bench.BENCH_MODULE)
    return [sys.executable, "-c", code]
bench.bench_command = bench_command
real_load_lane, real_write_run = command.load_lane, bench.write_run
command.load_lane = lambda name: dataclasses.replace(real_load_lane(name), sglang=VERSION)
def write_run(directory, run):
    run.meta["bench_from"] = f"the device bundle (sglang {VERSION}, {SITE}) with the device python3, beside the server"
    run.meta["lane"] = "none: the bundle above, not a lane validator venv"
    return real_write_run(directory, run)
bench.write_run = write_run
sys.exit(cli.main(sys.argv[1:]))
'
bench_step() {
  if ! cli bench --help > /dev/null 2>&1; then
    echo "sglang-deploy bench is not in this checkout's CLI: skipped"; return 0
  fi
  # The tiny model's context is 2,048 tokens: 1,024 in + 512 out (the command's defaults) fit. The sweep is
  # the default (1,8,16,32,64, topped by the unit's --max-running-requests 64); each step is cut at
  # REAL_SGLANG_BENCH_STEP_S so that a slow one fails alone and the report is still written.
  SGLANG_API_KEY=$(api_key) bounded "${REAL_SGLANG_BENCH_S:-300}" bash -c "cd '$ROOT' && PYTHONPATH='$ROOT/src:$ROOT/module_utils:/opt/sglang-bundle/tools' python3 -c \"\$0\" bench --endpoint '$URL' --model '$MODEL' --tokenizer /var/lib/sglang/models/tiny-llama-trained --input-len 1024 --output-len 512 --step-timeout ${REAL_SGLANG_BENCH_STEP_S:-55} --out '$R/h200/bench'" "$BENCH_WRAPPER" \
    > "$R/h200/bench.txt" 2>&1
  local rc=$?; tail -25 "$R/h200/bench.txt"
  mkdir -p "$OUT/bench"
  find "$R/h200/bench" -type f \( -name results.jsonl -o -name report.md -o -name bench.png -o -name sweep.json \) \
    -exec cp {} "$OUT/bench/" \; 2>/dev/null
  cp "$R/h200/bench.txt" "$OUT/bench/" 2>/dev/null
  return $rc
}

doctor_all() {
  local rc=0 log
  for log in "$R"/*/sglang.log; do
    cli doctor "$log" > "${log%.log}.doctor.txt" 2>&1; local one=$?
    echo "doctor $(basename "$(dirname "$log")"): exit $one $(head -c 300 "${log%.log}.doctor.txt")"
    (( one == 0 )) || rc=1
  done
  return $rc
}

scrub_check() {  # the key must appear in nothing that comes back
  local key; key=$(api_key)
  local hits; hits=$(grep -rlF -- "$key" "$R" "$OUT" 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "API KEY FOUND in: $hits (replaced by ********)"
    grep -rlF -- "$key" "$R" | xargs -r sed -i "s/$key/********/g"
    return 1
  fi
  echo "the API key appears in no result file"
}

finish() {
  for host in "${HOSTS[@]}"; do stop_server "$host" > /dev/null 2>&1; done
  phase scrub-check scrub_check
  note "device seconds in this script: $SECONDS"
  cp "$R/summary.txt" "$OUT/summary.txt"
  tar -C "$R" -czf "$OUT/results.tar.gz" .
  ls -l "$OUT"
}

device() {
  OUT=${OUT:-/tmp/real-sglang-out}; mkdir -p "$OUT"
  R=$(mktemp -d /tmp/real-sglang.XXXX); RENDER="$CACHE/render"
  exec > >(tee "$R/device.log") 2>&1
  trap finish EXIT
  {
    date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
    python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, torch.version.cuda)'
    ls -d /usr/local/cuda-* 2>/dev/null | tr '\n' ' '; echo
  } | tee "$R/device-facts.txt"
  phase unpack-bundle unpack || return 1
  phase install-host-files install_host_files || return 1
  phase make-and-train-checkpoint make_checkpoints
  local units=(); for host in "${HOSTS[@]}"; do units+=("$RENDER/$host/sglang.service"); done
  PYTHONPATH=/opt/sglang-bundle/site:$ROOT/src:$ROOT/module_utils phase validate-with-sglang-0.5.17 \
    bounded 90 python3 "$ROOT/scripts/device/validate_unit.py" "${units[@]}"

  if phase "ready h200 (trained)" serve h200 300; then
    models_card h200
    phase "verify h200 (trained): pass" suite h200
    # sglang-deploy bench (another change's command) only when asked: this run's budget is for the rest.
    [ "${REAL_SGLANG_BENCH:-0}" = 1 ] && phase "bench h200" bench_step
  fi
  stop_server h200
  if wanted h200-untrained && phase "ready h200-untrained" serve h200-untrained 180; then
    phase "verify h200-untrained: gate fails" suite h200-untrained
  fi
  stop_server h200-untrained
  for host in h200-mem070 h200-mem092; do
    if ! wanted "$host"; then note "$host: left out (REAL_SGLANG_HOSTS)"
    elif (( $(left) > 120 )); then phase "ready $host" serve "$host" 150; stop_server "$host"
    else note "$host: skipped (budget)"; fi
  done
  phase doctor-on-every-log doctor_all
}

case "${1:-}" in
  prepare) prepare ;;
  device) device ;;
  *) echo "usage: $0 prepare|device" >&2; exit 2 ;;
esac
