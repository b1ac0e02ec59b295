#!/usr/bin/env python3
"""What a local checkpoint holds, read from its JSON files and safetensors headers alone.

STDLIB ONLY, Python >= 3.9: ``sglang-deploy checkpoint`` and ``plan --checkpoint`` on the control node and
the ``sglang_checkpoint`` module on the GPU host run this one code. It reads ``config.json``,
``model.safetensors.index.json`` (or the single ``model.safetensors``), ``hf_quant_config.json`` where
present, and the header of every shard (safetensors.py: the 8-byte length, then the JSON header; never a
tensor's data), so a 400 GB checkpoint is judged in seconds and a few MB of memory.

What it judges, for sglang (read in the pinned 0.5.10.post1 and 0.5.23):

* **The MTP draft (NEXTN/EAGLE).** sglang's draft model loads only the names under
  ``model.layers.{num_hidden_layers}`` and skips what is absent without a word
  (``models/deepseek_common/deepseek_weight_loader.py``); its own ``embed_tokens`` and ``shared_head.head``
  are never loaded (the target's are shared). A checkpoint that declares ``num_nextn_predict_layers`` but
  ships no such tensors (``lukealonso/GLM-5-NVFP4``) therefore drafts with uninitialised weights: acceptance
  about 1, slower than no speculative decoding. The expected names are those of the last target layer
  renumbered, without its quantization scales, plus ``eh_proj``, ``enorm``, ``hnorm`` and
  ``shared_head.norm``. Under ``modelopt_fp4`` sglang builds the draft unquantized (``deepseek_nextn.py``
  sets ``quant_config = None``), so a draft tensor that is not BF16/F16/F32 cannot load as it should.
  Verdict ``speculative``: ``usable``, ``missing`` or ``wrong-dtype``.
* **Shared-expert fusion.** sglang 0.5.10 fuses the shared expert into the routed experts for GLM-5 and
  DeepSeek-V3 without comparing their dtypes (``determine_num_fused_shared_experts``); where the shared
  expert's dtype differs from the routed experts' (a BF16 shared expert beside NVFP4 experts, as in the
  GLM-5.1 NVFP4 checkpoints), ``--disable-shared-experts-fusion`` is required.

The draft's bytes per GPU under tensor parallelism follow sglang's layers: the MLA down-projections
(``q_a_proj``, ``kv_a_proj_with_mqa``), the DSA indexer, the router, ``eh_proj`` and every norm are
replicated on each rank; the experts, ``q_b_proj``, ``kv_b_proj`` and ``o_proj`` are split.

    python3 -m sglang_deploy_host.model.inspection DIR [--json]   exit 0: read (whatever the verdict); 2: not readable
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import stat
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import safetensors
from ..fs.files import PathLike, UnreadableFileError, read_regular_file

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_SHARD = "model.safetensors"
QUANT_CONFIG_NAME = "hf_quant_config.json"
# A config is kilobytes; an index of a large MoE names hundreds of thousands of tensors (tens of MB).
JSON_MAX_BYTES = 4 << 20
INDEX_MAX_BYTES = 64 << 20

USABLE, MISSING, WRONG_DTYPE = "usable", "missing", "wrong-dtype"
# The dtypes sglang can load into the unquantized draft it builds under modelopt_fp4.
UNQUANTIZED_DTYPES = frozenset({"BF16", "F16", "F32"})
# A quantized target layer's extra tensors, which an unquantized draft layer does not have.
SCALE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale")
# The draft layer's own tensors beside its decoder layer.
DRAFT_ONLY_NAMES = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")
# What sglang's draft loader never loads from the draft layer: it shares the target's.
DRAFT_LOADER_SKIPS = ("embed_tokens", "shared_head.head")
# Tensors every tensor-parallel rank holds whole (sglang's ReplicatedLinear, nn.Linear, norms, the router).
_REPLICATED = re.compile(
    r"(norm|\.q_a_proj\.|\.kv_a_proj_with_mqa\.|\.indexer\.|\.mlp\.gate\.|\.eh_proj\.|e_score_correction_bias)"
)
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_ROUTED = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
_SHARED = re.compile(r"\.mlp\.shared_experts\.(gate|up|down)_proj\.weight$")

# The verdict kept beside the weights (inspect_kept): its format, and the largest file read back.
VERDICT_SCHEMA = 1
VERDICT_MAX_BYTES = 16 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or is malformed; the message is one line, without a traceback."""


