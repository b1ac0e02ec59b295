#!/usr/bin/env python3
"""Model weights on disk: is a checkpoint directory complete, and how to finish one.

Stdlib only, Python >= 3.9: the hf_model role's modules (library/sglang_weights_info.py,
library/sglang_weights.py) import it on the GPU host, where Ansible ships it as module_utils. The
same file is a command line on any machine with this package (the control node, or a copy of
module_utils on PYTHONPATH):

    python3 -m sglang_deploy_host.model.weights check DIR [--manifest FILE] [--json]   exit 0 complete, 1 incomplete
    python3 -m sglang_deploy_host.model.weights manifest DIR [--json]                  a local source's files and sizes
    python3 -m sglang_deploy_host.model.weights plan TARGET (--source-dir SRC | --manifest FILE) [--margin-bytes N]
    python3 -m sglang_deploy_host.model.weights copy SRC DST --manifest FILE           resumable local copy
    python3 -m sglang_deploy_host.model.weights progress DIR --expected-bytes N

Completeness does not trust a download tool's exit status: every shard named in
``model.safetensors.index.json`` must exist with the size its own safetensors header implies
(8-byte little-endian header length + JSON header + the data the header's ``data_offsets`` point
into), and, when a manifest from the source is given, every file of the source must exist with the
source's size. A truncated shard is therefore found without any network access.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import safetensors

INDEX_NAME = "model.safetensors.index.json"
SINGLE_SHARD = "model.safetensors"
# Tool bookkeeping inside a download directory (hf download's resume metadata) is not model data.
IGNORED_DIRS = frozenset({".cache", ".git"})
COPY_CHUNK = 16 * 1024 * 1024


class WeightsError(Exception):
    """A checkpoint or manifest that cannot be read at all (bad index, bad header, bad manifest)."""


@dataclass
class FileStatus:
    name: str
    state: str  # ok | missing | truncated | oversized | bad-header
    expected_bytes: int | None
    present_bytes: int | None
    detail: str = ""


@dataclass
class CheckReport:
    directory: str
    complete: bool
    expected_bytes: int
    present_bytes: int
    files: list[FileStatus] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def problems(self) -> list[FileStatus]:
        return [f for f in self.files if f.state != "ok"]

    def brief(self) -> str:
        """One line naming what is wrong (for an Ansible failure message); empty when complete."""
        parts = list(self.errors)
        for f in self.problems():
            if f.state == "missing":
                known = "" if f.expected_bytes is None else f" ({f.expected_bytes} bytes)"
                parts.append(f"{f.name} missing{known}")
            elif f.state == "bad-header":
                parts.append(f"{f.name} bad-header ({f.detail})")
            else:
                parts.append(f"{f.name} {f.state} (expected {f.expected_bytes} bytes, found {f.present_bytes})")
        return "; ".join(parts)

    def summary(self) -> str:
        if self.complete:
            return f"{self.directory}: complete, {len(self.files)} files, {self.present_bytes} bytes"
        lines = [f"{self.directory}: INCOMPLETE"]
        lines += [f"  {e}" for e in self.errors]
        for f in self.problems():
            lines.append(
                f"  {f.name}: {f.state} (expected {f.expected_bytes} bytes, found {f.present_bytes})"
                + (f" {f.detail}" if f.detail else "")
            )
        return "\n".join(lines)


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (raises WeightsError when it cannot be read)."""
    header = _read_header(path)
    return {
        name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.begin, t.end]}
        for name, t in header.tensors.items()
    }


def _read_header(path: Path) -> safetensors.Header:
    """The header, spans checked (the completeness check needs no more); WeightsError otherwise."""
    try:
        return safetensors.read_header(path, strict=False)
    except safetensors.HeaderError as exc:
        raise WeightsError(f"{path.name}: {exc}") from exc
    except OSError as exc:
        raise WeightsError(f"{path.name}: {exc.strerror}") from exc


def safetensors_expected_size(path: Path) -> int:
    """File size the header implies: 8 + header length + end of the last tensor's data."""
    return _read_header(path).expected_size


