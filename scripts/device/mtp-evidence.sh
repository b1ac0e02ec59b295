#!/bin/bash
# Speculative decoding with trained weights on the device machine's H200: what MTP gains with a trained draft
# layer, what a checkpoint without its draft layer does (sglang serves it and says nothing), and whether
# SGLANG_ENABLE_SPEC_V2 helps - through the rendered units of inventory/device's device_mtp hosts (the tuned /
# tuned-mtp profiles' flags) and `sglang-deploy bench`, which records sglang's acceptance length.
#
#   scripts/device/mtp-evidence.sh prepare      here: the sglang bundle (build-sglang-bundle.sh), `sglang-deploy
#                                               render -i inventory/device` with a throwaway API key and `validate`
#   scripts/device/mtp-evidence.sh device [CALL]   on the device machine, through the run tool:
#       run(command="bash scripts/device/mtp-evidence.sh device", timeout_s=600,
#           carry=[".cache/real-sglang/bundle", ".cache/real-sglang/render"])
#     CALL "all" (default): train (train_tiny_mtp.py, TRAIN_S seconds), then the starts below; "serve": the
#     same starts on a trained model carried back in .cache/real-sglang/tiny-mtp.tar.gz (a first call's
#     $OUT/tiny-mtp.tar.gz; add it to carry), for a second call when the first ran out of budget.
#
# Per start (in this order, each skipped and said so when the budget cannot finish it):
#   mtp-off      tuned without MTP                       bench at concurrency 1 and 64
#   mtp-trained  tuned-mtp on the trained draft          bench at 1 and 64: the acceptance length must be >= 1.5
#   mtp-nodraft  tuned-mtp without the draft's tensors   bench at 1 (and 64 if time): acceptance about 1
#   mtp-specv2   tuned-mtp + SGLANG_ENABLE_SPEC_V2=True  bench at 1 and 64
# Before the starts: `sglang-deploy checkpoint` on both checkpoints (usable / missing) and `sglang-deploy plan
# --checkpoint` with the speculative flags on the draft-less one (must refuse: exit 2). After: `bench --compare`
# of each MTP start against mtp-off, the draft-less start's log searched for any word about the missing layer,
# and mtp-evidence.json: every figure, the verdicts, date and machine. Results: $OUT/results.tar.gz,
# $OUT/summary.txt, $OUT/mtp-evidence.json, $OUT/tiny-mtp.tar.gz. Then, here, keep them as fixtures:
#   tests/fixtures/real-sglang/h200-mtp-<date>/ (mtp-evidence.json, summary.txt, the bench runs' results.jsonl).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODELS=/var/lib/sglang/models
TRAIN_S=${TRAIN_S:-150}
BENCH_ARGS=(--input-len 256 --output-len 256 --prompts-per-concurrency 5 --seed 1 --step-timeout 90)

# shellcheck source=scripts/device/lib.sh
source "$ROOT/scripts/device/lib.sh"

train() {
  local carried="$CACHE/tiny-mtp.tar.gz"
  if [ "$CALL" = serve ]; then
    [ -f "$carried" ] || { echo "CALL serve needs $carried (a first call's \$OUT/tiny-mtp.tar.gz)"; return 1; }
    tar -C "$MODELS" -xzf "$carried" && return 0
  fi
  PYTHONPATH=$BUNDLE_DIR/site bounded $((TRAIN_S + 90)) python3 "$ROOT/scripts/device/train_tiny_mtp.py" "$MODELS/train" \
    --seconds "$TRAIN_S" || return 1
  mv "$MODELS/train/tiny-mtp" "$MODELS/train/tiny-mtp-nodraft" "$MODELS/"
  cp "$MODELS/train/report.json" "$R/train-report.json"
  tar -C "$MODELS" -czf "$OUT/tiny-mtp.tar.gz" tiny-mtp tiny-mtp-nodraft
}

inspect() {  # the checkpoints as the role and the CLI see them, before any start
  local rc=0
  cli checkpoint "$MODELS/tiny-mtp" --json > "$R/checkpoint-tiny-mtp.json" || rc=1
  cli checkpoint "$MODELS/tiny-mtp-nodraft" --json > "$R/checkpoint-tiny-mtp-nodraft.json" || rc=1
  cli checkpoint "$MODELS/tiny-mtp-nodraft" | tee "$R/checkpoint-tiny-mtp-nodraft.txt"
  cli plan --checkpoint "$MODELS/tiny-mtp-nodraft" --gpu-memory-mib 143771 --sm-major 9 --tp-size 1 \
    --speculative-algorithm EAGLE --kv-cache-dtype bfloat16 > "$R/plan-nodraft.txt" 2>&1
  echo "$?" > "$R/plan-nodraft.rc"
  echo "plan --checkpoint on the draft-less checkpoint: exit $(cat "$R/plan-nodraft.rc") (2 = refused)"
  return $rc
}

start() {  # start HOST CONCURRENCIES: serve, bench, stop
  local host=$1 concurrency=$2
  if (( $(left) < 150 )); then note "$host: skipped (budget: $(left) s left)"; return 124; fi
  install_host_files "$host" > /dev/null || return 1
  if phase "ready $host" serve "$host" 180; then
    phase "bench $host ($concurrency)" bench_endpoint "$host" 240 "$MODELS/tiny-mtp" "${BENCH_ARGS[@]}" --concurrency "$concurrency"
  fi
  stop_server "$host"
}

