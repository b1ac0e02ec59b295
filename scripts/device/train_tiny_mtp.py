#!/usr/bin/env python3
"""A small DeepSeek-V3 model with a trained MTP (nextn) draft layer, for measuring speculative decoding.

    python train_tiny_mtp.py OUT [--seconds 150 | --steps N] [--device cuda] [--size small|smoke]

Random weights accept no draft, so what MTP gains (and what a missing draft layer costs) needs trained
weights. GLM-5 does not fit a short training run; DeepSeek-V3 is the architecture whose draft sglang loads
with the same code (``DeepseekV3ForCausalLMNextN`` and ``deepseek_weight_loader.py``: GLM-5's draft class is
mapped onto it in 0.5.10.post1), with the same MLA attention and MoE layer. The model is transformers'
``DeepseekV3ForCausalLM`` (the implementation sglang's is checked against), with a word-level ``tokN``
tokenizer (make_glm5_arch.py's) so bench_serving's random token ids decode.

The data is a language with a rule a small model learns in a minute and that makes the next-next token
predictable: arithmetic progressions modulo the vocabulary (``a, a+d, a+2d, ...`` for a random start and a
stride from a small set, which changes now and then: SWITCH_PROBABILITY), so that any two tokens say what
most likely follows - also after bench_serving's random prompts. Phase 1 trains the target on next-token prediction. Phase 2 freezes it and trains the draft layer
as DeepSeek-V3's MTP module and sglang's NEXTN run it: at position i it sees ``enorm(embed(x[i+1]))`` beside
``hnorm(h[i])`` (the target's hidden state after its final norm, what sglang's logits processor hands the
draft), projects them with ``eh_proj``, runs one MoE decoder layer numbered ``num_hidden_layers`` and
predicts ``x[i+2]`` through ``shared_head.norm`` and the target's own head.

Written to OUT:
  tiny-mtp/          the checkpoint with the draft: the target's shards, the draft layer in mtp.safetensors
                     (``model.layers.<N>.*``, BF16, as festr2/GLM-5-NVFP4-MTP restores GLM-5's) and an index
                     naming both
  tiny-mtp-nodraft/  the same files without mtp.safetensors and its index entries (a lukealonso/GLM-5-NVFP4)
  report.json        losses, the target's greedy accuracy and the draft's top-1 agreement with the target's
                     greedy continuation on held-out progressions (an acceptance estimate before sglang runs)
Needs torch, transformers, tokenizers and safetensors (the device image and the sglang bundle).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_glm5_arch import SGLANG_DEEPSEEK_ATTRIBUTES, write_tokenizer  # noqa: E402
from progressions import SPECIALS, STRIDES, SWITCH_PROBABILITY, VOCAB  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    # On the H200: ~45 M parameters; learns the progressions in about a minute. The MLA shapes are DeepSeek-V3's
    # own (kv_lora_rank 512 + rope 64, heads of 128): sglang 0.5.17's triton MLA decode kernel refuses others
    # (128 + 32 failed on the device, 2026-12-05: "incompatible dimensions 128 and 256").
    "small": {"vocab_size": VOCAB, "hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 256,
              "num_hidden_layers": 4, "num_attention_heads": 8, "n_routed_experts": 16, "num_experts_per_tok": 2,
              "q_lora_rank": 256, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
              "v_head_dim": 128, "batch": 128, "seq": 128},
    # For a CPU check of the code path only (seconds).
    "smoke": {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
              "v_head_dim": 16, "batch": 8, "seq": 24},
}  # fmt: skip
# Positions the model serves: the quality check's long prompt (over 8,192 tokens) must fit. RoPE is relative
# and the rule looks at the last two tokens, so the model trained on 128 keeps to it far beyond.
MAX_POSITIONS = 16384


def progressions(batch: int, length: int, vocab: int, generator: torch.Generator, device: str) -> torch.Tensor:
    """``batch`` progressions of ``length`` tokens over the ids SPECIALS..vocab-1: a random start, then steps
    of a stride that changes with SWITCH_PROBABILITY at each step (modulo the span)."""
    span = vocab - SPECIALS
    start = torch.randint(0, span, (batch, 1), generator=generator)
    choices = torch.tensor(STRIDES)
    strides = choices[torch.randint(0, len(STRIDES), (batch, length - 1), generator=generator)]
    switch = torch.rand((batch, length - 1), generator=generator) < SWITCH_PROBABILITY
    switch[:, 0] = True  # the first step draws the first stride
    # The stride in force at each step: the one drawn at the last switch at or before it.
    last_switch = torch.cummax(torch.where(switch, torch.arange(length - 1).expand(batch, -1), torch.zeros_like(strides)), dim=1).values
    steps = torch.gather(strides, 1, last_switch)
    offsets = torch.cat((torch.zeros((batch, 1), dtype=steps.dtype), torch.cumsum(steps, dim=1)), dim=1)
    return ((start + offsets) % span + SPECIALS).to(device)


def make_config(size: dict[str, Any]) -> Any:
    from transformers import DeepseekV3Config

    keys = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
            "num_attention_heads", "n_routed_experts", "num_experts_per_tok", "q_lora_rank", "kv_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")  # fmt: skip
    config = DeepseekV3Config(
        **{k: size[k] for k in keys}, **SGLANG_DEEPSEEK_ATTRIBUTES, num_key_value_heads=size["num_attention_heads"],
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, num_nextn_predict_layers=1,
        max_position_embeddings=MAX_POSITIONS, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        architectures=["DeepseekV3ForCausalLM"],
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    return config


class DraftLayer(nn.Module):
    """DeepSeek-V3's MTP module as sglang's DeepseekModelNextN runs it (names as the checkpoint has them)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

        hidden = config.hidden_size
        self.enorm = DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.decoder = DeepseekV3DecoderLayer(config, layer_idx=config.num_hidden_layers)  # MoE: past the dense ones
        self.shared_head = nn.Module()
        self.shared_head.norm = DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)

    def forward(self, target: Any, next_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Logits for x[i+2] from x[i+1] (``next_ids``) and the target's h[i] (``hidden``), positions 0.."""
        embeds = target.model.embed_tokens(next_ids)
        x = self.eh_proj(torch.cat((self.enorm(embeds), self.hnorm(hidden)), dim=-1))
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0).expand(x.shape[0], -1)
        out = self.decoder(x, attention_mask=None, position_ids=positions,
                           position_embeddings=target.model.rotary_emb(x, positions))  # fmt: skip
        out = out[0] if isinstance(out, tuple) else out
        return target.lm_head(self.shared_head.norm(out))


