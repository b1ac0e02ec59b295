# Shared by the device runs (real-sglang.sh, glm5-arch.sh): sourced, not run. On the device machine
# (no systemd, no package index, root) they unpack the carried sglang bundle, install what the
# sglang_server role installs, start rendered units with run_unit.py (the argv and environment systemd
# would use), gate on readiness with the role's own code and run the CLI's commands against the server.
# The caller sets ROOT (the checkout), R (this run's results directory), RENDER (the render directory)
# and OUT (what comes back), and may set BUDGET_S (seconds this script may run, default 560).
# shellcheck shell=bash

BUDGET_S=${BUDGET_S:-560}
CACHE="$ROOT/.cache/real-sglang"

# prepare SCRIPT: here, before a device call: the bundle (build-sglang-bundle.sh), every inventory/device
# host rendered with a throwaway API key and validated with the lane's parser, into .cache/real-sglang/.
prepare() {
  set -e
  cd "$ROOT"
  bash scripts/device/build-sglang-bundle.sh "$CACHE/bundle"
  # The key goes only into the 0600 rendered env files, which travel to the device and are never
  # committed (the launcher masks it in every log line sglang prints).
  local key
  key=$(openssl rand -hex 24)
  rm -rf "$CACHE/render"
  SGLANG_API_KEY="$key" .venv/bin/sglang-deploy render -i inventory/device --out "$CACHE/render"
  SGLANG_API_KEY="$key" .venv/bin/sglang-deploy validate -i inventory/device
  du -sh "$CACHE/bundle" "$CACHE/render"
  echo "prepared: now run on the device: bash scripts/device/$1 device ..."
  echo "          carry: .cache/real-sglang/bundle .cache/real-sglang/render"
}
BUNDLE_DIR=/opt/sglang-bundle
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
  note "$(printf '%-38s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))"
  return $rc
}
host_py() { PYTHONPATH="$ROOT/module_utils" python3 "$@"; }
cli() { PYTHONPATH="$ROOT/src:$ROOT/module_utils:$BUNDLE_DIR/tools" python3 -m sglang_deploy.cli "$@"; }
json_field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
gpu_mem() { nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits | head -1; }

device_facts() {
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, torch.version.cuda)'
  ls -d /usr/local/cuda-* 2>/dev/null | tr '\n' ' '; echo
}

# unpack BUNDLE: the carried archive (sha256 checked) at $BUNDLE_DIR, the unit's PYTHONPATH; an
# identical bundle already there (a warm machine) is kept.
unpack() {
  local bundle=$1
  (cd "$bundle" && sha256sum -c --quiet SHA256SUMS) || return 1
  if cmp -s "$bundle/SHA256SUMS" "$BUNDLE_DIR/SHA256SUMS"; then echo "bundle already unpacked"; return 0; fi
  rm -rf "$BUNDLE_DIR" && mkdir -p "$BUNDLE_DIR"
  tar -C "$BUNDLE_DIR" -xJf "$bundle/sglang-site.tar.xz" && cp "$bundle/SHA256SUMS" "$BUNDLE_DIR/"
}

# install_host_files HOST: what the sglang_server role installs (module sglang_host_files, from the same
# sources), with HOST's rendered env file at its unit's EnvironmentFile= (ENV_FILE, the same path for
# every host of a render: /etc/sglang/sglang.env).
install_host_files() {
  local host=$1
  install -d -m 0755 /usr/local/libexec/sglang-deploy /etc/sglang /var/lib/sglang/models
  install -m 0755 "$ROOT"/module_utils/sglang_deploy_host/{gpufacts.py,sglang_launcher.py} /usr/local/libexec/sglang-deploy/
  mkdir -p "$R/$host"
  ENV_FILE=$(host_py -c 'import sys; from sglang_deploy_host.serving import systemd; print(systemd.directive(open(sys.argv[1]).read(), "EnvironmentFile"))' "$RENDER/$host/sglang.service")
  [ -n "$ENV_FILE" ] || { echo "$RENDER/$host/sglang.service has no EnvironmentFile="; return 1; }
  install -m 0600 "$RENDER/$host/sglang.env" "$ENV_FILE"
  host_py "$ROOT/scripts/device/run_unit.py" show "$RENDER/$host/sglang.service" > "$R/$host/unit-run.json" || return 1
  if [ ! -x /usr/bin/python3 ]; then  # ExecStartPre= runs gpufacts.py (stdlib only) with the system python3
    echo "no /usr/bin/python3 here: linking the image's python3 for ExecStartPre="; ln -s "$(command -v python3)" /usr/bin/python3
  fi
  # The unit's CUDA_HOME (and PATH) name the toolkit where the cuda_toolkit role installs it; sglang,
  # flashinfer and tvm_ffi JIT-compile kernels with its nvcc. Link it there if the image keeps it elsewhere.
  local cuda_home
  cuda_home=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["environment"].get("CUDA_HOME", ""))' "$R/$host/unit-run.json")
  if [ -n "$cuda_home" ] && [ ! -x "$cuda_home/bin/nvcc" ]; then
    local nvcc; nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
    [ -n "$nvcc" ] || { echo "no nvcc on this machine"; return 1; }
    echo "CUDA_HOME=$cuda_home is missing: linking it to $(dirname "$(dirname "$(readlink -f "$nvcc")")")"
    ln -sfn "$(dirname "$(dirname "$(readlink -f "$nvcc")")")" "$cuda_home"
  fi
  "$cuda_home/bin/nvcc" --version | tail -2
}