silence() {  # what sglang said about the draft-less checkpoint's missing layer (the evidence is: nothing)
  grep -inE 'missing|not found|unexpected|uninitiali|skipp' "$R/mtp-nodraft/sglang.log" > "$R/mtp-nodraft/draft-words.txt"
  echo "lines of mtp-nodraft's log about a missing draft weight: $(wc -l < "$R/mtp-nodraft/draft-words.txt")"
  return 0
}

compare() {  # bench --compare A B for each MTP start against mtp-off (runs on disk, no sweep)
  local a b host
  a=$(find "$R/mtp-off/bench" -name sweep.json -printf '%h\n' 2>/dev/null | head -1)
  for host in mtp-trained mtp-nodraft mtp-specv2; do
    b=$(find "$R/$host/bench" -name sweep.json -printf '%h\n' 2>/dev/null | head -1)
    [ -n "$a" ] && [ -n "$b" ] || continue
    cli bench --compare "$a" "$b" --out "$R/$host/compare" > "$R/$host/compare.txt" 2>&1
    echo "$host against mtp-off: $(tail -1 "$R/$host/compare.txt")"
  done
}

evidence() {  # every figure in one file, with what it shows
  python3 - "$R" "$OUT/mtp-evidence.json" <<'EOF'
import glob, json, os, subprocess, sys
root, out = sys.argv[1], sys.argv[2]
def records(host):
    found = {}
    for path in glob.glob(f"{root}/{host}/bench/**/results.jsonl", recursive=True):
        for line in open(path):
            r = json.loads(line)
            found[r["max_concurrency"]] = {k: r.get(k) for k in ("output_throughput", "median_itl_ms", "accept_length", "completed")}
    return found
def read(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
hosts = {h: records(h) for h in ("mtp-off", "mtp-trained", "mtp-nodraft", "mtp-specv2")}
def speedup(host, c):
    a, b = hosts["mtp-off"].get(c), hosts[host].get(c)
    return round(b["output_throughput"] / a["output_throughput"], 3) if a and b and a["output_throughput"] else None
checks = {h: read(f"{root}/checkpoint-{h}.json") or {} for h in ("tiny-mtp", "tiny-mtp-nodraft")}
result = {
    "date": subprocess.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True).stdout.strip(),
    "machine": gpu, "train": read(f"{root}/train-report.json"), "runs": hosts,
    "speedup_over_mtp_off": {h: {c: speedup(h, c) for c in (1, 64)} for h in ("mtp-trained", "mtp-nodraft", "mtp-specv2")},
    "checkpoint_verdicts": {h: c.get("speculative") for h, c in checks.items()},
    "plan_refuses_nodraft": open(f"{root}/plan-nodraft.rc").read().strip() == "2" if os.path.exists(f"{root}/plan-nodraft.rc") else None,
    "nodraft_log_lines_about_the_draft": sum(1 for _ in open(f"{root}/mtp-nodraft/draft-words.txt")) if os.path.exists(f"{root}/mtp-nodraft/draft-words.txt") else None,
}
trained = [r["accept_length"] for r in hosts["mtp-trained"].values() if r.get("accept_length")]
result["trained_accept_length_at_least_1_5"] = bool(trained) and min(trained) >= 1.5
json.dump(result, open(out, "w"), indent=2)
print(json.dumps({k: result[k] for k in ("speedup_over_mtp_off", "checkpoint_verdicts", "plan_refuses_nodraft",
                                          "trained_accept_length_at_least_1_5")}))
EOF
  cp "$OUT/mtp-evidence.json" "$R/"
}

finish() {
  local host
  for host in mtp-off mtp-trained mtp-nodraft mtp-specv2; do stop_server "$host" > /dev/null 2>&1; done
  pack_results
}

device() {
  OUT=${OUT:-/tmp/mtp-evidence-out}; mkdir -p "$OUT"
  R=$(mktemp -d /tmp/mtp-evidence.XXXX); RENDER="$CACHE/render"
  exec > >(tee "$R/device.log") 2>&1
  trap finish EXIT
  device_facts | tee "$R/device-facts.txt"
  phase unpack-bundle unpack "$CACHE/bundle" || return 1
  phase "train ($CALL)" train || return 1
  phase inspect-checkpoints inspect
  phase validate-with-sglang-0.5.17 validate_units mtp-off mtp-trained mtp-nodraft mtp-specv2
  start mtp-off 1,64
  start mtp-trained 1,64
  start mtp-nodraft "$( (( $(left) > 330 )) && echo 1,64 || echo 1)"
  [ -f "$R/mtp-nodraft/sglang.log" ] && phase silence silence
  start mtp-specv2 1,64
  phase compare compare
  phase evidence evidence
  phase doctor-on-every-log doctor_all
}

CALL=${2:-all}
case "${1:-}" in
  prepare) prepare mtp-evidence.sh ;;
  device) device ;;
  *) echo "usage: $0 prepare|device [all|serve]" >&2; exit 2 ;;
esac
