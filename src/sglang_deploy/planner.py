"""Memory planner for ``--mem-fraction-static``: will a fraction fit, and which one should we use?

How sglang 0.5.10.post1 spends a GPU (read in its source; paths below are under ``sglang/srt/``):

* ``model_executor/model_runner.py:999`` measures ``pre_model_load_memory``: the *free* memory after
  the CUDA context and NCCL are up (min over the TP ranks), i.e. ``F0 = total - runtime overhead``.
* ``model_executor/model_runner_kv_cache_mixin.py:167`` (``profile_max_num_token``) then sizes the KV
  pool as ``rest = post_load_free - F0 * (1 - f)`` = ``F0 * f - weights``, and
  ``kv_tokens = rest_bytes // cell_size`` (cell size per token: :func:`kv_cell`), aligned down to
  the page size (``_resolve_token_capacity``; 64 for DSA models on CUDA, ``server_args.py:1583``).
* So ``f`` is a fraction of ``F0``, not of the card. What is left, ``F0 * (1 - f)``, must hold what
  the planner calls the *outside* terms: CUDA-graph buffers (∝ the largest captured batch),
  activations of one prefill chunk (∝ ``--chunked-prefill-size``) and allocator slack
  (fragmentation: blocks PyTorch keeps reserved that a new allocation cannot use).

Calibration against the seed deployment (8x RTX PRO 6000, 97,887 MiB, TP8, GLM-5-NVFP4):

1. Runtime overhead. The 0.95 OOM said: torch 87.43 GiB allocated + 6.44 GiB reserved-unallocated,
   247 MiB free on a 95.593 GiB card, so 95.593 - 93.87 - 0.241 = 1.482 GiB (1,517 MiB) was held
   outside PyTorch (CUDA context, NCCL, cuBLAS): :data:`SEED_RUNTIME_OVERHEAD_MIB`.
   ``F0 = 97,887 - 1,517 = 96,370 MiB``.
2. Bytes per token. The KV pool held ~370K tokens at 0.85 and ~498K at 0.92. Subtracting the two
   ``F0*f - W = tokens * c`` equations: ``0.07 * F0 = 128K * c`` so ``c = 55,262 B/token``. The
   formula for GLM-5 (78 layers, kv_lora_rank 512, qk_rope_head_dim 64, DSA index_head_dim 128)
   with an fp8 cache gives ``(512+64)*78*1 + (128 + 128//128*4)*78*1 = 55,224 B`` - within 0.07 %
   of the seeds (bf16 would be 100,152 B and cannot fit the seed numbers). That is what the pinned
   sglang does for ``--kv-cache-dtype auto`` on a DSA model on SM >= 10 (``server_args.py:1430``).
3. Weights (the load's footprint per GPU). ``W = 0.85 * F0 - 370K * c`` = 60.95 GiB
   (:data:`SEED_WEIGHTS_GIB_PER_GPU`). The checkpoint's share (≈400 GB / 8 = 46.6 GiB) is smaller:
   replicated layers and load-time buffers count too, so a safetensors index gives a lower bound.
   Weights only move ``kv_tokens``; whether a fraction is *safe* does not depend on them.
4. CUDA graphs. At 0.92 the pool left ``0.08 * F0 = 7,710 MiB``; after capturing bs 1..64 about
   5.2 GiB stayed free, so capture took ≈ 2,385 MiB ≈ 37.3 MiB per unit of the largest batch:
   :data:`GRAPH_MIB_PER_BS` = 38.
5. Activations: not isolated by the seeds; :data:`ACTIVATION_MIB_PER_TOKEN` = 0.25 MiB per prefill
   token (2 GiB for the default 8192-token chunk) is an estimate, overridable.
6. Slack is the one free term, pinned between two observations: 0.92 with graphs up to bs 64 ran,
   so ``38*64 + 2048 + slack <= 7,710``; 0.95 with graphs up to bs 8 (``--max-running-requests 8``)
   died in capture, so ``38*8 + 2048 + slack > 0.05 * F0 = 4,818``. Hence
   ``2,466 < slack <= 3,230``: :data:`ALLOCATOR_SLACK_MIB` = 3,072.

7. Per-token buffers outside the pool (measured on a real sglang, tests/fixtures/real-sglang/): the
   token allocator's int64 free list (``mem_cache/allocator.py``, one entry per page) and, from sglang
   0.5.17 on (0.5.23, the cu130 lane, too: ``model_executor/runner/eager_runner.py:122``), the eager
   runner's input buffers sized to ``max(max_total_num_tokens, prefill buffer)`` tokens. Both are
   allocated after the pool is sized, outside the fraction: 58 B per KV token on an H200 (0.5.17, a
   2,048-context Llama, page size 1, 102-134 M tokens, three fractions: 8 B + 49.9-50.5 B), so
   :data:`FREE_LIST_BYTES_PER_PAGE` = 8 and :data:`EAGER_BUFFER_BYTES_PER_TOKEN` = 50 (0.5.10.post1
   has no eager runner: an over-estimate there). They come off :attr:`Plan.free_after_start_mib`;
   for the seed model (~0.5 M tokens, pages of 64) they are ~24 MiB, inside the allocator slack, so
   the safety terms stay as calibrated.

The recommendation keeps :data:`RECOMMENDATION_MARGIN_MIB` (694 MiB, the allocation that failed in
the seeds' OOM) on top of the outside terms and rounds down to a step of 0.01.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MIB = 1 << 20
GIB = 1 << 30

# -- calibration constants (derivation in the module docstring) ---------------------------------
SEED_GPU_MEMORY_MIB = 97_887
SEED_TP_SIZE = 8
SEED_RUNTIME_OVERHEAD_MIB = 1_517
SEED_KV_BYTES_PER_TOKEN = 55_262  # derived from the two seed points (formula: 55,224)
SEED_WEIGHTS_GIB_PER_GPU = 60.95
GRAPH_MIB_PER_BS = 38.0
ACTIVATION_MIB_PER_TOKEN = 0.25
ALLOCATOR_SLACK_MIB = 3_072
RECOMMENDATION_MARGIN_MIB = 694
FRACTION_STEP = 0.01
# Outside the pool, per KV-pool page and token (docstring, 7.).
FREE_LIST_BYTES_PER_PAGE = 8
EAGER_BUFFER_BYTES_PER_TOKEN = 50

# sglang 0.5.10.post1 constants (server_args.py dataclass defaults and memory_pool.py:1805-1806).
SGLANG_MAX_PREFILL_TOKENS_DEFAULT = 16_384
NSA_QUANT_BLOCK_SIZE = 128
NSA_INDEX_ELEMENT_SIZE = 1  # index_k_with_scale_buffer_dtype = torch.uint8
DSA_PAGE_SIZE = 64

# Architectures model_config.py:437-453 treats as MLA; the NSA/DSA list is model_config.py:55-79.
MLA_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN", "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM",
        "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "DotsVLMForCausalLM",
        "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
        "MistralLarge3ForCausalLMEagle", "KimiK25ForConditionalGeneration",
        "MiniCPM3ForCausalLM", "DeepseekVL2ForCausalLM", "KimiVLForConditionalGeneration",
        "KimiLinearForCausalLM", "BailingMoeV2_5ForCausalLM", "BailingMoeForCausalLMNextN",
        "SarvamMLAForCausalLM",
    }
)
NSA_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
    }
)
# model_config.py:1352 piecewise_cuda_graph_disabled_model_archs
PIECEWISE_DISABLED_ARCHITECTURES = frozenset(
    {"DeepseekV32ForCausalLM", "Qwen3NextForCausalLM", "GlmMoeDsaForCausalLM",
     "BailingMoeV2_5ForCausalLM", "LLaDAModelLM"}
)

# Bytes per element of each --kv-cache-dtype (model_runner.py:1902 configure_kv_cache_dtype).
_DTYPE_BYTES = {
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2, "float32": 4, "float": 4,
    "fp8_e4m3": 1, "fp8_e5m2": 1, "fp4_e2m1": 1,
}


class PlanError(ValueError):
    """Inputs the planner cannot work with; the message says which and how to fix it."""


# -- KV cell size ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class KvCell:
    """Bytes one token takes in the KV pool of one GPU, and how they were computed."""

    bytes_per_token: int
    attention: str  # "MHA", "MLA" or "MLA+DSA"
    kv_cache_dtype: str  # the dtype sglang resolves "auto" to
    formula: str
    page_size: int = 1


def resolve_kv_cache_dtype(
    kv_cache_dtype: str,
    config: Mapping[str, Any],
    *,
    sm_major: int | None = None,
    hf_quant_config: Mapping[str, Any] | None = None,
) -> str:
    """What sglang 0.5.10.post1 turns ``--kv-cache-dtype`` into for this model and GPU.

    DSA models on CUDA: ``auto`` -> ``fp8_e4m3`` on SM >= 10 else ``bfloat16``
    (``server_args.py:1430-1437``). Otherwise ``auto`` -> fp8 when the checkpoint's quantization
    says ``kv_cache_quant_algo: FP8`` (``model_runner.py:1903-1919``), else the model dtype.
    """
    dtype = kv_cache_dtype.lower()
    if dtype != "auto":
        if dtype not in _DTYPE_BYTES:
            raise PlanError(
                f"--kv-cache-dtype {kv_cache_dtype!r} is not one sglang 0.5.10.post1 knows "
                f"(auto, {', '.join(sorted(_DTYPE_BYTES))})"
            )
        return "bfloat16" if dtype == "bf16" else dtype
    if _is_nsa(config):
        if sm_major is None:
            raise PlanError(
                "--kv-cache-dtype auto on a DSA model depends on the GPU (fp8_e4m3 on SM >= 10, "
                "bfloat16 below). Fix: pass --sm-major (12 for RTX PRO 6000 Blackwell) or "
                "--gpu-facts, or set --kv-cache-dtype explicitly."
            )
        return "fp8_e4m3" if sm_major >= 10 else "bfloat16"
    if _kv_cache_quant_algo(config, hf_quant_config) == "FP8":
        return "fp8_e4m3"
    torch_dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return {"float16": "float16", "float32": "float32"}.get(torch_dtype, "bfloat16")


def kv_cell(
    config: Mapping[str, Any],
    kv_cache_dtype: str = "auto",
    *,
    tp_size: int = 1,
    sm_major: int | None = None,
    hf_quant_config: Mapping[str, Any] | None = None,
) -> KvCell:
    """Per-token KV cell size as ``ModelRunnerKVCacheMixin.get_cell_size_per_token`` computes it
    (``model_runner_kv_cache_mixin.py:74-140``) for the target model (not a draft worker, no
    hybrid SWA/mamba layers, attention TP = ``tp_size``)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    assert isinstance(text, Mapping)
    dtype = resolve_kv_cache_dtype(
        kv_cache_dtype, config, sm_major=sm_major, hf_quant_config=hf_quant_config
    )
    elem = _DTYPE_BYTES[dtype]
    fp4 = dtype == "fp4_e2m1"
    layers = _int(text, "num_hidden_layers")
    if _is_mla(config):
        rank, rope = _int(text, "kv_lora_rank"), _int(text, "qk_rope_head_dim")
        cell = (rank + rope) * layers * elem
        formula = f"({rank}+{rope})*{layers}*{elem}"
        if fp4:  # kv_scale_buffer: fp4 packs two values per byte plus one scale per 16
            cell = cell // 2 + ((rank + rope) // 16) * layers * elem
            formula = f"({formula})//2 + (({rank}+{rope})//16)*{layers}*{elem}"
        attention, page = "MLA", 1
        if _is_nsa(config):
            index_dim = _int(text, "index_head_dim")
            per_token = index_dim + index_dim // NSA_QUANT_BLOCK_SIZE * 4
            cell += per_token * layers * NSA_INDEX_ELEMENT_SIZE
            formula += (
                f" + ({index_dim}+{index_dim}//{NSA_QUANT_BLOCK_SIZE}*4)*{layers}"
                f"*{NSA_INDEX_ELEMENT_SIZE}"
            )
            attention, page = "MLA+DSA", DSA_PAGE_SIZE
        return KvCell(cell, attention, dtype, formula, page)
    heads = _int(text, "num_attention_heads")
    head_dim = int(text.get("head_dim") or _int(text, "hidden_size") // heads)
    v_head_dim = int(text.get("v_head_dim") or head_dim)
    kv_heads = max(1, int(text.get("num_key_value_heads") or heads) // tp_size)
    cell = kv_heads * (head_dim + v_head_dim) * layers * elem
    formula = f"{kv_heads}*({head_dim}+{v_head_dim})*{layers}*{elem}"
    if fp4:
        cell = cell // 2 + (kv_heads * head_dim * layers * 2 * elem) // 16
        formula = f"({formula})//2 + ({kv_heads}*{head_dim}*{layers}*2*{elem})//16"
    return KvCell(cell, "MHA", dtype, formula, 1)


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
) -> SglangDefaults:
    """Reproduces sglang 0.5.10.post1 ``server_args.py:1141-1327`` for a CUDA device.

    ``gpu_memory_mib`` is ``nvidia-smi --query-gpu=memory.total`` (the minimum over GPUs,
    ``utils/common.py:1514-1544``). Not reproduced: the VLM adjustment (``:1332``, multimodal
    models only), the aiter scaling (``:2417``, AMD only) and the llama-2 piecewise cap (``:1271``).
    """
    gpu_mem = gpu_memory_mib
    # server_args.py:1165-1228: chunked_prefill_size and cuda_graph_max_bs by GPU memory.
    if gpu_mem is None:
        tiers = (4096, 160)
    elif gpu_mem < 20 * 1024:
        tiers = (2048, 8)
    elif gpu_mem < 35 * 1024:
        tiers = (2048, 24 if tp_size < 4 else 80)
    elif gpu_mem < 60 * 1024:
        tiers = (4096, 32 if tp_size < 4 else 160)
    elif gpu_mem < 160 * 1024:  # the 90-160 GiB tier repeats the 60-90 one
        tiers = (8192, 256 if tp_size < 4 else 512)
    else:
        tiers = (16384, 512)
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
    gpu_memory_used_mib: float = 0.0  # by other processes before the start (gpu facts)
    runtime_overhead_mib: float = SEED_RUNTIME_OVERHEAD_MIB
    graph_mib_per_bs: float = GRAPH_MIB_PER_BS
    activation_mib_per_token: float = ACTIVATION_MIB_PER_TOKEN
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
    )
    graph_bs = _captured_max_bs(inputs, defaults.cuda_graph_max_bs)
    chunk = defaults.chunked_prefill_size if defaults.chunked_prefill_size > 0 else (
        SGLANG_MAX_PREFILL_TOKENS_DEFAULT
    )
    breakdown = {
        "cuda_graphs": inputs.graph_mib_per_bs * graph_bs,
        "activations": inputs.activation_mib_per_token * chunk,
        "allocator_slack": float(inputs.allocator_slack_mib),
    }
    required = sum(breakdown.values())
    free0 = inputs.gpu_memory_mib - inputs.runtime_overhead_mib - inputs.gpu_memory_used_mib

    recommended = _recommend(inputs, free0, required)
    fraction = inputs.mem_fraction_static
    reasons: list[str] = []
    safe: bool | None = None
    available = headroom = free_after = None
    if fraction is not None:
        available = round(free0 * (1 - fraction), 1)
        headroom = round(available - required, 1)
        free_after = available - breakdown["cuda_graphs"]
        safe = headroom >= 0
        if not safe:
            reasons.append(
                f"UNSAFE: {fraction} leaves {-headroom:,.0f} MiB too little outside the pool: "
                "expect torch.OutOfMemoryError in CUDA-graph capture or the first large prefill"
            )
    at = fraction if fraction is not None else recommended
    kv_tokens = _kv_tokens(inputs, free0, at) if at is not None else None
    pool = max(kv_tokens or 0, 0)
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
            **asdict(inputs),
            "free_at_start_mib": round(free0, 1),
            "effective_chunked_prefill_size": chunk,
            "effective_cuda_graph_max_bs": graph_bs,
            "sglang_default_reserved_mib": defaults.reserved_mib,
            "kv_token_buffers_mib": round(token_buffers, 1),
        },
        reasons=reasons,
    )