# validate_units HOST...: the rendered argv of each HOST through the serving sglang's own parser.
validate_units() {
  local units=() host
  for host in "$@"; do units+=("$RENDER/$host/sglang.service"); done
  PYTHONPATH="$BUNDLE_DIR/site:$ROOT/src:$ROOT/module_utils" bounded 120 python3 "$ROOT/scripts/device/validate_unit.py" "${units[@]}"
}

# serve HOST [TIMEOUT]: start HOST's unit and wait for the readiness gate; 0 when ready (the server stays
# up). Sets URL and MODEL; records the GPU's used memory before and when ready, and the seconds to ready.
serve() {
  local host=$1 timeout=${2:-300} unit="$RENDER/$1/sglang.service" dir="$R/$1"
  mkdir -p "$dir"
  echo "before start: $(gpu_mem)" > "$dir/gpu-memory.txt"
  host_py "$ROOT/scripts/device/run_unit.py" show "$unit" > "$dir/unit-run.json"
  local t0=$SECONDS
  host_py "$ROOT/scripts/device/run_unit.py" start "$unit" --log "$dir/sglang.log" --pid-file "$dir/pid" || return 1
  URL=$(json_field "$dir/unit-run.json" url)
  MODEL=$(json_field "$dir/unit-run.json" model)
  # The readiness gate's own code, as the role's sglang_wait_ready runs it (key from the env file); the
  # loop stops it early if the server exits (systemd's unit_state check has no systemd here).
  PYTHONPATH="$ROOT/module_utils" bounded "$timeout" python3 -m sglang_deploy_host.serving.endpoint wait-ready \
    --url "$URL" --timeout "$timeout" --env-file "$ENV_FILE" --initial-delay 2 --max-delay 5 > "$dir/wait-ready.txt" 2>&1 &
  local gate=$! server; server=$(cat "$dir/pid")
  while kill -0 "$gate" 2>/dev/null; do
    if ! kill -0 "$server" 2>/dev/null; then echo "the server exited before it was ready" >> "$dir/wait-ready.txt"; kill "$gate"; fi
    sleep 1
  done
  wait "$gate"; local rc=$?
  tail -1 "$dir/wait-ready.txt"
  echo "ready: $(gpu_mem)" >> "$dir/gpu-memory.txt"
  echo "$((SECONDS - t0))" > "$dir/seconds-to-ready.txt"
  return $rc
}

stop_server() {
  local host=$1 dir="$R/$1"
  [ -f "$dir/pid" ] || return 0
  host_py "$ROOT/scripts/device/run_unit.py" stop "$RENDER/$host/sglang.service" --pid-file "$dir/pid"
  rm -f "$dir/pid"
  sleep 2
  echo "after stop: $(gpu_mem)" >> "$dir/gpu-memory.txt"
}

# api_key [ENV]: the API key from the installed env file (ENV_FILE), else from a rendered one.
api_key() {
  local file=${1:-${ENV_FILE:-}}
  [ -n "$file" ] || file=$(ls "$RENDER"/*/sglang.env 2>/dev/null | head -1)
  [ -n "$file" ] && host_py -c 'import sys; from sglang_deploy_host.serving import systemd, unit_flags; print(systemd.env_file_values(open(sys.argv[1]).read()).get(unit_flags.API_KEY_ENV, ""))' "$file"
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
    code = bench._RUNNER.format(probe=str(bench.validator_venv._PROBE), stand_ins=list(bench.BENCH_STAND_INS),
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
# bench_endpoint HOST BUDGET_S TOKENIZER ARGS...: sglang-deploy bench --endpoint against HOST's running
# server (URL, MODEL from serve), results in $R/HOST/bench/<server>/<time>/, its output in $R/HOST/bench.txt.
bench_endpoint() {
  local host=$1 budget=$2 tokenizer=$3; shift 3
  SGLANG_API_KEY=$(api_key) bounded "$budget" bash -c "cd '$ROOT' && PYTHONPATH='$ROOT/src:$ROOT/module_utils:$BUNDLE_DIR/tools' python3 -c \"\$0\" bench --endpoint '$URL' --model '$MODEL' --tokenizer '$tokenizer' --out '$R/$host/bench' \"\$@\"" "$BENCH_WRAPPER" "$@" \
    > "$R/$host/bench.txt" 2>&1
  local rc=$?; tail -12 "$R/$host/bench.txt"
  return $rc
}

doctor_all() {
  local rc=0 log
  for log in "$R"/*/sglang.log; do
    [ -f "$log" ] || continue
    cli doctor "$log" > "${log%.log}.doctor.txt" 2>&1; local one=$?
    echo "doctor $(basename "$(dirname "$log")"): exit $one $(head -c 300 "${log%.log}.doctor.txt")"
    (( one == 0 )) || rc=1
  done
  return $rc
}

scrub_check() {  # the key must appear in nothing that comes back
  local key; key=$(api_key)
  if [ -z "$key" ]; then echo "no API key found to look for: the check cannot run"; return 1; fi
  local hits; hits=$(grep -rlF -- "$key" "$R" "$OUT" 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "API KEY FOUND in: $hits (replaced by ********)"
    grep -rlF -- "$key" "$R" | xargs -r sed -i "s/$key/********/g"
    return 1
  fi
  echo "the API key appears in no result file"
}

# pack_results: the last step of a device run (its EXIT trap): the secret check, the summary and every
# result file into $OUT/results.tar.gz.
pack_results() {
  phase scrub-check scrub_check
  note "device seconds in this script: $SECONDS"
  cp "$R/summary.txt" "$OUT/summary.txt"
  tar -C "$R" -czf "$OUT/results.tar.gz" .
  ls -l "$OUT"
}
