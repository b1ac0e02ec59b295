"""What an sglang server's start log says about memory: the launch it parsed and what it measured.

sglang (0.5.10.post1 to 0.5.23) logs, per start, ``server_args=ServerArgs(...)`` (every argument, as a
dataclass repr), then the free GPU memory before and after the weights, the KV pool it allocated, the
free memory when the pool is done, each CUDA-graph capture (``mem usage`` = what the graphs took) with a
progress line per captured batch size, and the final sizes with ``available_gpu_mem``. Its "GB" are GiB
(``get_available_gpu_memory`` divides by 1 << 30). The memory planner is checked against these readings
(``scripts/device/planner_vs_sglang.py``, ``tests/unit/memory/test_glm5_architecture.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.launch import flagtable
from sglang_deploy.launch.flagtable import LaunchSettings

GIB_MIB = 1024.0

# The first match of each (None when the start did not get that far).
_READINGS = {
    "mem_fraction_static": r"server_args=ServerArgs\(.*?\bmem_fraction_static=([0-9.]+)",
    "free_before_load_gib": r"Load weight begin\. avail mem=([0-9.]+) GB",
    "free_after_load_gib": r"Load weight end\..*?avail mem=([0-9.]+) GB",
    "weights_gib": r"Load weight end\..*?mem usage=([0-9.]+) GB",
    "kv_tokens": r"KV Cache is allocated\..*?#tokens: (\d+)",
    "kv_size_gib": r"KV Cache is allocated\..*?KV size: ([0-9.]+) GB",
    "free_after_pool_gib": r"Memory pool end\. avail mem=([0-9.]+) GB",
    "free_after_prefill_graphs_gib": r"Capture target prefill CUDA graph end\..*?avail mem=([0-9.]+) GB",
    "free_before_decode_graphs_gib": r"Capture target decode CUDA graph begin\..*?avail mem=([0-9.]+) GB",
    "decode_graphs_gib": r"Capture target decode CUDA graph end\..*?mem usage=([0-9.]+) GB",
    "free_after_decode_graphs_gib": r"Capture target decode CUDA graph end\..*?avail mem=([0-9.]+) GB",
    "max_total_num_tokens": r"max_total_num_tokens=(\d+)",
    "available_gpu_mem_gib": r"max_total_num_tokens=.*?available_gpu_mem=([0-9.]+) GB",
    "context_len": r"max_total_num_tokens=.*?context_len=(\d+)",
    # EAGLE/MTP: the target's verify graphs and the draft's own (they replace the decode graphs).
    "verify_graphs_gib": r"Capture target verify CUDA graph end\..*?mem usage=([0-9.]+) GB",
    "draft_decode_graphs_gib": r"Capture draft decode CUDA graph end\..*?mem usage=([0-9.]+) GB",
    "draft_extend_graphs_gib": r"Capture draft extend CUDA graph end\..*?mem usage=([0-9.]+) GB",
}
# The second match of each: an EAGLE/MTP draft loads after the target and gets a pool of its own.
_SECOND_READINGS = {
    "draft_weights_gib": r"Load weight end\..*?mem usage=([0-9.]+) GB",
    "draft_kv_size_gib": r"KV Cache is allocated\..*?KV size: ([0-9.]+) GB",
}
_INTEGERS = ("kv_tokens", "max_total_num_tokens", "context_len")
_MODEL_CLASS = re.compile(r"Load weight end\..*?type=(\w+)")
_READY = "The server is fired up and ready to roll!"
# tqdm's description while decode graphs are captured, largest batch first (0.5.17
# decode_cuda_graph_runner.py: "Capturing batches (bs={bs} avail_mem={mem:.2f} GB)").
_CAPTURE_STEP = re.compile(r"Capturing batches \(bs=(\d+) avail_mem=([0-9.]+) GB\)")
# ServerArgs(...) fields the planner reads, as sglang names them.
_ARG = r"\b{name}=('(?:[^'\\]|\\.)*'|None|True|False|-?\d+(?:\.\d+)?)"
LAUNCH_FIELDS = (
    "model_path", "tp_size", "mem_fraction_static", "max_running_requests", "chunked_prefill_size",
    "kv_cache_dtype", "attention_backend", "dsa_prefill_backend", "dsa_decode_backend", "nsa_prefill_backend",
    "nsa_decode_backend", "cuda_graph_max_bs", "cuda_graph_max_bs_decode", "disable_cuda_graph", "page_size",
    "speculative_algorithm", "speculative_num_draft_tokens",
)  # fmt: skip


@dataclass(frozen=True)
class StartLog:
    """One start's readings (MiB where the name says so, converted from sglang's GiB)."""

    readings: dict[str, float | int | None]
    server_args: dict[str, Any]
    model_class: str | None
    ready: bool
    # (batch size, free MiB) per decode-graph capture step, in capture order (largest batch first).
    capture_steps: list[tuple[int, float]] = field(default_factory=list)

    def mib(self, key: str) -> float | None:
        value = self.readings.get(key)
        return None if value is None else round(float(value) * GIB_MIB, 1)

    @property
    def kv_bytes_per_token(self) -> float | None:
        """The pools' bytes per token (sglang's KV size over its tokens, an EAGLE/MTP draft's pool of the
        same tokens included; 2-decimal GiB: +-0.013 %)."""
        size, tokens = self.readings.get("kv_size_gib"), self.readings.get("kv_tokens")
        if not size or not tokens:
            return None
        return (float(size) + float(self.readings.get("draft_kv_size_gib") or 0)) * (1 << 30) / float(tokens)

    @property
    def graphs_gib(self) -> float | None:
        """What the decode-time CUDA graphs took: the decode graphs, or EAGLE/MTP's verify and draft graphs."""
        if self.readings.get("decode_graphs_gib") is not None:
            return float(self.readings["decode_graphs_gib"] or 0)
        if self.readings.get("verify_graphs_gib") is None:
            return None
        # A draft phase whose backend captures no graphs (flashinfer MLA's draft extend) logs none.
        spec = ("verify_graphs_gib", "draft_decode_graphs_gib", "draft_extend_graphs_gib")
        return sum(float(self.readings.get(k) or 0) for k in spec)


