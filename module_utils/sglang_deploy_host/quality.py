"""The quality check: the served model's token distribution against a reference recorded on a known-good launch.

STDLIB ONLY at import time, Python >= 3.9: ``sglang-deploy quality`` runs it on the control node, the module
``sglang_quality`` on the host (after the readiness gate of ``up``, and in a rollout before a worker rejoins its
routers). Only :func:`prompt_set_data` (a YAML file) needs PyYAML, imported when called.

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
the measurements behind the defaults. Exit codes of :func:`main` and of ``sglang-deploy quality``: 0 PASS,
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import endpoint, gate
from .files import UnreadableFileError, read_regular_file

FORMAT = "sglang-deploy quality reference"
FORMAT_VERSION = 1
DEFAULT_PROMPTS = Path(__file__).with_name("probes") / "quality-v1.yml"
# A reference holds a few hundred kilobytes (the long prompt's text and ids, k entries per position); the cap
# bounds what is read, in memory, before a byte is parsed.
MAX_REFERENCE_BYTES = 32 * 1024 * 1024
MAX_PROMPT_SET_BYTES = 4 * 1024 * 1024
# What a prompt set may ask: bounded, so a careless file cannot turn a check into a load test.
MAX_PROMPTS = 64
MAX_TOP_K = 20
MAX_GENERATE_TOKENS = 512
MAX_CONCURRENCY = 64
MAX_COPIES = 16
# The smallest batch the concurrency check counts: the public practice on this box is 24 requests at c8.
MIN_BATCH_CONCURRENCY = 8
# A probability below this is treated as this (log 1e-12 = -27.6 nats): a zero or missing mass never makes
# the KL infinite, and a token the served model pushed out of reach still weighs heavily.
MIN_PROBABILITY = 1e-12
# The server fields a reference keeps about the launch it was recorded on (never the whole server_info: it
# holds the API key in clear).
LAUNCH_FIELDS = (
    "version", "model_path", "tokenizer_path", "served_model_name", "tp_size", "dtype", "kv_cache_dtype",
    "quantization", "attention_backend", "prefill_attention_backend", "decode_attention_backend",
    "nsa_prefill_backend", "nsa_decode_backend", "dsa_prefill_backend", "dsa_decode_backend",
    "moe_runner_backend", "fp4_gemm_backend", "fp8_gemm_backend", "speculative_algorithm",
    "speculative_num_steps", "speculative_num_draft_tokens", "disable_cuda_graph", "mem_fraction_static",
    "chunked_prefill_size", "max_running_requests", "enable_deterministic_inference",
)  # fmt: skip


def verdict_path(state_dir: str, unit: str) -> str:
    """Where a host keeps the last check's verdict line for ``unit`` (the module writes it, ``doctor -i`` reads it)."""
    return f"{state_dir.rstrip('/')}/{unit}.quality"


class QualityInputError(ValueError):
    """A reference or prompt set that cannot be used: the message names the file, the entry and the fix."""


class NoVerdictError(RuntimeError):
    """The check cannot judge this server (another model or tokenizer, no logprobs, no answer): exit 2."""