def train(model: nn.Module, step_loss: Any, seconds: float, min_steps: int, lr: float, steps: int | None = None) -> list[float]:
    """AdamW for ``seconds`` (at least ``min_steps``), or exactly ``steps`` when given (the same run on any
    machine, however loaded), the rate decaying linearly; the losses, one per step."""
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    losses: list[float] = []
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if steps is not None:
            if len(losses) >= steps:
                break
            done = len(losses) / steps
        else:
            if elapsed > seconds and len(losses) >= min_steps:
                break
            done = elapsed / max(seconds, 1e-6)
        for group in optim.param_groups:
            group["lr"] = lr * max(0.05, 1 - done)
        loss = step_loss()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def evaluate(target: Any, draft: DraftLayer, config: Any, size: dict[str, Any], device: str) -> dict[str, float]:
    """On held-out progressions: the target's next-token accuracy, and how often the draft's top-1 for x[i+2]
    equals the target's own greedy prediction there (what EAGLE's verification accepts)."""
    generator = torch.Generator().manual_seed(1234)
    ids = progressions(size["batch"], size["seq"], config.vocab_size, generator, device)
    out = target(input_ids=ids, output_hidden_states=True)
    greedy = out.logits.argmax(-1)  # greedy[i] = the target's x[i+1]
    target_acc = (greedy[:, 1:-1] == ids[:, 2:]).float().mean().item()  # from the second token on: the rule needs two
    hidden = out.hidden_states[-1]
    draft_logits = draft(target, greedy[:, :-1], hidden[:, :-1])  # x[i+1] as the target would generate it
    # At position i the draft predicts the target's next greedy token g[i+1]; from i = 1 on the rule is fixed.
    agree = draft_logits.argmax(-1)[:, 1:] == greedy[:, 2:]
    return {"target_next_token_accuracy": round(target_acc, 4), "draft_top1_agreement": round(agree.float().mean().item(), 4)}


