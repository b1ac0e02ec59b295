#!/bin/bash
# Speculative decoding and the quality check with trained weights on the device machine's GPU (H100 or H200):
# what MTP gains with a trained draft layer, what a checkpoint without its draft layer does (sglang serves it and
# says nothing), whether SGLANG_ENABLE_SPEC_V2 helps, and whether `sglang-deploy quality check` passes the launches
# that compute the model and fails those that do not - through the rendered units of inventory/device's device_mtp
# hosts (the tuned / tuned-mtp profiles' flags), `sglang-deploy bench`, which records sglang's acceptance length,
# and `sglang-deploy quality record|check`.
#
#   scripts/device/mtp-evidence.sh prepare      here: the sglang bundle (build-sglang-bundle.sh), `sglang-deploy
#                                               render -i inventory/device` with a throwaway API key and `validate`
#   scripts/device/mtp-evidence.sh device [CALL]   on the device machine, through the run tool:
#       run(command="bash scripts/device/mtp-evidence.sh device first", timeout_s=600,
#           carry=[".cache/real-sglang/bundle", ".cache/real-sglang/render"])
#     Every call trains the model (train_tiny_mtp.py, TRAIN_S seconds: a trained model is ~80 MB, more than a call
#     brings back), records the quality reference on its mtp-off start and checks its other starts against it.
#     CALL picks the starts (each "host:actions"; actions: record, check, bench1, bench64 = sglang-deploy bench at
#     concurrency 1 / 64; STARTS overrides), each skipped and said so when the budget cannot finish it:
#       first   mtp-off (record, bench 1 and 64), mtp-trained (check, bench 1 and 64 with --quality-reference: the
#               acceptance length must be >= 1.5), q-kv-fp8-e5m2 (check: must FAIL), q-restart (check: must PASS),
#               q-rope-drift (check: must FAIL)
#       second  mtp-off (record, bench 1 and 64), mtp-nodraft (check, bench 1: acceptance about 1), mtp-specv2
#               (check, bench 1 and 64), q-kv-fp8-e4m3 (check: measured), q-restart, q-rope-drift
# Before the starts (first call): `sglang-deploy checkpoint` on both checkpoints (usable / missing) and `sglang-deploy
# plan --checkpoint` with the speculative flags on the draft-less one (must refuse: exit 2). After: `bench
# --compare` of each MTP start against mtp-off, the draft-less start's log searched for any word about the missing
# layer, mtp-evidence.json and quality-evidence.json (every figure, the verdicts, date and machine). Results:
# $OUT/results.tar.gz, $OUT/summary.txt, $OUT/mtp-evidence.json, $OUT/quality-evidence.json. Then, here, keep them as
# fixtures: tests/fixtures/real-sglang/<gpu>-mtp-<date>/ (docs/quality.md and docs/performance.md say what they show).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODELS=/var/lib/sglang/models
TRAIN_S=${TRAIN_S:-100}
BENCH_ARGS=(--input-len 256 --output-len 256 --prompts-per-concurrency 5 --seed 1 --step-timeout 90)
STARTS_FIRST="mtp-off:record,bench1,bench64 mtp-trained:check,bench1,bench64 q-kv-fp8-e5m2:check q-restart:check q-rope-drift:check"
STARTS_SECOND="mtp-off:record,bench1,bench64 mtp-nodraft:check,bench1 mtp-specv2:check,bench1,bench64 q-kv-fp8-e4m3:check q-restart:check q-rope-drift:check"

# shellcheck source=scripts/device/lib.sh
source "$ROOT/scripts/device/lib.sh"

