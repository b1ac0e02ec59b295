"""GLM-5's own architecture on a real GPU (tests/fixtures/real-sglang/h200-glm5-arch-0.5.17/, made by
scripts/device/glm5-arch.sh on 2026-12-01): the memory planner against what sglang 0.5.17 measured there,
the cost of an fp8 pool under flashinfer MLA that the planner now names, and the planner's extrapolation
to the seed box (GLM-5-NVFP4 at TP 8 on 97,887 MiB cards) against the seed's own figures."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT

from sglang_deploy.bench import comparison as bench_comparison
from sglang_deploy.launch.config import LaunchConfig
from sglang_deploy.memory import architectures, planner, startlog
from sglang_deploy.observe import doctor

RUN = ROOT / "tests" / "fixtures" / "real-sglang" / "h200-glm5-arch-0.5.17"
STARTS = sorted(path.parent.name for path in RUN.glob("*/sglang.log"))
GLM5_CONFIG = json.loads((ROOT / "tests" / "fixtures" / "models" / "glm-5" / "config.json").read_text())


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "device" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


PVS = _script("planner_vs_sglang")
ROWS = {row["start"]: row for row in PVS.glm5_rows(RUN)}


def _log(start: str) -> startlog.StartLog:
    return startlog.parse((RUN / start / "sglang.log").read_text())


def _records(start: str) -> dict[int, dict]:
    return {r["max_concurrency"]: r for r in map(json.loads, (RUN / start / "bench" / "results.jsonl").read_text().splitlines())}


# --- the run itself -------------------------------------------------------------------------------
def test_every_start_served_glm5s_architecture_through_the_rendered_unit() -> None:
    assert STARTS == ["glm5-dsa-bf16", "glm5-dsa-bf16-bs128", "glm5-dsa-bf16-chunk4k", "glm5-dsa-bf16-small", "glm5-dsa-fp8", "glm5-dsa-mtp",
                      "glm5-dsa-mtp-f075", "glm5-mla-bf16", "glm5-mla-bf16-mtp", "glm5-mla-fp8", "glm5-mla-fp8-f070"]
    for start in STARTS:
        log = _log(start)
        assert log.ready, start  # "The server is fired up and ready to roll!"
        assert log.model_class == ("GlmMoeDsaForCausalLM" if "dsa" in start else "DeepseekV3ForCausalLM"), start
        assert doctor.diagnose((RUN / start / "sglang.log").read_text().splitlines()) == [], start


# What inventory/device/group_vars/device_glm5.yml changes against the proxmox profile, and why there.
CHANGED = {"model", "tp-size", "mem-fraction-static", "kv-cache-dtype", "max-running-requests"}
REMOVED = {"quantization", "nsa-decode-backend", "nsa-prefill-backend", "moe-runner-backend", "attention-backend"}


@pytest.mark.parametrize("start", STARTS)
def test_each_start_ran_the_proxmox_profile_minus_what_sm90_cannot_run(start: str) -> None:
    """The argv systemd would run (run_unit.py read it from the rendered unit): the launcher, then every flag
    of the seed profile with its value, except the documented changes."""
    unit = json.loads((RUN / start / "unit-run.json").read_text())
    argv = unit["exec_start"]
    assert argv[1].endswith("sglang_launcher.py") and argv[argv.index("--") - 1] == "api-key=SGLANG_API_KEY"
    flags: dict[str, object] = {}
    words = argv[argv.index("--") + 1:]
    for i, word in enumerate(words):
        if word.startswith("--"):
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
            flags[word[2:]] = value
    profile = __import__("yaml").safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/sglang_server.yml").read_text())
    for name, value in profile["sglang_server_flags"].items():
        if name in CHANGED or name in REMOVED and name not in flags:
            continue
        assert flags.get(name) == (True if value is True else str(value)), (start, name)
    assert flags["load-format"] == "dummy" and flags["tp-size"] == "1"
    assert ("attention-backend" in flags) == ("mla" in start)  # flashinfer kept where there is no indexer


def test_the_checkpoints_carry_glm5s_published_shapes_with_8_of_256_experts() -> None:
    assert dict(architectures.GLM5) | {"torch_dtype": "bfloat16"} == dict(architectures.GLM5)
    for key, value in GLM5_CONFIG.items():
        assert architectures.GLM5[key] == value, key  # the planner's fixture and the shipped shapes agree
    make = _script("make_glm5_arch")
    for variant in ("dsa", "mla"):
        config = json.loads((RUN / f"config-{variant}.json").read_text())
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim",
                    "qk_nope_head_dim", "v_head_dim", "q_lora_rank", "moe_intermediate_size", "num_experts_per_tok",
                    "vocab_size", "first_k_dense_replace", "num_nextn_predict_layers"):  # fmt: skip
            assert config[key] == architectures.GLM5[key], (variant, key)
        assert config["n_routed_experts"] == 8 and ("index_topk" in config) == (variant == "dsa")
        summary = json.loads((RUN / f"arch-{variant}.json").read_text())
        counted = make.parameter_count(make.shapes(8), indexer=variant == "dsa")
        assert summary["parameters"] == counted, variant
    # sglang's load held the counted BF16 weights plus its own copies (MLA's absorbed w_kc/w_vc).
    assert 77.62 < _log("glm5-dsa-bf16").readings["weights_gib"] < 77.62 * 1.04  # type: ignore[operator]


# --- the planner against sglang ---------------------------------------------------------------------
@pytest.mark.parametrize("start", STARTS)
def test_the_planners_kv_cell_is_sglangs_for_each_dtype_and_backend(start: str) -> None:
    """bf16 plain on DSA 100,152 B; fp8 in FlashMLA's packed layout 61,464 B (656 + 132 per layer); flashinfer
    MLA without the indexer 89,856 / 44,928 B; with MTP the draft's pool of the same tokens adds its one layer
    (x 79/78). sglang's own figure: its KV sizes (2-decimal GiB) / tokens."""
    cell = ROWS[start]["kv_bytes_per_token"]
    assert abs(cell["planner"] / cell["sglang"] - 1) < 0.0005, cell
    expected = {("dsa", "bfloat16"): 100_152, ("dsa", "fp8_e4m3"): 61_464, ("mla", "bfloat16"): 89_856, ("mla", "fp8_e4m3"): 44_928}
    layers = expected[("dsa" if "dsa" in start else "mla", ROWS[start]["kv_cache_dtype"])]
    assert cell["planner"] == (int(layers * (1 + 1 / 78)) if "mtp" in start else layers)


