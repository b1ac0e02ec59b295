"""Model architectures the project knows by name: their published shapes, in config.json's words.

One place for GLM-5's numbers: the memory planner computes its KV cell from them
(``sglang_server_memory_plan.architecture: glm-5``), and ``scripts/device/make_glm5_arch.py`` builds
the dummy-weight checkpoint that served GLM-5's architecture on the device's H200 from them.

Source of :data:`GLM5` (checked 2026-12-01): the defaults of ``GlmMoeDsaConfig`` in transformers 5.12.1
(``transformers/models/glm_moe_dsa/configuration_glm_moe_dsa.py``, documented for the checkpoint
``zai-org/GLM-5``: hidden 6144, 78 layers of which the first 3 dense, 64 heads, MLA with q_lora_rank
2048 / kv_lora_rank 512 / qk_nope 192 / qk_rope 64 / v_head 256, 256 routed experts top-8 + 1 shared of
2048, vocab 154,880, the DSA indexer 32 heads x 128 with top-2048), the same numbers as the model card
(744 B parameters, 40 B active) and THUDM/slime's GLM-5 training script (``NHIDDEN=6144``,
``MOE_FFN_HIDDEN=2048``, 3 dense + 75 MoE layers, 256 experts top-8). GLM-5 has one MTP (nextn) layer
(``num_nextn_predict_layers: 1``). ``lukealonso/GLM-5-NVFP4`` quantizes the experts to NVFP4 and keeps
attention in BF16: the KV cell does not depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

GLM5_SOURCE = (
    "transformers 5.12.1 GlmMoeDsaConfig defaults (checkpoint zai-org/GLM-5), as the model card and "
    "THUDM/slime's GLM-5 script give them"
)

# config.json of GLM-5 (zai-org/GLM-5, the NVFP4 checkpoint shares it): the fields sglang and the
# planner read.
GLM5: Mapping[str, Any] = MappingProxyType(
    {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "vocab_size": 154_880,
        "hidden_size": 6144,
        "intermediate_size": 12_288,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 78,
        "first_k_dense_replace": 3,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "q_lora_rank": 2048,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "v_head_dim": 256,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.5,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "index_topk": 2048,
        "index_head_dim": 128,
        "index_n_heads": 32,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 202_752,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
)

# Architectures by the name an inventory uses (sglang_server_memory_plan.architecture).
KNOWN: Mapping[str, Mapping[str, Any]] = MappingProxyType({"glm-5": GLM5})


def config(name: str) -> dict[str, Any]:
    """A copy of the named architecture's config.json fields; KeyError names the known ones."""
    try:
        return dict(KNOWN[name])
    except KeyError:
        raise KeyError(f"unknown architecture {name!r}; known: {', '.join(sorted(KNOWN))}") from None


# -- the tensors of a layer ------------------------------------------------------------------------
# A tensor as a safetensors header describes it: dtype and shape.
TensorSpec = tuple[str, tuple[int, ...]]
# What ModelOpt's NVFP4 export writes for one quantized linear layer of shape [out, in]: the weight two
# 4-bit values to a byte, an FP8 scale per block of 16 inputs, a global FP32 scale and the input's scale.
NVFP4_BLOCK = 16


