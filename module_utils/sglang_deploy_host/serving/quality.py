"""The quality check: the served model's token distribution against a reference recorded on a known-good launch.

STDLIB ONLY at import time, Python >= 3.9: ``sglang-deploy quality`` runs it on the control node, the module
``sglang_quality`` on the host (after the readiness gate of ``up``, and in a rollout before a worker rejoins its
routers). Only reading a prompt set (a YAML file, quality_reference.py) needs PyYAML, imported when called.

A regex over a few answers cannot tell a healthy launch from one that is no longer quite the model (an FP8 KV
cache losing precision, a wrong attention backend, a shared expert fused in the wrong dtype, the FP4 GEMM race
under concurrency): those answer fluently. What they change is the distribution over the next token. So a
reference is recorded once, on a conservative launch known to be good, through sglang's native ``/generate``
logprob API, and every later launch is compared with it:

1. **Teacher forcing (the prefill path)**: for each prompt of a fixed, versioned set, the prompt and a fixed
   continuation as token ids, ``max_new_tokens: 0``, ``return_logprob``, ``logprob_start_len`` at the last
   prompt token and ``top_logprobs_num: k``: the top-k distribution at every continuation position.
2. **Greedy decoding (the decode path)**: each prompt at temperature 0, one at a time (concurrency 1), with the
   top-k at every generated position; then every prompt ``copies`` times at once (concurrency >= 8), as a
   batch.

:func:`check` then measures, against the reference:

* **per-token KL divergence** KL(reference || served) at every teacher-forced position and at every greedy
  position before the served output departs from the reference's: over the reference's top-k tokens plus one
  "rest" bucket (the mass outside them). A token of the reference's top-k that the served model ranks below its
  own top-k counts with the served k-th probability, an upper bound on its probability, so the figure is a lower
  bound of the full-vocabulary KL; its mean and 99th percentile;
* **top-1 agreement**: the share of those positions where both rank the same token first;
* **greedy agreement**: the served greedy output against the reference's, and **batch consistency**: each
  batched output against the same launch's own concurrency-1 output. sglang is not batch-invariant by default
  (its kernels reduce in another order at another batch size), so greedy outputs may part where the top two
  tokens are nearly tied. A parting is a *tie flip* when the top-2 margin there (in the reference, or in the
  concurrency-1 run) is at most ``tie_margin`` nats, and a *departure* otherwise; a departure fails.

Thresholds are data (:class:`Thresholds`, stored in the reference, overridable per check); docs/quality.md gives
the measurements behind the defaults. The prompt set and the reference file, their formats and bounds, are
quality_reference.py. Exit codes of :func:`main` and of ``sglang-deploy quality``: 0 PASS,
1 FAIL, 2 no verdict (a malformed reference or prompt set, a reference from another model or tokenizer, a
server that does not return logprobs or does not answer).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import endpoint
from .quality_reference import (
    FORMAT,
    FORMAT_VERSION,
    Greedy,
    LAUNCH_FIELDS,
    PromptSet,
    QualityInputError,
    Reference,
    Thresholds,
    TopK,
    load_prompt_set,
    load_reference,
)

# A probability below this is treated as this (log 1e-12 = -27.6 nats): a zero or missing mass never makes
# the KL infinite, and a token the served model pushed out of reach still weighs heavily.
MIN_PROBABILITY = 1e-12


def verdict_path(state_dir: str, unit: str) -> str:
    """Where a host keeps the last check's verdict line for ``unit`` (the module writes it, ``doctor -i`` reads it)."""
    return f"{state_dir.rstrip('/')}/{unit}.quality"


class NoVerdictError(RuntimeError):
    """The check cannot judge this server (another model or tokenizer, no logprobs, no answer): exit 2."""


# -- the prompt set ---------------------------------------------------------------------------------------------


# -- talking to sglang -------------------------------------------------------------------------------------------


def _post(target: endpoint.Endpoint, path: str, payload: Mapping[str, Any]) -> Any:
    response = target.request("POST", path, dict(payload))
    if response.status == 404:
        raise NoVerdictError(f"POST {path}: 404: this server has no {path} (sglang's native API is needed; a router or a proxy in front hides it: check the worker itself)")
    return endpoint.expect_ok(response, f"POST {path}").json()