train() {
  PYTHONPATH=$BUNDLE_DIR/site bounded $((TRAIN_S + 90)) python3 "$ROOT/scripts/device/train_tiny_mtp.py" "$MODELS/train" \
    --seconds "$TRAIN_S" || return 1
  rm -rf "$MODELS/tiny-mtp" "$MODELS/tiny-mtp-nodraft"
  mv "$MODELS/train/tiny-mtp" "$MODELS/train/tiny-mtp-nodraft" "$MODELS/"
  cp "$MODELS/train/report.json" "$R/train-report.json"
  python3 "$ROOT/scripts/device/quality_prompts_tiny.py" "$R/quality-prompts.yml"
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

REFERENCE=""  # the quality reference this call recorded (record), that its later starts are checked against

quality() {  # quality HOST record|check: sglang-deploy quality against HOST's running server (URL, MODEL from serve)
  local host=$1 action=$2 rc
  local key; key=$(api_key)
  if [ "$action" = record ]; then
    SGLANG_API_KEY=$key bounded 120 bash -c "cd '$ROOT' && PYTHONPATH='$ROOT/src:$ROOT/module_utils:$BUNDLE_DIR/tools' \
      python3 -m sglang_deploy.cli quality record --endpoint '$URL' --model '$MODEL' --prompts '$R/quality-prompts.yml' \
      --out '$R/quality-reference.json'" > "$R/$host/quality-record.txt" 2>&1
    rc=$?; cat "$R/$host/quality-record.txt"
    (( rc == 0 )) && REFERENCE="$R/quality-reference.json"
    return $rc
  fi
  [ -n "$REFERENCE" ] || { echo "no reference recorded in this call: nothing to check against"; return 2; }
  SGLANG_API_KEY=$key bounded 120 bash -c "cd '$ROOT' && PYTHONPATH='$ROOT/src:$ROOT/module_utils:$BUNDLE_DIR/tools' \
    python3 -m sglang_deploy.cli quality check --endpoint '$URL' --reference '$REFERENCE' --json" > "$R/$host/quality.json" 2> "$R/$host/quality.err"
  rc=$?
  echo "$rc" > "$R/$host/quality.rc"
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(v["verdict"], "kl_mean", round(v["kl"]["mean"], 6), "kl_p99", round(v["kl"]["p99"], 6), "top1", round(v["top1_agreement"], 4), "greedy", v["greedy"]["identical"], "/", v["greedy"]["prompts"], "batch", v["batch"]["identical"], "/", v["batch"]["requests"], "s", v["seconds"])' "$R/$host/quality.json" 2>/dev/null || cat "$R/$host/quality.err"
  return $rc
}

start() {  # start HOST ACTIONS: serve, then each action (record, check, bench1, bench64), stop
  local host=$1 actions=$2 action concurrency=""
  if (( $(left) < 120 )); then note "$host: skipped (budget: $(left) s left)"; return 124; fi
  install_host_files "$host" > /dev/null || return 1
  if phase "ready $host" serve "$host" 180; then
    for action in ${actions//,/ }; do
      case "$action" in
        record|check) phase "quality $action $host" quality "$host" "$action" ;;
        bench1) concurrency+="${concurrency:+,}1" ;;
        bench64) concurrency+="${concurrency:+,}64" ;;
      esac
    done
    if [ -n "$concurrency" ] && (( $(left) > 60 )); then
      local with=()
      [ -n "$REFERENCE" ] && [[ ",$actions," == *",check,"* ]] && with=(--quality-reference "$REFERENCE")
      phase "bench $host ($concurrency)" bench_endpoint "$host" 240 "$MODELS/tiny-mtp" "${BENCH_ARGS[@]}" --concurrency "$concurrency" "${with[@]}"
    fi
  fi
  stop_server "$host"
}