def index_shards(directory: Path) -> list[str]:
    """Shard file names the checkpoint consists of (from the index, or the single model.safetensors)."""
    index = directory / INDEX_NAME
    if not index.exists():
        if (directory / SINGLE_SHARD).exists():
            return [SINGLE_SHARD]
        raise WeightsError(f"neither {INDEX_NAME} nor {SINGLE_SHARD} in {directory}")
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{INDEX_NAME}: not readable JSON ({exc})") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightsError(f"{INDEX_NAME}: no weight_map (tensor -> shard file)")
    shards = set()
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or shard.startswith("/") or ".." in Path(shard).parts:
            raise WeightsError(f"{INDEX_NAME}: tensor {tensor!r} maps to an invalid file {shard!r}")
        shards.add(shard)
    return sorted(shards)


def list_files(directory: Path) -> dict[str, int]:
    """Relative path -> size of every regular file under directory, tool bookkeeping left out."""
    result: dict[str, int] = {}
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS)
        for name in sorted(files):
            path = Path(root) / name
            # Symlinks are followed: an HF cache snapshot links its files into blobs/.
            if path.is_file():
                result[path.relative_to(directory).as_posix()] = path.stat().st_size
    return result


def validate_manifest(files: Any, origin: str) -> dict[str, int]:
    """A source's files, {relative path: size}, as the hub lists them or a manifest file holds them."""
    if not isinstance(files, dict) or not files:
        raise WeightsError(f"manifest {origin}: no 'files' mapping")
    for name, size in files.items():
        if (
            not isinstance(size, int) or isinstance(size, bool) or size < 0
            or not isinstance(name, str) or not name or name.startswith("/") or ".." in Path(name).parts
        ):
            raise WeightsError(f"manifest {origin}: bad entry {name!r}: {size!r}")
    return dict(files)


def parse_manifest(text: str, origin: str) -> dict[str, int]:
    """A manifest: {"files": {relative path: size}} (what `manifest --json` prints)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WeightsError(f"manifest {origin}: not JSON ({exc})") from exc
    return validate_manifest(data.get("files") if isinstance(data, dict) else None, origin)


def load_manifest(path: Path) -> dict[str, int]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WeightsError(f"manifest {path}: not readable ({exc})") from exc
    return parse_manifest(text, str(path))


def source_manifest(source_dir: Path) -> dict[str, int]:
    """The files of a local source directory and their sizes (raises when there is nothing to copy)."""
    if not source_dir.is_dir():
        raise WeightsError(f"source {source_dir} is not a directory")
    files = list_files(source_dir)
    if not files:
        raise WeightsError(f"source {source_dir} holds no files")
    return files


def _size_state(expected: int, present: int) -> str:
    if present == expected:
        return "ok"
    return "truncated" if present < expected else "oversized"


def check(directory: Path, manifest: dict[str, int] | None = None) -> CheckReport:
    """Is the checkpoint in directory complete? Never raises for a bad checkpoint: it reports."""
    statuses: dict[str, FileStatus] = {}
    errors: list[str] = []
    if not directory.is_dir():
        errors.append(f"{directory} is not a directory")
    else:
        try:
            shards = index_shards(directory)
        except WeightsError as exc:
            errors.append(str(exc))
            shards = []
        for shard in shards:
            path = directory / shard
            from_source = manifest.get(shard) if manifest else None
            if not path.is_file():
                statuses[shard] = FileStatus(shard, "missing", from_source, None)
                continue
            present = path.stat().st_size
            try:
                expected = safetensors_expected_size(path)
            except WeightsError as exc:
                statuses[shard] = FileStatus(shard, "bad-header", from_source, present, str(exc))
                continue
            state = _size_state(expected, present)
            detail = ""
            if state == "ok" and from_source is not None and from_source != present:
                # The header is consistent but the source holds another file: not the pinned one.
                state, detail = _size_state(from_source, present), "(size differs from the source)"
                expected = from_source
            statuses[shard] = FileStatus(shard, state, expected, present, detail)
        for name, size in sorted((manifest or {}).items()):
            if name in statuses:
                continue
            path = directory / name
            if not path.is_file():
                statuses[name] = FileStatus(name, "missing", size, None)
            else:
                present = path.stat().st_size
                statuses[name] = FileStatus(name, _size_state(size, present), size, present)
    files = [statuses[k] for k in sorted(statuses)]
    expected_total = sum(f.expected_bytes or 0 for f in files)
    present_total = sum(f.present_bytes or 0 for f in files)
    complete = not errors and bool(files) and all(f.state == "ok" for f in files)
    return CheckReport(str(directory), complete, expected_total, present_total, files, errors)


def free_bytes(path: Path) -> tuple[Path, int]:
    """Free space for an unprivileged-or-root writer at path or its nearest existing ancestor."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return probe, usage.free


