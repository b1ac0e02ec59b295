"""The memory planner against the seed deployment's numbers and the pinned sglang's own code.

Seed facts (8x RTX PRO 6000, 97,887 MiB, TP8, GLM-5-NVFP4; docs/seeds.md):
  0.95 (graphs up to bs 8): OOM in CUDA-graph capture on GPU 4: wanted 694 MiB, 247 MiB free,
       87.43 GiB allocated by PyTorch + 6.44 GiB reserved-unallocated.
  0.88: started.   0.85, graphs off: KV pool ~370K tokens.
  0.92, graphs for bs 1..64: KV pool ~498K tokens, ~5.2 GiB free per GPU after capture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_deploy.launch.config import LaunchConfig, LaunchConfigError
from sglang_deploy.memory import kvcell, planner
from sglang_deploy.commands import plan as plan_command
from sglang_deploy.memory.kvcell import kv_cell
from sglang_deploy.memory.planner import PlanInputs, plan, sglang_default_settings

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "tests" / "fixtures" / "models"
GLM5 = json.loads((MODELS / "glm-5" / "config.json").read_text())
LLAMA = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
DSV3 = json.loads((MODELS / "deepseek-v3" / "config.json").read_text())

GPU_MIB = 97_887
TOKENS_085, TOKENS_092 = 370_000, 498_000
FREE_AFTER_092_GIB = 5.2


# --- the derivation (module docstring of planner.py), done here from the raw seed numbers ---------
def derive_from_seeds() -> dict[str, float]:
    gpu_gib = GPU_MIB / 1024
    non_torch_gib = gpu_gib - (87.43 + 6.44) - 247 / 1024  # the 0.95 OOM message
    free0_mib = GPU_MIB - non_torch_gib * 1024
    cell = 0.07 * free0_mib * 2**20 / (TOKENS_092 - TOKENS_085)  # (0.92-0.85)*F0 = 128K*c
    weights_gib = (0.85 * free0_mib * 2**20 - TOKENS_085 * cell) / 2**30
    held_mib = 0.08 * free0_mib - FREE_AFTER_092_GIB * 1024  # 0.92 left 8% of F0
    # flashinfer MLA's bf16 copy of one layer of the fp8 pool (planner docstring 8.), not a graph.
    conversion_mib = TOKENS_092 * (512 + 64) * 2 / 2**20
    return {
        "runtime_overhead_mib": non_torch_gib * 1024,
        "free0_mib": free0_mib,
        "kv_bytes_per_token": cell,
        "weights_gib": weights_gib,
        "conversion_092_mib": conversion_mib,
        "graph_mib_per_bs": (held_mib - conversion_mib) / 64,
    }


def test_constants_are_the_seed_derivation() -> None:
    d = derive_from_seeds()
    assert round(d["runtime_overhead_mib"]) == planner.SEED_RUNTIME_OVERHEAD_MIB == 1517
    assert round(d["kv_bytes_per_token"]) == planner.SEED_KV_BYTES_PER_TOKEN == 55_262
    assert round(d["weights_gib"], 2) == planner.SEED_WEIGHTS_GIB_PER_GPU == 60.95
    # 28.7 MiB per unit of batch once the conversion copy is taken out; the planner rounds up.
    assert 28 < d["graph_mib_per_bs"] <= planner.GRAPH_MIB_PER_BS == 29


def test_slack_lies_between_what_0_92_proved_and_what_0_95_disproved() -> None:
    d = derive_from_seeds()
    free0 = d["free0_mib"]
    act = planner.ACTIVATION_MIB_PER_TOKEN * 8192  # sglang's chunk on this GPU
    # The pool at 0.95 is larger, and so is its conversion copy.
    tokens_095 = (0.95 * free0 * 2**20 - d["weights_gib"] * 2**30) / d["kv_bytes_per_token"]
    conversion_095 = tokens_095 * 1152 / 2**20
    upper = 0.08 * free0 - planner.GRAPH_MIB_PER_BS * 64 - d["conversion_092_mib"] - act  # 0.92, bs 64, ran
    lower = 0.05 * free0 - planner.GRAPH_MIB_PER_BS * 8 - conversion_095 - act  # 0.95, bs 8, OOM
    assert lower < planner.ALLOCATOR_SLACK_MIB <= upper
    assert (round(lower), round(upper)) == (1931, 3258)


def test_seed_bytes_per_token_match_sglangs_formula_for_glm5_with_fp8_kv() -> None:
    """The seeds' 55,262 B/token is GLM-5's MLA+DSA cell with an fp8 cache (55,224 B): 0.07 %."""
    cell = kv_cell(GLM5, "auto", tp_size=8, sm_major=12)
    assert cell.kv_cache_dtype == "fp8_e4m3"  # sglang: auto -> fp8_e4m3 for DSA on SM >= 10
    assert cell.attention == "MLA+DSA" and cell.page_size == 64
    assert cell.bytes_per_token == (512 + 64) * 78 * 1 + (128 + 128 // 128 * 4) * 78 * 1 == 55_224
    assert abs(derive_from_seeds()["kv_bytes_per_token"] / cell.bytes_per_token - 1) < 0.001
    bf16 = kv_cell(GLM5, "bfloat16")
    assert bf16.bytes_per_token == 100_152  # would need F0 = 170 GiB for the seed points


def test_kv_cell_sizes_for_mha_mla_and_dtypes() -> None:
    assert kv_cell(LLAMA, "auto").bytes_per_token == 8 * (128 + 128) * 32 * 2 == 131_072
    assert kv_cell(LLAMA, "auto", tp_size=8).bytes_per_token == 1 * 256 * 32 * 2
    assert kv_cell(LLAMA, "fp8_e5m2", tp_size=2).bytes_per_token == 4 * 256 * 32 * 1
    mla = kv_cell(DSV3, "auto", tp_size=8)  # MLA is not split by TP; no DSA indexer
    assert (mla.attention, mla.bytes_per_token, mla.page_size) == ("MLA", 576 * 61 * 2, 1)
    assert kv_cell(DSV3, "fp8_e4m3").bytes_per_token == 576 * 61
    fp4 = kv_cell(DSV3, "fp4_e2m1")
    assert fp4.bytes_per_token == (576 * 61) // 2 + (576 // 16) * 61
    assert kv_cell(GLM5, "auto", sm_major=9).kv_cache_dtype == "bfloat16"
    with pytest.raises(planner.PlanError, match="--sm-major"):
        kv_cell(GLM5, "auto")
    with pytest.raises(planner.PlanError, match="not one sglang"):
        kv_cell(LLAMA, "fp8_e4m3fn")


def test_auto_kv_dtype_follows_the_checkpoints_kv_quant_algo() -> None:
    quant = {"producer": {"name": "modelopt"}, "quantization": {"kv_cache_quant_algo": "FP8"}}
    assert kv_cell(LLAMA, "auto", hf_quant_config=quant).kv_cache_dtype == "fp8_e4m3"
    assert kv_cell(LLAMA, "auto").kv_cache_dtype == "bfloat16"


SEED = dict(
    gpu_memory_mib=GPU_MIB,
    tp_size=8,
    weights_gib_per_gpu=planner.SEED_WEIGHTS_GIB_PER_GPU,
    kv_bytes_per_token=kv_cell(GLM5, "auto", sm_major=12).bytes_per_token,
    page_size=64,
    mla_backend=True,
    piecewise_cuda_graph=kvcell.piecewise_cuda_graph_enabled(GLM5),
    max_running_requests=64,
    # The seed launch: --attention-backend flashinfer on an fp8 pool (planner docstring 8.).
    kv_conversion_bytes_per_token=kvcell.kv_conversion_bytes_per_token(GLM5, "fp8_e4m3", "flashinfer"),
)


def seed_plan(fraction: float | None, **changes: object) -> planner.Plan:
    return plan(PlanInputs(**{**SEED, **changes, "mem_fraction_static": fraction}))  # type: ignore[arg-type]


def test_planner_reproduces_the_seed_kv_pools_and_free_memory() -> None:
    at_085 = seed_plan(0.85, disable_cuda_graph=True)
    at_092 = seed_plan(0.92)
    assert at_085.kv_tokens is not None and at_092.kv_tokens is not None
    assert abs(at_085.kv_tokens / TOKENS_085 - 1) < 0.01, at_085.kv_tokens
    assert abs(at_092.kv_tokens / TOKENS_092 - 1) < 0.01, at_092.kv_tokens
    assert at_092.kv_tokens % 64 == 0  # DSA page size
    assert at_092.free_after_start_mib is not None
    assert abs(at_092.free_after_start_mib / 1024 - FREE_AFTER_092_GIB) < 0.1
    assert at_092.inputs["effective_cuda_graph_max_bs"] == 64  # capped by --max-running-requests


def test_never_calls_the_oom_fraction_safe() -> None:
    assert seed_plan(0.95).safe is False
    # seed 000's launch: --max-running-requests 8, so graphs only up to bs 8 - still an OOM
    oom = seed_plan(0.95, max_running_requests=8)
    assert oom.safe is False and oom.headroom_mib is not None and oom.headroom_mib < 0
    assert "UNSAFE" in oom.explanation()


@pytest.mark.parametrize("fraction", [0.88, 0.92])
@pytest.mark.parametrize("max_running_requests", [8, 64])
def test_calls_the_fractions_the_seeds_ran_safe(fraction: float, max_running_requests: int) -> None:
    result = seed_plan(fraction, max_running_requests=max_running_requests)
    assert result.safe is True and result.headroom_mib is not None and result.headroom_mib >= 0


def test_safe_and_unsafe_meet_exactly_where_the_outside_terms_fill_what_the_fraction_leaves() -> None:
    """The verdict's threshold on both sides, 0.1 MiB apart: the seed's 0.92 launch with the allocator slack
    (the one free term) set so that the terms outside the pool need exactly what 0.92 leaves, then 0.1 MiB more."""
    at_092 = seed_plan(0.92)
    assert at_092.available_mib is not None
    exact = planner.ALLOCATOR_SLACK_MIB + (at_092.available_mib - at_092.required_mib)
    fits = seed_plan(0.92, allocator_slack_mib=exact)
    assert fits.required_mib == fits.available_mib and fits.headroom_mib == 0 and fits.safe is True
    over = seed_plan(0.92, allocator_slack_mib=exact + 0.1)
    assert over.headroom_mib == -0.1 and over.safe is False and over.reasons[0].startswith("UNSAFE: 0.92 leaves 0 MiB too little")


def test_recommends_a_fraction_in_the_proven_range_above_sglangs_default() -> None:
    result = seed_plan(None)
    recommended = result.recommended_mem_fraction_static
    assert recommended is not None
    assert result.sglang_default_mem_fraction_static < recommended < 0.95
    assert 0.88 <= recommended <= 0.92
    assert seed_plan(recommended).safe is True
    # and it buys a bigger KV pool than sglang's default would
    default_pool = seed_plan(result.sglang_default_mem_fraction_static).kv_tokens
    assert result.kv_tokens is not None and default_pool is not None
    assert result.kv_tokens > default_pool


def test_more_graph_batches_or_a_bigger_chunk_lower_the_recommendation() -> None:
    base = seed_plan(None).recommended_mem_fraction_static
    assert base is not None
    more_graphs = seed_plan(None, max_running_requests=256).recommended_mem_fraction_static
    bigger_chunk = seed_plan(None, chunked_prefill_size=32768).recommended_mem_fraction_static
    assert more_graphs is not None and more_graphs < base
    assert bigger_chunk is not None and bigger_chunk < base


def test_weights_that_leave_no_kv_pool_are_unsafe() -> None:
    result = seed_plan(0.6)
    assert result.safe is False
    assert any("Not enough memory" in reason for reason in result.reasons)


def test_memory_held_by_another_process_lowers_what_is_left() -> None:
    busy = seed_plan(0.92, gpu_memory_used_mib=4096)
    assert busy.safe is False
    assert any("already in use" in reason for reason in busy.reasons)


# --- sglang's own heuristic -----------------------------------------------------------------------
def test_sglang_default_for_the_seed_box() -> None:
    """97,887 MiB is in the 90-160 GiB tier: chunk 8192, graph bs 512; DSA turns piecewise graphs off.
    reserve = 512 + 8192*1.5 + 512*2 + 8/8*1024 = 14,848 MB -> round((97887-14848)/97887, 3)."""
    d = sglang_default_settings(GPU_MIB, tp_size=8, mla_backend=True, piecewise_cuda_graph=False)
    assert (d.chunked_prefill_size, d.cuda_graph_max_bs, d.reserved_mib) == (8192, 512, 14_848)
    assert d.mem_fraction_static == round((97_887 - 14_848) / 97_887, 3) == 0.848


def test_sglang_default_floors_the_reserve_at_10_gib_on_big_gpus() -> None:
    d = sglang_default_settings(
        80 * 1024, tp_size=1, chunked_prefill_size=2048, cuda_graph_max_bs=8,
        piecewise_cuda_graph=False,
    )
    assert d.reserved_mib == 10 * 1024


GRID = [
    dict(gpu_mem=97_887.0, tp_size=8, mla=True, piecewise=False),
    dict(gpu_mem=97_887.0, tp_size=8, mla=False, piecewise=True),
    dict(gpu_mem=97_887.0, tp_size=8, mla=True, piecewise=False, chunked=4096, max_bs=64),
    dict(gpu_mem=81_559.0, tp_size=2, mla=False, piecewise=True),
    dict(gpu_mem=46_068.0, tp_size=4, mla=False, piecewise=True, max_total=3000),
    dict(gpu_mem=24_564.0, tp_size=1, mla=False, piecewise=True),
    dict(gpu_mem=15_360.0, tp_size=1, mla=False, piecewise=False),
    dict(gpu_mem=183_359.0, tp_size=8, mla=True, piecewise=True, spec="EAGLE"),
    dict(gpu_mem=143_771.0, tp_size=8, mla=False, piecewise=False, dp_attention=True, dp=8),
    dict(gpu_mem=143_771.0, tp_size=4, mla=False, piecewise=True, bs_list=[1, 2, 4, 48]),
    dict(gpu_mem=97_887.0, tp_size=8, mla=False, piecewise=True, chunked=-1),
    dict(gpu_mem=97_887.0, tp_size=8, mla=False, piecewise=False, spec="STANDALONE", pp=2),
]

# Runs ServerArgs._handle_gpu_memory_settings itself (the pinned sglang, in the validator venv) on a
# stand-in object carrying only the attributes that method reads.
PROBE = textwrap.dedent(
    """
    import importlib.util, json, sys, types
    spec = importlib.util.spec_from_file_location("probe", sys.argv[1])
    probe = importlib.util.module_from_spec(spec); spec.loader.exec_module(probe)
    probe._install_stand_ins(json.loads(sys.argv[2]))
    from sglang.srt.server_args import ServerArgs
    out = []
    for case in json.loads(sys.stdin.read()):
        s = types.SimpleNamespace(
            device="cuda", chunked_prefill_size=case.get("chunked"),
            cuda_graph_max_bs=case.get("max_bs"), cuda_graph_bs=case.get("bs_list"),
            tp_size=case["tp_size"], pp_size=case.get("pp", 1), dp_size=case.get("dp", 1),
            torch_compile_max_bs=None, disable_cuda_graph_padding=False,
            speculative_algorithm=case.get("spec"), piecewise_cuda_graph_max_tokens=None,
            piecewise_cuda_graph_tokens=None, max_total_tokens=case.get("max_total"),
            model_path="org/model", mem_fraction_static=None,
            max_prefill_tokens=ServerArgs.max_prefill_tokens,
            enable_dp_attention=case.get("dp_attention", False),
            disable_piecewise_cuda_graph=not case["piecewise"], enable_symm_mem=False,
            language_only=False,
        )
        s.use_mla_backend = lambda case=case: case["mla"]
        s.get_model_config = lambda: types.SimpleNamespace(is_multimodal=False)
        s._generate_cuda_graph_batch_sizes = (
            lambda s=s: ServerArgs._generate_cuda_graph_batch_sizes(s))
        s._generate_piecewise_cuda_graph_tokens = (
            lambda s=s: ServerArgs._generate_piecewise_cuda_graph_tokens(s))
        ServerArgs._handle_gpu_memory_settings(s, case["gpu_mem"])
        out.append([s.chunked_prefill_size, s.cuda_graph_max_bs, s.mem_fraction_static])
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_sglang_default_matches_the_pinned_sglangs_own_code() -> None:
    from sglang_deploy.lanes.catalog import load_lane
    from sglang_deploy.launch.validator_venv import ensure_validator_env

    lane = load_lane("cu128")
    env = ensure_validator_env(lane)
    probe_path = ROOT / "src" / "sglang_deploy" / "launch" / "_validator_probe.py"
    done = subprocess.run(
        [str(env / "bin" / "python"), "-c", PROBE, str(probe_path),
         json.dumps(list(lane.validator.stand_ins))],
        input=json.dumps(GRID), capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [
        sglang_default_settings(
            case["gpu_mem"], tp_size=case["tp_size"], pp_size=case.get("pp", 1),
            chunked_prefill_size=case.get("chunked"), cuda_graph_max_bs=case.get("max_bs"),
            cuda_graph_bs=case.get("bs_list"), max_total_tokens=case.get("max_total"),
            mla_backend=case["mla"], piecewise_cuda_graph=case["piecewise"],
            enable_dp_attention=case.get("dp_attention", False), dp_size=case.get("dp", 1),
            speculative_algorithm=case.get("spec"),
        )
        for case in GRID
    ]
    mine = [[d.chunked_prefill_size, d.cuda_graph_max_bs, d.mem_fraction_static] for d in ours]
    assert mine == theirs


# --- inputs ---------------------------------------------------------------------------------------
def test_weights_from_a_safetensors_index() -> None:
    index = json.loads((MODELS / "glm-5" / "model.safetensors.index.json").read_text())
    assert planner.weights_gib_from_index(index, 8) == pytest.approx(400e9 / 8 / 2**30)
    with pytest.raises(planner.PlanError, match="total_size"):
        planner.weights_gib_from_index({"weight_map": {}}, 8)


def test_inputs_from_the_seed_profile_flags(profile: dict) -> None:
    values = planner.inputs_from_settings(LaunchConfig.from_vars(profile["sglang_server_flags"], python="/py").settings)
    assert values["tp_size"] == 8 and values["mem_fraction_static"] == 0.92
    assert values["max_running_requests"] == 64 and values["kv_cache_dtype"] == "auto"
    assert values["disable_cuda_graph"] is False
    auto = LaunchConfig.from_vars({"mem-fraction-static": "auto"}, python="/py").settings
    assert "mem_fraction_static" not in planner.inputs_from_settings(auto)
    with pytest.raises(LaunchConfigError, match="Jinja template"):
        LaunchConfig.from_vars({"tp-size": "{{ gpu_count }}"}, python="/py")


def test_gpu_facts_summary_takes_the_smallest_gpu_and_the_busiest() -> None:
    facts = {"gpus": [
        {"index": 0, "memory_total_mib": 97887, "memory_used_mib": 0, "compute_cap": "12.0"},
        {"index": 1, "memory_total_mib": 97871, "memory_used_mib": 512, "compute_cap": "12.0"},
    ]}
    assert planner.gpu_facts_summary(facts) == {
        "gpu_memory_mib": 97871.0, "gpu_memory_used_mib": 512.0, "gpu_count": 2, "sm_major": 12,
    }
    with pytest.raises(planner.PlanError):
        planner.gpu_facts_summary({"gpus": []})


# --- the command ----------------------------------------------------------------------------------
def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "plan", *argv],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )


SEED_ARGS = ("--gpu-memory-mib", "97887", "--tp-size", "8", "--weights-gib-per-gpu", "60.95",
             "--model-config", str(MODELS / "glm-5" / "config.json"), "--sm-major", "12",
             "--max-running-requests", "64")


def test_cli_json_for_the_oom_fraction_exits_1() -> None:
    done = run_cli(*SEED_ARGS, "--mem-fraction-static", "0.95", "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    for key in ("safe", "required_mib", "headroom_mib", "kv_tokens",
                "recommended_mem_fraction_static", "sglang_default_mem_fraction_static"):
        assert key in out
    assert out["safe"] is False and out["headroom_mib"] < 0
    assert out["sglang_default_mem_fraction_static"] == 0.848
    assert any("55,224 B/token" in note for note in out["notes"])


def test_cli_table_for_the_working_fraction_exits_0() -> None:
    done = run_cli(*SEED_ARGS, "--mem-fraction-static", "0.92")
    assert done.returncode == 0, done.stderr
    assert "safe" in done.stdout and "recommended --mem-fraction-static" in done.stdout


def test_cli_without_gpu_memory_says_how_to_get_it() -> None:
    done = run_cli("--tp-size", "8")
    assert done.returncode == 2 and "--gpu-memory-mib" in done.stderr