class AbsentCheckpointError(CheckpointError):
    """No checkpoint there yet: no directory, no config.json, or neither the index nor a single shard."""


class IncompleteCheckpointError(CheckpointError):
    """A shard the index names is absent or shorter than its header says: a fetch that has not finished."""


@dataclass
class Inspection:
    """What :func:`inspect` found; :meth:`to_dict` is ``sglang-deploy checkpoint --json``."""

    path: str
    architecture: str
    model_type: str
    num_layers: int
    draft_layers_declared: int
    quantization: Optional[str]
    shards: int
    shard_files: List[str]
    tensors: int
    tensor_bytes: int
    draft_tensors_present: List[str] = field(default_factory=list)
    draft_tensors_missing: List[str] = field(default_factory=list)
    draft_dtypes: Dict[str, int] = field(default_factory=dict)
    draft_bytes: int = 0
    # The draft tensors sglang loads (not its own embedding or head), by how tensor parallelism stores them.
    draft_loaded_replicated_bytes: int = 0
    draft_loaded_split_bytes: int = 0
    # What the draft allocates in BF16 for its own embedding and head (vocab x hidden, twice), never loaded
    # from the checkpoint: sglang swaps in the target's once the draft has loaded.
    draft_embedding_and_head_bytes: int = 0
    draft_tensors_wrong_dtype: List[str] = field(default_factory=list)
    speculative: str = MISSING
    speculative_reason: str = ""
    routed_expert_dtypes: Dict[str, int] = field(default_factory=dict)
    shared_expert_dtypes: Dict[str, int] = field(default_factory=dict)
    shared_experts_fusion: str = "no-shared-experts"  # or: same-dtype, dtypes-differ

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @property
    def draft_layer(self) -> int:
        return self.num_layers

    def summary(self) -> str:
        """The text form: what the checkpoint is and what it means for a launch."""
        lines = [
            f"{self.path}: {self.architecture} ({self.model_type}), {self.num_layers} layers, "
            f"{self.tensors:,} tensors in {self.shards} shard(s), {self.tensor_bytes / 1e9:,.1f} GB"
            + (f", quantization {self.quantization}" if self.quantization else "")
        ]
        lines.append(f"MTP draft layer for speculative decoding: {self.speculative.upper()}")
        lines.append(f"  {self.speculative_reason[:1].upper()}{self.speculative_reason[1:]}")
        if self.draft_tensors_present:
            dtypes = ", ".join(f"{k} {v}" for k, v in sorted(self.draft_dtypes.items()))
            lines.append(
                f"  draft layer {self.draft_layer}: {len(self.draft_tensors_present)} tensors present ({dtypes}), "
                f"{self.draft_bytes / 1e9:,.2f} GB"
            )
        if self.draft_tensors_missing:
            lines.append(
                f"  {len(self.draft_tensors_missing)} expected tensors absent, e.g. {self.draft_tensors_missing[0]}"
            )
        if self.shared_experts_fusion == "dtypes-differ":
            lines.append(
                f"Shared experts {_counts(self.shared_expert_dtypes)} beside routed experts "
                f"{_counts(self.routed_expert_dtypes)}: sglang fuses them without checking; launch with "
                "--disable-shared-experts-fusion"
            )
        elif self.shared_experts_fusion == "same-dtype":
            lines.append(f"Shared and routed experts are both {_counts(self.routed_expert_dtypes)}: fusion is safe")
        return "\n".join(lines)

    def draft_bytes_per_gpu(self, tp_size: int) -> int:
        """What the draft's loaded tensors take on one GPU at this tensor-parallel size."""
        if tp_size < 1:
            raise ValueError(f"tp_size {tp_size} is not a size")
        return self.draft_loaded_replicated_bytes + -(-self.draft_loaded_split_bytes // tp_size)


def _counts(counts: Dict[str, int]) -> str:
    return "/".join(sorted(counts)) or "none"


def split_over_tensor_parallel(name: str) -> bool:
    """Whether sglang splits this tensor over the TP ranks (False: every rank holds it whole)."""
    return _REPLICATED.search(name) is None


def _json(path: Path, what: str, max_bytes: int) -> Any:
    try:
        raw = read_regular_file(path, max_bytes)
    except FileNotFoundError:
        raise AbsentCheckpointError(f"{what} {path} does not exist") from None
    except (OSError, UnreadableFileError) as err:
        raise CheckpointError(f"{what} {path}: {getattr(err, 'strerror', None) or err}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{what} {path} is not JSON ({safetensors.shown(str(err))})") from None
    except RecursionError:
        raise CheckpointError(f"{what} {path} is not a checkpoint's (JSON nested too deeply)") from None


# The largest count a config may give (a real model's are far below): a hostile one would make the inspection
# build millions of names.
MAX_COUNTS = {"num_hidden_layers": 10_000, "num_nextn_predict_layers": 16, "vocab_size": 10_000_000, "hidden_size": 1_000_000}


def _int(config: Dict[str, Any], key: str, default: Optional[int] = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if value is None:
            raise CheckpointError(f"{CONFIG_NAME} has no {key}")
        raise CheckpointError(f"{CONFIG_NAME}: {key} = {safetensors.shown(repr(value))} is not a count")
    if value > MAX_COUNTS.get(key, value):
        raise CheckpointError(f"{CONFIG_NAME}: {key} = {value} is more than any real model has (at most {MAX_COUNTS[key]:,})")
    return value


def _within(root: Path, path: Path, what: str) -> Path:
    """``path`` (a file of the checkpoint), if it lies inside the checkpoint once links are resolved - or, for a
    Hugging Face cache snapshot (``.../snapshots/<revision>``), in its repository's ``blobs/``; CheckpointError
    otherwise: a link out of the checkpoint would make the inspection read (and judge) a file it does not hold."""
    real = Path(os.path.realpath(path))
    base = Path(os.path.realpath(root))
    homes = [base] + ([base.parent.parent / "blobs"] if base.parent.name == "snapshots" else [])
    if not any(real == home or home in real.parents for home in homes):
        raise CheckpointError(
            f"{what} {safetensors.shown(str(path))} is a link out of the checkpoint (to {safetensors.shown(str(real))}): "
            "not read. Fix: copy the file into the checkpoint directory"
        )
    return path


def _text_config(config: Any) -> Dict[str, Any]:
    if not isinstance(config, dict):
        raise CheckpointError(f"{CONFIG_NAME} is not a JSON object")
    text = config.get("text_config")
    return dict(text) if isinstance(text, dict) else config


def _quantization(config: Dict[str, Any], quant: Any) -> Optional[str]:
    """The quantization the checkpoint declares: hf_quant_config.json's quant_algo, else config.json's."""
    for source in (quant, config.get("quantization_config")):
        if not isinstance(source, dict):
            continue
        nested = source.get("quantization")
        for part in (nested if isinstance(nested, dict) else {}, source):
            for key in ("quant_algo", "quant_method"):
                if isinstance(part.get(key), str):
                    return str(part[key])
    return None


def _weight_map(directory: Path) -> Tuple[Dict[str, str], List[str]]:
    """tensor -> shard from the index (or the single shard's own names later), and the shard names."""
    index_path = directory / INDEX_NAME
    if not index_path.exists() and not index_path.is_symlink():
        if (directory / SINGLE_SHARD).exists():
            return {}, [SINGLE_SHARD]
        raise AbsentCheckpointError(f"neither {INDEX_NAME} nor {SINGLE_SHARD} in {directory}")
    index = _json(_within(directory, index_path, "the index"), "the index", INDEX_MAX_BYTES)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{INDEX_NAME} has no weight_map (tensor -> shard file)")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or shard.startswith("/") or ".." in Path(shard).parts or not shard.isprintable():
            raise CheckpointError(
                f"{INDEX_NAME}: tensor {safetensors.shown(str(tensor))!r} maps to an invalid file {safetensors.shown(str(shard))!r}"
            )
    return weight_map, sorted(set(weight_map.values()))


def inspect(directory: PathLike) -> Inspection:
    """Inspect the checkpoint in ``directory``; CheckpointError (IncompleteCheckpointError for a fetch that
    has not finished) when it cannot be read."""
    root = Path(directory)
    if not root.exists():
        raise AbsentCheckpointError(f"{root} does not exist")
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a directory")
    full_config = _json(_within(root, root / CONFIG_NAME, CONFIG_NAME), CONFIG_NAME, JSON_MAX_BYTES)
    config = _text_config(full_config)
    quant_path = root / QUANT_CONFIG_NAME
    quant = _json(_within(root, quant_path, QUANT_CONFIG_NAME), QUANT_CONFIG_NAME, JSON_MAX_BYTES) if quant_path.exists() else None
    architectures = full_config.get("architectures") if isinstance(full_config, dict) else None
    architecture = str(architectures[0]) if isinstance(architectures, list) and architectures else "unknown"
    layers = _int(config, "num_hidden_layers")
    declared = _int(config, "num_nextn_predict_layers", 0)
    weight_map, shard_names = _weight_map(root)

    embedding = 2 * 2 * _int(config, "vocab_size", 0) * _int(config, "hidden_size", 0)
    scan = _Scan(layers, weight_map)
    for shard in shard_names:
        scan.shard(root, shard)
    if scan.tensors == 0:
        raise CheckpointError(f"{root}: the shards hold no tensors")
    return scan.result(
        path=str(root), architecture=architecture, model_type=str(full_config.get("model_type") or "unknown"),
        declared=declared, quantization=_quantization(full_config, quant), shards=len(shard_names),
        shard_files=shard_names, draft_embedding_and_head_bytes=embedding,
    )  # fmt: skip


class _Scan:
    """One pass over the shards' headers, keeping only what the verdicts need (a header at a time)."""

    def __init__(self, layers: int, weight_map: Dict[str, str]) -> None:
        self.layers = layers
        self.weight_map = weight_map
        self.named: Dict[str, int] = {}  # shard -> how many tensors the index puts there
        for owner in weight_map.values():
            self.named[owner] = self.named.get(owner, 0) + 1
        self.tensors = 0
        self.tensor_bytes = 0
        self.last_layer: List[str] = []  # layer N-1's names: the expected draft names, renumbered
        self.draft: Dict[str, Tuple[str, int]] = {}  # name -> (dtype, bytes), layers >= N
        self.routed: Dict[str, int] = {}
        self.shared: Dict[str, int] = {}
        self.draft_routed: Dict[str, int] = {}
        self.draft_shared: Dict[str, int] = {}

    def shard(self, root: Path, shard: str) -> None:
        path = root / shard
        if not path.exists():
            raise IncompleteCheckpointError(f"shard {safetensors.shown(shard)} named by {INDEX_NAME} is missing")
        _within(root, path, "shard")
        try:
            header = safetensors.read_header(path)
        except safetensors.ShortFileError as err:
            raise IncompleteCheckpointError(f"shard {shard}: {err}") from None
        except safetensors.HeaderError as err:
            raise CheckpointError(f"shard {shard}: {err}") from None
        except OSError as err:
            raise CheckpointError(f"shard {shard}: {err.strerror}") from None
        if header.file_size < header.expected_size:
            raise IncompleteCheckpointError(
                f"shard {shard} is {header.file_size} bytes, shorter than the {header.expected_size} its header says"
            )
        if header.file_size > header.expected_size:
            raise CheckpointError(
                f"shard {shard} is {header.file_size} bytes, longer than the {header.expected_size} its header says"
            )
        weight_map = self.weight_map
        if weight_map:
            held = sum(1 for name in header.tensors if weight_map.get(name) == shard)
            if held != self.named.get(shard, 0):
                absent = next(n for n, owner in weight_map.items() if owner == shard and n not in header.tensors)
                raise CheckpointError(f"{INDEX_NAME} puts {safetensors.shown(absent)} in {shard}, whose header does not hold it")
        for name, tensor in header.tensors.items():
            self.tensor(name, tensor)

    def tensor(self, name: str, tensor: safetensors.Tensor) -> None:
        self.tensors += 1
        self.tensor_bytes += tensor.nbytes
        match = _LAYER.fullmatch(name)
        layer = int(match.group(1)) if match else -1
        if layer >= self.layers:
            self.draft[name] = (tensor.dtype, tensor.nbytes)
            experts = (self.draft_routed, self.draft_shared)
        else:
            if layer == self.layers - 1:
                self.last_layer.append(match.group(2) if match else name)
            experts = (self.routed, self.shared)
        for pattern, counts in zip((_ROUTED, _SHARED), experts):
            if pattern.search(name):
                counts[tensor.dtype] = counts.get(tensor.dtype, 0) + 1

    def expected_draft(self, declared: int) -> List[str]:
        names = [n for n in self.last_layer if not n.endswith(SCALE_SUFFIXES)] + list(DRAFT_ONLY_NAMES)
        return sorted({f"model.layers.{self.layers + j}.{n}" for j in range(max(declared, 1)) for n in names})

    def result(self, *, declared: int, **kwargs: Any) -> Inspection:
        missing = [n for n in self.expected_draft(declared) if n not in self.draft]
        loaded = {n: v for n, v in self.draft.items() if not any(f".{s}." in n for s in DRAFT_LOADER_SKIPS)}
        wrong = sorted(n for n, (dtype, _) in loaded.items() if dtype not in UNQUANTIZED_DTYPES)
        dtypes: Dict[str, int] = {}
        for dtype, _ in self.draft.values():
            dtypes[dtype] = dtypes.get(dtype, 0) + 1
        inspection = Inspection(
            num_layers=self.layers, draft_layers_declared=declared, tensors=self.tensors,
            tensor_bytes=self.tensor_bytes, draft_tensors_present=sorted(self.draft),
            draft_tensors_missing=missing, draft_dtypes=dtypes,
            draft_bytes=sum(size for _, size in self.draft.values()),
            draft_loaded_replicated_bytes=sum(s for n, (_, s) in loaded.items() if not split_over_tensor_parallel(n)),
            draft_loaded_split_bytes=sum(s for n, (_, s) in loaded.items() if split_over_tensor_parallel(n)),
            draft_tensors_wrong_dtype=wrong, routed_expert_dtypes=dict(self.routed),
            shared_expert_dtypes=dict(self.shared), **kwargs,
        )  # fmt: skip
        inspection.speculative, inspection.speculative_reason = _draft_verdict(inspection)
        inspection.shared_experts_fusion = _fusion(self.routed, self.shared, self.draft_routed, self.draft_shared)
        return inspection


def _draft_verdict(found: Inspection) -> Tuple[str, str]:
    n = found.draft_layer
    if found.draft_tensors_missing:
        declared = (
            f"the config declares {found.draft_layers_declared} draft layer(s) (num_nextn_predict_layers)"
            if found.draft_layers_declared
            else "the config declares no draft layer (num_nextn_predict_layers)"
        )
        return MISSING, (
            f"{declared} but draft layer {n} is missing ({len(found.draft_tensors_missing)} of its tensors absent, "
            f"model.layers.{n}.*). sglang loads this checkpoint without an error and drafts with uninitialised "
            "weights: acceptance about 1, slower than no speculative decoding. Serve it without speculative "
            "flags, or serve a checkpoint with the draft layer restored (docs/performance.md, 'Serving MTP')."
        )
    if found.draft_tensors_wrong_dtype:
        first = found.draft_tensors_wrong_dtype[0]
        return WRONG_DTYPE, (
            f"draft layer {n} is there, but {len(found.draft_tensors_wrong_dtype)} of its tensors are quantized "
            f"(e.g. {first}); sglang builds the draft unquantized (BF16) under modelopt_fp4 and cannot load them. "
            "Serve a checkpoint whose draft layer is BF16."
        )
    return USABLE, f"draft layer {n} is complete and unquantized: speculative decoding (EAGLE/NEXTN) can use it."


def _fusion(*counts: Dict[str, int]) -> str:
    routed, shared, draft_routed, draft_shared = counts
    if not shared and not draft_shared:
        return "no-shared-experts"
    for r, s in ((routed, shared), (draft_routed, draft_shared)):
        if r and s and set(r) != set(s):
            return "dtypes-differ"
    return "same-dtype"


# -- the verdict kept beside the weights ---------------------------------------------------------------
def verdict_path(directory: PathLike) -> str:
    """Where the verdict is kept by default: beside the weights, as the hf_model role keeps its manifest."""
    return f"{str(directory).rstrip('/')}.checkpoint.json"


def _identity(path: Path) -> Optional[List[Any]]:
    """What says a file is the one inspected: size, mtime and inode (None: absent)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return [info.st_size, info.st_mtime_ns, info.st_ino]


def _key(root: Path, shards: Sequence[str]) -> Dict[str, Any]:
    names = [CONFIG_NAME, INDEX_NAME, QUANT_CONFIG_NAME, *shards]
    return {name: _identity(root / name) for name in names}


def _safe_directory(path: Path) -> Optional[str]:
    """Why a verdict may not be kept in (or read from) this directory: None when root or this user owns it
    and nobody else can write it, so nobody else can plant or swap a verdict there."""
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"{path}: {err.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory (a link?)"
    if info.st_uid not in (0, os.geteuid()):
        return f"{path} is owned by uid {info.st_uid}"
    if info.st_mode & 0o022:
        return f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def read_kept(directory: PathLike, verdict_path: PathLike) -> Optional[Inspection]:
    """The kept verdict, if it is for these very files; None otherwise (absent, another checkpoint, a file
    changed since, a file or directory others could have written)."""
    root, path = Path(directory), Path(verdict_path)
    if _safe_directory(path.parent) is not None:
        return None
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
            return None
        kept = json.loads(read_regular_file(path, VERDICT_MAX_BYTES).decode("utf-8"))
    except (OSError, UnreadableFileError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("schema") != VERDICT_SCHEMA or kept.get("path") != str(root):
        return None
    shards = kept.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, str) for s in shards):
        return None
    if kept.get("key") != _key(root, shards):
        return None
    try:
        return Inspection(**kept["inspection"])
    except (KeyError, TypeError):
        return None


def keep(directory: PathLike, verdict_path: PathLike, inspection: Inspection) -> Optional[str]:
    """Write the verdict for these files (a new file, renamed into place; nothing followed); the reason
    when it may not be kept there."""
    root, path = Path(directory), Path(verdict_path)
    why = _safe_directory(path.parent)
    if why is not None:
        return why
    shards = inspection.shard_files
    data = {"schema": VERDICT_SCHEMA, "path": str(root), "shards": shards, "key": _key(root, shards),
            "inspection": inspection.to_dict()}  # fmt: skip
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o644)
            json.dump(data, handle, sort_keys=True)
            handle.write("\n")
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line of ``sglang-deploy checkpoint`` and ``python3 -m sglang_deploy_host.model.inspection``."""
    parser.add_argument("directory", help="the checkpoint directory (config.json, the index, the shards)")
    parser.add_argument("--json", action="store_true", help="print the inspection as one JSON object")


def run(directory: str, as_json: bool) -> int:
    """Print the inspection; 0 when the checkpoint could be read (whatever the verdict), 2 with one line
    on stderr when it could not."""
    try:
        found = inspect(directory)
    except CheckpointError as err:
        print(f"checkpoint {directory}: {err}", file=sys.stderr)
        return 2
    print(json.dumps(found.to_dict(), indent=2, sort_keys=True) if as_json else found.summary())
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sglang_deploy_host.model.inspection", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args.directory, args.json)


if __name__ == "__main__":
    sys.exit(main())
