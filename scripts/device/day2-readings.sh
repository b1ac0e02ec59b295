#!/bin/bash
# Day-2 readings on the device machine's H200 (issues 24 and 25), with sglang 0.5.17 serving the tiny Llama
# through inventory/device's rendered h200 unit (run_unit.py, the readiness gate's own code), as
# real-sglang.sh does it:
#   issue 25  the real Prometheus /metrics page (--enable-metrics): idle right after ready, during a burst
#             of concurrent requests (more than --max-running-requests, so some queue) and after it
#   issue 24  do kept JIT caches make a restart faster? Three starts of the same unit, each with every
#             JIT/compile cache variable (and HOME) pointed into one directory:
#               a  K, empty (first start)      b  K again (kept caches)      c  K2, empty (cold again)
#             For each: seconds from run_unit.py start (ExecStartPre= included) to /health_generate 200
#             (polled every 0.5-1 s), and each cache's bytes and files before the start and at ready.
#
#   here:    scripts/device/real-sglang.sh prepare    (bundle + render of inventory/device; or render into
#            another directory and name it with DAY2_RENDER, relative to the checkout)
#   device:  run(command="DAY2_RENDER=.cache/real-sglang/render bash scripts/device/day2-readings.sh device",
#                carry=[".cache/real-sglang/bundle", ".cache/real-sglang/render"], timeout_s=600)
#            starts a, b, c; the traffic (the helper's defaults) on b
#   device-traffic (the second call, after the first showed flashinfer's sampling JIT stalling the traffic):
#            start d (cold, empty K), the traffic with greedy requests only (--all-greedy) for clean pages,
#            then one top_p request (the first non-greedy sampling: flashinfer JIT-compiles its sampling
#            module then), stop, start e (same K) and the same request again (kept: no compile)
#            BUDGET_S=480 DAY2_RENDER=... bash scripts/device/day2-readings.sh device-traffic
# Results: $OUT/results.tar.gz (all of $R), $OUT/summary.txt, $OUT/jit-cache-starts.json.
# The run of 2026-12-01 and what it showed: tests/fixtures/real-sglang/day2/README.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/device/lib.sh
source "$ROOT/scripts/device/lib.sh"
HELPER="$ROOT/scripts/device/day2_readings.py"
HOST=h200  # the inventory host whose rendered unit is started (only its Environment= lines are added to)

# Each cache variable -> its directory under K. Where each name was found: cache-env-vars.txt (find_cache_vars).
CACHE_ENV=(
  HOME=home                                       # everything that defaults to ~ (~/.cache/..., ~/.triton, ~/.nv)
  TRITON_CACHE_DIR=triton                         # triton (device's /opt/torch/.venv)
  TORCHINDUCTOR_CACHE_DIR=inductor                # torch inductor (default /tmp/torchinductor_$USER)
  SGLANG_CACHE_DIR=sglang                         # sglang: torch_compile_cache, flashinfer autotune, ...
  TVM_FFI_CACHE_DIR=tvm-ffi                       # sglang's JIT kernels (sglang/kernels/jit) and tvm_ffi
  FLASHINFER_WORKSPACE_BASE=flashinfer            # flashinfer JIT: <base>/.cache/flashinfer
  SGLANG_DG_CACHE_DIR=deep_gemm                   # sglang sets DG_JIT_CACHE_DIR from it
  DG_JIT_CACHE_DIR=deep_gemm                      # DeepGEMM's own (overwritten by sglang when it loads DG)
  CUDA_CACHE_PATH=cuda                            # the driver's PTX JIT cache (default ~/.nv/ComputeCache)
  TORCH_EXTENSIONS_DIR=torch_extensions           # torch.utils.cpp_extension builds
  CUTE_DSL_CACHE_DIR=cute_dsl                     # CUTLASS CuTe DSL (in flashinfer)
  FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=fa_cute_dsl  # sglang's / flashinfer's FA CuTe DSL kernels
  PYTHONPYCACHEPREFIX=pycache                     # CPython bytecode (the bundle has no __pycache__)
)