def tokenize(target: endpoint.Endpoint, model: str, text: str, special: bool) -> List[int]:
    """The served tokenizer's ids for ``text`` (sglang's ``/tokenize``)."""
    data = _post(target, "/tokenize", {"model": model, "prompt": text, "add_special_tokens": special})
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
        raise NoVerdictError(f"POST /tokenize: no list of token ids in the answer ({str(data)[:200]!r})")
    return tokens


def _top(entry: Any, what: str) -> TopK:
    """One position's ``[[logprob, id, text], ...]`` as (logprob, id) pairs, best first."""
    if not isinstance(entry, list) or not entry:
        raise NoVerdictError(f"{what}: no top logprobs at a position (the server returned {str(entry)[:120]!r})")
    pairs: TopK = []
    for item in entry:
        if not isinstance(item, (list, tuple)) or len(item) < 2:
            raise NoVerdictError(f"{what}: a top logprob that is not [logprob, token_id, text]: {str(item)[:120]!r}")
        logprob, token = item[0], item[1]
        if isinstance(token, bool) or not isinstance(token, int) or not isinstance(logprob, (int, float)) or isinstance(logprob, bool):
            raise NoVerdictError(f"{what}: a top logprob that is not [logprob, token_id, text]: {str(item)[:120]!r}")
        value = float(logprob)
        if math.isnan(value):
            raise NoVerdictError(f"{what}: the server returned NaN logprobs (a numeric failure: the launch computes NaN)")
        pairs.append((max(value, math.log(MIN_PROBABILITY)), token))
    pairs.sort(key=lambda pair: -pair[0])
    return pairs


def _meta(data: Any, what: str) -> Dict[str, Any]:
    meta = data.get("meta_info") if isinstance(data, dict) else None
    if not isinstance(meta, dict):
        raise NoVerdictError(f"{what}: no meta_info in the answer ({str(data)[:200]!r})")
    return meta


def score(target: endpoint.Endpoint, model: str, prompt_ids: Sequence[int], continuation_ids: Sequence[int], top_k: int) -> Tuple[List[TopK], List[float]]:
    """Teacher forcing: the top-k at each continuation position and the continuation tokens' own logprobs."""
    what = "POST /generate (teacher-forced scoring)"
    data = _post(target, "/generate", {
        "input_ids": list(prompt_ids) + list(continuation_ids),
        "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": True, "logprob_start_len": len(prompt_ids) - 1, "top_logprobs_num": top_k,
    })  # fmt: skip
    meta = _meta(data, what)
    tops, own = meta.get("input_top_logprobs"), meta.get("input_token_logprobs")
    if not isinstance(tops, list) or not isinstance(own, list):
        raise NoVerdictError(f"{what}: the answer has no input_top_logprobs / input_token_logprobs: this server does not return logprobs")
    # sglang: entries from logprob_start_len on, the first (the last prompt token) without a logprob.
    want = len(continuation_ids) + 1
    if len(tops) != want or len(own) != want:
        raise NoVerdictError(f"{what}: {len(tops)} positions of logprobs for {want} asked (logprob_start_len not honoured)")
    positions = [_top(entry, what) for entry in tops[1:]]
    logprobs = []
    for item, token in zip(own[1:], continuation_ids):
        if not isinstance(item, (list, tuple)) or len(item) < 2 or item[1] != token or not isinstance(item[0], (int, float)):
            raise NoVerdictError(f"{what}: the scored tokens are not the ones sent ({str(item)[:120]!r})")
        logprobs.append(float(item[0]))
    return positions, logprobs