def _linear(name: str, out_features: int, in_features: int, dtype: str) -> dict[str, TensorSpec]:
    if dtype != "NVFP4":
        return {f"{name}.weight": (dtype, (out_features, in_features))}
    return {
        f"{name}.weight": ("U8", (out_features, in_features // 2)),
        f"{name}.weight_scale": ("F8_E4M3", (out_features, in_features // NVFP4_BLOCK)),
        f"{name}.weight_scale_2": ("F32", ()),
        f"{name}.input_scale": ("F32", ()),
    }


def decoder_layer_tensors(
    config: Mapping[str, Any], layer: int, *, experts: str = "BF16", shared_experts: str | None = None
) -> dict[str, TensorSpec]:
    """The tensors of decoder layer ``layer`` of a DeepSeek-V3-style model (MLA attention, the DSA indexer
    when the config has ``index_topk``, dense MLP for the first ``first_k_dense_replace`` layers, MoE after),
    named as GLM-5's and DeepSeek-V3's checkpoints name them. ``experts`` is the routed experts' format
    (``BF16`` or ``NVFP4``, as ModelOpt writes it); ``shared_experts`` the shared expert's (default: the
    routed experts'); everything else is BF16 but the router's score bias (F32), as in those checkpoints.
    791 tensors for GLM-5's MoE layer in BF16 with its four MTP tensors (:func:`draft_layer_tensors`)."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    q_rank, kv_rank = int(config["q_lora_rank"]), int(config["kv_lora_rank"])
    nope, rope, v_dim = int(config["qk_nope_head_dim"]), int(config["qk_rope_head_dim"]), int(config["v_head_dim"])
    p = f"model.layers.{layer}"
    t: dict[str, TensorSpec] = {
        f"{p}.input_layernorm.weight": ("BF16", (h,)),
        f"{p}.post_attention_layernorm.weight": ("BF16", (h,)),
        f"{p}.self_attn.q_a_layernorm.weight": ("BF16", (q_rank,)),
        f"{p}.self_attn.kv_a_layernorm.weight": ("BF16", (kv_rank,)),
    }
    t.update(_linear(f"{p}.self_attn.q_a_proj", q_rank, h, "BF16"))
    t.update(_linear(f"{p}.self_attn.q_b_proj", heads * (nope + rope), q_rank, "BF16"))
    t.update(_linear(f"{p}.self_attn.kv_a_proj_with_mqa", kv_rank + rope, h, "BF16"))
    t.update(_linear(f"{p}.self_attn.kv_b_proj", heads * (nope + v_dim), kv_rank, "BF16"))
    t.update(_linear(f"{p}.self_attn.o_proj", h, heads * v_dim, "BF16"))
    if config.get("index_topk") is not None:
        idx_heads, idx_dim = int(config["index_n_heads"]), int(config["index_head_dim"])
        t.update(_linear(f"{p}.self_attn.indexer.wq_b", idx_heads * idx_dim, q_rank, "BF16"))
        t.update(_linear(f"{p}.self_attn.indexer.wk", idx_dim, h, "BF16"))
        t.update(_linear(f"{p}.self_attn.indexer.weights_proj", idx_heads, h, "BF16"))
        t[f"{p}.self_attn.indexer.k_norm.weight"] = ("BF16", (idx_dim,))
        t[f"{p}.self_attn.indexer.k_norm.bias"] = ("BF16", (idx_dim,))
    if layer < int(config.get("first_k_dense_replace", 0)):
        inter = int(config["intermediate_size"])
        for name, out_f, in_f in (("gate_proj", inter, h), ("up_proj", inter, h), ("down_proj", h, inter)):
            t.update(_linear(f"{p}.mlp.{name}", out_f, in_f, "BF16"))
        return t
    inter, routed = int(config["moe_intermediate_size"]), int(config["n_routed_experts"])
    t[f"{p}.mlp.gate.weight"] = ("BF16", (routed, h))
    t[f"{p}.mlp.gate.e_score_correction_bias"] = ("F32", (routed,))
    shapes = (("gate_proj", inter, h), ("up_proj", inter, h), ("down_proj", h, inter))
    for expert in range(routed):
        for name, out_f, in_f in shapes:
            t.update(_linear(f"{p}.mlp.experts.{expert}.{name}", out_f, in_f, experts))
    shared = inter * int(config.get("n_shared_experts") or 0)  # the shared experts as one MLP
    for name, out_f, in_f in ((("gate_proj", shared, h), ("up_proj", shared, h), ("down_proj", h, shared)) if shared else ()):
        t.update(_linear(f"{p}.mlp.shared_experts.{name}", out_f, in_f, shared_experts or experts))
    return t


def draft_layer_tensors(
    config: Mapping[str, Any], *, experts: str = "BF16", embedding_and_head: bool = False
) -> dict[str, TensorSpec]:
    """The MTP (nextn) draft layer as a checkpoint holds it: decoder layer ``num_hidden_layers`` plus its
    ``eh_proj``, ``enorm``, ``hnorm`` and ``shared_head.norm`` (and, as DeepSeek-V3 ships them, its own
    ``embed_tokens`` and ``shared_head.head`` when ``embedding_and_head``; GLM-5's restored drafts lack them)."""
    n, h = int(config["num_hidden_layers"]), int(config["hidden_size"])
    p = f"model.layers.{n}"
    t = decoder_layer_tensors(config, n, experts=experts)
    t.update(_linear(f"{p}.eh_proj", h, 2 * h, "BF16"))
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        t[f"{p}.{norm}.weight"] = ("BF16", (h,))
    if embedding_and_head:
        vocab = int(config["vocab_size"])
        t[f"{p}.embed_tokens.weight"] = ("BF16", (vocab, h))
        t[f"{p}.shared_head.head.weight"] = ("BF16", (vocab, h))
    return t