def test_plan_reads_a_real_inventory_through_ansible_inventory(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(textwrap.dedent(
        """
        sglang_servers:
          hosts:
            gpu-01:
              sglang_server_flags:
                tp-size: 8
                mem-fraction-static: 0.95
                max-running-requests: 8
              sglang_server_flags_override:
                mem-fraction-static: 0.92
              sglang_server_memory_plan:
                gpu_memory_mib: 97887
                weights_gib_per_gpu: 60.95
                kv_bytes_per_token: 55224
                page_size: 64
        """
    ))
    args = plan_command_args("-i", str(inventory))
    inputs, notes, _verdict = plan_command.build_inputs(args)
    assert inputs.mem_fraction_static == 0.92  # the override wins, as in the unit
    assert (inputs.tp_size, inputs.max_running_requests, inputs.gpu_memory_mib) == (8, 8, 97887)
    assert notes[0].startswith("launch flags of gpu-01")
    assert plan(inputs).safe is True


def plan_command_args(*argv: str) -> object:
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    plan_command.register(sub)
    return parser.parse_args(["plan", *argv])


# --- role integration: roles/sglang_server/tasks/resolve.yml, run by real Ansible --------------------
def run_role_tasks(
    tmp_path: Path, fraction: object, unsafe_ok: bool = False, weights_gib: float = 60.95
) -> subprocess.CompletedProcess[str]:
    """The role's resolve.yml on this machine, with the nvidia-smi stand-in replaying the 8-GPU box
    while a server holds ~93 GB per GPU (its own memory must not change the plan: idempotence)."""
    standin_bin = tmp_path / "bin"
    standin_bin.mkdir(exist_ok=True)
    link = standin_bin / "nvidia-smi"
    if not link.exists():
        link.symlink_to(ROOT / "tests" / "standin" / "nvidia-smi")
    play = [{
        "hosts": "all",
        "gather_facts": False,
        "vars": {
            # The seed launch's memory-relevant flags; the KV cell, page size, the fp8 conversion of
            # flashinfer MLA and GLM-5's TP 8 terms follow from `architecture` (SM 12 from the facts).
            "sglang_server_flags": {"tp-size": 8, "mem-fraction-static": fraction, "max-running-requests": 64,
                                    "kv-cache-dtype": "auto", "attention-backend": "flashinfer",
                                    "nsa-decode-backend": "trtllm", "nsa-prefill-backend": "trtllm"},
            "sglang_server_memory_plan": {"weights_gib_per_gpu": weights_gib, "architecture": "glm-5"},
            "sglang_server_mem_fraction_unsafe_ok": unsafe_ok,
        },
        "tasks": [
            {"name": "Resolve", "ansible.builtin.include_role": {"name": "sglang_server", "tasks_from": "resolve"}},
            {"name": "Show the launch", "ansible.builtin.debug": {
                "msg": "ARGV {{ sglang_server_resolved.launch.flag_argv | join(' ') }}"}},
        ],
    }]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    gpu-01:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default",
           "PATH": f"{standin_bin}:{os.environ['PATH']}",
           "NVIDIA_SMI_FIXTURE_DIR": str(ROOT / "tests/fixtures/nvidia-smi/rtx-pro-6000-8gpu-busy")}
    exe = Path(sys.executable).with_name("ansible-playbook")
    return subprocess.run([str(exe), "-i", str(inventory), str(playbook)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT, check=False)


def test_role_tasks_resolve_auto_to_the_planners_fraction(tmp_path: Path) -> None:
    done = run_role_tasks(tmp_path, "auto")
    assert done.returncode == 0, done.stdout + done.stderr
    expected = seed_plan(None).recommended_mem_fraction_static
    assert f"--mem-fraction-static {expected} " in done.stdout


def test_role_tasks_fail_auto_when_no_fraction_fits_instead_of_dropping_the_flag(tmp_path: Path) -> None:
    """Weights too big for the 96 GB cards: no fraction leaves a KV pool. Before, `auto` resolved to
    None and the flag silently vanished (sglang's own default took over)."""
    done = run_role_tasks(tmp_path, "auto", weights_gib=95.0)
    assert done.returncode == 2, done.stdout
    assert "host gpu-01: memory plan: mem-fraction-static auto cannot be resolved" in done.stdout
    assert "NO SAFE FRACTION: the weights (95.0 GiB per GPU) leave no KV pool" in done.stdout
    assert "ARGV" not in done.stdout


def test_role_tasks_fail_an_unsafe_fraction_with_the_planners_explanation(tmp_path: Path) -> None:
    done = run_role_tasks(tmp_path, 0.95)
    assert done.returncode == 2, done.stdout
    assert "host gpu-01: sglang_server_flags['mem-fraction-static'] = 0.95 is unsafe" in done.stdout
    short = -seed_plan(0.95).headroom_mib  # type: ignore[operator]
    assert f"UNSAFE: 0.95 leaves {short:,.0f} MiB too little" in done.stdout
    assert "sglang_server_mem_fraction_unsafe_ok" in done.stdout
    forced = run_role_tasks(tmp_path, 0.95, unsafe_ok=True)
    assert forced.returncode == 0 and "--mem-fraction-static 0.95 " in forced.stdout
    safe = run_role_tasks(tmp_path, 0.92)
    assert safe.returncode == 0 and "--mem-fraction-static 0.92 " in safe.stdout


def test_doctor_filter_reads_a_journal_text() -> None:
    import importlib.util

    path = ROOT / "filter_plugins" / "sglang_doctor.py"
    spec = importlib.util.spec_from_file_location("sglang_doctor", path)
    assert spec is not None and spec.loader is not None
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    journal = (ROOT / "tests/fixtures/logs/cuda-graph-oom/seed-000-graph-capture-0.95.log")
    findings = plugin.sglang_doctor(journal.read_text(), {"recommended_mem_fraction_static": 0.91})
    assert [f["id"] for f in findings] == ["cuda-graph-oom", "memory-fragmentation"]
    assert "0.91" in findings[0]["fix"]
    from sglang_deploy.serving import server

    with pytest.raises(planner.PlanError, match="no GPU memory size"):
        launch = LaunchConfig.from_vars({"mem-fraction-static": "auto"}, python="/py").settings
        server.plan_for_launch(launch, gpu_facts=None, plan_vars={})


def test_plan_takes_gpu_memory_and_sm_from_gpu_facts(tmp_path: Path) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"gpus": [
        {"index": i, "memory_total_mib": 97887, "memory_used_mib": 2, "compute_cap": "12.0"}
        for i in range(8)
    ]}))
    args = plan_command_args("--gpu-facts", str(facts), "--tp-size", "8",
                             "--model-config", str(MODELS / "glm-5" / "config.json"))
    inputs, notes, _verdict = plan_command.build_inputs(args)  # type: ignore[arg-type]
    assert (inputs.gpu_memory_mib, inputs.gpu_memory_used_mib) == (97887.0, 2.0)
    assert inputs.kv_bytes_per_token == 55_224 and inputs.page_size == 64  # SM 12 -> fp8
    assert notes[0] == "GPU facts: 8 GPUs, smallest 97887 MiB"