def _captured_max_bs(inputs: PlanInputs, server_max_bs: int) -> int:
    """Largest batch CUDA graphs are captured for: capped by the request pool
    (``cuda_graph_runner.py:454-480``), 0 with ``--disable-cuda-graph``."""
    if inputs.disable_cuda_graph:
        return 0
    if inputs.max_running_requests is not None:
        return min(server_max_bs, inputs.max_running_requests)
    return server_max_bs


def _recommend(inputs: PlanInputs, free0: float, required: float) -> float | None:
    """Largest fraction on the step grid leaving ``required + margin`` (and a KV pool)."""
    limit = 1 - (required + inputs.margin_mib) / free0
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
    rest_bytes = (free0 * fraction * MIB) - inputs.weights_gib_per_gpu * GIB
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
    "kv_bytes_per_token": (True, 1, False),
    "page_size": (True, 1, False),
    "mem_fraction_static": (False, 0, True),
    "cuda_graph_max_bs": (True, 1, False),
    "max_running_requests": (True, 1, False),
    "max_total_tokens": (True, 1, False),
    "gpu_memory_used_mib": (False, 0, False),
    "runtime_overhead_mib": (False, 0, False),
    "graph_mib_per_bs": (False, 0, False),
    "activation_mib_per_token": (False, 0, False),
    "allocator_slack_mib": (False, 0, False),
    "margin_mib": (False, 0, False),
}