@pytest.mark.parametrize("start", STARTS)
def test_the_planner_reproduces_kv_tokens_within_2_percent_and_free_memory_within_10(start: str) -> None:
    row = ROWS[start]
    assert abs(row["kv_tokens"]["error_pct"]) < 2.0, row["kv_tokens"]
    assert abs(row["free_after_capture_mib"]["error_pct"]) < 10.0, row["free_after_capture_mib"]
    # Tighter than the issue asks: KV tokens within 1 % on every start, free memory within 2 % (1.5 % on the
    # memory-saving start: graphs only to 32, 4,096-token chunks; under 1 % on the others).
    assert abs(row["kv_tokens"]["error_pct"]) < 1.0 and abs(row["free_after_capture_mib"]["error_pct"]) < 2.0
    graphs = row["decode_graph_mib"]
    assert abs(graphs["planner"] - graphs["sglang"]) < 0.05 * graphs["sglang"], graphs


def test_an_fp8_pool_under_flashinfer_mla_holds_one_bf16_copy_of_a_layer_in_the_graphs() -> None:
    """The decode graphs took 1.01 GiB (948K tokens) and 0.48 GiB (449K tokens) more with an fp8 pool than
    with bf16: (tokens + 1) x 576 x 2 B each, the copy get_key_buffer(layer).to(q.dtype) makes."""
    bf16 = _log("glm5-mla-bf16").mib("decode_graphs_gib")
    assert bf16 is not None
    for start in ("glm5-mla-fp8", "glm5-mla-fp8-f070"):
        log = _log(start)
        extra = log.mib("decode_graphs_gib") - bf16  # type: ignore[operator]
        copy = (int(log.readings["max_total_num_tokens"]) + 1) * 576 * 2 / 2**20  # type: ignore[arg-type]
        assert abs(extra / copy - 1) < 0.02, (start, extra, copy)
        assert ROWS[start]["decode_graph_mib"]["of_which_kv_conversion_planner"] == pytest.approx(copy, rel=0.01)
    # DSA does not convert: its fp8 and bf16 graphs are the same size.
    assert _log("glm5-dsa-fp8").readings["decode_graphs_gib"] == _log("glm5-dsa-bf16").readings["decode_graphs_gib"]


