#!/bin/bash
# GLM-5's own architecture on the device machine's H200: sglang 0.5.17 serving dummy weights with GLM-5's
# shapes (scripts/device/make_glm5_arch.py) through the rendered units of inventory/device's device_glm5
# hosts, the memory readings the planner is checked against, and the profile's speed choices as A/Bs with
# `sglang-deploy bench`.
#
#   scripts/device/glm5-arch.sh prepare       here: the sglang bundle (build-sglang-bundle.sh), `sglang-deploy
#                                             render -i inventory/device` with a throwaway API key and
#                                             `sglang-deploy validate` (the lane's parser), into .cache/real-sglang/
#   scripts/device/glm5-arch.sh device CALL   on the device machine, through the run tool, one call per CALL:
#       run(command="bash scripts/device/glm5-arch.sh device mla",
#           carry=[".cache/real-sglang/bundle", ".cache/real-sglang/render"], timeout_s=600)
#
# CALL is a list of starts (one inventory host each, in order; a start the budget cannot finish is skipped
# and said so). Per start: run_unit.py starts the unit (ExecStartPre=, ExecStart=, Environment=), the
# readiness gate's own code waits, then the start's steps run:
#   act          one prefill each of 1,024 / 2,048 / 4,096 / 8,192 tokens and the GPU memory after each
#                (server_readings.py activations: the planner's activation term)
#   bench=C,...  sglang-deploy bench --endpoint at those concurrencies: 512 in / 128 out tokens, 5 prompts
#                per concurrent request, warm-up = concurrency, seed 1 (the same for every start)
#   snap         /metrics and /server_info (server_readings.py snapshot: the dashboards' metric names)
# and the unit is stopped (SIGTERM to its session, SIGKILL after the unit's TimeoutStopSec=). Every start
# of a call shares the JIT caches under /var/lib/sglang/cache (the units' environment): each start records
# how many files it added to each (cache-files.txt), so the first start of a kind pays the builds and the
# later ones show what they reused. Then `sglang-deploy doctor` reads every log. Results: $OUT/results.tar.gz
# (server logs, readings, bench runs, summary.txt) and $OUT/summary.txt. Then, here:
#   tar -xzf results.tar.gz -C DIR && python scripts/device/planner_vs_sglang.py DIR --json ...
# The runs of 2026-12-01 and what they showed: tests/fixtures/real-sglang/README.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODELS=/var/lib/sglang/models
JIT_CACHES=/var/lib/sglang/cache
BENCH_ARGS=(--input-len 512 --output-len 128 --prompts-per-concurrency 5 --seed 1 --step-timeout 120)

# CALL -> "HOST:STEP+STEP ..." in the order they run (the most important first).
declare -A CALLS=(
  [mla]="glm5-mla-bf16:bench=1,64+snap glm5-mla-fp8:bench=1,64 glm5-mla-fp8-f070:bench=1 glm5-mla-bf16-mtp:bench=1"
  [dsa]="glm5-dsa-bf16:act+bench=1,64+snap glm5-dsa-fp8:bench=1,64 glm5-dsa-bf16-bs128:- glm5-dsa-bf16-small:bench=64 glm5-dsa-mtp:bench=1"
  # What the first two calls of 2026-12-01 left for the budget's rest: both variants.
  [rest]="glm5-mla-fp8-f070:bench=1 glm5-dsa-fp8:bench=1,64 glm5-mla-bf16-mtp:bench=1"
  # What the budget left out of those three calls: the MTP starts and the memory-saving one.
  [last]="glm5-dsa-mtp:bench=1 glm5-dsa-bf16-small:bench=64 glm5-mla-bf16-mtp:bench=1"
  [small]="glm5-dsa-bf16-small:bench=64 glm5-mla-bf16-mtp:bench=1"
  # MTP's memory at a second fraction on DSA, and the MLA+MTP start given the first start's longer wait.
  [mtp]="glm5-mla-bf16-mtp:bench=1 glm5-dsa-mtp-f075:bench=1"
  [mtp-f075]="glm5-dsa-mtp-f075:bench=1"
  # The chunked-prefill size alone (the memory-saving start changed it with the graph cap).
  [chunk]="glm5-dsa-bf16-chunk4k:bench=1,64"
)

# ---------------------------------------------------------------------------------------------------------
# shellcheck source=scripts/device/lib.sh
source "$ROOT/scripts/device/lib.sh"

make_checkpoint() {  # make_checkpoint VARIANT: the checkpoint directory the variant's units load
  PYTHONPATH=$BUNDLE_DIR/site python3 "$ROOT/scripts/device/make_glm5_arch.py" "$MODELS/glm5-$1" --variant "$1" \
    && cp "$MODELS/glm5-$1/arch.json" "$R/arch-$1.json" && cp "$MODELS/glm5-$1/config.json" "$R/config-$1.json"
}