def _check_number(name: str, value: Any, integer: bool, low: float, exclusive: bool) -> None:
    kind = "an integer" if integer else "a number"
    bound = f"> {low:g}" if exclusive else f">= {low:g}"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value):
        raise PlanError(f"{name} = {value!r} must be {kind} {bound}")
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


# -- model files ----------------------------------------------------------------------------------
def _architectures(config: Mapping[str, Any]) -> list[str]:
    return list(config.get("architectures") or [])


def _is_mla(config: Mapping[str, Any]) -> bool:
    return any(a in MLA_ARCHITECTURES for a in _architectures(config))


def _is_nsa(config: Mapping[str, Any]) -> bool:
    """``is_deepseek_nsa``: the first architecture is a DSA one and ``index_topk`` is set."""
    archs = _architectures(config)
    return bool(archs) and archs[0] in NSA_ARCHITECTURES and config.get("index_topk") is not None


def piecewise_cuda_graph_enabled(config: Mapping[str, Any]) -> bool:
    """``_handle_piecewise_cuda_graph`` item 1 (model arch); other items depend on flags."""
    archs = _architectures(config)
    return not (any(a in PIECEWISE_DISABLED_ARCHITECTURES for a in archs) or _is_nsa(config))


def _kv_cache_quant_algo(
    config: Mapping[str, Any], hf_quant_config: Mapping[str, Any] | None
) -> str | None:
    for source in (hf_quant_config, config.get("quantization_config")):
        if not isinstance(source, Mapping):
            continue
        nested = source.get("quantization")
        for part in (source, nested if isinstance(nested, Mapping) else {}):
            algo = part.get("kv_cache_quant_algo")
            if isinstance(algo, str):
                return algo.upper()
    return None


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if value is None:
        raise PlanError(f"config.json has no {key!r}: the planner needs it for the KV cell size")
    return int(value)