def test_the_conversion_costs_each_decode_step_time_in_proportion_to_the_pool() -> None:
    """Median ITL at concurrency 1: 23.8 ms bf16, 83.0 ms fp8 with 449K pool tokens, 147.6 ms with 948K. The
    excess over bf16 per pool token is the same at both sizes (a cost of the pool, not of the batch) and is
    the planner's KV_CONVERSION_US_PER_TOKEN_H200."""
    bf16 = _records("glm5-mla-bf16")[1]["median_itl_ms"]
    per_token = []
    for start in ("glm5-mla-fp8", "glm5-mla-fp8-f070"):
        tokens = _log(start).readings["max_total_num_tokens"]
        per_token.append((_records(start)[1]["median_itl_ms"] - bf16) * 1000 / tokens)  # type: ignore[operator]
    assert abs(per_token[0] / per_token[1] - 1) < 0.05, per_token
    assert statistics.mean(per_token) == pytest.approx(planner.KV_CONVERSION_US_PER_TOKEN_H200, rel=0.05)
    # The same pool without the conversion (bf16) is 6x faster per token at concurrency 1.
    assert _records("glm5-mla-fp8")[1]["median_itl_ms"] > 6 * bf16
    # And the planner says so for such a launch, before any start.
    fp8 = PVS.glm5_inputs(_log("glm5-mla-fp8"), json.loads((RUN / "config-mla.json").read_text()), 143_771, 9)[0]
    assert any(reason.startswith("SLOW:") for reason in planner.plan(fp8).reasons)


def test_the_activation_term_is_what_a_long_prefill_left_reserved() -> None:
    """One prefill each of 1,024-8,192 tokens on the idle DSA server: the reserved memory grew by 4,602 MiB for
    8,192 tokens, linearly; GLM-5's TP 1 term (0.58 MiB per token) is within 5 % of it."""
    probe = json.loads((RUN / "glm5-dsa-bf16" / "activations.json").read_text())
    growth = {p["prompt_tokens"]: p["growth_over_idle_mib"] for p in probe["prefills"]}
    assert sorted(growth) == [1024, 2048, 4096, 8192] and growth == dict(sorted(growth.items()))
    assert list(growth.values()) == sorted(growth.values())  # more tokens, more memory
    slope = (growth[8192] - growth[1024]) / (8192 - 1024)
    assert planner.GLM5_TERMS_TP1_DSA.activation_mib_per_token == pytest.approx(slope, rel=0.05)
    assert planner.GLM5_TERMS_TP1_DSA.activation_mib_per_token * 8192 == pytest.approx(growth[8192], rel=0.05)


def test_the_committed_comparison_is_what_the_planner_says_today() -> None:
    committed = json.loads((RUN / "planner-vs-sglang.json").read_text())
    fresh = json.loads(json.dumps(PVS.glm5_rows(RUN)))
    assert committed == fresh, "run: python scripts/device/planner_vs_sglang.py " + str(RUN.relative_to(ROOT)) + " --json ..."


# --- the speed choices: bench records of each A/B -------------------------------------------------
def test_bf16_kv_is_faster_on_both_attention_paths() -> None:
    dsa = bench_comparison.compare_sides(bench_comparison.load_side(str(RUN / "glm5-dsa-bf16" / "bench")), bench_comparison.load_side(str(RUN / "glm5-dsa-fp8" / "bench")))
    assert dict(dsa.judged())[1] == pytest.approx(1.0, abs=0.05)  # one request: the same
    assert dict(dsa.judged())[64] < 0.9 and dsa.slower == [64]  # fp8 loses 14 % at 64 on the DSA backends
    mla = bench_comparison.compare_sides(bench_comparison.load_side(str(RUN / "glm5-mla-bf16" / "bench")), bench_comparison.load_side(str(RUN / "glm5-mla-fp8" / "bench")))
    assert dict(mla.judged())[1] < 0.2 and mla.b_failed == [64]  # 6x slower; at 64 it did not finish in 120 s
    assert not mla.ok and mla.verdict().startswith("B is SLOWER")