def generate(target: endpoint.Endpoint, model: str, prompt_ids: Sequence[int], tokens: int, top_k: int) -> Greedy:
    what = "POST /generate (greedy)"
    data = _post(target, "/generate", {
        "input_ids": list(prompt_ids),
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0},
        "return_logprob": True, "logprob_start_len": len(prompt_ids) - 1, "top_logprobs_num": top_k,
    })  # fmt: skip
    meta = _meta(data, what)
    own, tops = meta.get("output_token_logprobs"), meta.get("output_top_logprobs")
    if not isinstance(own, list) or not isinstance(tops, list):
        raise NoVerdictError(f"{what}: the answer has no output_token_logprobs / output_top_logprobs: this server does not return logprobs")
    if not own:
        raise NoVerdictError(f"{what}: zero tokens generated (a server that answers nothing)")
    if len(tops) != len(own):
        raise NoVerdictError(f"{what}: {len(own)} tokens but {len(tops)} positions of top logprobs")
    ids = []
    for item in own:
        if not isinstance(item, (list, tuple)) or len(item) < 2 or isinstance(item[1], bool) or not isinstance(item[1], int):
            raise NoVerdictError(f"{what}: an output token that is not [logprob, token_id, text]: {str(item)[:120]!r}")
        ids.append(item[1])
    return Greedy(ids, [_top(entry, what) for entry in tops])


def _in_batch(count: int, concurrency: int, work: Callable[[int], Any]) -> List[Any]:
    """``work(0..count-1)`` with ``concurrency`` requests in flight, results in order (a failure raises)."""
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(work, range(count)))