def test_plan_exits_non_zero_when_no_fraction_is_safe(capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_deploy import cli

    argv = ["plan", "--gpu-memory-mib", "97887", "--tp-size", "8", "--max-running-requests", "64",
            "--weights-gib-per-gpu", "95", "--kv-bytes-per-token", "55224"]  # fmt: skip
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert "none is safe" in out and "NO SAFE FRACTION: the weights (95.0 GiB per GPU)" in out
    assert cli.main([*argv, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["recommended_mem_fraction_static"] is None


# --- the KV layout follows the KV dtype and the DSA backends (sglang's own rules) ------------------------
@pytest.mark.parametrize(("version", "sm", "dtype", "flags", "expected"), [
    # 0.5.10.post1 (the cu128 lane): an fp8 pool on SM >= 10 runs trtllm whatever the flags say.
    ("0.5.10.post1", 12, "fp8_e4m3", (None, None), ("trtllm", "trtllm")),
    ("0.5.10.post1", 12, "fp8_e4m3", ("flashmla_sparse", "flashmla_kv"), ("trtllm", "trtllm")),
    ("0.5.10.post1", 12, "bfloat16", ("trtllm", "trtllm"), ("trtllm", "trtllm")),
    ("0.5.10.post1", 12, "bfloat16", (None, None), ("flashmla_sparse", "trtllm")),
    # 0.5.17 on (the device; 0.5.23 too): the flags are kept; unset ones get sglang's per-GPU default.
    ("0.5.17", 9, "fp8_e4m3", (None, None), ("flashmla_kv", "flashmla_kv")),
    ("0.5.17", 9, "bfloat16", (None, None), ("flashmla_sparse", "fa3")),
    ("0.5.17", 12, "fp8_e4m3", (None, None), ("flashinfer_sparse_mla", "flashinfer_sparse_mla")),
    ("0.5.23", 12, "fp8_e4m3", ("trtllm", "trtllm"), ("trtllm", "trtllm")),
])  # fmt: skip
def test_dsa_backends_as_each_sglang_picks_them(version, sm, dtype, flags, expected) -> None:
    chosen = kvcell.resolve_dsa_backends(dtype, *flags, sm_major=sm, sglang_version=version, architecture="GlmMoeDsaForCausalLM")
    assert (chosen.prefill, chosen.decode) == expected


def test_an_fp8_pool_is_packed_unless_trtllm_reads_it_and_a_draft_adds_its_layers() -> None:
    plain = kvcell.DsaBackends("trtllm", "trtllm", "")
    packed = kvcell.DsaBackends("flashmla_kv", "flashmla_kv", "")
    assert kv_cell(GLM5, "fp8_e4m3", dsa_backends=plain).bytes_per_token == (576 + 132) * 78 == 55_224
    assert kv_cell(GLM5, "fp8_e4m3", dsa_backends=packed).bytes_per_token == (512 + 16 + 128 + 132) * 78 == 61_464
    assert kv_cell(GLM5, "bfloat16", dsa_backends=packed).bytes_per_token == (1152 + 132) * 78 == 100_152
    assert kv_cell(DSV3, "fp8_e4m3", dsa_backends=packed).bytes_per_token == 576 * 61  # no indexer: never packed
    # An EAGLE/MTP draft keeps a pool of the same tokens for its own layers (sglang: 1 + draft/layers).
    assert kv_cell(GLM5, "bfloat16", draft_layers=1).bytes_per_token == int(100_152 * 79 / 78)


def test_the_conversion_copy_grows_with_the_fraction_and_the_recommendation_accounts_for_it() -> None:
    with_copy = dict(SEED, kv_conversion_bytes_per_token=1152)
    best = plan(PlanInputs(**with_copy)).recommended_mem_fraction_static
    assert best is not None
    assert plan(PlanInputs(**with_copy, mem_fraction_static=best)).headroom_mib >= SEED_MARGIN  # type: ignore[operator]
    over = plan(PlanInputs(**with_copy, mem_fraction_static=round(best + 0.01, 2)))
    assert over.headroom_mib < SEED_MARGIN  # type: ignore[operator]  # the next step up does not keep the margin
    small, large = (plan(PlanInputs(**with_copy, mem_fraction_static=f)).breakdown_mib["kv_conversion"] for f in (0.80, 0.90))
    assert large > small  # a bigger pool, a bigger copy
    assert kvcell.kv_conversion_bytes_per_token(GLM5, "fp8_e4m3", "flashinfer") == 1152
    assert kvcell.kv_conversion_bytes_per_token(GLM5, "bfloat16", "flashinfer") == 0
    assert kvcell.kv_conversion_bytes_per_token(GLM5, "fp8_e4m3", None) == 0
    assert kvcell.kv_conversion_bytes_per_token(LLAMA, "fp8_e4m3", "flashinfer") == 0


SEED_MARGIN = planner.RECOMMENDATION_MARGIN_MIB


def test_an_eagle_draft_loads_inside_the_fraction_and_its_graphs_follow_the_measured_ratio() -> None:
    """docstring 10.: the draft's weights come off the pool like the target's; its graphs are a measured
    multiple of the decode graphs, else sglang's own 4 GiB; NGRAM has no draft model."""
    eagle = dict(SEED, speculative_algorithm="EAGLE", mem_fraction_static=0.85, kv_conversion_bytes_per_token=0)
    base = plan(PlanInputs(**eagle))
    assert base.breakdown_mib["speculative_draft"] == planner.SPECULATIVE_RESERVE_MIB
    assert base.inputs["effective_draft_weights_gib_per_gpu"] == 0.0  # nothing known about the draft
    draft = dict(draft_embedding_gib_per_gpu=0.5, draft_projection_gib_per_gpu=0.1, draft_layer_share=1 / 78)
    estimated = plan(PlanInputs(**eagle, **draft, speculative_graph_ratio=3.0))
    share = (planner.SEED_WEIGHTS_GIB_PER_GPU - 0.5) / 78
    assert estimated.inputs["effective_draft_weights_gib_per_gpu"] == pytest.approx(0.5 + 0.1 + share, abs=1e-3)
    lost = round(estimated.inputs["effective_draft_weights_gib_per_gpu"] * planner.GIB / SEED["kv_bytes_per_token"])
    assert base.kv_tokens - estimated.kv_tokens == pytest.approx(lost, abs=64)  # type: ignore[operator]  # pages of 64
    assert estimated.breakdown_mib["speculative_draft"] == pytest.approx(2 * estimated.breakdown_mib["cuda_graphs"], abs=0.1)
    # The released embedding and head come back before capture.
    assert estimated.free_after_start_mib - base.free_after_start_mib == pytest.approx(  # type: ignore[operator]
        base.breakdown_mib["speculative_draft"] - estimated.breakdown_mib["speculative_draft"] + 0.5 * 1024, abs=4
    )
    # A measured figure wins over the estimate; NGRAM (no draft model) counts neither.
    given = plan(PlanInputs(**eagle, **draft, draft_weights_gib_per_gpu=2.0))
    assert given.inputs["effective_draft_weights_gib_per_gpu"] == 2.0
    ngram = plan(PlanInputs(**dict(eagle, speculative_algorithm="NGRAM"), **draft, draft_weights_gib_per_gpu=2.0))
    assert "speculative_draft" not in ngram.breakdown_mib and ngram.inputs["effective_draft_weights_gib_per_gpu"] == 0.0
    with pytest.raises(planner.PlanError, match="speculative_graph_ratio"):
        plan(PlanInputs(**eagle, speculative_graph_ratio=0.5))  # fewer graphs than without a draft: not a GPU's