def test_halving_the_prefill_chunk_saves_activation_memory_and_costs_a_little_at_64() -> None:
    """chunked-prefill-size 4,096 against sglang's 8,192 (the only change): one request the same, 64 requests 5 %
    fewer output tokens/s and a worse p99 TTFT (the 64 prompts of 512 tokens take more prefill batches); what it
    buys is memory, half the activation term (0.58 MiB per token: 2.3 GiB at TP 1), which the planner counts."""
    ab = bench_comparison.compare_sides(bench_comparison.load_side(str(RUN / "glm5-dsa-bf16" / "bench")), bench_comparison.load_side(str(RUN / "glm5-dsa-bf16-chunk4k" / "bench")))
    ratios = dict(ab.judged())
    assert ratios[1] == pytest.approx(1.0, abs=0.02) and 0.9 < ratios[64] < 0.97
    assert _records("glm5-dsa-bf16-chunk4k")[64]["p99_ttft_ms"] > 1.2 * _records("glm5-dsa-bf16")[64]["p99_ttft_ms"]
    assert _log("glm5-dsa-bf16-chunk4k").server_args["chunked_prefill_size"] == 4096
    assert _log("glm5-dsa-bf16").server_args["chunked_prefill_size"] == 8192
    saved = ROWS["glm5-dsa-bf16"]["planner_activation_mib"] - ROWS["glm5-dsa-bf16-chunk4k"]["planner_activation_mib"]
    assert saved == pytest.approx(0.58 * 4096, rel=0.01)


# --- extrapolated to the seed box: GLM-5-NVFP4, TP 8, 97,887 MiB, sglang 0.5.10.post1 -----------------
def _box_plan(fraction: object, flags: dict[str, object], max_running: int = 64) -> planner.Plan:
    launch = {"tp-size": 8, "attention-backend": "flashinfer", "nsa-prefill-backend": "trtllm",
              "nsa-decode-backend": "trtllm", "max-running-requests": max_running, "quantization": "modelopt_fp4",
              **flags}  # fmt: skip
    typed = LaunchConfig.from_vars(launch, python="/py").settings
    derived, _ = planner.architecture_inputs(GLM5_CONFIG, typed, sm_major=12, sglang_version="0.5.10.post1", architecture="glm-5")
    values = {**planner.inputs_from_settings(typed), **derived}
    values.pop("kv_cache_dtype", None)
    values.update(gpu_memory_mib=97_887, weights_gib_per_gpu=planner.SEED_WEIGHTS_GIB_PER_GPU)
    values["mem_fraction_static"] = None if fraction == "auto" else fraction
    return planner.plan(planner.PlanInputs(**values))


def test_the_seed_launch_reproduces_the_seed_with_the_conversion_split_out() -> None:
    at_092 = _box_plan(0.92, {"kv-cache-dtype": "auto"})
    assert at_092.kv_tokens == pytest.approx(498_000, rel=0.01)  # the seed: KV ~498K tokens
    assert at_092.free_after_start_mib / 1024 == pytest.approx(5.2, abs=0.1)  # type: ignore[operator]
    assert at_092.safe and at_092.breakdown_mib["kv_conversion"] == pytest.approx(548, abs=1)
    assert any(reason.startswith("SLOW:") for reason in at_092.reasons)
    # 0.95 with graphs up to bs 8 (the first launch): out of memory in capture, as on the box.
    assert _box_plan(0.95, {"kv-cache-dtype": "fp8_e4m3"}, max_running=8).safe is False


def test_the_tuned_profile_plans_a_safe_fraction_and_drops_the_conversion() -> None:
    profiles = __import__("yaml").safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/profiles.yml").read_text())
    tuned = profiles["sglang_server_profiles"]["tuned"]
    assert tuned["kv-cache-dtype"] == "bfloat16" and "speculative-algorithm" not in tuned
    plan = _box_plan("auto", {k: v for k, v in tuned.items() if k != "mem-fraction-static"})
    assert "kv_conversion" not in plan.breakdown_mib and "speculative_draft" not in plan.breakdown_mib
    assert plan.inputs["kv_bytes_per_token"] == 100_152  # bf16, the plain layout
    assert plan.recommended_mem_fraction_static == 0.92
    assert plan.kv_tokens is not None and plan.kv_tokens > 64 * 3 * 1024  # 64 requests of 3K tokens
    assert not any(reason.startswith("SLOW:") for reason in plan.reasons)