@dataclass
class PendingFile:
    """A file of the source that the target does not hold at the source's size yet."""

    name: str
    size: int
    present_bytes: int | None  # None: absent from the target

    @property
    def offset(self) -> int:
        """Where writing starts: a shorter file is resumed from its end, anything else written in full."""
        present = self.present_bytes
        return present if present is not None and present < self.size else 0

    @property
    def bytes_to_write(self) -> int:
        return self.size - self.offset


def pending_files(target: Path, manifest: dict[str, int]) -> list[PendingFile]:
    """The manifest's files that target lacks or holds at another size, in name order."""
    pending = []
    for name, size in sorted(manifest.items()):
        path = target / name
        present = path.stat().st_size if path.is_file() else None
        if present != size:
            pending.append(PendingFile(name, size, present))
    return pending


def plan(target: Path, manifest: dict[str, int], margin_bytes: int, source_dir: Path | None = None) -> dict[str, Any]:
    """What a fetch into target still needs: bytes to write and whether the disk holds them.

    With a local source_dir the source itself is checked too, so a broken source is refused before
    anything is copied.
    """
    report = check(target, manifest)
    source_report = check(source_dir, manifest) if source_dir is not None else None
    pending = [] if report.complete else pending_files(target, manifest)
    missing = sum(f.bytes_to_write for f in pending)
    probe, free = free_bytes(target)
    needed = 0 if report.complete else missing + margin_bytes
    return {
        "target": str(target),
        "complete": report.complete,
        "total_bytes": sum(manifest.values()),
        "file_count": len(manifest),
        "missing_bytes": missing,
        "missing_files": [f.name for f in pending],
        "margin_bytes": margin_bytes,
        "needed_bytes": needed,
        "free_bytes": free,
        "free_path": str(probe),
        "enough_space": free >= needed,
        "files": dict(sorted(manifest.items())),
        "problems_brief": report.brief(),
        "source_complete": None if source_report is None else source_report.complete,
        "source_problems_brief": "" if source_report is None else source_report.brief(),
        "source_problems": [] if source_report is None else (
            [asdict(f) for f in source_report.problems()] + [{"error": e} for e in source_report.errors]),
        "problems": [asdict(f) for f in report.problems()] + [{"error": e} for e in report.errors],
    }


def copy_plan(source: Path, target: Path, manifest: dict[str, int]) -> list[PendingFile]:
    """What copy_resumable would write; refuses (before anything is written) a source that no
    longer matches the manifest."""
    for name, size in sorted(manifest.items()):
        src = source / name
        try:
            actual = src.stat().st_size
        except OSError as exc:
            raise WeightsError(f"source {src}: {exc.strerror}") from exc
        if actual != size:
            raise WeightsError(f"source {src} is {actual} bytes, the manifest says {size}")
    return pending_files(target, manifest)


