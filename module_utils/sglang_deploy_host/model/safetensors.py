"""A safetensors file's header, read without touching its tensor data.

STDLIB ONLY, Python >= 3.9 (hosts run it: the weights' completeness check and the checkpoint
inspection). A safetensors file is an 8-byte little-endian header length, that many bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, offsets relative to
the end of the header), then the tensors' bytes. Only the first ``8 + header length`` bytes are read, from
a regular file (a FIFO or device is refused before a byte is read), and the header length is checked
against the format's cap and the file's own size first: a 400 GB checkpoint is inspected in a few MB.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, Tuple

from ..fs.files import PathLike, UnreadableFileError, open_regular_file

# The format allows headers up to 100 MB; a real shard's is kilobytes (GLM-5-NVFP4's largest: ~0.5 MB), and a
# hostile one of 100 MB would take gigabytes to parse. Larger ones are refused before a byte of them is read.
MAX_HEADER_BYTES = 16 * 1024 * 1024
# A tensor's dimensions and each one's size: a real one has at most 5; past these no tensor is real, and a shape
# of a million dimensions would take minutes to multiply out.
MAX_DIMS = 16
MAX_DIM_SIZE = 1 << 48
# A tensor name as a checkpoint writes it: printable, and short enough to show.
MAX_NAME_CHARS = 1024
# No cap on a shard's size: only its header is read.
_ANY_SIZE = 1 << 62
# Bits per element of each safetensors dtype (the sub-byte float formats pack elements).
DTYPE_BITS: Dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip


class HeaderError(ValueError):
    """A header that cannot be what it claims (not JSON, a tensor without a valid span, ...)."""


class ShortFileError(HeaderError):
    """The file ends before its header does: a copy or download that has not finished, or a cut file."""


@dataclass(frozen=True)
class Tensor:
    """One tensor's entry: its dtype, shape and data span (bytes after the header)."""

    dtype: str
    shape: Tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    """The parsed header of one file."""

    file_size: int
    header_len: int
    tensors: Dict[str, Tensor]
    metadata: Dict[str, Any]

    @property
    def data_end(self) -> int:
        return max((t.end for t in self.tensors.values()), default=0)

    @property
    def expected_size(self) -> int:
        """The file's size as the header implies it: 8 + header length + the end of the last tensor's data."""
        return 8 + self.header_len + self.data_end


def shown(name: str) -> str:
    """A name from a file, as a message shows it: non-printable characters escaped (an escape sequence never reaches
    a terminal raw), at most 120 characters."""
    text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(name))
    return text if len(text) <= 120 else text[:117] + "..."


def _element_count(shape: Tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _tensor(name: str, entry: Any, *, strict: bool) -> Tensor:
    if not name.isprintable() or len(name) > MAX_NAME_CHARS:
        raise HeaderError(f"a tensor name {shown(name)!r} is not printable or longer than {MAX_NAME_CHARS} characters")
    if not isinstance(entry, dict):
        raise HeaderError(f"tensor {name!r} is not an object")
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise HeaderError(f"tensor {name!r} has no valid data_offsets")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    if not strict:
        return Tensor(str(dtype), tuple(shape) if isinstance(shape, list) else (), offsets[0], offsets[1])
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise HeaderError(f"tensor {name!r} has dtype {dtype!r}, not a safetensors dtype")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise HeaderError(f"tensor {name!r} has a shape of {len(shape) if isinstance(shape, list) else type(shape).__name__} "
                          f"dimensions, not a list of at most {MAX_DIMS} sizes")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM_SIZE for d in shape):
        raise HeaderError(f"tensor {name!r} has shape {str(shape)[:120]}, not a list of sizes")
    span = -(-_element_count(tuple(shape)) * DTYPE_BITS[dtype] // 8)
    if offsets[1] - offsets[0] != span:
        raise HeaderError(
            f"tensor {name!r} ({dtype} {shape}) needs {span} bytes but its data_offsets span {offsets[1] - offsets[0]}"
        )
    return Tensor(dtype, tuple(shape), offsets[0], offsets[1])


def read_header(path: PathLike, *, strict: bool = True) -> Header:
    """The header of the safetensors file at ``path``. ``strict`` also checks every tensor's dtype and
    shape against its span (the inspection's truth); without it only the spans are checked (enough to
    know the file's size). ShortFileError when the file ends inside its header, HeaderError for anything
    else that is not a header; OSError when it cannot be opened."""
    try:
        handle = open_regular_file(path, _ANY_SIZE)
    except UnreadableFileError as err:
        raise HeaderError(f"not a safetensors file: {err}") from None
    with handle:
        file_size = os.fstat(handle.fileno()).st_size
        raw_len = handle.read(8)
        if len(raw_len) != 8:
            raise ShortFileError("shorter than the 8-byte header length")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len == 0 or header_len > MAX_HEADER_BYTES:
            raise HeaderError(f"header length {header_len} is not plausible (at most {MAX_HEADER_BYTES} bytes)")
        if header_len > file_size - 8:
            raise ShortFileError(f"file ends inside its {header_len}-byte header ({file_size} bytes in all)")
        raw = handle.read(header_len)
    if len(raw) != header_len:
        raise ShortFileError(f"file ends inside its {header_len}-byte header")
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HeaderError(f"header is not JSON ({shown(str(exc))})") from None
    except RecursionError:
        raise HeaderError("header is not a safetensors header (JSON nested too deeply)") from None
    if not isinstance(parsed, dict):
        raise HeaderError("header is not a JSON object")
    metadata = parsed.pop("__metadata__", None)
    tensors = {str(name): _tensor(str(name), entry, strict=strict) for name, entry in parsed.items()}
    if strict:
        _check_tiling(tensors)
    return Header(file_size, int(header_len), tensors, metadata if isinstance(metadata, dict) else {})


def _check_tiling(tensors: Dict[str, Tensor]) -> None:
    """The tensors' spans tile the data from byte 0 with no overlap and no hole, which the safetensors loader
    requires (it refuses the file otherwise): a header that passes here is one sglang can load."""
    at = 0
    for name, tensor in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if tensor.begin != at:
            kind = "overlaps the one before it" if tensor.begin < at else f"leaves a hole of {tensor.begin - at} bytes before it"
            raise HeaderError(f"tensor {name!r}'s data (bytes {tensor.begin}-{tensor.end}) {kind}: the safetensors loader refuses this file")
        at = tensor.end