def test_the_tuned_mtp_profile_plans_the_bf16_draft_sglang_builds_under_modelopt_fp4() -> None:
    profiles = __import__("yaml").safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/profiles.yml").read_text())
    tuned = profiles["sglang_server_profiles"]["tuned-mtp"]
    assert tuned["kv-cache-dtype"] == "bfloat16" and tuned["speculative-algorithm"] == "EAGLE"
    plan = _box_plan("auto", {k: v for k, v in tuned.items() if k != "mem-fraction-static"})
    assert "kv_conversion" not in plan.breakdown_mib and "speculative_draft" in plan.breakdown_mib
    assert plan.inputs["kv_bytes_per_token"] == int(100_152 * (1 + 1 / 78))  # bf16 plain + the nextn layer's pool
    # The draft's graphs (the H200's MLA ratio on the seed's graph term) move the fraction.
    assert plan.breakdown_mib["speculative_draft"] == pytest.approx((planner.GLM5_MTP_GRAPH_RATIO_MLA - 1) * 29 * 64, abs=1)
    # Its weights: layer 78 in BF16 (deepseek_nextn.py drops the quant config under modelopt_fp4), 19.9 GB, of
    # which 205 MB replicated and the rest split 8 ways = 2.485 GiB, + its own embedding and head (0.443 GiB)
    # - not the target's NVFP4 bytes per layer (1.36 GiB in all, the estimate before 2026-12-05).
    assert plan.inputs["effective_draft_weights_gib_per_gpu"] == pytest.approx(2.928, abs=0.001)
    assert plan.recommended_mem_fraction_static == 0.84
    # 64 of the bench's requests (1,024 in + 512 out) fit with room to spare.
    assert plan.kv_tokens is not None and plan.kv_tokens > 1.5 * 64 * (1024 + 512)
    assert not any(reason.startswith("SLOW:") for reason in plan.reasons)


# --- the calls that finished the list (2026-12-01/02, night): MTP and the memory-saving start ------


def _decode_rates(start_dir: Path, running: int) -> list[tuple[bool, float]]:
    """(CUDA graph used, generation tok/s) of each decode log line with ``running`` requests."""
    text = (start_dir / "sglang.log").read_text()
    pattern = rf"#running-req: {running},.*cuda graph: (True|False), gen throughput \(token/s\): ([0-9.]+)"
    return [(graph == "True", float(rate)) for graph, rate in re.findall(pattern, text)]


@pytest.mark.parametrize(("start", "without"), [("glm5-dsa-mtp", "glm5-dsa-bf16"), ("glm5-dsa-mtp-f075", "glm5-dsa-bf16"),
                                                ("glm5-mla-bf16-mtp", "glm5-mla-bf16")])  # fmt: skip
def test_mtp_launches_glm5_with_its_nextn_draft_and_without_accepted_drafts_only_costs(start: str, without: str) -> None:
    """EAGLE over GLM-5's nextn layer starts (draft class, its graphs) and serves on both attention paths;
    random weights never accept a draft, so one request gets slower, not faster (its gain needs real weights)."""
    text = (RUN / start / "sglang.log").read_text()
    log = startlog.parse(text)
    assert log.ready and log.model_class == _log(without).model_class
    assert f"type={log.model_class}NextN" in text and "Capture draft decode CUDA graph end" in text
    assert "accept len: 1.00, accept rate: 0.00" in text
    (record,) = _records(start).values()
    assert record["completed"] == 5 and record["max_concurrency"] == 1
    assert record["median_itl_ms"] > _records(without)[1]["median_itl_ms"]


