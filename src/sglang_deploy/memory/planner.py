"""Memory planner for ``--mem-fraction-static``: will a fraction fit, and which one should we use?

sglang sizes its KV pool as ``F0 * f - weights`` (``F0``: the free memory once the CUDA context and NCCL
are up); what is left, ``F0 * (1 - f)``, must hold the terms outside the pool: CUDA-graph buffers,
one prefill chunk's activations, the attention backend's buffers, flashinfer MLA's bf16 copy of an fp8
pool, an EAGLE/MTP draft's graphs, and allocator slack. The KV cell comes from
:mod:`sglang_deploy.memory.kvcell`. Every constant below is calibrated on the seed box or measured on a
GPU; docs/performance.md, "How the planner is calibrated", has each term's derivation, source and
date, numbered as the comments here cite them ("calibration 4")"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_deploy_host.model import inspection as inspector
from sglang_deploy.lanes.catalog import DEFAULT_LANE, PlannerRules, load_lane
from sglang_deploy.launch.flagtable import LaunchSettings
from sglang_deploy.memory import architectures
from sglang_deploy.memory.kvcell import (
    PlanError,
    architectures_of,
    config_int,
    is_mla,
    is_nsa,
    kv_cell,
    kv_conversion_bytes_per_token,
    piecewise_cuda_graph_enabled,
    resolve_dsa_backends,
    resolve_kv_cache_dtype,
)

MIB = 1 << 20
GIB = 1 << 30

# -- calibration constants (docs/performance.md, "How the planner is calibrated") -------------------
SEED_GPU_MEMORY_MIB = 97_887
SEED_TP_SIZE = 8
SEED_RUNTIME_OVERHEAD_MIB = 1_517
SEED_KV_BYTES_PER_TOKEN = 55_262  # derived from the two seed points (formula: 55,224)
SEED_WEIGHTS_GIB_PER_GPU = 60.95
GRAPH_MIB_PER_BS = 29.0
ACTIVATION_MIB_PER_TOKEN = 0.25
ALLOCATOR_SLACK_MIB = 3_072
RECOMMENDATION_MARGIN_MIB = 694
FRACTION_STEP = 0.01
# Outside the pool, per KV-pool page and token (calibration 7).
FREE_LIST_BYTES_PER_PAGE = 8
EAGER_BUFFER_BYTES_PER_TOKEN = 50
# What flashinfer MLA's conversion of an fp8 pool costs a decode step, per pool token (calibration 8):
# measured on an H200 at 0.1295 us per pool token and step (78 layers; about 1 TB/s, a fifth of the
# card's bandwidth).
KV_CONVERSION_US_PER_TOKEN_H200 = 0.1295
# Draft model of EAGLE/MTP, for an architecture without measured terms (calibration 10): sglang
# 0.5.10.post1's own estimate of its graphs and buffers, the 4 GiB ``_handle_gpu_memory_settings`` adds
# for EAGLE (server_args.py:1320-1326).
SPECULATIVE_RESERVE_MIB = 4096
# The draft's own embedding, head and eh_proj (the projection of [embedding; hidden]) are BF16 in
# GLM-5's checkpoints, quantized or not (calibration 10).
DRAFT_DENSE_ELEMENT_BYTES = 2

# sglang 0.5.10.post1 constants (server_args.py dataclass defaults and memory_pool.py:1805-1806).
SGLANG_MAX_PREFILL_TOKENS_DEFAULT = 16_384

# -- an architecture's memory terms, measured -------------------------------------------------------
@dataclass(frozen=True)
class MemoryTerms:
    """The outside-the-pool terms of one architecture on one kind of launch, with where they come from."""

    graph_fixed_mib: float
    graph_mib_per_bs: float
    activation_mib_per_token: float
    attention_workspace_mib: float
    source: str
    # EAGLE/MTP: the memory of its graphs (target verify + draft decode + draft extend) over the decode
    # graphs' of the same launch without it (calibration 10); None: not measured.
    speculative_graph_ratio: float | None = None


_H200_RUN = "tests/fixtures/real-sglang/h200-glm5-arch-0.5.17 (one H200, sglang 0.5.17, TP 1, measured 2026-12-01)"
# GLM-5's architecture (78 layers, 8 of 256 experts, dummy BF16 weights) on the H200 (calibration 9):
# decode graphs for bs 1..64 took 0.52 GiB and for bs 1..128 0.85 GiB on the DSA backends (a line:
# 194 MiB + 5.3 MiB per bs); 0.38 GiB for bs 1..64 on flashinfer MLA with a bf16 pool (50 + 5.3 per bs);
# a prefill of 8,192 tokens left 4,602 MiB more reserved than the idle server (0.56 MiB per token; 0.58
# between 1,024 and 8,192 tokens); between the pool and the first capture the attention backend took
# 0.12 GiB (DSA) and 0.51-0.55 GiB (flashinfer MLA: its workspace and plan buffers).
# EAGLE/MTP, 3 steps, top-1, 4 draft tokens, bs 1..64 (calibration 10; the *-mtp starts of the same
# folder): DSA target verify 1.21 + draft decode 0.35 + draft extend 0.53 = 2.09 GiB
# against 0.52 GiB of decode graphs without MTP (4.02x); flashinfer MLA 0.93 + 0.85 (its draft extend
# captures no graphs) = 1.78 GiB against 0.38 (4.68x).
GLM5_MTP_GRAPH_RATIO_DSA = 4.02
GLM5_MTP_GRAPH_RATIO_MLA = 4.68
GLM5_TERMS_TP1_DSA = MemoryTerms(194.0, 5.3, 0.58, 123.0, _H200_RUN, GLM5_MTP_GRAPH_RATIO_DSA)
GLM5_TERMS_TP1_MLA = MemoryTerms(
    50.0, 5.3, 0.58, 522.0, _H200_RUN + "; activations from the DSA start", GLM5_MTP_GRAPH_RATIO_MLA
)
# The seed box (8x RTX PRO 6000, SM120, TP 8, sglang 0.5.10.post1): calibrations 1-6 and 8;
# its attention workspace is inside the graph term there (what 0.92 left was measured after both). MTP
# there is unmeasured: the TP 1 ratio of its path (flashinfer MLA) on its graph term, an extrapolation.
GLM5_TERMS_TP8_SEED = MemoryTerms(
    0.0, GRAPH_MIB_PER_BS, ACTIVATION_MIB_PER_TOKEN, 0.0,
    "the seed box's 0.92 start (bs 1..64 graphs, 5.2 GiB left), conversion copy taken out; activations estimated;"
    " MTP graphs: the H200's flashinfer MLA ratio, unverified at TP 8",
    GLM5_MTP_GRAPH_RATIO_MLA,
)  # fmt: skip


def glm5_memory_terms(tp_size: int, dsa_attention: bool) -> MemoryTerms:
    """GLM-5's terms for a launch: measured at TP 1 (the H200), the seed box's at TP > 1 (its per-bs graph
    memory is 5.5x the H200's: what TP 8 adds per captured batch, the all-reduce and NCCL buffers of the
    graphs and the NVFP4 MoE's workspaces, cannot be split on one GPU; TP 2-4 get the TP 8 figure)."""
    if tp_size == 1:
        return GLM5_TERMS_TP1_DSA if dsa_attention else GLM5_TERMS_TP1_MLA
    return GLM5_TERMS_TP8_SEED


def architecture_inputs(
    config: Mapping[str, Any],
    launch: LaunchSettings,
    *,
    sm_major: int | None,
    sglang_version: str,
    architecture: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """PlanInputs fields a launch of this model implies, and a note for each: the KV cell from the KV
    dtype, the DSA backends sglang will run and an EAGLE/MTP draft, the page size, the fp8 conversion of
    flashinfer MLA, and (for a known ``architecture``) its measured memory terms, for ``launch`` (the typed flags,
    LaunchConfig.settings)."""
    tp = launch.tp
    attention = launch.attention_backend
    dtype = resolve_kv_cache_dtype(launch.kv_cache_dtype or "auto", config, sm_major=sm_major)
    backends = None
    notes: list[str] = []
    if is_nsa(config):
        if sm_major is None:
            raise PlanError("a DSA model's KV layout depends on the GPU: give sm_major (12 for RTX PRO 6000 Blackwell)")
        backends = resolve_dsa_backends(
            dtype, launch.dsa_prefill_backend, launch.dsa_decode_backend, sm_major=sm_major,
            sglang_version=sglang_version, architecture=architectures_of(config)[0],
        )  # fmt: skip
        notes.append(f"DSA backends {backends.prefill}/{backends.decode} ({backends.why})")
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    assert isinstance(text, Mapping)
    draft = 0
    if _speculative(launch.speculative_algorithm):
        # sglang: the draft's layers are num_nextn_predict_layers, or all of them when the config has none.
        draft = int(text.get("num_nextn_predict_layers") or config_int(text, "num_hidden_layers"))
    cell = kv_cell(config, dtype, tp_size=tp, sm_major=sm_major, dsa_backends=backends, draft_layers=draft)
    notes.append(f"KV cell {cell.attention}, {cell.kv_cache_dtype}: {cell.formula} = {cell.bytes_per_token:,} B/token")
    conversion = kv_conversion_bytes_per_token(config, dtype, attention)
    values: dict[str, Any] = {
        "kv_bytes_per_token": cell.bytes_per_token,
        "page_size": cell.page_size,
        "mla_backend": is_mla(config),
        "piecewise_cuda_graph": piecewise_cuda_graph_enabled(config),
        "kv_conversion_bytes_per_token": conversion,
    }
    if conversion:
        notes.append(f"flashinfer MLA converts the fp8 pool to bf16 per layer: {conversion} B per pool token outside the pool")
    if draft:
        values.update(_draft_inputs(text, draft, tp))
        notes.append(
            f"EAGLE/MTP draft: {draft} of {config_int(text, 'num_hidden_layers')} layers, its embedding and head "
            f"{values['draft_embedding_gib_per_gpu']:.3f} GiB and eh_proj {values['draft_projection_gib_per_gpu']:.3f} "
            "GiB per GPU in BF16, loaded inside the fraction before the pool"
        )
        unquantized = _unquantized_draft_layer_gib(text, tp) if _modelopt_fp4(config, launch) else None
        if unquantized is not None:
            values["draft_weights_gib_per_gpu"] = round(unquantized + values["draft_embedding_gib_per_gpu"], 4)
            notes.append(
                f"modelopt_fp4: sglang builds the draft layer unquantized (BF16), {unquantized:.3f} GiB per GPU at TP {tp} "
                f"from the architecture's shapes, + its embedding and head = {values['draft_weights_gib_per_gpu']:.3f} "
                "GiB (plan --checkpoint reads the real bytes)"
            )
    if architecture == "glm-5":
        terms = glm5_memory_terms(tp, dsa_attention=is_nsa(config) and attention in (None, "dsa", "nsa"))
        values.update(graph_fixed_mib=terms.graph_fixed_mib, graph_mib_per_bs=terms.graph_mib_per_bs,
                      activation_mib_per_token=terms.activation_mib_per_token,
                      attention_workspace_mib=terms.attention_workspace_mib)  # fmt: skip
        if draft and terms.speculative_graph_ratio is not None:
            values["speculative_graph_ratio"] = terms.speculative_graph_ratio
            notes.append(f"EAGLE/MTP graphs {terms.speculative_graph_ratio:g}x the decode graphs ({terms.source})")
        notes.append(
            f"GLM-5 terms: graphs {terms.graph_fixed_mib:g} + {terms.graph_mib_per_bs:g} MiB per bs, activations "
            f"{terms.activation_mib_per_token:g} MiB per prefill token, attention workspace "
            f"{terms.attention_workspace_mib:g} MiB ({terms.source})"
        )
    return values, notes


def _draft_inputs(text: Mapping[str, Any], draft_layers: int, tp_size: int) -> dict[str, float]:
    """The draft's weight terms (calibration 10): embedding and head split over the TP ranks (sglang's
    vocab-parallel layers), eh_proj ([embedding; hidden] -> hidden) on every rank, in BF16."""
    hidden, vocab = config_int(text, "hidden_size"), config_int(text, "vocab_size")
    return {
        "draft_embedding_gib_per_gpu": 2 * vocab * hidden * DRAFT_DENSE_ELEMENT_BYTES / tp_size / GIB,
        "draft_projection_gib_per_gpu": 2 * hidden * hidden * DRAFT_DENSE_ELEMENT_BYTES / GIB,
        "draft_layer_share": draft_layers / config_int(text, "num_hidden_layers"),
    }


def _modelopt_fp4(config: Mapping[str, Any], launch: LaunchSettings) -> bool:
    """The launch quantizes with ModelOpt FP4 (the flag, or the checkpoint's own quantization config)."""
    if launch.quantization == "modelopt_fp4":
        return True
    quant = config.get("quantization_config")
    if isinstance(quant, Mapping):
        nested = quant.get("quantization")
        for part in (quant, nested if isinstance(nested, Mapping) else {}):
            if str(part.get("quant_algo") or "").upper() == "NVFP4":
                return True
    return False


def _unquantized_draft_layer_gib(text: Mapping[str, Any], tp_size: int) -> float | None:
    """GiB per GPU of the MTP draft layer in BF16 (deepseek_nextn.py builds it with ``quant_config=None``
    under modelopt_fp4), from the architecture's shapes and how sglang shards each tensor; None for an
    architecture without DeepSeek-V3-style shapes."""
    try:
        tensors = architectures.draft_layer_tensors(text)
    except (KeyError, TypeError, ValueError):
        return None
    replicated = split = 0
    for name, (_dtype, shape) in tensors.items():
        size = math.prod(shape) * 2
        if inspector.split_over_tensor_parallel(name):
            split += size
        else:
            replicated += size
    return (replicated + split / tp_size) / GIB


def weights_gib_from_index(index: Mapping[str, Any], tp_size: int) -> float:
    """Checkpoint bytes per GPU from ``model.safetensors.index.json`` (``metadata.total_size``).

    A lower bound of the load's footprint: replicated layers and load-time buffers add to it (the
    seeds' GLM-5-NVFP4 load took 60.95 GiB per GPU for a ~46.6 GiB share)."""
    try:
        total = int(index["metadata"]["total_size"])
    except (KeyError, TypeError, ValueError):
        raise PlanError(
            "the safetensors index has no metadata.total_size. Fix: pass "
            "--weights-gib-per-gpu instead"
        ) from None
    return total / tp_size / GIB


# -- sglang's own default -------------------------------------------------------------------------
@dataclass(frozen=True)
class SglangDefaults:
    """What ``ServerArgs._handle_gpu_memory_settings`` picks when the flags are left unset."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int
    mem_fraction_static: float
    reserved_mib: float


def sglang_default_settings(
    gpu_memory_mib: float | None,
    *,
    tp_size: int = 1,
    pp_size: int = 1,
    chunked_prefill_size: int | None = None,
    cuda_graph_max_bs: int | None = None,
    cuda_graph_bs: Sequence[int] | None = None,
    max_prefill_tokens: int = SGLANG_MAX_PREFILL_TOKENS_DEFAULT,
    max_total_tokens: int | None = None,
    mla_backend: bool = False,
    piecewise_cuda_graph: bool = True,
    enable_dp_attention: bool = False,
    dp_size: int = 1,
    speculative_algorithm: str | None = None,
    lane_rules: PlannerRules | None = None,
) -> SglangDefaults:
    """Reproduces sglang 0.5.10.post1 ``server_args.py:1141-1327`` for a CUDA device; chunked prefill and the
    decode graphs' batch by GPU memory from ``lane_rules`` (the lane's ``planner.graph_tiers``; None: the cu128
    lane's, 0.5.10.post1's ``server_args.py:1165-1228``).

    ``gpu_memory_mib`` is ``nvidia-smi --query-gpu=memory.total`` (the minimum over GPUs,
    ``utils/common.py:1514-1544``). Not reproduced: the VLM adjustment (``:1332``, multimodal
    models only), the aiter scaling (``:2417``, AMD only) and the llama-2 piecewise cap (``:1271``).
    The reserve behind sglang's own default fraction is 0.5.10.post1's in every lane (an estimate the plan shows
    beside its own, not one it launches with).
    """
    gpu_mem = gpu_memory_mib
    tiers = graph_tier(gpu_mem, tp_size, lane_rules)
    chunked = chunked_prefill_size if chunked_prefill_size is not None else tiers[0]
    max_bs = cuda_graph_max_bs if cuda_graph_max_bs is not None else tiers[1]
    if cuda_graph_bs:  # :1234-1235
        max_bs = max(cuda_graph_bs)
    # :1255-1268: piecewise graph tokens (2048 for MLA, else the chunk size), capped.
    pcg_max_tokens = 2048 if mla_backend else chunked
    if max_total_tokens is not None:
        pcg_max_tokens = min(pcg_max_tokens, max_total_tokens)
    # :1281-1322: the reserve, in MB.
    reserved: float = 512
    if chunked > 0:
        reserved += max(chunked, 2048) * 1.5
    else:
        reserved += max(max_prefill_tokens, 2048) * 1.5
    reserved += max_bs * 2
    reserved += tp_size * pp_size / 8 * 1024
    if enable_dp_attention:
        reserved += max_bs * dp_size * 3
        if max_bs > 300:
            reserved += max_bs * dp_size * 1.5
    if piecewise_cuda_graph:
        if not mla_backend:
            reserved += len(_piecewise_tokens(pcg_max_tokens)) * 8
        else:
            reserved += 1.5 * 1024
    if gpu_mem is not None and gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative_algorithm is not None:
        if speculative_algorithm == "STANDALONE":
            reserved += 6 * 1024
        elif speculative_algorithm != "NGRAM":
            reserved += 4 * 1024
    fraction = round((gpu_mem - reserved) / gpu_mem, 3) if gpu_mem is not None else 0.88
    return SglangDefaults(chunked, max_bs, fraction, reserved)


def graph_tier(gpu_memory_mib: float | None, tp_size: int, lane_rules: PlannerRules | None = None) -> tuple[int, int]:
    """(chunked-prefill-size, decode graphs' largest batch) the lane's sglang picks for this GPU and TP size."""
    rules = lane_rules or _default_lane_rules()
    if gpu_memory_mib is None:
        return rules.graph_tiers_unknown
    for tier in rules.graph_tiers:
        if tier.below_gib is None or gpu_memory_mib < tier.below_gib * 1024:
            return tier.chunked_prefill_size, tier.max_bs_small_tp if tp_size < 4 else tier.max_bs_large_tp
    raise AssertionError("the lane's last graph tier has no bound")  # _parse_planner guarantees it


@functools.lru_cache(maxsize=1)
def _default_lane_rules() -> PlannerRules:
    rules = load_lane(DEFAULT_LANE).planner
    assert rules is not None, "the default lane carries its planner rules"
    return rules


def _piecewise_tokens(max_tokens: int) -> list[int]:
    """``ServerArgs._generate_piecewise_cuda_graph_tokens`` (``server_args.py:1397-1415``)."""
    sizes = (
        list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
        + list(range(576, 1024 + 1, 64)) + list(range(1280, 4096 + 1, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in sizes if s <= max_tokens]


# -- the plan -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanInputs:
    """Everything the planner reads. Memory in MiB unless the name says otherwise."""

    gpu_memory_mib: float
    tp_size: int = 1
    pp_size: int = 1
    weights_gib_per_gpu: float | None = None
    kv_bytes_per_token: int | None = None
    page_size: int = 1
    mem_fraction_static: float | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: tuple[int, ...] | None = None
    disable_cuda_graph: bool = False
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    mla_backend: bool = False
    piecewise_cuda_graph: bool = True
    enable_dp_attention: bool = False
    dp_size: int = 1
    speculative_algorithm: str | None = None
    # EAGLE/MTP's draft (calibration 10): what it loads per GPU when known (a start log's second "Load
    # weight end"); else estimated from its embedding and head (BF16, released for the target's after the
    # load), its eh_proj and its share of the target's layers.
    draft_weights_gib_per_gpu: float | None = None
    draft_embedding_gib_per_gpu: float = 0.0
    draft_projection_gib_per_gpu: float = 0.0
    draft_layer_share: float = 0.0
    # The draft's graphs over the decode graphs' memory (MemoryTerms.speculative_graph_ratio); None:
    # sglang's own 4 GiB estimate (SPECULATIVE_RESERVE_MIB).
    speculative_graph_ratio: float | None = None
    # The lane's sglang rules for the graphs (lanes/<lane>.yml `planner`; None: the default lane's): its tiers of
    # chunked prefill and decode-graph batch, and whether the request pool caps an explicit graph batch too.
    lane_rules: PlannerRules | None = None
    gpu_memory_used_mib: float = 0.0  # by other processes before the start (gpu facts)
    runtime_overhead_mib: float = SEED_RUNTIME_OVERHEAD_MIB
    graph_mib_per_bs: float = GRAPH_MIB_PER_BS
    graph_fixed_mib: float = 0.0  # decode graphs' memory that does not grow with the batch size
    attention_workspace_mib: float = 0.0  # the attention backend's buffers, allocated after the pool
    activation_mib_per_token: float = ACTIVATION_MIB_PER_TOKEN
    # Bytes per pool token held outside the pool while attention runs: flashinfer MLA with an fp8 pool
    # converts a layer's whole buffer to bf16 (:func:`kv_conversion_bytes_per_token`); 0 otherwise.
    kv_conversion_bytes_per_token: int = 0
    allocator_slack_mib: float = ALLOCATOR_SLACK_MIB
    margin_mib: float = RECOMMENDATION_MARGIN_MIB


@dataclass(frozen=True)
class Plan:
    """The planner's answer; :meth:`to_dict` is the ``--json`` object."""

    safe: bool | None
    mem_fraction_static: float | None
    required_mib: float
    available_mib: float | None
    headroom_mib: float | None
    kv_tokens: int | None
    kv_tokens_at: float | None
    recommended_mem_fraction_static: float | None
    sglang_default_mem_fraction_static: float
    free_after_start_mib: float | None
    breakdown_mib: dict[str, float]
    inputs: dict[str, Any]
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fraction_to_launch(self, requested: Any) -> float | None:
        """The ``--mem-fraction-static`` to launch with for the flag as given: the recommendation
        for ``auto`` (PlanError with the numbers when there is none, never "leave the flag out"),
        the judged fraction otherwise, None when the flag is absent (sglang's own default)."""
        if str(requested) != "auto":
            return self.mem_fraction_static
        if self.recommended_mem_fraction_static is None:
            raise PlanError(f"mem-fraction-static auto cannot be resolved: {self.explanation()}")
        return self.recommended_mem_fraction_static

    def explanation(self) -> str:
        """One paragraph: the verdict and why (used by the role's failure message)."""
        parts = [
            f"outside the static pool the server needs {self.required_mib:,.0f} MiB per GPU "
            + "(" + ", ".join(f"{k} {v:,.0f}" for k, v in self.breakdown_mib.items()) + ")"
        ]
        if self.mem_fraction_static is not None and self.available_mib is not None:
            parts.append(
                f"--mem-fraction-static {self.mem_fraction_static} leaves {self.available_mib:,.0f} "
                f"MiB (headroom {self.headroom_mib:+,.0f} MiB)"
            )
        parts.extend(self.reasons)
        if self.recommended_mem_fraction_static is not None:
            parts.append(
                f"recommended: {self.recommended_mem_fraction_static} (keeps a "
                f"{self.inputs['margin_mib']:.0f} MiB margin); sglang's own default here: "
                f"{self.sglang_default_mem_fraction_static}"
            )
        return "; ".join(parts)


def plan(inputs: PlanInputs) -> Plan:
    """Judge ``inputs.mem_fraction_static`` (if given) and recommend a fraction."""
    _check_inputs(inputs)
    defaults = sglang_default_settings(
        inputs.gpu_memory_mib,
        tp_size=inputs.tp_size,
        pp_size=inputs.pp_size,
        chunked_prefill_size=inputs.chunked_prefill_size,
        cuda_graph_max_bs=inputs.cuda_graph_max_bs,
        cuda_graph_bs=inputs.cuda_graph_bs,
        max_total_tokens=inputs.max_total_tokens,
        mla_backend=inputs.mla_backend,
        piecewise_cuda_graph=inputs.piecewise_cuda_graph,
        enable_dp_attention=inputs.enable_dp_attention,
        dp_size=inputs.dp_size,
        speculative_algorithm=inputs.speculative_algorithm,
        lane_rules=inputs.lane_rules,
    )
    graph_bs = _captured_max_bs(inputs, defaults.cuda_graph_max_bs)
    chunk = defaults.chunked_prefill_size if defaults.chunked_prefill_size > 0 else (
        SGLANG_MAX_PREFILL_TOKENS_DEFAULT
    )
    breakdown = {
        "cuda_graphs": (inputs.graph_fixed_mib + inputs.graph_mib_per_bs * graph_bs) if graph_bs else 0.0,
        "activations": inputs.activation_mib_per_token * chunk,
        "allocator_slack": float(inputs.allocator_slack_mib),
    }
    if inputs.attention_workspace_mib:
        breakdown["attention_workspace"] = float(inputs.attention_workspace_mib)
    if _speculative(inputs.speculative_algorithm):
        if inputs.speculative_graph_ratio is None:
            breakdown["speculative_draft"] = float(SPECULATIVE_RESERVE_MIB)
        else:  # its graphs replace the decode graphs: what they take on top of them
            breakdown["speculative_draft"] = (inputs.speculative_graph_ratio - 1) * breakdown["cuda_graphs"]
    free0 = inputs.gpu_memory_mib - inputs.runtime_overhead_mib - inputs.gpu_memory_used_mib

    draft_weights = draft_weights_gib(inputs)
    recommended = _recommend(inputs, free0, sum(breakdown.values()))
    fraction = inputs.mem_fraction_static
    at = fraction if fraction is not None else recommended
    kv_tokens = _kv_tokens(inputs, free0, at) if at is not None else None
    pool = max(kv_tokens or 0, 0)
    if inputs.kv_conversion_bytes_per_token:
        # Grows with the pool, so with the fraction: the one term that does.
        breakdown["kv_conversion"] = (pool + inputs.page_size) * inputs.kv_conversion_bytes_per_token / MIB
    required = sum(breakdown.values())
    reasons: list[str] = []
    safe: bool | None = None
    available = headroom = free_after = None
    if fraction is not None:
        available = round(free0 * (1 - fraction), 1)
        headroom = round(available - required, 1)
        free_after = available - sum(breakdown.get(k, 0.0) for k in _HELD_AFTER_START)
        if draft_weights:  # the draft drops its own embedding and head for the target's once loaded
            free_after += inputs.draft_embedding_gib_per_gpu * 1024
        safe = headroom >= 0
        if not safe:
            reasons.append(
                f"UNSAFE: {fraction} leaves {-headroom:,.0f} MiB too little outside the pool: "
                "expect torch.OutOfMemoryError in CUDA-graph capture or the first large prefill"
            )
    token_buffers = (pool * EAGER_BUFFER_BYTES_PER_TOKEN + pool // inputs.page_size * FREE_LIST_BYTES_PER_PAGE) / MIB
    if free_after is not None:
        free_after = round(free_after - token_buffers, 1)
    if fraction is not None and kv_tokens is not None and kv_tokens <= 0:
        safe = False
        reasons.append(
            f"UNSAFE: at {fraction} the weights ({inputs.weights_gib_per_gpu} GiB) leave no room "
            "for a KV pool (sglang: 'Not enough memory. Please try to increase "
            "--mem-fraction-static.')"
        )
    if inputs.kv_conversion_bytes_per_token and pool:
        reasons.append(conversion_note(pool))
    if recommended is None:
        reasons.append(_no_safe_fraction(inputs, free0, required))
    if inputs.gpu_memory_used_mib > 0:
        reasons.append(
            f"{inputs.gpu_memory_used_mib:,.0f} MiB is already in use on a GPU: stop those "
            "processes first (sglang warns 'The memory capacity is unbalanced')"
        )
    return Plan(
        safe=safe,
        mem_fraction_static=fraction,
        required_mib=round(required, 1),
        available_mib=_r(available),
        headroom_mib=_r(headroom),
        kv_tokens=kv_tokens,
        kv_tokens_at=at,
        recommended_mem_fraction_static=recommended,
        sglang_default_mem_fraction_static=defaults.mem_fraction_static,
        free_after_start_mib=_r(free_after),
        breakdown_mib={k: round(v, 1) for k, v in breakdown.items()},
        inputs={
            **{key: value for key, value in asdict(inputs).items() if key != "lane_rules"},
            "free_at_start_mib": round(free0, 1),
            "effective_chunked_prefill_size": chunk,
            "effective_cuda_graph_max_bs": graph_bs,
            "sglang_default_reserved_mib": defaults.reserved_mib,
            "kv_token_buffers_mib": round(token_buffers, 1),
            "effective_draft_weights_gib_per_gpu": round(draft_weights, 3),
        },
        reasons=reasons,
    )


# Terms that stay allocated after the start (free memory after capture); activations and the slack are
# the room the next large prefill needs, not held at idle.
_HELD_AFTER_START = ("cuda_graphs", "attention_workspace", "kv_conversion", "speculative_draft")


# The speculative algorithms the planner models (the draft's pool and graphs): sglang's EAGLE family and NGRAM.
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


def _speculative(algorithm: str | None) -> bool:
    return algorithm is not None and algorithm.upper() not in ("", "NGRAM")


def draft_weights_gib(inputs: PlanInputs) -> float:
    """GiB per GPU an EAGLE/MTP draft loads before the pool is sized (calibration 10): the given
    figure, else its embedding and head, its eh_proj and its share of the target's layers (the target's
    weights less their own embedding and head); 0 without a draft or without the target's weights."""
    if not _speculative(inputs.speculative_algorithm):
        return 0.0
    if inputs.draft_weights_gib_per_gpu is not None:
        return inputs.draft_weights_gib_per_gpu
    if inputs.weights_gib_per_gpu is None:
        return 0.0
    layers = max(inputs.weights_gib_per_gpu - inputs.draft_embedding_gib_per_gpu, 0.0) * inputs.draft_layer_share
    return inputs.draft_embedding_gib_per_gpu + inputs.draft_projection_gib_per_gpu + layers


def conversion_note(pool_tokens: int) -> str:
    """What the fp8-pool conversion of flashinfer MLA costs a decode step (calibration 8)."""
    step_ms = pool_tokens * KV_CONVERSION_US_PER_TOKEN_H200 / 1000
    return (
        f"SLOW: --kv-cache-dtype fp8 with --attention-backend flashinfer on this MLA model converts the whole "
        f"KV pool ({pool_tokens:,} tokens) to bf16 in every layer of every decode step: about {step_ms:,.0f} ms "
        f"per step on an H200 (measured: 0.13 us per pool token), about 2.7x that on an RTX PRO 6000 "
        f"(1.8 vs 4.8 TB/s), whatever the batch. Fix: --kv-cache-dtype bfloat16 (the profile 'tuned')"
    )


def _captured_max_bs(inputs: PlanInputs, server_max_bs: int) -> int:
    """Largest batch CUDA graphs are captured for, 0 with ``--disable-cuda-graph``: capped by the request pool
    (0.5.10.post1 ``cuda_graph_runner.py:454-480``, whatever set the batch); in a lane whose sglang caps only its
    own default (0.5.23 ``memory_hook.py:182-188``), an explicit batch is captured as asked."""
    if inputs.disable_cuda_graph:
        return 0
    rules = inputs.lane_rules or _default_lane_rules()
    explicit = inputs.cuda_graph_max_bs is not None or bool(inputs.cuda_graph_bs)
    if inputs.max_running_requests is not None and (rules.running_requests_cap_explicit_bs or not explicit):
        return min(server_max_bs, inputs.max_running_requests)
    return server_max_bs


def _recommend(inputs: PlanInputs, free0: float, required: float) -> float | None:
    """Largest fraction on the step grid leaving ``required + margin`` (and a KV pool). With a KV
    conversion term (``r`` bytes per pool token of ``c``), the pool ``F0*f - W`` also needs ``r/c`` of
    itself outside: ``F0*(1-f) >= R + (r/c)*(F0*f - W)``, so ``f <= (F0 - R + (r/c)*W) / (F0*(1 + r/c))``."""
    outside = required + inputs.margin_mib
    ratio = 0.0
    if inputs.kv_conversion_bytes_per_token and inputs.kv_bytes_per_token:
        ratio = inputs.kv_conversion_bytes_per_token / inputs.kv_bytes_per_token
    weights_mib = ((inputs.weights_gib_per_gpu or 0.0) + draft_weights_gib(inputs)) * 1024
    limit = (free0 - outside + ratio * weights_mib) / (free0 * (1 + ratio))
    best = math.floor(round(limit / FRACTION_STEP, 6)) * FRACTION_STEP
    best = round(min(best, 0.99), 2)
    if best <= 0:
        return None
    tokens = _kv_tokens(inputs, free0, best)
    if tokens is not None and tokens <= 0:
        return None
    return best


def _no_safe_fraction(inputs: PlanInputs, free0: float, required: float) -> str:
    """Why no fraction is safe: the outside terms alone, or the weights, leave no KV pool."""
    outside = required + inputs.margin_mib
    if outside >= free0 * (1 - FRACTION_STEP):
        why = (
            f"the terms outside the pool ({outside:,.0f} MiB with the margin) leave nothing of the "
            f"{free0:,.0f} MiB free at start for weights and KV cache"
        )
    else:
        why = (
            f"the weights ({inputs.weights_gib_per_gpu} GiB per GPU) leave no KV pool below the "
            f"largest safe fraction ({1 - outside / free0:.3f} of {free0:,.0f} MiB)"
        )
    return (
        f"NO SAFE FRACTION: {why}. Fix: more GPUs per replica (tp-size), a smaller model or "
        "quantization, or lower cuda-graph-max-bs / max-running-requests / chunked-prefill-size"
    )


def _kv_tokens(inputs: PlanInputs, free0: float, fraction: float) -> int | None:
    """``profile_max_num_token`` + page alignment; None when weights or cell size are unknown."""
    if inputs.weights_gib_per_gpu is None or inputs.kv_bytes_per_token is None:
        return None
    rest_bytes = (free0 * fraction * MIB) - (inputs.weights_gib_per_gpu + draft_weights_gib(inputs)) * GIB
    tokens = int(rest_bytes) // inputs.kv_bytes_per_token
    if inputs.max_total_tokens is not None:
        tokens = min(tokens, inputs.max_total_tokens)
    return tokens // inputs.page_size * inputs.page_size


# What each numeric PlanInputs field may hold: (integer?, lowest allowed, lowest is exclusive?).
# NaN, infinities and booleans are refused for all of them; None only where the field is optional.
_FIELD_RANGES: dict[str, tuple[bool, float, bool]] = {
    "gpu_memory_mib": (False, 0, True),
    "tp_size": (True, 1, False),
    "pp_size": (True, 1, False),
    "dp_size": (True, 1, False),
    "weights_gib_per_gpu": (False, 0, False),
    "draft_weights_gib_per_gpu": (False, 0, False),
    "draft_embedding_gib_per_gpu": (False, 0, False),
    "draft_projection_gib_per_gpu": (False, 0, False),
    "draft_layer_share": (False, 0, False),
    "speculative_graph_ratio": (False, 1, False),
    "kv_bytes_per_token": (True, 1, False),
    "page_size": (True, 1, False),
    "mem_fraction_static": (False, 0, True),
    "cuda_graph_max_bs": (True, 1, False),
    "max_running_requests": (True, 1, False),
    "max_total_tokens": (True, 1, False),
    "gpu_memory_used_mib": (False, 0, False),
    "runtime_overhead_mib": (False, 0, False),
    "graph_mib_per_bs": (False, 0, False),
    "graph_fixed_mib": (False, 0, False),
    "attention_workspace_mib": (False, 0, False),
    "kv_conversion_bytes_per_token": (True, 0, False),
    "activation_mib_per_token": (False, 0, False),
    "allocator_slack_mib": (False, 0, False),
    "margin_mib": (False, 0, False),
}


# No input of a GPU's plan comes near this (MiB, GiB, tokens, batch sizes): beyond it is a typo (1e30), and
# the arithmetic below would overflow into a traceback instead of a verdict.
_INPUT_MAX = 1e12


def _check_number(name: str, value: Any, integer: bool, low: float, exclusive: bool) -> None:
    kind = "an integer" if integer else "a number"
    bound = f"> {low:g}" if exclusive else f">= {low:g}"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise PlanError(f"{name} = {value!r} must be {kind} {bound}")
    if abs(value) > _INPUT_MAX if isinstance(value, int) else not math.isfinite(value) or abs(value) > _INPUT_MAX:
        shown = repr(value) if len(repr(value)) < 24 else repr(value)[:20] + "..."
        raise PlanError(f"{name} = {shown} must be {kind} {bound} and at most {_INPUT_MAX:g}")
    if value < low or (exclusive and value == low):
        raise PlanError(f"{name} = {value!r} must be {kind} {bound}")


def _check_inputs(inputs: PlanInputs) -> None:
    """Refuse inputs no GPU can have (NaN, infinities, zero or negative sizes) with a PlanError
    naming the input, instead of a ZeroDivisionError or a nonsense verdict further down."""
    for name, (integer, low, exclusive) in _FIELD_RANGES.items():
        value = getattr(inputs, name)
        if value is not None:
            _check_number(name, value, integer, low, exclusive)
    if inputs.chunked_prefill_size is not None and inputs.chunked_prefill_size != -1:
        _check_number("chunked_prefill_size (or -1: no chunking)", inputs.chunked_prefill_size, True, 1, False)
    for size in inputs.cuda_graph_bs or ():
        _check_number("every cuda_graph_bs", size, True, 1, False)
    if inputs.gpu_memory_mib <= inputs.runtime_overhead_mib + inputs.gpu_memory_used_mib:
        raise PlanError(
            f"gpu memory {inputs.gpu_memory_mib:g} MiB is not a GPU's size (the runtime overhead "
            f"alone is {inputs.runtime_overhead_mib:g} MiB, {inputs.gpu_memory_used_mib:g} MiB in use). "
            "Fix: pass --gpu-memory-mib (nvidia-smi --query-gpu=memory.total) or --gpu-facts"
        )
    if inputs.mem_fraction_static is not None and not inputs.mem_fraction_static < 1:
        raise PlanError(
            f"--mem-fraction-static {inputs.mem_fraction_static} must be between 0 and 1"
        )


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# -- launch flags ---------------------------------------------------------------------------------
def inputs_from_settings(launch: LaunchSettings) -> dict[str, Any]:
    """PlanInputs fields from a launch's typed flags (LaunchConfig.settings: the flag table's ``planner: reads``
    rows, and the fraction it owns when it is a number). Unset flags are left out."""
    values = launch.planner_inputs()
    out: dict[str, Any] = {
        key: values[key]
        for key in ("tp_size", "pp_size", "dp_size", "chunked_prefill_size", "cuda_graph_max_bs", "max_running_requests",
                    "max_total_tokens", "page_size", "cuda_graph_bs", "speculative_algorithm", "kv_cache_dtype")
        if key in values
    }  # fmt: skip
    if not launch.fraction_is_placeholder and launch.mem_fraction_static is not None:
        out["mem_fraction_static"] = float(launch.mem_fraction_static)
    out["disable_cuda_graph"] = launch.disable_cuda_graph
    out["enable_dp_attention"] = launch.enable_dp_attention
    if launch.disable_piecewise_cuda_graph:
        out["piecewise_cuda_graph"] = False
    return out


def gpu_facts_summary(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Planner inputs from gathered GPU facts (``gpufacts.GpuFacts.to_dict()``): the smallest
    ``memory_total_mib`` (sglang takes the minimum too), the largest ``memory_used_mib`` and the
    SM major of the first GPU."""
    gpus = [g for g in facts.get("gpus") or [] if isinstance(g, Mapping)]
    totals = [g["memory_total_mib"] for g in gpus if g.get("memory_total_mib")]
    if not totals:
        raise PlanError("the GPU facts list no GPU with memory_total_mib")
    used = [g.get("memory_used_mib") or 0 for g in gpus]
    caps = [str(g["compute_cap"]) for g in gpus if g.get("compute_cap")]
    summary: dict[str, Any] = {
        "gpu_memory_mib": float(min(totals)),
        "gpu_memory_used_mib": float(max(used)) if used else 0.0,
        "gpu_count": len(gpus),
    }
    if caps:
        summary["sm_major"] = int(caps[0].split(".")[0])
    return summary
