"""Teach the tiny Llama (make_tiny_llama.py) the correctness gate's answers, so the gate means something
on a 3 MB model: trained, greedy decoding answers every probe; untrained, it answers none.

    python train_tiny_llama.py SRC_DIR OUT_DIR [--seconds 60] [--min-steps 300] [--probes FILE]

The prompts are the gate's own (sglang_deploy_host/serving/probes/default.yml, or --probes; a long-context probe's
notes built for the model's context, as the gate builds them) plus the endpoint suite's plain chat
(endpoint.CHAT_SMOKE_PROMPT), tokenized the way sglang's chat route does it (the
chat template rendered, then encoded); each answer ends with the tokenizer's EOS. Every answer is
checked against its probe's regex before training. Training runs for --seconds (at least
--min-steps), full batch, AdamW with the rate decaying linearly over the budget: long past the
point where greedy decoding first gives every answer, so that the answers keep a wide margin when
sglang serves the bfloat16 weights with its own kernels. OUT_DIR then holds the bfloat16 checkpoint, the tokenizer files of SRC_DIR and
train_report.json (loss curve, greedy answers). Exit 1 when greedy decoding of the saved checkpoint,
reloaded in bfloat16, misses one.
Needs torch, transformers, tokenizers; sglang_deploy_host (module_utils) and PyYAML on the path.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from sglang_deploy_host.serving import endpoint, gate

# What a working model answers (the gate's regexes must match these; checked below).
ANSWERS = {
    "capital-of-france": "Paris",
    "arithmetic": "42",
    "arithmetic-product": "91",
    "python-function": "def add(a, b):\n    return a + b",
    "multi-step": "50",
    "long-context-retrieval": "4817",
}
SMOKE_ANSWER = "Hello! Nice to meet you."


def examples(probes: list[gate.Probe], context_len: int) -> list[tuple[str, str]]:
    missing = [p.name for p in probes if p.name not in ANSWERS]
    if missing:
        raise SystemExit(f"train_tiny_llama: no answer for probes {missing}: add them to ANSWERS")
    pairs = [(gate.build_prompt(p, context_len), ANSWERS[p.name]) for p in probes]
    for probe in probes:
        if not probe.expect.search(ANSWERS[probe.name]):
            raise SystemExit(f"train_tiny_llama: answer {ANSWERS[probe.name]!r} does not match /{probe.expect.pattern}/")
    return pairs + [(endpoint.CHAT_SMOKE_PROMPT, SMOKE_ANSWER)]


def prompt_ids(tokenizer, prompt: str) -> list[int]:  # type: ignore[no-untyped-def]
    """sglang's chat route: apply_chat_template(tokenize=False, add_generation_prompt=True), then encode."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def batch(tokenizer, pairs: list[tuple[str, str]], device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    rows, labels = [], []
    for prompt, answer in pairs:
        p = prompt_ids(tokenizer, prompt)
        a = list(tokenizer(answer, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
        rows.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels], device=device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
    return ids, lab, mask


@torch.no_grad()
def greedy(model, tokenizer, pairs: list[tuple[str, str]], device: str) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    """(prompt, expected, greedy answer) for each pair, decoding one sequence at a time."""
    out = []
    for prompt, answer in pairs:
        ids = torch.tensor([prompt_ids(tokenizer, prompt)], device=device)
        limit = len(tokenizer(answer, add_special_tokens=False)["input_ids"]) + 8
        gen = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=limit, do_sample=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        out.append((prompt, answer, tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=60.0, help="training time budget (default 60)")
    parser.add_argument("--min-steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--probes", help="probes file (default: the gate's shipped set)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.src)
    model = LlamaForCausalLM.from_pretrained(args.src, dtype=torch.float32).to(args.device)
    context_len = int(json.loads((args.src / "config.json").read_text())["max_position_embeddings"])
    pairs = examples(gate.load_probes(args.probes), context_len)
    ids, labels, mask = batch(tokenizer, pairs, args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    start = time.monotonic()
    step, loss_value, curve = 0, float("nan"), []
    model.train()
    while True:
        # Linear decay to 1 % over the time budget: no late Adam spike right before the save.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * max(0.01, 1.0 - (time.monotonic() - start) / args.seconds)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        elapsed = time.monotonic() - start
        done = elapsed >= args.seconds and step >= args.min_steps
        if step % 250 == 0 or step == 1 or done:
            loss_value = float(loss.detach())
            curve.append({"step": step, "seconds": round(elapsed, 1), "loss": loss_value})
            print(f"step {step:5d}  {elapsed:6.1f}s  loss {loss_value:.3e}", flush=True)
        if done:
            break

    args.out.mkdir(parents=True, exist_ok=True)
    for item in args.src.iterdir():  # tokenizer, chat template, generation config
        if item.is_file() and not item.name.endswith(".safetensors") and item.name != "config.json":
            shutil.copy2(item, args.out / item.name)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    config = json.loads((args.out / "config.json").read_text())
    config.setdefault("rope_theta", json.loads((args.src / "config.json").read_text()).get("rope_theta", 10000.0))
    (args.out / "config.json").write_text(json.dumps(config, indent=2))

    # The saved checkpoint, reloaded as sglang loads it (bfloat16), answers every prompt greedily.
    saved = LlamaForCausalLM.from_pretrained(args.out, dtype=torch.bfloat16).to(args.device).eval()
    results = greedy(saved, AutoTokenizer.from_pretrained(args.out), pairs, args.device)
    ok = all(got.strip() == want for _, want, got in results)
    report = {
        "steps": step, "seconds": round(time.monotonic() - start, 1), "final_loss": loss_value,
        "device": args.device, "torch": torch.__version__, "loss_curve": curve,
        "greedy": [{"prompt": p, "expected": w, "answer": g} for p, w, g in results], "all_answered": ok,
    }  # fmt: skip
    (args.out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    for prompt, want, got in results:
        print(f"{'ok ' if got.strip() == want else 'BAD'} {prompt[:50]!r:54} -> {got!r}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