# make_unit NAME K: HOST's rendered unit with one Environment= line per cache variable, before ExecStartPre=
make_unit() {
  local name=$1 k=$2 dir="$RENDER/$1" pair inserted=0 line
  mkdir -p "$dir"
  for pair in "${CACHE_ENV[@]}"; do mkdir -p "$k/${pair#*=}"; done
  {
    while IFS= read -r line; do
      if [[ $inserted == 0 && $line == ExecStartPre=* ]]; then
        echo "# day2-readings.sh: every JIT/compile cache (and HOME) under $k"
        for pair in "${CACHE_ENV[@]}"; do echo "Environment=\"${pair%%=*}=$k/${pair#*=}\""; done
        inserted=1
      fi
      printf '%s\n' "$line"
    done < "$RENDER_IN/$HOST/sglang.service"
  } > "$dir/sglang.service"
  [ $inserted = 1 ] || { echo "no ExecStartPre= in $RENDER_IN/$HOST/sglang.service"; return 1; }
  host_py "$ROOT/scripts/device/run_unit.py" show "$dir/sglang.service" | grep -E '"(HOME|[A-Z_]*CACHE[A-Z_]*|TORCH_EXTENSIONS_DIR|FLASHINFER_WORKSPACE_BASE|PYTHONPYCACHEPREFIX)"'
}

make_checkpoint() {  # the untrained tiny Llama, at the path the h200 unit serves (its training is no matter here)
  local models=/var/lib/sglang/models
  grep -q -- "--model $models/tiny-llama-trained" "$RENDER_IN/$HOST/sglang.service" || { echo "unexpected --model"; return 1; }
  PYTHONPATH=$BUNDLE_DIR/site bounded 120 python3 "$ROOT/scripts/device/make_tiny_llama.py" "$models/tiny-llama-untrained" || return 1
  rm -rf "$models/tiny-llama-trained" && cp -a "$models/tiny-llama-untrained" "$models/tiny-llama-trained"
}