def save(target: Any, draft: DraftLayer, tokenizer_dir: Path, out: Path, config: Any) -> dict[str, Any]:
    """tiny-mtp/ (target + mtp.safetensors) and tiny-mtp-nodraft/ (target alone), BF16."""
    from safetensors.torch import save_file

    with_draft, without = out / "tiny-mtp", out / "tiny-mtp-nodraft"
    for path in (with_draft, without):
        shutil.rmtree(path, ignore_errors=True)
    target.to(torch.bfloat16).save_pretrained(with_draft, max_shard_size="50MB")
    for name in tokenizer_dir.iterdir():
        shutil.copy(name, with_draft / name.name)
    n = config.num_hidden_layers
    tensors = {}
    for name, tensor in draft.to(torch.bfloat16).state_dict().items():
        key = name.replace("decoder.", "", 1) if name.startswith("decoder.") else name
        if key.endswith("e_score_correction_bias"):
            tensor = tensor.float()  # F32, as the checkpoints ship the router's bias
        tensors.update(_checkpoint_names(f"model.layers.{n}.{key}", tensor))
    save_file(tensors, str(with_draft / "mtp.safetensors"), metadata={"format": "pt"})
    index_path = with_draft / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:  # one shard: name it, so the index can name the draft's too
        (with_draft / "model.safetensors").rename(with_draft / "model-00001-of-00001.safetensors")
        from safetensors import safe_open

        with safe_open(str(with_draft / "model-00001-of-00001.safetensors"), "pt") as handle:
            index = {"metadata": {}, "weight_map": dict.fromkeys(handle.keys(), "model-00001-of-00001.safetensors")}
    shutil.copytree(with_draft, without)
    (without / "mtp.safetensors").unlink()
    (without / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    index["weight_map"].update(dict.fromkeys(tensors, "mtp.safetensors"))
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    return {"draft_tensors": len(tensors), "draft_bytes": sum(t.numel() * t.element_size() for t in tensors.values())}


def _checkpoint_names(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """One parameter as checkpoints store it: transformers 5 holds a MoE layer's experts fused
    (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]); checkpoints, and sglang's loader, name
    them one per expert (``experts.<e>.gate_proj.weight`` ...), as save_pretrained writes the target's."""
    if name.endswith(".mlp.experts.gate_up_proj"):
        prefix = name.removesuffix("gate_up_proj")
        half = tensor.shape[1] // 2
        out = {}
        for e in range(tensor.shape[0]):
            out[f"{prefix}{e}.gate_proj.weight"] = tensor[e, :half].contiguous()
            out[f"{prefix}{e}.up_proj.weight"] = tensor[e, half:].contiguous()
        return out
    if name.endswith(".mlp.experts.down_proj"):
        prefix = name.removesuffix("down_proj")
        return {f"{prefix}{e}.down_proj.weight": tensor[e].contiguous() for e in range(tensor.shape[0])}
    return {name: tensor.contiguous()}


def reload(out: Path, config: Any, device: str) -> tuple[Any, DraftLayer]:
    """The target and the draft read back from tiny-mtp/'s files in BF16 (the experts fused again): what
    the report's second evaluation runs on, so it speaks for the files sglang loads."""
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM

    target = DeepseekV3ForCausalLM.from_pretrained(out / "tiny-mtp", torch_dtype=torch.bfloat16).to(device).eval()
    stored = load_file(str(out / "tiny-mtp" / "mtp.safetensors"))
    prefix = f"model.layers.{config.num_hidden_layers}."
    experts = config.n_routed_experts
    state: dict[str, torch.Tensor] = {}
    for name, tensor in stored.items():
        key = name.removeprefix(prefix)
        if ".mlp.experts." in f".{key}":
            continue
        state[key if key.split(".")[0] in ("enorm", "hnorm", "eh_proj", "shared_head") else f"decoder.{key}"] = tensor
    state["decoder.mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat((stored[f"{prefix}mlp.experts.{e}.gate_proj.weight"], stored[f"{prefix}mlp.experts.{e}.up_proj.weight"]))
         for e in range(experts)])  # fmt: skip
    state["decoder.mlp.experts.down_proj"] = torch.stack([stored[f"{prefix}mlp.experts.{e}.down_proj.weight"] for e in range(experts)])
    draft = DraftLayer(config).to(torch.bfloat16)
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if not m.endswith("e_score_correction_bias")]:
        raise SystemExit(f"mtp.safetensors does not read back: missing {missing}, unexpected {unexpected}")
    return target, draft.to(device).eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=150, help="training budget, both phases (2/3 target, 1/3 draft)")
    parser.add_argument("--steps", type=int, help="train exactly this many steps per phase instead of --seconds (target, then draft)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    args = parser.parse_args(argv)
    from transformers import DeepseekV3ForCausalLM

    size = SIZES[args.size]
    torch.manual_seed(0)
    config = make_config(size)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = args.out / "tokenizer"
    write_tokenizer(tokenizer_dir, config.vocab_size)
    target = DeepseekV3ForCausalLM(config).to(args.device)
    generator = torch.Generator().manual_seed(0)
    loss_fn = nn.CrossEntropyLoss()

    def target_loss() -> torch.Tensor:
        ids = progressions(size["batch"], size["seq"], config.vocab_size, generator, args.device)
        logits = target(input_ids=ids).logits[:, :-1]
        return loss_fn(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    target.train()
    t0 = time.monotonic()
    target_losses = train(target, target_loss, args.seconds * 2 / 3, 20, 1e-3, args.steps)
    target.eval()
    for param in target.parameters():
        param.requires_grad_(False)
    draft = DraftLayer(config)
    # transformers initializes a model's weights in from_pretrained/__init__ of the whole model only (its
    # MoE experts and router start as torch.empty): the same initializer, module by module.
    draft.apply(target._init_weights)
    draft = draft.to(args.device)
    draft.train()

    def draft_loss() -> torch.Tensor:
        ids = progressions(size["batch"], size["seq"], config.vocab_size, generator, args.device)
        with torch.no_grad():
            hidden = target(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        logits = draft(target, ids[:, 1:-1], hidden[:, :-2])  # at i: x[i+1] and h[i] -> x[i+2]
        return loss_fn(logits.reshape(-1, logits.shape[-1]), ids[:, 2:].reshape(-1))

    draft_losses = train(draft, draft_loss, args.seconds / 3, 20, 1e-3, args.steps)
    draft.eval()
    quality = evaluate(target, draft, config, size, args.device)
    saved = save(target, draft, tokenizer_dir, args.out, config)
    reloaded = evaluate(*reload(args.out, config, args.device), config, size, args.device)
    quality.update({f"{key}_bf16_files": value for key, value in reloaded.items()})
    report = {
        "size": args.size, "device": args.device, "train_seconds": round(time.monotonic() - t0, 1),
        "target_steps": len(target_losses), "target_loss_first_last": [target_losses[0], target_losses[-1]],
        "draft_steps": len(draft_losses), "draft_loss_first_last": [draft_losses[0], draft_losses[-1]],
        "uniform_loss": math.log(config.vocab_size), **quality, **saved,
        "checkpoints": ["tiny-mtp", "tiny-mtp-nodraft"], "strides": list(STRIDES),
    }  # fmt: skip
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
