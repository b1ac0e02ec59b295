"""The quality check's files: the prompt set it asks and the reference it compares with, their formats, bounds
and thresholds (the check itself is quality.py). STDLIB ONLY at import time, Python >= 3.9; only
:func:`prompt_set_data` (a YAML file) needs PyYAML, imported when called.

Every file is read bounded (``MAX_REFERENCE_BYTES``, ``MAX_PROMPT_SET_BYTES``) and parsed whole before a
request is sent: a malformed entry is a :class:`QualityInputError` naming the file, the entry and the fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from . import gate
from ..fs.files import UnreadableFileError, read_regular_file


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


class QualityInputError(ValueError):
    """A reference or prompt set that cannot be used: the message names the file, the entry and the fix."""


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


TopK = List[Tuple[float, int]]  # (logprob, token id), best first


@dataclass(frozen=True)
class Greedy:
    """A greedy output: its token ids and the top-k at each generated position."""

    ids: List[int]
    tops: List[TopK]

    def to_data(self) -> Dict[str, Any]:
        return {"ids": self.ids, "tops": [[list(pair) for pair in top] for top in self.tops]}


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