silence() {  # what sglang said about the draft-less checkpoint's missing layer (the evidence is: nothing)
  [ -f "$R/mtp-nodraft/sglang.log" ] || return 0
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

quality_evidence() {  # every quality check of this call against its reference, in one file
  python3 - "$R" "$OUT/quality-evidence.json" "$CALL" <<'EOF'
import json, os, subprocess, sys
root, out, call = sys.argv[1:4]
# What each start must give (docs/quality.md): a launch that computes the model passes, one that does not fails.
EXPECTED = {"mtp-trained": "PASS", "mtp-nodraft": "PASS", "mtp-specv2": "PASS", "q-restart": "PASS",
            "q-kv-fp8-e5m2": "FAIL", "q-rope-drift": "FAIL", "q-kv-fp8-e4m3": "measured"}
def read(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
def argv(host):
    """The launch's own arguments: ExecStart= after the launcher's "--"."""
    words = (read(f"{root}/{host}/unit-run.json") or {}).get("exec_start") or []
    return words[words.index("--") + 1:] if "--" in words else words
def flags(words):
    found, i = {}, 0
    while i < len(words):
        if words[i].startswith("--"):
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
            found[words[i]] = value
            i += 1 if value is True else 2
        else:
            i += 1
    return found
base = flags(argv("mtp-off"))
reference = read(f"{root}/quality-reference.json") or {}
launches = []
for host in EXPECTED:
    verdict = read(f"{root}/{host}/quality.json")
    if verdict is None:
        if os.path.exists(f"{root}/{host}/quality.err"):
            launches.append({"name": host, "verdict": "NO VERDICT", "error": open(f"{root}/{host}/quality.err").read()[-500:],
                             "expected": EXPECTED[host], "as_expected": False})
        continue
    mine = flags(argv(host))
    changed = {k: [base.get(k), v] for k, v in mine.items() if base.get(k) != v and k not in ("--model-path", "--model")}
    changed.update({k: [v, None] for k, v in base.items() if k not in mine})
    env = (read(f"{root}/{host}/unit-run.json") or {}).get("environment") or {}
    launches.append({
        "name": host, "flags_changed": changed,
        "environment_changed": {k: v for k, v in env.items() if k == "SGLANG_ENABLE_SPEC_V2"},
        "kl_mean": verdict["kl"]["mean"], "kl_p99": verdict["kl"]["p99"], "kl_max": verdict["kl"]["max"],
        "kl_positions": verdict["kl"]["positions"], "kl_prefill_mean": verdict["kl"]["prefill_mean"],
        "kl_decode_mean": verdict["kl"]["decode_mean"], "top1_agreement": verdict["top1_agreement"],
        "greedy_identical": f"{verdict['greedy']['identical']}/{verdict['greedy']['prompts']}",
        "greedy_partings": verdict["greedy"]["partings"],
        "batch_consistent": not verdict["batch"]["departures"],
        "batch": f"{verdict['batch']['identical']} identical, {verdict['batch']['tie_flips']} tie flips of {verdict['batch']['requests']} at c{verdict['batch']['concurrency']}",
        "continuation_nll": verdict["continuation_nll"], "verdict": verdict["verdict"], "reasons": verdict["reasons"],
        "threshold": verdict["thresholds"], "seconds": verdict["seconds"], "tokens": verdict["tokens"],
        "expected": EXPECTED[host],
        "as_expected": EXPECTED[host] == "measured" or verdict["verdict"] == EXPECTED[host],
    })
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
result = {
    "date": subprocess.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True).stdout.strip(),
    "machine": gpu, "call": call, "sglang": reference.get("launch", {}).get("version"),
    "reference": {"recorded_on": "mtp-off", "prompt_set": reference.get("prompt_set"), "seconds": reference.get("seconds"),
                  "tokens": reference.get("tokens"), "batch": reference.get("batch"), "launch": reference.get("launch")},
    "launches": launches,
}
json.dump(result, open(out, "w"), indent=2)
for launch in launches:
    print(launch["name"], launch["verdict"], "expected", launch["expected"], "kl_mean", launch.get("kl_mean"), "top1", launch.get("top1_agreement"))
EOF
  cp "$OUT/quality-evidence.json" "$R/"
}

finish() {
  local item
  for item in $STARTS; do stop_server "${item%%:*}" > /dev/null 2>&1; done
  [ -f "$R/quality-reference.json" ] && cp "$R/quality-reference.json" "$OUT/"
  pack_results
}

device() {
  OUT=${OUT:-/tmp/mtp-evidence-out}; mkdir -p "$OUT"
  R=$(mktemp -d /tmp/mtp-evidence.XXXX); RENDER="$CACHE/render"
  exec > >(tee "$R/device.log") 2>&1
  trap finish EXIT
  device_facts | tee "$R/device-facts.txt"
  note "call $CALL: $STARTS"
  phase unpack-bundle unpack "$CACHE/bundle" || return 1
  phase "train ($CALL)" train || return 1
  [ "$CALL" = first ] && phase inspect-checkpoints inspect
  local item hosts=()
  for item in $STARTS; do hosts+=("${item%%:*}"); done
  phase validate-with-sglang-0.5.17 validate_units "${hosts[@]}"
  for item in $STARTS; do start "${item%%:*}" "${item#*:}"; done
  phase silence silence
  phase compare compare
  phase evidence evidence
  phase quality-evidence quality_evidence
  phase doctor-on-every-log doctor_all
}

CALL=${2:-first}
case "$CALL" in
  first) STARTS=${STARTS:-$STARTS_FIRST} ;;
  second) STARTS=${STARTS:-$STARTS_SECOND} ;;
  *) echo "usage: $0 prepare|device [first|second]" >&2; exit 2 ;;
esac
case "${1:-}" in
  prepare) prepare mtp-evidence.sh ;;
  device) device ;;
  *) echo "usage: $0 prepare|device [first|second]" >&2; exit 2 ;;
esac