@pytest.mark.parametrize("start", ["glm5-dsa-mtp", "glm5-dsa-mtp-f075", "glm5-mla-bf16-mtp"])
def test_the_planners_mtp_terms_are_the_drafts_weights_and_graphs(start: str) -> None:
    """The draft loads 4.66-4.67 GiB inside the fraction before the pool (the planner: its BF16 embedding,
    head and eh_proj plus one 78th of the target's layers); its graphs replace the decode graphs at the
    planner's measured ratio (the f075 start is the ratio's check at another fraction)."""
    row = ROWS[start]
    assert row["draft_weights_gib"]["planner"] == pytest.approx(row["draft_weights_gib"]["sglang"], abs=0.02)
    without = _log("glm5-dsa-bf16" if "dsa" in start else "glm5-mla-bf16").readings["decode_graphs_gib"]
    ratio = planner.GLM5_MTP_GRAPH_RATIO_DSA if "dsa" in start else planner.GLM5_MTP_GRAPH_RATIO_MLA
    assert _log(start).graphs_gib / without == pytest.approx(ratio, rel=0.02)  # type: ignore[operator]
    # Without the draft's weights the plan would promise 13-17 % more KV tokens than sglang allocated.
    inputs, _ = PVS.glm5_inputs(_log(start), json.loads((RUN / f"config-{'dsa' if 'dsa' in start else 'mla'}.json").read_text()), 143_771, 9)
    naive = planner.plan(dataclasses.replace(inputs, draft_weights_gib_per_gpu=0.0))
    assert naive.kv_tokens > 1.1 * row["kv_tokens"]["sglang"]  # type: ignore[operator]


def test_a_graph_cap_below_the_concurrency_decodes_64_requests_without_graphs() -> None:
    """cuda-graph-max-bs-decode 32 with 64 requests: every decode step of the batch runs eagerly, ~10x
    slower on this GPU than the same start with graphs up to 64 (the bench at 64 timed out)."""
    small = _decode_rates(RUN / "glm5-dsa-bf16-small", 64)
    full = _decode_rates(RUN / "glm5-dsa-bf16", 64)
    assert small and not any(graph for graph, _ in small)
    assert full and all(graph for graph, _ in full)
    assert 5 * statistics.median(rate for _, rate in small) < statistics.median(rate for _, rate in full)


def _draft_weights(config: dict, quantization: str | None) -> float | None:
    launch = {"tp-size": 8, "speculative-algorithm": "EAGLE", "kv-cache-dtype": "bfloat16",
              **({"quantization": quantization} if quantization else {})}  # fmt: skip
    typed = LaunchConfig.from_vars(launch, python="/py").settings
    derived, _ = planner.architecture_inputs(config, typed, sm_major=12, sglang_version="0.5.10.post1", architecture="glm-5")
    return derived.get("draft_weights_gib_per_gpu")


@pytest.mark.parametrize(
    ("quantization_config", "bf16_draft"),
    [
        ({"quant_algo": "NVFP4"}, True),  # ModelOpt's hf_quant_config shape, as the checkpoint's config carries it
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "nvfp4"}}, True),  # nested, any case
        ({"quant_algo": "FP8"}, False),
        ({"quantization": {"quant_algo": "FP8"}}, False),
        ({"quant_algo": None}, False),
        ("NVFP4", False),  # not a mapping: no quantization config sglang reads
    ],
)
def test_the_checkpoints_own_nvfp4_config_makes_the_draft_bf16_as_the_flag_does(
    quantization_config: object, bf16_draft: bool
) -> None:
    """Without --quantization, sglang still takes modelopt_fp4 from the checkpoint's quantization config (and then
    builds the draft unquantized): the planner must count the BF16 draft layer from either source, and only then."""
    by_flag = _draft_weights(GLM5_CONFIG, "modelopt_fp4")
    assert by_flag == pytest.approx(2.928, abs=0.001)
    by_config = _draft_weights({**GLM5_CONFIG, "quantization_config": quantization_config}, None)
    assert (by_config == by_flag) if bf16_draft else by_config is None


@pytest.mark.parametrize(
    "change",
    [{"q_lora_rank": None}, {"q_lora_rank": [1536]}, {"q_lora_rank": "lora"}],
    ids=["missing", "not-a-number", "not-an-integer"],
)
def test_an_architecture_without_deepseek_v3_draft_shapes_falls_back_to_the_estimate(change: dict) -> None:
    """A config the draft layer's tensors cannot be built from (a key missing, a list, a word: KeyError, TypeError,
    ValueError) leaves the draft's weights to the estimate - no crash, no invented figure."""
    config = {k: v for k, v in {**GLM5_CONFIG, **change}.items() if v is not None}
    assert _draft_weights(config, "modelopt_fp4") is None