def copy_resumable(source: Path, target: Path, manifest: dict[str, int]) -> list[PendingFile]:
    """Copy the manifest's files from source to target; a shorter target file is appended to.

    Returns what was written (copy_plan's answer before the copy). Files are 0644 and directories
    0755 whatever the umask, so the server's user can read what root fetched but not change it.
    """
    pending = copy_plan(source, target, manifest)
    target.mkdir(parents=True, exist_ok=True)
    os.chmod(target, 0o755)
    for item in pending:
        dst = target / item.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        for parent in dst.relative_to(target).parents:
            os.chmod(target / parent, 0o755)
        with (source / item.name).open("rb") as reader, dst.open("ab" if item.offset else "wb") as writer:
            reader.seek(item.offset)
            shutil.copyfileobj(reader, writer, COPY_CHUNK)
            writer.flush()
            os.fsync(writer.fileno())
        os.chmod(dst, 0o644)
    return pending


def bytes_on_disk(directory: Path) -> int:
    """Every byte under directory, download tools' partial files included (progress, not truth)."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += (Path(root) / name).lstat().st_size
            except OSError:
                continue  # a partial file renamed between walk and stat
    return total


def progress(directory: Path, expected_bytes: int) -> dict[str, Any]:
    """Bytes under directory so far against the expected total (a fetch's progress line)."""
    present = bytes_on_disk(directory) if directory.is_dir() else 0
    return {"bytes": present, "expected_bytes": expected_bytes,
            "percent": round(100.0 * present / max(expected_bytes, 1), 1)}


def _print(data: Any, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if as_json else text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m sglang_deploy_host.model.weights", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="is DIR a complete checkpoint (exit 0) or not (exit 1)")
    p_check.add_argument("directory", type=Path)
    p_check.add_argument("--manifest", type=Path, help="source's file sizes (manifest --json output)")
    p_check.add_argument("--json", action="store_true")
    p_manifest = sub.add_parser("manifest", help="files and sizes of a local source directory")
    p_manifest.add_argument("directory", type=Path)
    p_manifest.add_argument("--json", action="store_true")
    p_plan = sub.add_parser("plan", help="bytes still to fetch into TARGET and whether the disk has room")
    p_plan.add_argument("target", type=Path)
    group = p_plan.add_mutually_exclusive_group(required=True)
    group.add_argument("--source-dir", type=Path)
    group.add_argument("--manifest", type=Path)
    group.add_argument("--manifest-json", help="the source's sizes as JSON text: {\"files\": {name: size}}")
    p_plan.add_argument("--margin-bytes", type=int, default=0)
    p_copy = sub.add_parser("copy", help="resumable copy of a local source's files")
    p_copy.add_argument("source", type=Path)
    p_copy.add_argument("target", type=Path)
    p_copy.add_argument("--manifest", type=Path, required=True)
    p_progress = sub.add_parser("progress", help="bytes under DIR against an expected total")
    p_progress.add_argument("directory", type=Path)
    p_progress.add_argument("--expected-bytes", type=int, required=True)
    args = parser.parse_args(argv)

    try:
        if args.command == "check":
            manifest = load_manifest(args.manifest) if args.manifest else None
            report = check(args.directory, manifest)
            _print(dict(asdict(report), brief=report.brief()), args.json, report.summary())
            return 0 if report.complete else 1
        if args.command == "manifest":
            files = source_manifest(args.directory)
            data = {"files": files, "total_bytes": sum(files.values())}
            _print(data, args.json, "\n".join(f"{s}\t{n}" for n, s in files.items()))
            return 0
        if args.command == "plan":
            if args.source_dir is not None:
                manifest = source_manifest(args.source_dir)
            elif args.manifest_json is not None:
                manifest = parse_manifest(args.manifest_json, "--manifest-json")
            else:
                manifest = load_manifest(args.manifest)
            _print(plan(args.target, manifest, args.margin_bytes, args.source_dir), True, "")
            return 0
        if args.command == "copy":
            written = copy_resumable(args.source, args.target, load_manifest(args.manifest))
            print(json.dumps({"written": [item.name for item in written]}))
            return 0
        if args.command == "progress":
            print(json.dumps(progress(args.directory, args.expected_bytes)))
            return 0
    except WeightsError as exc:
        print(f"sglang_deploy_host.model.weights {args.command}: {exc}", file=sys.stderr)
        return 2
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