cache_files() {  # one line per JIT cache directory: name and file count
  local d
  for d in "$JIT_CACHES"/*/; do [ -d "$d" ] && echo "$(basename "$d") $(find "$d" -type f | wc -l)"; done
}

run_steps() {  # run_steps HOST STEP+STEP...
  local host=$1 step
  local -a steps; IFS=+ read -r -a steps <<< "$2"
  for step in "${steps[@]}"; do
    case "$step" in
      act) phase "$host activations" bounded 120 env PYTHONPATH="$ROOT/module_utils" python3 "$ROOT/scripts/device/server_readings.py" activations \
             "$URL" "$ENV_FILE" --out "$R/$host/activations.json" ;;
      snap) phase "$host snapshot" bounded 60 env PYTHONPATH="$ROOT/module_utils" python3 "$ROOT/scripts/device/server_readings.py" snapshot \
              "$URL" "$ENV_FILE" --out "$R/$host" ;;
      bench=*) phase "$host bench ${step#bench=}" bench_endpoint "$host" 330 "$MODELS/glm5-$VARIANT" \
                 --concurrency "${step#bench=}" "${BENCH_ARGS[@]}" ;;
      -) ;;
      *) note "$host: unknown step $step" ;;
    esac
    echo "after $step: $(gpu_mem)" >> "$R/$host/gpu-memory.txt"
  done
}

start() {  # start HOST STEPS: one server start and its steps
  local host=$1 steps=$2
  VARIANT=${host#glm5-}; VARIANT=${VARIANT%%-*}
  # A start needs about 110 s to be ready and stop, a bench step about 40 s per concurrency.
  local need=110 step
  local -a parts; IFS=+ read -r -a parts <<< "$steps"
  for step in "${parts[@]}"; do
    case "$step" in bench=*) need=$(( need + 40 * ($(tr -cd ',' <<< "$step" | wc -c) + 1) )) ;; act) need=$(( need + 30 )) ;; esac
  done
  if (( $(left) < need )); then note "$host: skipped (budget: $(left) s left, needs about $need s)"; return 0; fi
  mkdir -p "$R/$host"
  cache_files > "$R/$host/cache-files-before.txt"
  # The first start of a call may JIT-build what the call's kind needs first (minutes): it waits longer.
  local wait=300; [ "$host" = "${HOSTS[0]}" ] && wait=420
  if phase "ready $host" serve "$host" "$wait"; then
    run_steps "$host" "$steps"
  fi
  stop_server "$host"
  cache_files > "$R/$host/cache-files-after.txt"
  join -a1 -a2 -e0 -o 0,1.2,2.2 <(sort "$R/$host/cache-files-before.txt") <(sort "$R/$host/cache-files-after.txt") \
    | awk '{print $1, $2, "->", $3, "(" ($3 - $2) " added)"}' > "$R/$host/cache-files.txt"
  note "$host JIT cache files (before -> after): $(paste -sd';' "$R/$host/cache-files.txt")"
}

finish() {
  for host in "${HOSTS[@]}"; do stop_server "$host" > /dev/null 2>&1; done
  phase doctor-on-every-log doctor_all
  du -sk "$JIT_CACHES"/* 2>/dev/null > "$R/jit-cache-sizes.txt"
  cp "$JIT_CACHES"/flashinfer-prebuild.* "$R/" 2>/dev/null
  pack_results
}

device() {
  local call=${1:-}
  [ -n "${CALLS[$call]+x}" ] || { echo "usage: $0 device CALL (${!CALLS[*]})" >&2; exit 2; }
  OUT=${OUT:-/tmp/glm5-arch-out}; mkdir -p "$OUT"
  R=$(mktemp -d /tmp/glm5-arch.XXXX); RENDER="$CACHE/render"
  exec > >(tee "$R/device.log") 2>&1
  read -r -a ENTRIES <<< "${CALLS[$call]}"
  HOSTS=(); local entry
  for entry in "${ENTRIES[@]}"; do HOSTS+=("${entry%%:*}"); done
  trap finish EXIT
  note "call $call: ${HOSTS[*]}"
  device_facts | tee "$R/device-facts.txt"
  phase unpack-bundle unpack "$CACHE/bundle" || return 1
  phase install-host-files install_host_files "${HOSTS[0]}" || return 1
  local variant
  for variant in $(printf '%s\n' "${HOSTS[@]}" | sed 's/^glm5-//; s/-.*//' | sort -u); do
    phase "make the $variant checkpoint" make_checkpoint "$variant" || return 1
  done
  phase validate-with-sglang-0.5.17 validate_units "${HOSTS[@]}"
  mkdir -p "$JIT_CACHES"
  [ "$call" = dsa ] && prebuild_flashinfer_mla
  for entry in "${ENTRIES[@]}"; do start "${entry%%:*}" "${entry#*:}"; done
}

# The mla call's first start would spend minutes JIT-building flashinfer's FA3 MLA and prefill modules
# (one file each is several minutes of nvcc). The dsa call (which needs neither) builds them in the
# background into the units' flashinfer cache, at nice 19 on 4 of the 16 cores, in a session of its own
# that outlives the call: a warm machine's next call (mla) finds them built, and the build's seconds are
# kept as the cold-JIT figure (flashinfer-prebuild.jsonl). On a fresh machine the mla call builds them.
prebuild_flashinfer_mla() {
  local unit_env="$R/${HOSTS[0]}/unit-run.json" cuda_home
  cuda_home=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["environment"]["CUDA_HOME"])' "$unit_env")
  setsid nice -n 19 env MAX_JOBS=4 FLASHINFER_WORKSPACE_BASE="$JIT_CACHES/flashinfer" CUDA_HOME="$cuda_home" \
    PATH="$cuda_home/bin:$PATH" PYTHONPATH="$BUNDLE_DIR/site" \
    python3 "$ROOT/scripts/device/flashinfer_prebuild.py" --log "$JIT_CACHES/flashinfer-prebuild.jsonl" \
    > "$JIT_CACHES/flashinfer-prebuild.out" 2>&1 < /dev/null &
  note "flashinfer MLA prebuild started in the background (pid $!)"
}

case "${1:-}" in
  prepare) prepare glm5-arch.sh ;;
  device) shift; device "$@" ;;
  *) echo "usage: $0 prepare | device CALL" >&2; exit 2 ;;
esac