# find_cache_vars: where each cache variable is read, in the sources that run here (file:line)
find_cache_vars() {
  local tsite s=$BUNDLE_DIR/site v libcuda
  tsite=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  {
    echo "# device: torch/triton in $tsite; the bundle in $s"
    PYTHONPATH=$s python3 - <<'EOF'
import importlib.metadata as m
for name in ("torch", "triton", "sglang", "flashinfer-python", "apache-tvm-ffi", "sgl-deep-gemm", "sglang-kernel"):
    try:
        print(f"version {name} {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"version {name} absent")
EOF
    for v in TRITON_CACHE_DIR TRITON_HOME; do
      echo "## $v"; grep -rn --include=*.py -e "\"$v\"" -e "'$v'" "$tsite/triton" | head -4
    done
    echo "## TORCHINDUCTOR_CACHE_DIR"; grep -rn --include=*.py TORCHINDUCTOR_CACHE_DIR "$tsite/torch/_inductor" | head -4
    echo "## TORCH_EXTENSIONS_DIR"; grep -n TORCH_EXTENSIONS_DIR "$tsite/torch/utils/cpp_extension.py" | head -4
    for v in SGLANG_CACHE_DIR SGLANG_DG_CACHE_DIR DG_JIT_CACHE_DIR TVM_FFI_CACHE_DIR FLASHINFER_WORKSPACE_BASE \
             CUTE_DSL_CACHE_DIR FLASH_ATTENTION_CUTE_DSL_CACHE_DIR SGLANG_USE_CUSTOM_TRITON_KERNEL_CACHE; do
      echo "## $v"
      grep -rn --include=*.py -e "$v" "$s/sglang" "$s/flashinfer/jit" "$s/flashinfer/cute_dsl" "$s/tvm_ffi" "$s/deep_gemm" \
        "$s/flashinfer/data/cutlass/python/CuTeDSL/cutlass/base_dsl" 2>/dev/null | grep -v '/test' | head -6
    done
    echo "## DG_JIT_CACHE_DIR in deep_gemm's binary"; ls "$s"/deep_gemm/*.so 2>/dev/null | while read -r so; do
      echo "$so: $(grep -c -a DG_JIT_CACHE_DIR "$so") line(s)"; done
    libcuda=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
    echo "## CUDA_CACHE_* in the driver ($libcuda -> $(readlink -f "$libcuda"))"
    [ -n "$libcuda" ] && grep -a -o 'CUDA_CACHE_[A-Z_]*' "$(readlink -f "$libcuda")" | sort | uniq -c
    echo "## PYTHONPYCACHEPREFIX: $(PYTHONPYCACHEPREFIX=/x python3 -c 'import sys; print("sys.pycache_prefix =", sys.pycache_prefix)')"
  } > "$R/cache-env-vars.txt" 2>&1
  grep -c . "$R/cache-env-vars.txt"
}

snap() {  # snap K DIR WHEN: sizes of every cache under K -> DIR/caches-WHEN.json (+ a file manifest)
  bounded 60 python3 "$HELPER" sizes "$1" "$2/caches-$3.json" --manifest "$2/caches-$3.tsv.gz" | sed "s/^/  $3: /"
}

# serve_timed NAME TIMEOUT: lib.sh's serve, with the gate polling every 0.5-1 s and the time in ms
serve_timed() {
  local host=$1 timeout=$2 unit="$RENDER/$1/sglang.service" dir="$R/$1"
  mkdir -p "$dir"
  echo "before start: $(gpu_mem)" > "$dir/gpu-memory.txt"
  host_py "$ROOT/scripts/device/run_unit.py" show "$unit" > "$dir/unit-run.json"
  local t0; t0=$(date +%s.%N)
  host_py "$ROOT/scripts/device/run_unit.py" start "$unit" --log "$dir/sglang.log" --pid-file "$dir/pid" || return 1
  URL=$(json_field "$dir/unit-run.json" url)
  MODEL=$(json_field "$dir/unit-run.json" model)
  PYTHONPATH="$ROOT/module_utils" bounded "$timeout" python3 -m sglang_deploy_host.serving.endpoint wait-ready \
    --url "$URL" --timeout "$timeout" --env-file "$ENV_FILE" --initial-delay 0.5 --max-delay 1 > "$dir/wait-ready.txt" 2>&1 &
  local gate=$! server; server=$(cat "$dir/pid")
  while kill -0 "$gate" 2>/dev/null; do
    if ! kill -0 "$server" 2>/dev/null; then echo "the server exited before it was ready" >> "$dir/wait-ready.txt"; kill "$gate"; fi
    sleep 0.1
  done
  wait "$gate"; local rc=$?
  local t1; t1=$(date +%s.%N)
  echo "$t0 $t1" > "$dir/start-ready-epoch.txt"
  python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$t1" > "$dir/seconds-to-ready.txt"
  echo "ready: $(gpu_mem)" >> "$dir/gpu-memory.txt"
  echo "rc=$rc after $(cat "$dir/seconds-to-ready.txt") s: $(tail -1 "$dir/wait-ready.txt")"
  return $rc
}

start_and_measure() {  # NAME K TIMEOUT
  local name=$1 k=$2 timeout=$3 d="$R/$1"
  mkdir -p "$d"
  snap "$k" "$d" before-start
  ls -A /tmp > "$d/tmp-before.txt"
  serve_timed "$name" "$timeout"; local rc=$?
  echo "$rc" > "$d/ready-rc.txt"
  snap "$k" "$d" at-ready
  ls -A /tmp > "$d/tmp-at-ready.txt"
  grep -h "Engine startup timings" "$d/sglang.log" | cut -c1-300
  return $rc
}

traffic_step() {  # /metrics idle, the traffic, /metrics during and after (in $R/metrics)
  bounded 120 python3 "$HELPER" traffic "$URL" "$ENV_FILE" "$MODEL" "$R/metrics"
}

probe_step() {  # NAME TIMEOUT: one top_p request on the running server -> $R/NAME/probe.json
  bounded "$2" python3 "$HELPER" probe "$URL" "$ENV_FILE" "$R/$1/probe.json" --timeout "$(( $2 - 5 ))"
}

assemble() { python3 "$HELPER" assemble "$R" "$R/jit-cache-starts.json" && cp "$R/jit-cache-starts.json" "$OUT/"; }

finish() {
  local h
  for h in start-a start-b start-c start-d start-e; do stop_server "$h" > /dev/null 2>&1; done
  [ -f "$R/jit-cache-starts.json" ] || assemble
  pack_results
}

# The start of either call: results and log directories, the bundle, the helpers, the checkpoint.
begin_call() {
  OUT=${OUT:-/tmp/day2-out}; mkdir -p "$OUT"
  R=$(mktemp -d /tmp/day2.XXXX)
  RENDER_IN="$ROOT/${DAY2_RENDER:-.cache/real-sglang/render}"; RENDER=$RENDER_IN
  exec > >(tee "$R/device.log") 2>&1
  trap finish EXIT
  device_facts | tee "$R/device-facts.txt"
  phase unpack-bundle unpack "$CACHE/bundle" || return 1
  phase install-host-files install_host_files "$HOST" || return 1
  phase make-checkpoint make_checkpoint || return 1
}

device() {
  begin_call || return 1
  phase cache-env-names find_cache_vars
  local k=/var/tmp/day2-caches/K k2=/var/tmp/day2-caches/K2
  rm -rf /var/tmp/day2-caches
  RENDER="$R/units"  # from here on: the three variants of HOST's unit (stop_server reads them there)
  make_unit start-a "$k" && make_unit start-b "$k" && make_unit start-c "$k2" || return 1

  phase "start a: cold, empty K" start_and_measure start-a "$k" 240
  phase "stop a" stop_server start-a
  snap "$k" "$R/start-a" after-stop
  if phase "start b: warm, same K" start_and_measure start-b "$k" 150; then
    phase "metrics + traffic (on b)" traffic_step
    snap "$k" "$R/start-b" after-traffic
  fi
  phase "stop b" stop_server start-b
  if (( $(left) > 150 )); then
    phase "start c: cold, fresh K2" start_and_measure start-c "$k2" $(( $(left) - 60 < 240 ? $(left) - 60 : 240 ))
    phase "stop c" stop_server start-c
  else
    note "start c: skipped (budget: $(left) s left)"
  fi
  phase assemble assemble
}

device_traffic() {
  begin_call || return 1
  local k=/var/tmp/day2-caches/K
  rm -rf /var/tmp/day2-caches
  RENDER="$R/units"
  make_unit start-d "$k" > /dev/null && make_unit start-e "$k" > /dev/null || return 1

  phase "start d: cold, empty K" start_and_measure start-d "$k" 240 || return 1
  phase "metrics + greedy traffic (on d)" bounded 120 python3 "$HELPER" traffic "$URL" "$ENV_FILE" "$MODEL" "$R/metrics" \
    --all-greedy --burst-deadline 60
  snap "$k" "$R/start-d" after-traffic
  local t=$(( $(left) - 110 )); (( t > 240 )) && t=240
  phase "first top_p request (on d)" probe_step start-d "$t"
  snap "$k" "$R/start-d" after-probe
  phase "stop d" stop_server start-d
  if python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["first_top_p_request"]["status"] != 200)' "$R/start-d/probe.json" 2>/dev/null && (( $(left) > 90 )); then
    phase "start e: warm, same K" start_and_measure start-e "$k" 120 && phase "first top_p request (on e)" probe_step start-e 40
    phase "stop e" stop_server start-e
  else
    note "start e: skipped (the probe on d did not finish, or budget: $(left) s left)"
  fi
  phase assemble assemble
}

case "${1:-}" in
  prepare) prepare day2-readings.sh ;;
  device) device ;;
  device-traffic) device_traffic ;;
  *) echo "usage: $0 prepare|device|device-traffic" >&2; exit 2 ;;
esac
