#!/usr/bin/env python3
"""List the GPU architectures of the CUDA device code inside shared objects, without a GPU.

Stdlib only: the sglang_ml_env and sglang_kernel_proof modules run it on target hosts (through
mlenv.kernel_proof); the ``sglang-deploy kernels`` command imports it.

    python3 fatbin.py [--require sm_120] [--json] [--cubins] PATH...     (Python >= 3.10)

PATH is a venv (its ``lib*/python*/site-packages`` are scanned), a directory (scanned
recursively) or a file. Files named ``*.so``/``*.so.N`` are read as ELF64 host objects: their
``.nv_fatbin`` section is walked container by container, entry by entry. A bare cubin (a device
ELF image, as flashinfer-cubin ships ~10,000 of them) is read from its own ELF header when named
as a PATH; ``--cubins`` also collects the ``*.cubin`` files under a directory PATH, summed up as
one ``PATH/**/*.cubin`` entry (a per-file verdict on one-target files would say nothing).
Fat binaries outside ``.nv_fatbin`` (e.g. a cubin loaded from a byte array in ``.rodata``) are
not looked for.

Fat binary layout (little endian), as nvcc/fatbinary 12.x-13.x write it. Checked against
``cuobjdump`` 13.2 on objects compiled here with nvcc 13.0 (tests/fixtures/fatbin/build.sh):

    container header (16 bytes): u32 magic 0xBA55ED50, u16 version 1, u16 header size (16),
                                 u64 size of the entries that follow
    entry header (64, 80 or 112 bytes; the extra bytes are an option block):
        +0  u16 kind (1 = PTX, 2 = ELF cubin)   +2  u16 (0x0101)
        +4  u32 entry header size               +8  u64 payload size (8-aligned, as stored)
        +16 u32 compressed size (0 if stored)   +24 u16 minor, u16 major code version
        +28 u32 SM number (90, 100, 120, ...)   +40 u64 flags
        +56 u64 uncompressed size (0 if stored); the payload follows the entry header
    entry flags: 0x1 64-bit, 0x2 debug, 0x10 linux, 0x1000/0x2000 compressed (NVIDIA's LZ
                 variants, CUDA 11/12), 0x8000 compressed with zstd (CUDA 12.8+/13),
                 0x100000 arch-specific target ("a": sm_90a, sm_120a),
                 0x200000 family-specific target ("f": sm_100f, sm_120f)

The "a"/"f" suffix of a fat binary entry is read from the entry flags, not from its cubin:
ptxas 13.0 writes the same ELF ``e_flags`` for sm_120, sm_120a and sm_120f (0x05007802 in a fat
binary), and the entry header is all there is for compressed payloads, which are not decompressed
(zstd is not in the standard library before Python 3.14). A stored (uncompressed) cubin payload
is cross-checked: it must be a CUDA ELF whose SM number equals the entry header's. A bare cubin
has no entry header: see ``cubin_target`` for where its suffix comes from.

Names: a cubin entry is ``sm_<N>[a|f]``, a PTX entry ``compute_<N>[a|f]``.

``--require ARCH`` (exit status 1 when unmet) is checked only for objects that carry cubins:
  * ``sm_120``  is met by a cubin for SM 12.0 in any variant: sm_120, sm_120a or sm_120f;
  * ``sm_120f`` is met by sm_120f or sm_120a (an "a" target has every family-specific feature);
  * ``sm_120a`` is met by sm_120a only.
A cubin for another SM never meets it, not even one the driver could load by same-major binary
compatibility (an sm_80 cubin on sm_86): the proof is that the exact target was compiled.
The text table marks a target that only some of an object's fat binary containers (compilation
units) carry, e.g. ``sm_90a[3/56]``; ``--require`` is judged per object, as the JSON lists it.
An object with PTX but no cubin is listed as "PTX only" and does not fail ``--require`` (its code
is JIT-compiled at load, if the PTX target allows); an object without device code is not listed.

Only regular files are read, each at most ``MAX_OBJECT_BYTES`` (4 GiB): a device, FIFO or socket
named as a PATH, or a file over the cap (named or found in a walk), is an error; a walk skips what
is not a regular file and does not follow links.

Exit status: 0 ok; 1 a required arch is missing; 2 a PATH is missing, is not a regular file or
directory, or a file is over the cap or not a valid ELF/fat binary; 3 ``--require`` was given but no
object under the PATHs has device code.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import json
import mmap
import os
import re
import struct
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

try:
    from ..fs import files
except ImportError:  # run as a script (python3 fatbin.py, even isolated): the fs domain's file, by path
    import importlib.util

    _files = Path(__file__).parent.parent / "fs" / "files.py"
    _spec = importlib.util.spec_from_file_location("sglang_deploy_host_files", _files)
    assert _spec is not None and _spec.loader is not None
    files = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(files)

FATBIN_MAGIC = 0xBA55ED50
FATBIN_CONTAINER_HEADER = struct.Struct("<IHHQ")
# kind, (0x0101), header size, payload size, compressed size, (option offset), minor, major,
# SM number, (name offset), (name size), flags, (zero), uncompressed size
FATBIN_ENTRY_HEADER = struct.Struct("<HHIQIIHHIIIQQQ")
KIND_PTX = 1
KIND_CUBIN = 2

FLAG_COMPRESSED = 0x1000 | 0x2000 | 0x8000
FLAG_ARCH_SPECIFIC = 0x100000  # the "a" in sm_90a / sm_120a
FLAG_FAMILY_SPECIFIC = 0x200000  # the "f" in sm_100f / sm_120f

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_CUDA = 190
SHT_NOBITS = 8
SHN_XINDEX = 0xFFFF
ELF64_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")

ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")
SHARED_OBJECT_RE = re.compile(r"\.so(\.\d+)*$")
# The largest object read: libtorch_cuda.so and flash-attention's kernels are 1-2 GB, growing with each
# arch a wheel adds. Objects are mapped, not read, and only the headers and .nv_fatbin are touched, so
# the cap guards against absurd input (a sparse or endless file), not against memory use.
MAX_OBJECT_BYTES = 4 << 30


class FatbinError(ValueError):
    """A file that claims to be an ELF object or fat binary but does not parse as one."""


class UnreadableFileError(FatbinError):
    """Not a regular file (a device, FIFO, socket or directory) or larger than the cap: never read."""


class NotElf64Error(FatbinError):
    """Not a little-endian ELF64 file at all (a linker script named .so, a 32-bit object):
    skipped in a directory walk, an error when named as a PATH."""


@dataclass(frozen=True, order=True)
class Target:
    """One code target: a cubin (``sm_120a``) or PTX (``compute_120``)."""

    sm: int
    variant: str  # "", "a" or "f"
    ptx: bool = False

    @property
    def name(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.sm}{self.variant}"


@dataclass(frozen=True)
class FatbinEntry:
    kind: int
    target: Target
    compressed: bool
    code_version: tuple[int, int]
    payload_offset: int  # within the buffer that was parsed
    payload_size: int
    container: int  # index of its container, from 0


@dataclass
class ObjectReport:
    """The device code of one file. ``containers``: its fat binary containers that hold entries
    (for a ``PATH/**/*.cubin`` summary: the cubin files; 0 for one bare cubin)."""

    path: Path
    cubins: set[str] = field(default_factory=set)
    ptx: set[str] = field(default_factory=set)
    containers: int = 0
    entries: int = 0
    # target name -> how many containers carry it. A container is one compilation unit's code, so
    # a target in fewer containers than the object has means some kernels lack that target.
    coverage: dict[str, int] = field(default_factory=dict)
    # entry kinds other than PTX (1) and cubin (2): not judged, reported on stderr
    other_kinds: set[int] = field(default_factory=set)

    @property
    def has_device_code(self) -> bool:
        return bool(self.cubins or self.ptx or self.other_kinds)

    def archs(self) -> list[str]:
        """Cubin targets then PTX targets, each ordered by SM number then variant."""
        return sort_archs(self.cubins) + sort_archs(self.ptx)


def sort_archs(names: Iterable[str]) -> list[str]:
    def key(name: str) -> tuple[int, str]:
        _, _, rest = name.partition("_")
        digits = rest.rstrip("af")
        return (int(digits), rest[len(digits) :])

    return sorted(names, key=key)


def _target(sm: int, flags: int, *, ptx: bool) -> Target:
    variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
    return Target(sm, variant, ptx)


def cubin_sm(image: bytes | mmap.mmap, start: int = 0) -> tuple[int, bool]:
    """(SM number, arch-specific flag) from a CUDA ELF header at ``start``.

    ``e_flags`` has two layouts: ELF ABI version < 8 keeps the SM in bits 0-7 and "a" at 0x800
    (EF_CUDA_ACCELERATORS_V1); ABI version 8 (CUDA 12.8+) keeps the SM in bits 8-15 and "a" at 0x8
    (EF_CUDA_ACCELERATORS). The "a" bit is only meaningful for bare cubins: cubins inside a fat
    binary carry their variant in the entry header instead.
    """
    if image[start : start + 4] != ELF_MAGIC or len(image) < start + 64:
        raise FatbinError("not an ELF image")
    if image[start + 4] != ELFCLASS64 or image[start + 5] != ELFDATA2LSB:
        raise FatbinError("not a little-endian ELF64 image")
    (machine,) = struct.unpack_from("<H", image, start + 18)
    if machine != EM_CUDA:
        raise FatbinError(f"ELF machine {machine}, not CUDA ({EM_CUDA})")
    abi_version = image[start + 8]
    (flags,) = struct.unpack_from("<I", image, start + 48)
    if abi_version >= 8:
        return (flags >> 8) & 0xFF, bool(flags & 0x8)
    return flags & 0xFF, bool(flags & 0x800)


def _tool_options(buf: bytes | mmap.mmap, offset: int, size: int) -> tuple[str, str] | None:
    """(tool name, tool options) from a ``.note.nv.tkinfo`` note, the record of the tool that made
    the cubin: namesz, descsz, type, "NVIDIA Corp"; desc = u32 version (2), u32 offsets of the
    object name, tool name, tool version, tool branch and tool options into the strings after."""
    if size < 12:
        return None
    namesz, descsz, _ = struct.unpack_from("<III", buf, offset)
    desc = offset + 12 + ((namesz + 3) & ~3)
    if desc + descsz > offset + size or descsz < 24:
        return None
    version, _, tool_name, _, _, tool_options = struct.unpack_from("<6I", buf, desc)
    if version != 2:
        return None
    strings = bytes(buf[desc + 24 : desc + descsz])

    def string(at: int) -> str:
        end = strings.find(b"\0", at)
        return strings[at : end if end >= 0 else len(strings)].decode(errors="replace")

    if tool_name >= len(strings) or tool_options >= len(strings):
        return None
    return string(tool_name), string(tool_options)


def cubin_target(buf: bytes | mmap.mmap) -> Target:
    """The target of a bare cubin: the SM from ``e_flags``; "a" from ``e_flags`` (CUDA 12.x sets
    it) or else from the ptxas options in ``.note.nv.tkinfo`` (ptxas 13.0 writes the same ``e_flags``
    for sm_120, sm_120a and sm_120f; its ``-arch sm_120a`` option is the only record left, and it
    is where cuobjdump 13.2 gets "sm_120a" from, since nothing else in the file differs)."""
    sm, arch_specific = cubin_sm(buf)
    if arch_specific:
        return Target(sm, "a")
    note = elf_sections(buf).get(".note.nv.tkinfo")
    tool = _tool_options(buf, *note) if note else None
    if tool is not None and tool[0] == "ptxas":
        words = tool[1].split()
        for flag, value in itertools.pairwise(words):
            target = ARCH_RE.match(value)
            if flag in ("-arch", "--gpu-name") and target and int(target.group(1)) == sm:
                return Target(sm, target.group(2))
    return Target(sm, "")


def parse_fatbin(
    buf: bytes | mmap.mmap, start: int = 0, end: int | None = None
) -> tuple[int, list[FatbinEntry]]:
    """Walk the fat binary containers in ``buf[start:end]``: (container count, entries).

    Containers follow each other; zero bytes between or after them are alignment padding.
    """
    end = len(buf) if end is None else end
    if end > len(buf):
        raise FatbinError(f"fat binary region ends at {end}, past the end of the file ({len(buf)})")
    entries: list[FatbinEntry] = []
    containers = 0
    pos = start
    while pos + FATBIN_CONTAINER_HEADER.size <= end:
        magic, _, header_size, fat_size = FATBIN_CONTAINER_HEADER.unpack_from(buf, pos)
        if magic != FATBIN_MAGIC:
            if magic == 0:  # padding: containers start 8-aligned
                pos += 4
                continue
            raise FatbinError(f"no fat binary magic at offset {pos:#x} (found {magic:#010x})")
        if header_size < FATBIN_CONTAINER_HEADER.size:
            raise FatbinError(f"fat binary container at {pos:#x}: header size {header_size}")
        body, body_end = pos + header_size, pos + header_size + fat_size
        if body_end > end:
            raise FatbinError(
                f"fat binary container at {pos:#x} runs past its region ({body_end:#x} > {end:#x})"
            )
        entries.extend(_parse_entries(buf, body, body_end, containers))
        containers += 1
        pos = body_end
    return containers, entries


def _parse_entries(buf: bytes | mmap.mmap, pos: int, end: int, container: int) -> Iterator[FatbinEntry]:
    while pos < end:
        if pos + FATBIN_ENTRY_HEADER.size > end:
            raise FatbinError(f"truncated fat binary entry header at {pos:#x}")
        kind, _, header_size, payload_size, _, _, minor, major, sm, _, _, flags, _, _ = (
            FATBIN_ENTRY_HEADER.unpack_from(buf, pos)
        )
        if header_size < FATBIN_ENTRY_HEADER.size:
            raise FatbinError(f"fat binary entry at {pos:#x}: header size {header_size}")
        payload = pos + header_size
        if payload + payload_size > end:
            raise FatbinError(f"fat binary entry at {pos:#x}: payload runs past its container")
        compressed = bool(flags & FLAG_COMPRESSED)
        target = _target(sm, flags, ptx=kind == KIND_PTX)
        if kind == KIND_CUBIN and not compressed and payload_size:
            try:
                payload_sm, _ = cubin_sm(buf, payload)
            except FatbinError as exc:
                raise FatbinError(f"cubin entry at {pos:#x} ({target.name}): {exc}") from None
            if payload_sm != sm:
                raise FatbinError(
                    f"cubin entry at {pos:#x}: header says SM {sm}, its ELF image says SM {payload_sm}"
                )
        yield FatbinEntry(kind, target, compressed, (major, minor), payload, payload_size, container)
        pos = payload + payload_size


def elf_sections(buf: bytes | mmap.mmap) -> dict[str, tuple[int, int]]:
    """Section name -> (file offset, size) of a little-endian ELF64 file (SHT_NOBITS left out)."""
    if len(buf) < 64 or buf[:4] != ELF_MAGIC:
        raise NotElf64Error("not an ELF file")
    if buf[4] != ELFCLASS64 or buf[5] != ELFDATA2LSB:
        raise NotElf64Error("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", buf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 0x3A)
    if shoff == 0:
        return {}
    if shentsize < ELF64_SECTION_HEADER.size or shoff + shentsize > len(buf):
        raise FatbinError("bad section header table")

    def header(index: int) -> tuple[int, ...]:
        offset = shoff + index * shentsize
        if offset + ELF64_SECTION_HEADER.size > len(buf):
            raise FatbinError(f"section header {index} lies past the end of the file")
        return ELF64_SECTION_HEADER.unpack_from(buf, offset)

    first = header(0)
    if shnum == 0:  # more than 0xff00 sections: the count is in section 0's sh_size
        shnum = first[5]
    if shstrndx == SHN_XINDEX:
        shstrndx = first[6]
    if shstrndx >= shnum:
        raise FatbinError("section name table index out of range")
    names_offset, names_size = header(shstrndx)[4], header(shstrndx)[5]
    sections: dict[str, tuple[int, int]] = {}
    for index in range(shnum):
        name_at, sh_type, _, _, offset, size, *_ = header(index)
        if sh_type == SHT_NOBITS or name_at >= names_size:
            continue
        name_end = buf.find(b"\0", names_offset + name_at, names_offset + names_size)
        name = bytes(buf[names_offset + name_at : name_end if name_end >= 0 else names_offset + names_size])
        if offset + size > len(buf):
            raise FatbinError(f"section {name.decode(errors='replace')} runs past the end of the file")
        sections.setdefault(name.decode(errors="replace"), (offset, size))
    return sections


def open_regular_file(path: Path, max_bytes: int | None = None) -> BinaryIO:
    """``path`` open for reading if it is a regular file of at most ``max_bytes`` (default
    MAX_OBJECT_BYTES), else UnreadableFileError (``files.open_regular_file``); OSError if it cannot be
    opened."""
    try:
        return files.open_regular_file(path, MAX_OBJECT_BYTES if max_bytes is None else max_bytes)
    except files.UnreadableFileError as err:
        raise UnreadableFileError(str(err)) from None


def read_entries(path: Path) -> list[FatbinEntry]:
    """The entries of the ``.nv_fatbin`` section of a host ELF object, in file order ([] if none)."""
    with open_regular_file(path) as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        fatbin = elf_sections(buf).get(".nv_fatbin")
        if fatbin is None:
            return []
        return parse_fatbin(buf, fatbin[0], fatbin[0] + fatbin[1])[1]


def scan_file(path: Path) -> ObjectReport:
    """The device code in one file: a host ELF object with ``.nv_fatbin``, or a bare cubin."""
    report = ObjectReport(path)
    with open_regular_file(path) as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise NotElf64Error("empty file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != ELF_MAGIC:
                raise NotElf64Error("not an ELF file")
            (machine,) = struct.unpack_from("<H", buf, 18) if len(buf) >= 20 else (0,)
            if machine == EM_CUDA:
                name = cubin_target(buf).name
                report.cubins.add(name)
                report.coverage[name] = 1
                return report
            fatbin = elf_sections(buf).get(".nv_fatbin")
            if fatbin is None:
                return report
            offset, size = fatbin
            report.containers, entries = parse_fatbin(buf, offset, offset + size)
    report.entries = len(entries)
    report.containers = len({entry.container for entry in entries})  # empty ones do not count
    for entry in entries:
        if entry.kind == KIND_CUBIN:
            report.cubins.add(entry.target.name)
        elif entry.kind == KIND_PTX:
            report.ptx.add(entry.target.name)
        else:
            report.other_kinds.add(entry.kind)
    known = [entry for entry in entries if entry.kind in (KIND_PTX, KIND_CUBIN)]
    for name, _container in {(entry.target.name, entry.container) for entry in known}:
        report.coverage[name] = report.coverage.get(name, 0) + 1
    return report


def is_shared_object_name(path: Path) -> bool:
    return bool(SHARED_OBJECT_RE.search(path.name))


def is_cubin_name(path: Path) -> bool:
    return path.name.endswith(".cubin")


def iter_objects(root: Path, *, cubins: bool = False) -> Iterator[Path]:
    """The files to scan under ``root``: itself if not a directory (scan_file refuses what is not a
    regular file); else the shared objects (and with ``cubins`` the ``*.cubin`` files) in a venv's
    site-packages or under a directory: regular files only, links neither followed nor read."""
    if not root.is_dir():
        if not root.exists():
            raise FileNotFoundError(errno.ENOENT, "no such file or directory")
        yield root
        return
    bases = [root]
    if (root / "pyvenv.cfg").is_file():
        bases = sorted({p.resolve() for p in root.glob("lib*/python*/site-packages") if p.is_dir()}) or [root]
    seen: set[Path] = set()
    for base in bases:
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                wanted = is_shared_object_name(path) or (cubins and is_cubin_name(path))
                if not wanted or path.is_symlink() or not path.is_file():
                    continue
                real = path.resolve()
                if real not in seen:
                    seen.add(real)
                    yield path


def meets(archs: Iterable[str], required: str) -> bool:
    """Whether the cubin targets ``archs`` meet ``required`` (see the module docstring)."""
    want = ARCH_RE.match(required)
    if want is None:
        raise ValueError(f"not an SM architecture: {required!r} (expected sm_<N>, sm_<N>a or sm_<N>f)")
    sm, variant = want.group(1), want.group(2)
    accepted = {"": ("", "a", "f"), "f": ("f", "a"), "a": ("a",)}[variant]
    return any(f"sm_{sm}{suffix}" in archs for suffix in accepted)


@dataclass
class ScanResult:
    reports: list[ObjectReport]
    errors: list[str]


def scan(paths: Sequence[Path], *, cubins: bool = False) -> ScanResult:
    """Scan each PATH. With ``cubins``, the bare ``*.cubin`` files found under a directory PATH
    are summed up into one report named ``PATH/**/*.cubin``: each holds one target, so a
    per-file verdict would say nothing about the set a library picks its kernels from."""
    result = ScanResult([], [])
    for root in paths:
        try:
            files = list(iter_objects(root, cubins=cubins))
        except OSError as exc:
            result.errors.append(f"{root}: {exc.strerror or exc}")
            continue
        bare = ObjectReport(root / "**" / "*.cubin")
        for path in files:
            try:
                report = scan_file(path)
            except NotElf64Error as exc:
                if not root.is_dir():
                    result.errors.append(f"{path}: {exc}")
                continue
            except FatbinError as exc:
                result.errors.append(f"{path}: {exc}")
                continue
            except OSError as exc:
                result.errors.append(f"{path}: {exc.strerror or exc}")
                continue
            if root.is_dir() and is_cubin_name(path) and report.cubins:
                bare.containers += 1
                bare.entries += 1
                for name in report.cubins:
                    bare.cubins.add(name)
                    bare.coverage[name] = bare.coverage.get(name, 0) + 1
            elif report.has_device_code:
                result.reports.append(report)
        if bare.cubins:
            result.reports.append(bare)
    return result


def _names(report: ObjectReport, names: Iterable[str]) -> str:
    """``sm_90a``, or ``sm_90a[3/56]`` when only 3 of the object's 56 containers carry it
    (cubins only: PTX is commonly embedded once, not per container)."""
    cells = []
    for name in sort_archs(names):
        count = report.coverage.get(name, 0)
        partial = report.containers > 1 and count < report.containers
        cells.append(f"{name}[{count}/{report.containers}]" if partial else name)
    return " ".join(cells) or "-"


def _table(reports: Sequence[ObjectReport], required: str | None) -> str:
    rows = [("object", "cubins", "ptx", "status" if required else "")]
    for report in reports:
        if not report.cubins:
            status = "PTX only"
        elif required:
            status = "ok" if meets(report.cubins, required) else f"MISSING {required}"
        else:
            status = ""
        rows.append(
            (
                str(report.path),
                _names(report, report.cubins),
                " ".join(sort_archs(report.ptx)) or "-",
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


def build_parser(prog: str = "fatbin.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="List the SM architectures of the CUDA cubins (and PTX) embedded in shared objects.",
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="+", type=Path, help="a venv, a directory or a file")
    parser.add_argument(
        "--require",
        metavar="ARCH",
        help="exit 1 if an object with cubins has none for ARCH (sm_120: sm_120/sm_120a/sm_120f; sm_120a: only sm_120a)",
    )
    parser.add_argument("--json", action="store_true", help="print {object: [archs]} as JSON")
    parser.add_argument(
        "--cubins",
        action="store_true",
        help="also read the bare *.cubin files under a directory PATH, summed up as one PATH/**/*.cubin entry",
    )


def run(paths: Sequence[Path], required: str | None, as_json: bool, *, cubins: bool = False) -> int:
    """Scan, print, and return the exit status (see the module docstring)."""
    if required is not None and ARCH_RE.match(required) is None:
        print(f"--require {required!r}: expected sm_<N>, sm_<N>a or sm_<N>f, e.g. sm_120", file=sys.stderr)
        return 2
    result = scan(paths, cubins=cubins)
    if as_json and (result.reports or not result.errors):
        print(json.dumps({str(r.path): r.archs() for r in result.reports}, indent=2, sort_keys=True))
    elif result.reports:
        print(_table(result.reports, required))
    elif not result.errors:  # else the errors say what was not read
        print("no CUDA device code found under: " + " ".join(str(p) for p in paths))
    for report in result.reports:
        if report.other_kinds:
            kinds = ", ".join(f"{kind:#x}" for kind in sorted(report.other_kinds))
            print(
                f"note: {report.path}: fat binary entries of unknown kind {kinds} not judged", file=sys.stderr
            )
    for error in result.errors:
        print(f"error: {error}", file=sys.stderr)
    if result.errors:
        return 2
    if required is None:
        return 0
    with_cubins = [r for r in result.reports if r.cubins]
    if not result.reports:
        print(f"--require {required}: no object with device code found", file=sys.stderr)
        return 3
    missing = [r for r in with_cubins if not meets(r.cubins, required)]
    for report in missing:
        print(
            f"{report.path}: no {required} cubin (has {' '.join(sort_archs(report.cubins))})", file=sys.stderr
        )
    return 1 if missing else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args.paths, args.require, args.json, cubins=args.cubins)


if __name__ == "__main__":
    sys.exit(main())