@dataclass(frozen=True)
class Thresholds:
    """What a check tolerates (docs/quality.md: the measurements behind each default)."""

    # Measured on a real GPU (docs/quality.md, tests/fixtures/real-sglang/h100-quality-2026-12-06/): a restart and
    # MTP on (another kernel path) stay under 2e-5 mean and 5e-4 p99; an FP8 E4M3 KV cache 0.005 / 0.062; FP8 E5M2
    # 0.0075 / 0.23; a RoPE base the weights were not trained with 0.14 / 4.0. The mean catches a model that drifts
    # everywhere, the p99 one that drifts where it is unsure (KV precision shows there first).
    kl_mean: float = 0.01
    kl_p99: float = 0.1
    top1_agreement: float = 0.95
    # Greedy outputs part at near-ties under batching and precision changes: 0.125 to 0.375 nats there, measured.
    tie_margin: float = 0.5

    @classmethod
    def from_data(cls, data: Any, where: str) -> "Thresholds":
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise QualityInputError(f"{where}: thresholds must be a mapping, found {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise QualityInputError(f"{where}: unknown thresholds {unknown} (known: {', '.join(cls.__dataclass_fields__)})")
        values = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise QualityInputError(f"{where}: thresholds.{key} must be a finite number >= 0, found {value!r}")
            if key == "top1_agreement" and value > 1:
                raise QualityInputError(f"{where}: thresholds.top1_agreement is a share (0 to 1), found {value!r}")
            values[key] = float(value)
        return replace(cls(), **values)

    def merged(self, overrides: Optional[Mapping[str, Any]], where: str) -> "Thresholds":
        """These thresholds with ``overrides`` (a mapping of some of them) in their place, checked."""
        return Thresholds.from_data({**asdict(self), **dict(overrides or {})}, where)


# -- the prompt set ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QualityPrompt:
    """A prompt and the continuation scored after it; ``min_prompt_tokens`` bounds a long prompt from below
    (counted with the served tokenizer when a reference is recorded)."""

    name: str
    prompt: str
    continuation: str
    min_prompt_tokens: int = 0


@dataclass(frozen=True)
class PromptSet:
    name: str
    version: int
    prompts: Tuple[QualityPrompt, ...]
    top_k: int = 20
    generate_tokens: int = 48
    concurrency: int = MIN_BATCH_CONCURRENCY
    copies: int = 3


def _bounded_int(where: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise QualityInputError(f"{where}: {key} must be a whole number from {low} to {high}, found {value!r}")
    return value


def _text(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise QualityInputError(f"{where}: {key} must be a non-empty string")
    return value


def _name(where: str, key: str, value: Any) -> str:
    """A name a report shows (a prompt's, a model's): printable, at most 200 characters - an escape sequence in a
    reference never reaches a terminal."""
    text = _text(where, key, value)
    if not text.isprintable() or len(text) > 200:
        raise QualityInputError(f"{where}: {key} must be printable and at most 200 characters")
    return text


def parse_prompt_set(data: Any, source: str) -> PromptSet:
    """A prompt set from YAML data; errors name the file, the entry and the fix."""
    if not isinstance(data, dict):
        raise QualityInputError(f"{source}: want a mapping with name, version and prompts, found {type(data).__name__}")
    known = {"name", "version", "top_k", "generate_tokens", "batch", "prompts"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise QualityInputError(f"{source}: unknown keys {unknown} (allowed: {', '.join(sorted(known))})")
    name = _name(source, "name", data.get("name"))
    version = _bounded_int(source, "version", data.get("version"), 1, 10**6)
    batch = data.get("batch") or {}
    if not isinstance(batch, dict) or set(batch) - {"concurrency", "copies"}:
        raise QualityInputError(f"{source}: batch must be a mapping of concurrency and copies, found {batch!r}")
    entries = data.get("prompts")
    if not isinstance(entries, list) or not entries:
        raise QualityInputError(f"{source}: prompts must be a non-empty list")
    if len(entries) > MAX_PROMPTS:
        raise QualityInputError(f"{source}: {len(entries)} prompts, more than the {MAX_PROMPTS} a check takes")
    prompts: List[QualityPrompt] = []
    for number, entry in enumerate(entries, 1):
        where = f"{source}: prompt {number}"
        if not isinstance(entry, dict):
            raise QualityInputError(f"{where}: want a mapping with name, prompt and continuation, found {entry!r}")
        allowed = {"name", "prompt", "continuation", "context", "min_prompt_tokens"}
        extra = sorted(set(entry) - allowed)
        if extra:
            raise QualityInputError(f"{where}: unknown keys {extra} (allowed: {', '.join(sorted(allowed))})")
        prompt = _text(where, "prompt", entry.get("prompt"))
        if entry.get("context") is not None:
            try:
                context = gate.parse_context(where, entry["context"])
            except gate.ProbeFileError as err:
                raise QualityInputError(str(err)) from None
            prompt = gate.notes_prompt(str(entry.get("name") or f"prompt-{number}"), context, context.filler_chars, prompt)
        prompts.append(
            QualityPrompt(
                name=_name(where, "name", entry.get("name")), prompt=prompt,
                continuation=_text(where, "continuation", entry.get("continuation")),
                min_prompt_tokens=_bounded_int(where, "min_prompt_tokens", entry.get("min_prompt_tokens", 0), 0, 10**7),
            )  # fmt: skip
        )
    names = [p.name for p in prompts]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise QualityInputError(f"{source}: prompt names must be unique, repeated: {repeated}")
    return PromptSet(
        name=name, version=version, prompts=tuple(prompts),
        top_k=_bounded_int(source, "top_k", data.get("top_k", 20), 2, MAX_TOP_K),
        generate_tokens=_bounded_int(source, "generate_tokens", data.get("generate_tokens", 48), 1, MAX_GENERATE_TOKENS),
        concurrency=_bounded_int(source, "batch.concurrency", batch.get("concurrency", MIN_BATCH_CONCURRENCY), MIN_BATCH_CONCURRENCY, MAX_CONCURRENCY),
        copies=_bounded_int(source, "batch.copies", batch.get("copies", 3), 1, MAX_COPIES),
    )  # fmt: skip


def _read(path: "str | Path", limit: int, kind: str, parse: Callable[[str], Any]) -> Any:
    """A file read bounded and parsed; QualityInputError naming the file otherwise (a deep nesting included)."""
    try:
        raw = read_regular_file(path, limit)
    except OSError as err:
        raise QualityInputError(f"{path}: cannot read it ({err.strerror})") from None
    except UnreadableFileError as err:
        raise QualityInputError(f"{path}: {err}") from None
    try:
        return parse(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise QualityInputError(f"{path}: not a text file ({err.reason} at byte {err.start})") from None
    except (ValueError, RecursionError) as err:
        raise QualityInputError(f"{path}: not {kind} ({' '.join(str(err).split())[:200]})") from None


def _yaml(text: str) -> Any:
    import yaml  # control node only

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(str(err)) from None


def prompt_set_data(path: "str | Path | None" = None) -> Any:
    """The YAML data of a prompt set file (the shipped set when ``path`` is None), unparsed."""
    return _read(Path(path) if path else DEFAULT_PROMPTS, MAX_PROMPT_SET_BYTES, "YAML", _yaml)


def load_prompt_set(path: "str | Path | None" = None) -> PromptSet:
    return parse_prompt_set(prompt_set_data(path), str(Path(path) if path else DEFAULT_PROMPTS))


# -- talking to sglang -------------------------------------------------------------------------------------------
TopK = List[Tuple[float, int]]  # (logprob, token id), best first


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


@dataclass(frozen=True)
class Greedy:
    """A greedy output: its token ids and the top-k at each generated position."""

    ids: List[int]
    tops: List[TopK]

    def to_data(self) -> Dict[str, Any]:
        return {"ids": self.ids, "tops": [[list(pair) for pair in top] for top in self.tops]}


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
@dataclass(frozen=True)
class ReferencePrompt:
    name: str
    prompt: str
    continuation: str
    prompt_ids: List[int]
    continuation_ids: List[int]
    scored: List[TopK]
    greedy: Greedy
    continuation_logprobs: List[float]


@dataclass(frozen=True)
class Reference:
    served_model: str
    recorded: str
    launch: Dict[str, Any]
    prompt_set: Dict[str, Any]
    thresholds: Thresholds
    prompts: Tuple[ReferencePrompt, ...]

    @property
    def top_k(self) -> int:
        return int(self.prompt_set["top_k"])


def _ids(where: str, value: Any) -> List[int]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise QualityInputError(f"{where}: want a non-empty list of token ids")
    return value


def _tops(where: str, value: Any, count: int, top_k: int) -> List[TopK]:
    if not isinstance(value, list) or len(value) != count:
        raise QualityInputError(f"{where}: want {count} positions of top logprobs, found {len(value) if isinstance(value, list) else type(value).__name__}")
    positions: List[TopK] = []
    for index, entry in enumerate(value):
        if not isinstance(entry, list) or not 2 <= len(entry) <= top_k:
            raise QualityInputError(f"{where}[{index}]: want 2 to {top_k} [logprob, token_id] pairs")
        pairs: TopK = []
        for pair in entry:
            ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (int, float)) and not isinstance(pair[0], bool)
            ok = ok and isinstance(pair[1], int) and not isinstance(pair[1], bool) and pair[1] >= 0
            if not ok or not math.isfinite(pair[0]) or pair[0] > 1e-6:
                raise QualityInputError(f"{where}[{index}]: {str(pair)[:80]} is not a [logprob <= 0, token_id] pair")
            pairs.append((float(pair[0]), int(pair[1])))
        if any(pairs[i][0] < pairs[i + 1][0] for i in range(len(pairs) - 1)):
            raise QualityInputError(f"{where}[{index}]: the pairs are not best first")
        positions.append(pairs)
    return positions


def _logprobs(where: str, value: Any, count: int) -> List[float]:
    ok = isinstance(value, list) and len(value) == count
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v <= 1e-6 for v in value)
    if not ok:
        raise QualityInputError(f"{where}: want {count} finite logprobs <= 0, one per continuation token")
    return [float(v) for v in value]


def parse_reference(data: Any, source: str) -> Reference:
    """A reference from its JSON data; QualityInputError naming the file and the entry otherwise."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise QualityInputError(f"{source}: not a quality reference (want \"format\": {FORMAT!r}; record one with `sglang-deploy quality record`)")
    if data.get("format_version") != FORMAT_VERSION:
        raise QualityInputError(f"{source}: format_version {data.get('format_version')!r}; this sglang-deploy reads {FORMAT_VERSION}: record it again")
    served = _name(source, "served_model", data.get("served_model"))
    prompt_set = data.get("prompt_set")
    if not isinstance(prompt_set, dict):
        raise QualityInputError(f"{source}: prompt_set must be a mapping")
    _name(source, "prompt_set.name", prompt_set.get("name"))
    top_k = _bounded_int(source, "prompt_set.top_k", prompt_set.get("top_k"), 2, MAX_TOP_K)
    _bounded_int(source, "prompt_set.generate_tokens", prompt_set.get("generate_tokens"), 1, MAX_GENERATE_TOKENS)
    _bounded_int(source, "prompt_set.concurrency", prompt_set.get("concurrency"), MIN_BATCH_CONCURRENCY, MAX_CONCURRENCY)
    _bounded_int(source, "prompt_set.copies", prompt_set.get("copies"), 1, MAX_COPIES)
    entries = data.get("prompts")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_PROMPTS:
        raise QualityInputError(f"{source}: prompts must be a list of 1 to {MAX_PROMPTS}")
    prompts = []
    for number, entry in enumerate(entries, 1):
        where = f"{source}: prompts[{number - 1}]"
        if not isinstance(entry, dict):
            raise QualityInputError(f"{where}: not a mapping")
        continuation_ids = _ids(f"{where}.continuation_ids", entry.get("continuation_ids"))
        greedy = entry.get("greedy")
        if not isinstance(greedy, dict):
            raise QualityInputError(f"{where}.greedy: not a mapping of ids and tops")
        greedy_ids = _ids(f"{where}.greedy.ids", greedy.get("ids"))
        prompts.append(ReferencePrompt(
            name=_name(where, "name", entry.get("name")), prompt=_text(where, "prompt", entry.get("prompt")),
            continuation=_text(where, "continuation", entry.get("continuation")),
            prompt_ids=_ids(f"{where}.prompt_ids", entry.get("prompt_ids")), continuation_ids=continuation_ids,
            scored=_tops(f"{where}.scored", entry.get("scored"), len(continuation_ids), top_k),
            greedy=Greedy(greedy_ids, _tops(f"{where}.greedy.tops", greedy.get("tops"), len(greedy_ids), top_k)),
            continuation_logprobs=_logprobs(f"{where}.continuation_logprobs", entry.get("continuation_logprobs"), len(continuation_ids)),
        ))  # fmt: skip
    # What the report shows of the launch: the known fields, each a short printable scalar.
    given = data.get("launch") if isinstance(data.get("launch"), dict) else {}
    launch = {key: given[key] for key in LAUNCH_FIELDS if key in given and _printable_scalar(given[key])}
    recorded = str(data.get("recorded") or "?")
    if not recorded.isprintable() or len(recorded) > 40:
        raise QualityInputError(f"{source}: recorded must be a printable time")
    return Reference(served, recorded, launch, {k: prompt_set[k] for k in ("name", "version", "top_k", "generate_tokens",
                                                                           "concurrency", "copies") if k in prompt_set},
                     Thresholds.from_data(data.get("thresholds"), source), tuple(prompts))  # fmt: skip


def _printable_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (int, float, bool)) or (isinstance(value, str) and value.isprintable() and len(value) <= 200)


def reference_data(path: "str | Path") -> Any:
    """A reference file's JSON, read bounded; QualityInputError naming the file otherwise."""
    return _read(path, MAX_REFERENCE_BYTES, "JSON", json.loads)


def load_reference(path: "str | Path") -> Reference:
    return parse_reference(reference_data(path), str(path))


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


# -- command line (python3 -m sglang_deploy_host.quality) --------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python3 -m sglang_deploy_host.quality record|check``: the same as ``sglang-deploy quality`` against one
    URL, for a machine with only this package (the device runs). Exit 0 PASS, 1 FAIL, 2 no verdict."""
    parser = argparse.ArgumentParser(prog="python3 -m sglang_deploy_host.quality", description=main.__doc__)
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