# -- measuring ---------------------------------------------------------------------------------------------------
def kl_divergence(reference: TopK, served: TopK) -> float:
    """KL(reference || served) over the reference's top-k and one bucket for the rest (module docstring)."""
    floor = served[-1][0] if served else math.log(MIN_PROBABILITY)
    served_by_id = {token: logprob for logprob, token in served}
    total = 0.0
    p_mass = q_mass = 0.0
    for logprob, token in reference:
        p = math.exp(logprob)
        q_log = served_by_id.get(token, floor)
        q = math.exp(q_log)
        total += p * (logprob - q_log)
        p_mass += p
        q_mass += q
    p_rest = max(1.0 - p_mass, 0.0)
    if p_rest > 0:
        q_rest = max(1.0 - q_mass, MIN_PROBABILITY)
        total += p_rest * math.log(max(p_rest, MIN_PROBABILITY) / q_rest)
    return max(total, 0.0)


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` 0.99 for p99); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


def margin(top: TopK) -> float:
    """The gap in nats between the first and the second token of a position (inf with one token)."""
    return top[0][0] - top[1][0] if len(top) > 1 else math.inf


@dataclass(frozen=True)
class Parting:
    """Where a greedy output first differs from the one it is compared with."""

    prompt: str
    position: int
    margin: float
    tie: bool

    def describe(self) -> str:
        kind = "a tie flip" if self.tie else "a departure"
        return f"{self.prompt}: parts at token {self.position} ({kind}: top-2 margin {self.margin:.3f} nats there)"


def parting(name: str, expected: Greedy, got: Sequence[int], tie_margin: float) -> Optional[Parting]:
    """Where ``got`` first differs from ``expected`` (None when identical), judged by ``expected``'s margin."""
    for position, token in enumerate(expected.ids):
        if position >= len(got):
            break
        if got[position] != token:
            gap = margin(expected.tops[position]) if position < len(expected.tops) else math.inf
            return Parting(name, position, gap, gap <= tie_margin)
    if len(got) != len(expected.ids):
        position = min(len(got), len(expected.ids))
        # One stopped where the other went on: the end-of-sequence token was (or was not) chosen there.
        gap = margin(expected.tops[position]) if position < len(expected.tops) else math.inf
        return Parting(name, position, gap, gap <= tie_margin)
    return None


# -- recording ---------------------------------------------------------------------------------------------------
def _served_model(target: endpoint.Endpoint, model: str) -> Optional[int]:
    cards = endpoint.model_cards(target)
    ids = [str(card.get("id")) for card in cards]
    if model not in ids:
        raise NoVerdictError(f"this server does not serve {model!r} (it lists {ids}): a reference is for one model")
    return endpoint.context_length(target, model)


def launch_info(target: endpoint.Endpoint) -> Dict[str, Any]:
    """What the launch says of itself (:data:`LAUNCH_FIELDS` of /get_server_info, never the key); {} when the
    server does not say."""
    try:
        response = target.get("/get_server_info")
        data = response.json() if response.status == 200 else {}
    except endpoint.EndpointError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: data[key] for key in LAUNCH_FIELDS if key in data and isinstance(data[key], (str, int, float, bool, type(None)))}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Run:
    """What one launch answered to a prompt set: scoring, greedy at concurrency 1, the batch."""

    prompt_ids: List[List[int]]
    continuation_ids: List[List[int]]
    scored: List[List[TopK]]
    continuation_logprobs: List[List[float]]
    greedy: List[Greedy]
    batch: List[List[int]]  # copies x prompts outputs, prompt-major: batch[i] is prompt i % len(prompts)
    seconds: float
    tokens: Dict[str, int] = field(default_factory=dict)


def _answer(target: endpoint.Endpoint, model: str, prompts: Sequence[Tuple[str, List[int], List[int]]], top_k: int,
            generate_tokens: int, concurrency: int, copies: int) -> _Run:
    """Score, decode and batch ``prompts`` (name, prompt ids, continuation ids) against one launch."""
    started = time.monotonic()
    scored, own = [], []
    for _name, prompt_ids, continuation_ids in prompts:
        positions, logprobs = score(target, model, prompt_ids, continuation_ids, top_k)
        scored.append(positions)
        own.append(logprobs)
    greedy = [generate(target, model, prompt_ids, generate_tokens, top_k) for _name, prompt_ids, _c in prompts]
    count = len(prompts) * copies
    batch = _in_batch(count, concurrency, lambda i: generate(target, model, prompts[i % len(prompts)][1], generate_tokens, 2).ids)
    # Prefilled once: every prompt and continuation; the greedy and batched requests repeat the prompts, which
    # sglang's prefix cache serves (``sent`` counts them as sent).
    tokens = {
        "prompt": sum(len(p) + len(c) for _n, p, c in prompts),
        "sent": sum(len(p) + len(c) for _n, p, c in prompts) + sum(len(p) for _n, p, _c in prompts) * (1 + copies),
        "scored": sum(len(c) for _n, _p, c in prompts),
        "generated": sum(len(g.ids) for g in greedy) + sum(len(ids) for ids in batch),
    }
    return _Run([list(p) for _n, p, _c in prompts], [list(c) for _n, _p, c in prompts], scored, own, greedy, batch,
                round(time.monotonic() - started, 2), tokens)  # fmt: skip


def record(target: endpoint.Endpoint, model: str, prompt_set: PromptSet, thresholds: Optional[Thresholds] = None) -> Dict[str, Any]:
    """The reference: ``prompt_set`` answered by this (known-good) launch. NoVerdictError when the server cannot
    be recorded (another model, no logprobs, a long prompt shorter than its set asks); the launch's own batch
    consistency is recorded and must hold (a launch that is not consistent with itself is no reference)."""
    limits = thresholds or Thresholds()
    context = _served_model(target, model)
    prompts = []
    for prompt in prompt_set.prompts:
        prompt_ids = tokenize(target, model, prompt.prompt, True)
        continuation_ids = tokenize(target, model, prompt.continuation, False)
        if not prompt_ids or not continuation_ids:
            raise NoVerdictError(f"prompt {prompt.name}: the tokenizer gave no tokens for its prompt or continuation")
        if len(prompt_ids) < prompt.min_prompt_tokens:
            raise NoVerdictError(
                f"prompt {prompt.name}: {len(prompt_ids):,} tokens with this tokenizer, fewer than the set's "
                f"min_prompt_tokens {prompt.min_prompt_tokens:,}: lengthen its context.filler_chars"
            )
        need = max(len(prompt_ids) + len(continuation_ids), len(prompt_ids) + prompt_set.generate_tokens)
        if context is not None and need > context:
            raise NoVerdictError(f"prompt {prompt.name}: needs {need:,} tokens, more than the served context of {context:,}")
        prompts.append((prompt.name, prompt_ids, continuation_ids))
    run = _answer(target, model, prompts, prompt_set.top_k, prompt_set.generate_tokens, prompt_set.concurrency, prompt_set.copies)
    batch = _batch_consistency(prompts, run.greedy, run.batch, limits.tie_margin)
    if batch["departures"]:
        raise NoVerdictError(
            "this launch is not consistent with itself: " + "; ".join(batch["departures"][:3])
            + ". Record the reference on a conservative launch (docs/quality.md)"
        )
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "recorded": _now(),
        "served_model": model, "launch": launch_info(target), "context_length": context,
        "prompt_set": {"name": prompt_set.name, "version": prompt_set.version, "top_k": prompt_set.top_k,
                       "generate_tokens": prompt_set.generate_tokens, "concurrency": prompt_set.concurrency,
                       "copies": prompt_set.copies},
        "thresholds": asdict(limits),
        "prompts": [
            {"name": name, "prompt": prompt.prompt, "continuation": prompt.continuation,
             "prompt_ids": prompt_ids, "continuation_ids": continuation_ids,
             "scored": [[list(pair) for pair in top] for top in run.scored[i]],
             "continuation_logprobs": run.continuation_logprobs[i], "greedy": run.greedy[i].to_data()}
            for i, ((name, prompt_ids, continuation_ids), prompt) in enumerate(zip(prompts, prompt_set.prompts))
        ],
        "batch": {key: batch[key] for key in ("requests", "identical", "tie_flips", "tie_flip_margins")},
        "seconds": run.seconds, "tokens": run.tokens,
    }  # fmt: skip


# -- the reference file ------------------------------------------------------------------------------------------


# -- checking ----------------------------------------------------------------------------------------------------
def _batch_consistency(prompts: Sequence[Tuple[str, List[int], List[int]]], greedy: Sequence[Greedy],
                       batch: Sequence[Sequence[int]], tie_margin: float) -> Dict[str, Any]:
    """Each batched output against the same launch's concurrency-1 output (tie flips tolerated)."""
    identical = ties = 0
    departures: List[str] = []
    margins: List[float] = []
    for i, ids in enumerate(batch):
        index = i % len(prompts)
        part = parting(prompts[index][0], greedy[index], ids, tie_margin)
        if part is None:
            identical += 1
        elif part.tie:
            ties += 1
            margins.append(round(part.margin, 4))
        else:
            departures.append(f"request {i + 1} ({part.describe()})")
    return {"requests": len(batch), "identical": identical, "tie_flips": ties, "tie_flip_margins": margins,
            "departures": departures}  # fmt: skip


@dataclass
class Verdict:
    passed: bool
    reasons: List[str]
    thresholds: Thresholds
    kl: Dict[str, Any]
    top1_agreement: float
    greedy: Dict[str, Any]
    batch: Dict[str, Any]
    tokens: Dict[str, int]
    seconds: float
    reference: Dict[str, Any]
    continuation_nll: Dict[str, float]

    @property
    def word(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.word
        return data

    def line(self) -> str:
        """The one line a log, the journal's doctor and the rollout show."""
        head = f"sglang-deploy quality check: {self.word}"
        figures = (f"KL mean {self.kl['mean']:.4g} (max {self.thresholds.kl_mean:g}), p99 {self.kl['p99']:.4g} "
                   f"(max {self.thresholds.kl_p99:g}), top-1 {self.top1_agreement:.1%} (min {self.thresholds.top1_agreement:.0%}), "
                   f"greedy {self.greedy['identical']}/{self.greedy['prompts']} identical, batch {self.batch['identical'] + self.batch['tie_flips']}"
                   f"/{self.batch['requests']} consistent at c{self.batch['concurrency']}")  # fmt: skip
        return f"{head}: {'; '.join(self.reasons)} [{figures}]" if self.reasons else f"{head} [{figures}]"

    def report(self) -> str:
        ref = self.reference
        lines = [
            self.line(),
            f"  reference: {ref['served_model']} recorded {ref['recorded']} (prompt set {ref['prompt_set']}, launch: "
            + (", ".join(f"{k}={v}" for k, v in ref["launch"].items() if k not in ("model_path", "tokenizer_path")) or "not recorded") + ")",
            f"  per-token KL (nats) over {self.kl['positions']} positions ({self.kl['prefill_positions']} teacher-forced, "
            f"{self.kl['decode_positions']} greedy): mean {self.kl['mean']:.4g}, p99 {self.kl['p99']:.4g}, max {self.kl['max']:.4g}",
            f"  continuation NLL (nats/token): reference {self.continuation_nll['reference']:.4f}, served {self.continuation_nll['served']:.4f}",
            f"  greedy at concurrency 1 against the reference: {self.greedy['identical']}/{self.greedy['prompts']} identical, "
            f"{self.greedy['tie_flips']} tie flip(s)",
            f"  batch at concurrency {self.batch['concurrency']} against concurrency 1: {self.batch['identical']}/{self.batch['requests']} "
            f"identical, {self.batch['tie_flips']} tie flip(s)",
            f"  {self.tokens.get('prompt', 0):,} prompt tokens ({self.tokens.get('sent', 0):,} sent, the repeats from sglang's "
            f"prefix cache), {self.tokens.get('scored', 0):,} scored, {self.tokens.get('generated', 0):,} generated in {self.seconds:.1f} s",
        ]  # fmt: skip
        lines += [f"  - {text}" for text in self.greedy["partings"] + self.batch["departures"]]
        return "\n".join(lines)


@dataclass(frozen=True)
class Figures:
    """What a verdict is judged on: the KL mean and p99, the top-1 agreement, the greedy outputs' departures from the
    reference's, and the batched outputs that depart from their concurrency-1 ones."""

    kl_mean: float
    kl_p99: float
    top1_agreement: float
    greedy_departures: Tuple[Parting, ...] = ()
    batch_departures: int = 0
    batch_requests: int = 0
    concurrency: int = 0


def judge(figures: Figures, limits: Thresholds) -> List[str]:
    """Why ``figures`` fail ``limits``, each reason naming the figure and its threshold; [] is a PASS."""
    reasons = []
    if figures.kl_mean > limits.kl_mean:
        reasons.append(f"mean per-token KL {figures.kl_mean:.4g} nats is over {limits.kl_mean:g}")
    if figures.kl_p99 > limits.kl_p99:
        reasons.append(f"p99 per-token KL {figures.kl_p99:.4g} nats is over {limits.kl_p99:g}")
    for part in figures.greedy_departures:
        if part.margin > limits.tie_margin:
            reasons.append(f"the greedy output of {part.prompt!r} departs from the reference's at token {part.position}, "
                           f"where the reference's top-2 margin is {part.margin:.2f} nats (more than tie_margin {limits.tie_margin:g})")
    if figures.top1_agreement < limits.top1_agreement:
        reasons.append(f"top-1 agreement {figures.top1_agreement:.1%} is under {limits.top1_agreement:.0%}")
    if figures.batch_departures:
        reasons.append(f"{figures.batch_departures} of {figures.batch_requests} batched outputs at concurrency {figures.concurrency} "
                       "depart from the same prompt's concurrency-1 output (batch inconsistency: a race under load)")
    return reasons


def check(target: endpoint.Endpoint, reference: Reference, thresholds: Optional[Thresholds] = None) -> Verdict:
    """The served model against ``reference`` (module docstring). NoVerdictError when this server cannot be
    judged against it: another served model, another tokenizer, no logprobs."""
    limits = thresholds or reference.thresholds
    model = reference.served_model
    _served_model(target, model)
    for prompt in reference.prompts:
        for text, ids, special, part in ((prompt.prompt, prompt.prompt_ids, True, "prompt"),
                                         (prompt.continuation, prompt.continuation_ids, False, "continuation")):
            got = tokenize(target, model, text, special)
            if got != ids:
                first = next((i for i, (a, b) in enumerate(zip(got, ids)) if a != b), min(len(got), len(ids)))
                raise NoVerdictError(
                    f"the reference was recorded with another tokenizer: the {part} of {prompt.name!r} is {len(got):,} "
                    f"tokens here, {len(ids):,} in the reference, first different at token {first}. Record a "
                    "reference for this model (docs/quality.md)"
                )
    prompts = [(p.name, p.prompt_ids, p.continuation_ids) for p in reference.prompts]
    sets = reference.prompt_set
    run = _answer(target, model, prompts, reference.top_k, int(sets["generate_tokens"]), int(sets["concurrency"]), int(sets["copies"]))
    prefill: List[float] = []
    agree = 0
    for ref_prompt, served in zip(reference.prompts, run.scored):
        for ref_top, top in zip(ref_prompt.scored, served):
            prefill.append(kl_divergence(ref_top, top))
            agree += ref_top[0][1] == top[0][1]
    decode: List[float] = []
    identical = ties = 0
    partings: List[str] = []
    departures: List[Parting] = []
    for ref_prompt, served_greedy in zip(reference.prompts, run.greedy):
        part = parting(ref_prompt.name, ref_prompt.greedy, served_greedy.ids, limits.tie_margin)
        common = len(ref_prompt.greedy.ids) if part is None else part.position
        for position in range(min(common, len(served_greedy.tops))):
            decode.append(kl_divergence(ref_prompt.greedy.tops[position], served_greedy.tops[position]))
            agree += ref_prompt.greedy.tops[position][0][1] == served_greedy.tops[position][0][1]
        if part is None:
            identical += 1
        elif part.tie:
            ties += 1
            partings.append(f"greedy {part.describe()}")
        else:
            partings.append(f"greedy {part.describe()}")
            departures.append(part)
    every = prefill + decode
    kl = {"mean": sum(every) / len(every) if every else 0.0, "p99": percentile(every, 0.99), "max": max(every, default=0.0),
          "positions": len(every), "prefill_positions": len(prefill), "decode_positions": len(decode),
          "prefill_mean": sum(prefill) / len(prefill) if prefill else 0.0,
          "decode_mean": sum(decode) / len(decode) if decode else 0.0}  # fmt: skip
    top1 = agree / len(every) if every else 1.0
    batch = _batch_consistency(prompts, run.greedy, run.batch, limits.tie_margin)
    batch["concurrency"] = int(sets["concurrency"])
    reasons = judge(Figures(kl["mean"], kl["p99"], top1, tuple(departures), len(batch["departures"]), batch["requests"],
                            batch["concurrency"]), limits)  # fmt: skip
    ref_nll = [-lp for p in reference.prompts for lp in p.continuation_logprobs]
    served_nll = [-lp for values in run.continuation_logprobs for lp in values]
    return Verdict(
        passed=not reasons, reasons=reasons, thresholds=limits, kl=kl, top1_agreement=top1,
        greedy={"prompts": len(reference.prompts), "identical": identical, "tie_flips": ties, "partings": partings},
        batch=batch, tokens=run.tokens, seconds=run.seconds,
        reference={"served_model": model, "recorded": reference.recorded, "launch": reference.launch,
                   "prompt_set": f"{sets.get('name')} v{sets.get('version')}"},
        continuation_nll={"reference": sum(ref_nll) / len(ref_nll) if ref_nll else 0.0,
                          "served": sum(served_nll) / len(served_nll) if served_nll else 0.0},
    )  # fmt: skip


# -- command line (python3 -m sglang_deploy_host.serving.quality) --------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python3 -m sglang_deploy_host.serving.quality record|check``: the same as ``sglang-deploy quality`` against one
    URL, for a machine with only this package (the device runs). Exit 0 PASS, 1 FAIL, 2 no verdict."""
    parser = argparse.ArgumentParser(prog="python3 -m sglang_deploy_host.serving.quality", description=main.__doc__)
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", help="the served model name (record)")
    parser.add_argument("--prompts", help="a prompt set file (record; default: the shipped set, needs PyYAML)")
    parser.add_argument("--reference", help="the reference file (check)")
    parser.add_argument("--out", help="where record writes the reference")
    parser.add_argument("--env-file", help="the unit's EnvironmentFile= holding the API key (else $SGLANG_API_KEY)")
    parser.add_argument("--cafile", default="")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        target = endpoint.Endpoint(endpoint.check_url(args.url), api_key=endpoint.api_key_from_env_file(args.env_file, endpoint.API_KEY_ENV), cafile=args.cafile)
        if args.action == "record":
            if not args.model or not args.out:
                parser.error("record needs --model and --out")
            data = record(target, args.model, load_prompt_set(args.prompts))
            Path(args.out).write_text(json.dumps(data) + "\n", encoding="utf-8")
            print(f"recorded {args.out}: {len(data['prompts'])} prompts, {data['tokens']}, {data['seconds']} s")
            return 0
        if not args.reference:
            parser.error("check needs --reference")
        verdict = check(target, load_reference(args.reference))
    except (QualityInputError, NoVerdictError, endpoint.EndpointError, ValueError) as err:
        print(f"quality: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(json.dumps(verdict.to_dict(), indent=2) if args.json else verdict.report())
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