def parse(text: str) -> StartLog:
    """A start log (carriage returns of the progress bars read as line ends)."""
    text = text.replace("\r", "\n")
    readings: dict[str, float | int | None] = {}
    for key, pattern in _READINGS.items():
        match = re.search(pattern, text)
        if match is None:
            readings[key] = None
        else:
            readings[key] = int(match.group(1)) if key in _INTEGERS else float(match.group(1))
    for key, pattern in _SECOND_READINGS.items():
        matches = re.findall(pattern, text)
        readings[key] = float(matches[1]) if len(matches) > 1 else None
    model = _MODEL_CLASS.search(text)
    steps: dict[int, float] = {}
    for match in _CAPTURE_STEP.finditer(text):
        steps.setdefault(int(match.group(1)), float(match.group(2)) * GIB_MIB)
    return StartLog(
        readings=readings,
        server_args=server_args(text),
        model_class=model.group(1) if model else None,
        ready=_READY in text,
        capture_steps=list(steps.items()),
    )


def server_args(text: str) -> dict[str, Any]:
    """The :data:`LAUNCH_FIELDS` of the first ``server_args=ServerArgs(...)`` line, typed."""
    start = text.find("server_args=ServerArgs(")
    if start < 0:
        return {}
    line = text[start:].split("\n", 1)[0]
    out: dict[str, Any] = {}
    for name in LAUNCH_FIELDS:
        match = re.search(_ARG.format(name=name), line)
        if match is not None:
            out[name] = _value(match.group(1))
    return out


def _value(raw: str) -> Any:
    if raw.startswith("'"):
        return raw[1:-1]
    if raw in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[raw]
    return float(raw) if "." in raw else int(raw)


def launch_settings(args: dict[str, Any], lane: str) -> LaunchSettings:
    """ServerArgs fields as the typed launch the planner reads (the flag table's rows; ``tp_size`` is ``tp-size``,
    unset ones left out; sglang's resolved ``dsa`` attention backend means "none given")."""
    flags = {name.replace("_", "-"): value for name, value in args.items() if value is not None and value is not False}
    if flags.get("attention-backend") in ("dsa", "nsa"):
        flags.pop("attention-backend")
    return flagtable.settings_of(flags, lane, variable="ServerArgs")
