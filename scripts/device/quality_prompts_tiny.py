#!/usr/bin/env python3
"""The quality check's prompt set for the tiny trained DeepSeek-V3 of train_tiny_mtp.py (its language).

    python quality_prompts_tiny.py OUT.yml [--vocab 1024] [--long-tokens 8300]

The shipped set (module_utils/sglang_deploy_host/serving/probes/quality-v1.yml) is English for GLM-5; the tiny model
speaks progressions of ``tokN`` words (train_tiny_mtp.py: a stride that changes now and then). This set has the
same shape: five short prompts and one of more than 8,192 tokens, each followed by a continuation that is
scored token by token. The continuations change stride twice, so that some of their positions are uncertain
(the model's distribution is spread there, and a launch that computes it differently moves it), the rest are
the rule's near-certain next tokens. Fixed by a seed: the same file on every run.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from progressions import SPECIALS, STRIDES, VOCAB  # noqa: E402

NAME = "tiny-mtp-progressions"
VERSION = 1
SEED = 20261206


def progression(rng: random.Random, start: int, length: int, vocab: int, switch_every: int = 0) -> list[int]:
    """``length`` token ids from ``start``: a stride from STRIDES, changed every ``switch_every`` tokens (0: never)."""
    span = vocab - SPECIALS
    ids, value, stride = [], start, rng.choice(STRIDES)
    for i in range(length):
        if switch_every and i and i % switch_every == 0:
            stride = rng.choice([s for s in STRIDES if s != stride])
        ids.append(SPECIALS + value % span)
        value += stride
    return ids


def continuation(rng: random.Random, last: int, before: int, length: int, vocab: int) -> list[int]:
    """``length`` ids going on from ``before, last``: the stride they show, then two changes of stride."""
    span = vocab - SPECIALS
    stride = (last - before) % span
    value = last - SPECIALS
    ids = []
    changes = {length // 3, 2 * length // 3}
    for i in range(length):
        if i in changes:
            stride = rng.choice([s for s in STRIDES if s != stride])
        value = (value + stride) % span
        ids.append(SPECIALS + value)
    return ids


def quoted(ids: list[int], lead: str = "", per_line: int = 18, indent: int = 6) -> str:
    """The ids as a double-quoted YAML scalar of ``tokN`` words, ``per_line`` to a line: YAML folds each line
    break into one space, so the text is the words joined by spaces (after ``lead``), in lines yamllint takes."""
    words = [f"tok{i}" for i in ids]
    lines = [" ".join(words[i:i + per_line]) for i in range(0, len(words), per_line)]
    return '"' + lead + ("\n" + " " * indent).join(lines) + '"'


def prompt_set(vocab: int, long_tokens: int) -> str:
    rng = random.Random(SEED)
    entries = []
    for number in range(5):
        prompt = progression(rng, rng.randrange(vocab), 16, vocab, switch_every=8)
        entries.append((f"short-{number + 1}", prompt, continuation(rng, prompt[-1], prompt[-2], 32, vocab), 0))
    prompt = progression(rng, rng.randrange(vocab), long_tokens, vocab, switch_every=40)
    entries.append(("long-context", prompt, continuation(rng, prompt[-1], prompt[-2], 32, vocab), 8192))
    lines = [
        "---",
        "# Written by scripts/device/quality_prompts_tiny.py: the quality check's prompt set for the tiny trained",
        "# DeepSeek-V3 of train_tiny_mtp.py (its tokN language); the shipped set is English for GLM-5.",
        f"name: {NAME}",
        f"version: {VERSION}",
        "top_k: 20",
        "generate_tokens: 48",
        "batch: {concurrency: 8, copies: 3}",
        "prompts:",
    ]
    for name, prompt, cont, minimum in entries:
        lines += [f"  - name: {name}", f"    prompt: {quoted(prompt)}", f"    continuation: {quoted(cont, ' ')}"]
        if minimum:
            lines.append(f"    min_prompt_tokens: {minimum}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--long-tokens", type=int, default=8300)
    args = parser.parse_args(argv)
    args.out.write_text(prompt_set(args.vocab, args.long_tokens), encoding="utf-8")
    print(f"{args.out}: {NAME} v{VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
