"""The KV pool's cell: how many bytes one token takes in sglang's KV pool on one GPU, for a model's
config.json and the launch's KV dtype and DSA backends, as the pinned sglang computes it.

What the model files say about attention (MLA, DSA/NSA, piecewise graphs) is read here too: the
planner (:mod:`sglang_deploy.memory.planner`) builds its plan on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
DTYPE_BYTES = {
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2, "float32": 4, "float": 4,
    "fp8_e4m3": 1, "fp8_e5m2": 1, "fp4_e2m1": 1,
}


# flashinfer MLA under an fp8 pool (calibration 8, docs/performance.md): one layer's whole KV buffer
# converted to the query's bf16 on every attention call, held while the call runs (captured into the
# decode graphs' memory).
KV_CONVERSION_ELEMENT_BYTES = 2


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
        if dtype not in DTYPE_BYTES:
            raise PlanError(
                f"--kv-cache-dtype {kv_cache_dtype!r} is not one sglang 0.5.10.post1 knows "
                f"(auto, {', '.join(sorted(DTYPE_BYTES))})"
            )
        return "bfloat16" if dtype == "bf16" else dtype
    if is_nsa(config):
        if sm_major is None:
            raise PlanError(
                "--kv-cache-dtype auto on a DSA model depends on the GPU (fp8_e4m3 on SM >= 10, "
                "bfloat16 below). Fix: pass --sm-major (12 for RTX PRO 6000 Blackwell) or "
                "--gpu-facts, or set --kv-cache-dtype explicitly."
            )
        return "fp8_e4m3" if sm_major >= 10 else "bfloat16"
    if kv_cache_quant_algo(config, hf_quant_config) == "FP8":
        return "fp8_e4m3"
    torch_dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return {"float16": "float16", "float32": "float32"}.get(torch_dtype, "bfloat16")


# -- DSA backends and the KV layout they imply ------------------------------------------------------
# The pool layout of a DSA model follows the DSA backends, not only the dtype
# (``calculate_mla_kv_cache_dim``: 0.5.10.post1 ``model_runner_kv_cache_mixin.py:240-285``, 0.5.17
# ``mem_cache/kv_cache_configurator.py:1985-2036``): with ``trtllm`` for either phase the cell is the
# plain 576 elements; otherwise an fp8 pool is FlashMLA's packed layout, 512 fp8 + 4 B of scale per 128
# + the 64 rope values kept in bf16 = 656 B per layer. bf16 is always plain.
DSA_PACKED_ROPE_BYTES = 2  # DSATokenToKVPool.rope_storage_dtype = torch.bfloat16
# sglang versions whose DSA defaults differ: 0.5.10.post1 (the cu128 lane) forces trtllm for an fp8
# pool on SM >= 10 whatever the flags say (server_args.py:1464-1467); from 0.5.17 on the flags are kept
# and only unset backends are chosen (arg_groups/overrides.py _dsa_split_backend_resolution).
_DSA_FLAGS_KEPT_FROM = (0, 5, 17)


@dataclass(frozen=True)
class DsaBackends:
    """The DSA prefill/decode backends sglang runs with, and why (for the plan's notes)."""

    prefill: str
    decode: str
    why: str

    @property
    def plain_layout(self) -> bool:
        return "trtllm" in (self.prefill, self.decode)


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def resolve_dsa_backends(
    kv_cache_dtype: str,
    prefill: str | None,
    decode: str | None,
    *,
    sm_major: int,
    sglang_version: str,
    architecture: str = "",
) -> DsaBackends:
    """The backends sglang ``sglang_version`` picks for a DSA model with this resolved KV dtype
    (``fp8_e4m3`` or ``bfloat16``) and these ``--nsa-/--dsa-*-backend`` flags (None = unset)."""
    fp8 = kv_cache_dtype.startswith("fp8")
    if version_tuple(sglang_version) < _DSA_FLAGS_KEPT_FROM:
        if fp8 and sm_major >= 10:
            return DsaBackends("trtllm", "trtllm", f"sglang {sglang_version} forces trtllm for an fp8 pool on SM >= 10")
        default = ("flashmla_sparse", "trtllm" if sm_major >= 10 else "fa3") if not fp8 else ("flashmla_kv", "flashmla_kv")
    elif fp8:
        if sm_major >= 12 and architecture == "GlmMoeDsaForCausalLM":
            default = ("flashinfer_sparse_mla", "flashinfer_sparse_mla")
        else:
            default = ("trtllm", "trtllm") if sm_major >= 10 else ("flashmla_kv", "flashmla_kv")
    else:
        default = ("flashmla_sparse", "trtllm" if sm_major >= 10 else "fa3")
    chosen = (prefill or default[0], decode or default[1])
    why = "the flags" if prefill and decode else f"sglang {sglang_version}'s default for the unset ones"
    return DsaBackends(chosen[0], chosen[1], why)


def kv_cell(
    config: Mapping[str, Any],
    kv_cache_dtype: str = "auto",
    *,
    tp_size: int = 1,
    sm_major: int | None = None,
    hf_quant_config: Mapping[str, Any] | None = None,
    dsa_backends: DsaBackends | None = None,
    draft_layers: int = 0,
) -> KvCell:
    """Per-token KV cell size as sglang computes it (0.5.10.post1 ``get_cell_size_per_token``,
    0.5.17 ``PoolConfigurator._compute_cell_size``) for the target model (no hybrid SWA/mamba
    layers, attention TP = ``tp_size``). ``dsa_backends``: what :func:`resolve_dsa_backends` found
    (None: plain layout, as with trtllm). ``draft_layers``: an EAGLE/MTP draft's layers, whose pool
    has the same tokens (the cell grows by ``draft_layers / layers``)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    assert isinstance(text, Mapping)
    dtype = resolve_kv_cache_dtype(
        kv_cache_dtype, config, sm_major=sm_major, hf_quant_config=hf_quant_config
    )
    elem = DTYPE_BYTES[dtype]
    fp4 = dtype == "fp4_e2m1"
    layers = config_int(text, "num_hidden_layers")
    if is_mla(config):
        rank, rope = config_int(text, "kv_lora_rank"), config_int(text, "qk_rope_head_dim")
        packed = (
            is_nsa(config) and dtype.startswith("fp8") and dsa_backends is not None
            and not dsa_backends.plain_layout
        )  # fmt: skip
        if packed:
            per_layer = rank + rank // NSA_QUANT_BLOCK_SIZE * 4 + rope * DSA_PACKED_ROPE_BYTES
            cell = per_layer * layers
            formula = f"({rank}+{rank}//{NSA_QUANT_BLOCK_SIZE}*4+{rope}*{DSA_PACKED_ROPE_BYTES})*{layers}"
        else:
            cell = (rank + rope) * layers * elem
            formula = f"({rank}+{rope})*{layers}*{elem}"
        if fp4:  # kv_scale_buffer: fp4 packs two values per byte plus one scale per 16
            cell = cell // 2 + ((rank + rope) // 16) * layers * elem
            formula = f"({formula})//2 + (({rank}+{rope})//16)*{layers}*{elem}"
        attention, page = "MLA", 1
        if is_nsa(config):
            index_dim = config_int(text, "index_head_dim")
            per_token = index_dim + index_dim // NSA_QUANT_BLOCK_SIZE * 4
            cell += per_token * layers * NSA_INDEX_ELEMENT_SIZE
            formula += (
                f" + ({index_dim}+{index_dim}//{NSA_QUANT_BLOCK_SIZE}*4)*{layers}"
                f"*{NSA_INDEX_ELEMENT_SIZE}"
            )
            attention, page = "MLA+DSA", DSA_PAGE_SIZE
            if dsa_backends is not None:
                attention += f" ({'packed' if packed else 'plain'} layout: {dsa_backends.prefill}/{dsa_backends.decode})"
    else:
        heads = config_int(text, "num_attention_heads")
        head_dim = int(text.get("head_dim") or config_int(text, "hidden_size") // heads)
        v_head_dim = int(text.get("v_head_dim") or head_dim)
        kv_heads = max(1, int(text.get("num_key_value_heads") or heads) // tp_size)
        cell = kv_heads * (head_dim + v_head_dim) * layers * elem
        formula = f"{kv_heads}*({head_dim}+{v_head_dim})*{layers}*{elem}"
        if fp4:
            cell = cell // 2 + (kv_heads * head_dim * layers * 2 * elem) // 16
            formula = f"({formula})//2 + ({kv_heads}*{head_dim}*{layers}*2*{elem})//16"
        attention, page = "MHA", 1
    if draft_layers:
        cell = int(cell * (1 + draft_layers / layers))
        formula = f"({formula}) * (1 + {draft_layers}/{layers})"
    return KvCell(cell, attention, dtype, formula, page)


def kv_conversion_bytes_per_token(
    config: Mapping[str, Any], kv_cache_dtype: str, attention_backend: str | None
) -> int:
    """Bytes per pool token that flashinfer MLA holds outside the pool under an fp8 pool (calibration 8
    in docs/performance.md): ``get_key_buffer(layer).to(q.dtype)`` in ``flashinfer_mla_backend.py``
    (0.5.10.post1 :639, 0.5.17 :660, 0.5.23 :822) copies the layer's whole buffer, ``kv_lora_rank + qk_rope_head_dim``
    bf16 values per token. 0 for any other backend, a bf16 pool or a model without MLA."""
    if attention_backend != "flashinfer" or not kv_cache_dtype.startswith("fp8") or not is_mla(config):
        return 0
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    assert isinstance(text, Mapping)
    return (config_int(text, "kv_lora_rank") + config_int(text, "qk_rope_head_dim")) * KV_CONVERSION_ELEMENT_BYTES


# -- model files ----------------------------------------------------------------------------------
def architectures_of(config: Mapping[str, Any]) -> list[str]:
    return list(config.get("architectures") or [])


def is_mla(config: Mapping[str, Any]) -> bool:
    return any(a in MLA_ARCHITECTURES for a in architectures_of(config))


def is_nsa(config: Mapping[str, Any]) -> bool:
    """``is_deepseek_nsa``: the first architecture is a DSA one and ``index_topk`` is set."""
    archs = architectures_of(config)
    return bool(archs) and archs[0] in NSA_ARCHITECTURES and config.get("index_topk") is not None


def piecewise_cuda_graph_enabled(config: Mapping[str, Any]) -> bool:
    """``_handle_piecewise_cuda_graph`` item 1 (model arch); other items depend on flags."""
    archs = architectures_of(config)
    return not (any(a in PIECEWISE_DISABLED_ARCHITECTURES for a in archs) or is_nsa(config))


def kv_cache_quant_algo(
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


def config_int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if value is None:
        raise PlanError(f"config.json has no {key!r}: the planner needs it for the KV cell size")
    return int(value)
