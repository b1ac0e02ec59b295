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