# -- launch flags ---------------------------------------------------------------------------------
def inputs_from_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """PlanInputs fields from a launch's flags (``LaunchConfig.to_dict()['flags']``: names without
    dashes, values as strings / True / lists). Unknown or absent flags are left out."""

    def get(*names: str) -> Any:
        for name in names:
            if name in flags and flags[name] is not None and flags[name] is not False:
                return flags[name]
        return None

    def number(value: Any, kind: type, name: str) -> Any:
        if value is None:
            return None
        text = str(value)
        if "{{" in text or "{%" in text:
            raise PlanError(
                f"flag --{name} is a Jinja template ({text!r}) the planner cannot evaluate. "
                f"Fix: pass --{name} on the command line"
            )
        try:
            return kind(text)
        except ValueError:
            raise PlanError(f"flag --{name}={text!r} is not a {kind.__name__}") from None

    out: dict[str, Any] = {}
    pairs: list[tuple[str, tuple[str, ...], type]] = [
        ("tp_size", ("tp-size", "tensor-parallel-size", "tp"), int),
        ("pp_size", ("pp-size", "pipeline-parallel-size"), int),
        ("dp_size", ("dp-size", "data-parallel-size"), int),
        ("chunked_prefill_size", ("chunked-prefill-size",), int),
        ("cuda_graph_max_bs", ("cuda-graph-max-bs",), int),
        ("max_running_requests", ("max-running-requests",), int),
        ("max_total_tokens", ("max-total-tokens",), int),
        ("page_size", ("page-size",), int),
    ]
    for key, names, kind in pairs:
        value = number(get(*names), kind, names[0])
        if value is not None:
            out[key] = value
    fraction = get("mem-fraction-static")
    if fraction is not None and str(fraction) != "auto":
        out["mem_fraction_static"] = number(fraction, float, "mem-fraction-static")
    bs = get("cuda-graph-bs")
    if bs is not None:
        values = bs if isinstance(bs, (list, tuple)) else str(bs).split()
        out["cuda_graph_bs"] = tuple(number(v, int, "cuda-graph-bs") for v in values)
    out["disable_cuda_graph"] = get("disable-cuda-graph") is True
    out["enable_dp_attention"] = get("enable-dp-attention") is True
    if get("disable-piecewise-cuda-graph") is True:
        out["piecewise_cuda_graph"] = False
    spec = get("speculative-algorithm")
    if spec is not None:
        out["speculative_algorithm"] = str(spec)
    kv_dtype = get("kv-cache-dtype")
    if kv_dtype is not None:
        out["kv_cache_dtype"] = str(kv_dtype)
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
