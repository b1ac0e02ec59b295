#!/usr/bin/env python3
"""A checkpoint directory with GLM-5's architecture and no weights, for ``--load-format dummy``.

    make_glm5_arch.py OUT --variant dsa [--experts 8]    GlmMoeDsaForCausalLM: GLM-5 itself (MLA + DSA indexer)
    make_glm5_arch.py OUT --variant mla [--experts 8]    DeepseekV3ForCausalLM with GLM-5's MLA and MoE shapes
                                                         and no indexer: the attention path of flashinfer MLA

The shapes are GLM-5's published ones (src/sglang_deploy/memory/architectures.py says where they come from),
all 78 layers. One thing is shrunk so that the model fits one H200 in BF16: the routed experts, 256 -> 8
(``--experts``), which keeps every per-token shape (top-8 of 8: each token still runs 8 experts of 2,048,
plus the shared one); only the expert weights that are never read in a step go. sglang fills the weights
with random values (``--load-format dummy``); the tokenizer is a word-level one with GLM-5's vocabulary
size (154,880 entries, ``tokN``), so that bench_serving's random token ids and the model's outputs decode.
Also written: ``arch.json`` (the shapes, the parameter count by part and the BF16 bytes, for the planner).
Needs transformers (sglang's pin: the bundle's 5.12.1) and tokenizers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
from sglang_deploy.memory import architectures  # noqa: E402  (the repo's src, without installing it)

# What sglang's DeepseekV2 model code reads and GLM-5's config.json has under other names or not at all
# (without them the first try on the H200 failed to build the model): MoE on every layer
# after the dense ones, DeepSeek-V3's sigmoid router with its bias ("noaux_tc"), no q/k norm, plain RoPE.
SGLANG_DEEPSEEK_ATTRIBUTES: dict[str, Any] = {
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "rope_theta": 1_000_000.0,
    "rope_scaling": None,
    "use_qk_norm": False,
}


def shapes(experts: int) -> dict[str, Any]:
    config = architectures.config("glm-5")
    if not 1 <= config["num_experts_per_tok"] <= experts <= config["n_routed_experts"]:
        raise SystemExit(f"--experts {experts}: between top-k {config['num_experts_per_tok']} and {config['n_routed_experts']}")
    config["n_routed_experts"] = experts
    return config


def parameter_count(c: dict[str, Any], *, indexer: bool) -> dict[str, int]:
    """Parameters by part, as sglang's DeepseekV2 model holds them (norms included, biases none)."""
    h, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    attention = (
        h * c["q_lora_rank"] + c["q_lora_rank"]  # q_a_proj + q_a_layernorm
        + c["q_lora_rank"] * heads * qk  # q_b_proj
        + h * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + c["kv_lora_rank"]  # kv_a_proj_with_mqa + norm
        + c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"])  # kv_b_proj
        + heads * c["v_head_dim"] * h  # o_proj
        + 2 * h  # input and post-attention RMSNorm
    )
    if indexer:  # DSA: wq_b, wk (+ its norm), weights_proj
        attention += (
            c["q_lora_rank"] * c["index_n_heads"] * c["index_head_dim"] + h * c["index_head_dim"]
            + 2 * c["index_head_dim"] + h * c["index_n_heads"]
        )  # fmt: skip
    dense = 3 * h * c["intermediate_size"]
    expert = 3 * h * c["moe_intermediate_size"]
    moe = c["n_routed_experts"] * expert + c["n_shared_experts"] * expert + h * c["n_routed_experts"] + c["n_routed_experts"]
    dense_layers = c["first_k_dense_replace"]
    return {
        "embedding": c["vocab_size"] * h,
        "lm_head": c["vocab_size"] * h,
        "attention": attention * layers,
        "dense_mlp": dense * dense_layers,
        "moe": moe * (layers - dense_layers),
        "final_norm": h,
    }


def write_config(out: Path, c: dict[str, Any], variant: str) -> None:
    kwargs = {k: v for k, v in c.items() if k not in ("architectures", "model_type", "torch_dtype")}
    kwargs.update(SGLANG_DEEPSEEK_ATTRIBUTES, bos_token_id=0, eos_token_id=1)
    if variant == "dsa":
        from transformers import GlmMoeDsaConfig

        config = GlmMoeDsaConfig(**kwargs, num_experts=c["n_routed_experts"], architectures=["GlmMoeDsaForCausalLM"])
    else:
        from transformers import DeepseekV3Config

        for key in ("index_topk", "index_head_dim", "index_n_heads"):
            kwargs.pop(key)
        config = DeepseekV3Config(**kwargs, architectures=["DeepseekV3ForCausalLM"])
    config.torch_dtype = "bfloat16"
    config.save_pretrained(out)
    # Checked, not assumed: what was written carries the shapes asked for.
    written = json.loads((out / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "vocab_size", "n_routed_experts"):
        if written.get(key) != c[key]:
            raise SystemExit(f"config.json has {key}={written.get(key)!r}, wanted {c[key]!r}")
    if variant == "dsa" and written.get("index_topk") != c["index_topk"]:
        raise SystemExit("config.json lost index_topk: sglang would not see a DSA model")


def write_tokenizer(out: Path, vocab_size: int) -> None:
    """Word-level, one entry per id: decode(ids) -> "tokA tokB ...", which encodes back to the same ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|unk|>"]
    vocab = {token: i for i, token in enumerate(specials)}
    vocab.update({f"tok{i}": i for i in range(len(specials), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=specials[0], eos_token=specials[1], unk_token=specials[2],
        model_max_length=architectures.GLM5["max_position_embeddings"],
    )  # fmt: skip
    fast.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2))
    if fast.vocab_size != vocab_size:
        raise SystemExit(f"tokenizer has {fast.vocab_size} entries, wanted {vocab_size}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--variant", choices=("dsa", "mla"), required=True)
    parser.add_argument("--experts", type=int, default=8, help="routed experts kept (GLM-5: 256; top-k 8)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    c = shapes(args.experts)
    write_config(args.out, c, args.variant)
    write_tokenizer(args.out, c["vocab_size"])
    params = parameter_count(c, indexer=args.variant == "dsa")
    summary = {
        "variant": args.variant,
        "architecture": "GlmMoeDsaForCausalLM" if args.variant == "dsa" else "DeepseekV3ForCausalLM",
        "shapes_source": architectures.GLM5_SOURCE,
        "changed_from_glm5": {"n_routed_experts": [architectures.GLM5["n_routed_experts"], args.experts]}
        | ({} if args.variant == "dsa" else {"indexer": ["DSA, top-2048", "none"]}),
        "parameters": params,
        "parameters_total": sum(params.values()),
        "bf16_gib": round(2 * sum(params.values()) / 2**30, 2),
    }
    (args.out / "arch.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
