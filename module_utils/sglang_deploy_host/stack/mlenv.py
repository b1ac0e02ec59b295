"""The ml-env on a host: the checks a new venv must pass before it is switched to, the kernel proof,
and which venvs of the store to keep. Stdlib only.

Two interpreters use this file:
  * the NEW venv's python runs ``python -m sglang_deploy_host.stack.mlenv check`` (interp.run_module), as
    only that interpreter sees what the venv holds: every pin of the lock installed at exactly that
    version and nothing else, the imports work, torch's CUDA is the lock's, transformers knows the
    model types. It prints a JSON report (with the venv's site-packages); exit 1 when anything is
    wrong.
  * the Ansible modules (sglang_ml_env, sglang_kernel_proof) run ``kernel_proof`` and
    ``prune_plan`` in their own interpreter: parsing cubins and listing directories need nothing
    from the venv.

A venv in the store is complete when its MARKER exists: written only after its checks passed.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import fnmatch
import hashlib
import importlib
import io
import json
import os
import stat
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..gpu import fatbin
from .lockfile import header_fields, normalize, pins

# The submodules this module's check needs in the venv's interpreter (interp.run_module copies them in):
# itself, what it imports, and what those import.
CHECK_MODULES = ("stack.mlenv", "stack.lockfile", "gpu.fatbin", "fs.files")

MARKER = ".sglang-deploy-ml-env.json"
"""The check's report in a venv of the store: its presence marks the venv complete."""
LOCK_NAME = "sglang-deploy.lock.txt"
"""The lock a venv was installed from, kept inside it."""
PREEXISTING = "preexisting-"
"""Prefix of a hand-made ml-env directory moved into the store: the operator's, never pruned."""


def compare_versions(locked: Dict[str, str], installed: Dict[str, str]) -> List[str]:
    """Every difference between the lock and what is installed, one sentence each."""
    problems = []
    for name, version in sorted(locked.items()):
        have = installed.get(name)
        if have is None:
            problems.append(f"{name}=={version} is in the lock but not installed")
        elif have != version:
            problems.append(f"{name} is {have}, the lock pins {version}")
    problems += [
        f"{name}=={installed[name]} is installed but not in the lock" for name in sorted(set(installed) - set(locked))
    ]
    return problems


def installed_versions() -> Dict[str, str]:
    from importlib import metadata

    return {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()}


def driver_present() -> bool:
    """Whether the NVIDIA driver's libcuda.so.1 loads (kernels packages link it at import)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def run_check(args: argparse.Namespace) -> Dict[str, object]:
    """The report of ``check``, run by the venv's own python."""
    lock_text = Path(args.lock).read_text(encoding="utf-8")
    locked = pins(lock_text)
    problems = [] if locked else [f"{args.lock} holds no name==version pins"]
    problems += compare_versions(locked, installed_versions())
    imported: List[str] = []
    skipped: Dict[str, str] = {}
    modules = list(args.imports)
    if driver_present():
        modules += args.driver_imports
    else:
        skipped = {name: "no NVIDIA driver (libcuda.so.1) on this host" for name in args.driver_imports}
    for name in modules:
        try:
            importlib.import_module(name)
            imported.append(name)
        except Exception as exc:  # any failure to import is the finding, whatever its type
            problems.append(f"import {name} failed: {type(exc).__name__}: {exc}")
    torch_cuda = None
    if args.cuda:
        try:
            import torch  # type: ignore[import-not-found]

            torch_cuda = torch.version.cuda
        except Exception as exc:
            problems.append(f"cannot read torch.version.cuda: {type(exc).__name__}: {exc}")
        else:
            if torch_cuda != args.cuda:
                problems.append(f"torch.version.cuda is {torch_cuda!r}, the lane needs {args.cuda!r}")
    if args.model_types:
        try:
            from transformers.models.auto.configuration_auto import (  # type: ignore[import-not-found]
                CONFIG_MAPPING_NAMES,
            )
        except Exception as exc:
            problems.append(f"cannot read transformers' model types: {type(exc).__name__}: {exc}")
        else:
            problems += [
                f"transformers does not know model type {model_type!r}"
                for model_type in args.model_types
                if model_type not in CONFIG_MAPPING_NAMES
            ]
    return {
        "ok": not problems,
        "problems": problems,
        "python": ".".join(map(str, sys.version_info[:2])),
        "site_packages": sysconfig.get_paths()["purelib"],
        "packages": len(locked),
        "imported": imported,
        "not_imported": skipped,
        "torch_cuda": torch_cuda,
        "model_types": list(args.model_types),
        "lock": header_fields(lock_text),
    }


def site_packages(path: Path) -> Path:
    """The site-packages of a venv (``lib*/python*/site-packages``), or ``path`` itself when it is not
    a venv (already a site-packages directory)."""
    if not (path / "pyvenv.cfg").is_file():
        return path
    found = sorted({p.resolve() for p in path.glob("lib*/python*/site-packages") if p.is_dir()})
    if len(found) != 1:
        raise FileNotFoundError(f"{path} is a venv with {len(found)} site-packages directories, expected one")
    return found[0]


@dataclass
class KernelProof:
    archs: Dict[str, List[str]]
    """Cubin archs of every object judged (required or exempt), by path relative to site-packages."""
    required: List[str]
    """The objects that must carry the archs."""
    problems: List[str]


def kernel_proof(
    site: Path, packages: Sequence[str], required_archs: Sequence[str], exemptions: Sequence[str]
) -> KernelProof:
    """Parse the cubins of every shared object (and, summed up as ``<dir>/**/*.cubin``, the bare
    cubins) of ``packages`` under ``site``: each must carry every required arch unless an exemption
    glob (relative to ``site``) matches it. An exempt object must still LACK the archs and every
    exemption must match an object, so the lane's list stays true; exemptions outside ``packages``
    are looked up in their own top directory.
    """
    for arch in required_archs:
        fatbin.meets([], arch)  # ValueError naming a malformed arch, before anything is scanned
    for package in packages:
        if "/" in package or package in ("", ".", ".."):
            raise ValueError(f"kernel package {package!r} is not a directory name under site-packages, e.g. sgl_kernel")
    roots = list(dict.fromkeys([*packages, *(glob.split("/", 1)[0] for glob in exemptions)]))
    archs: Dict[str, List[str]] = {}
    problems: List[str] = []
    for root in roots:
        base = site / root
        if not base.is_dir():
            if root in packages:
                problems.append(f"kernel package {root} is not installed in {site}")
            continue
        result = fatbin.scan([base], cubins=True)
        problems += [f"cannot read {error}" for error in result.errors]
        found = {
            str(report.path.relative_to(site)): fatbin.sort_archs(report.cubins)
            for report in result.reports
            if report.cubins
        }
        if root in packages and not found and not result.errors:
            problems.append(f"kernel package {root} has no object with CUDA cubins in {base}: nothing to prove")
        archs.update(found)
    required: List[str] = []
    judged: Dict[str, List[str]] = {}
    for name, cubins in sorted(archs.items()):
        exempt = [glob for glob in exemptions if fnmatch.fnmatch(name, glob)]
        if exempt:
            judged[name] = cubins
            has = [arch for arch in required_archs if fatbin.meets(cubins, arch)]
            if has:
                problems.append(
                    f"{name} now has {' '.join(has)} (cubins {' '.join(cubins)}): "
                    f"drop {exempt[0]} from the lane's kernel_exemptions"
                )
        elif name.split("/", 1)[0] in packages:
            judged[name] = cubins
            required.append(name)
            missing = [arch for arch in required_archs if not fatbin.meets(cubins, arch)]
            if missing:
                problems.append(f"{name} has no {' '.join(missing)} cubin (has {' '.join(cubins)})")
    problems += [
        f"kernel_exemptions entry {glob} matches no object with cubins under {site}: drop it from the lane"
        for glob in exemptions
        if not any(fnmatch.fnmatch(name, glob) for name in archs)
    ]
    return KernelProof(judged, required, problems)


def is_complete(venv: Path) -> bool:
    return (venv / MARKER).is_file()


REJECTED = "rejected-"
"""Prefix of a kept venv that failed the checks before reuse, set aside for inspection: never pruned."""
# A marker or a lock is a few KB; anything far larger is not one.
_SMALL_FILE_MAX_BYTES = 1 << 20
# A RECORD lists a package's files, a few MB for the largest (torch).
_RECORD_MAX_BYTES = 64 << 20
# Files named in a problem, at most.
_NAMED = 5


def _root_file(path: Path, what: str) -> Tuple[Optional[bytes], str]:
    """The bytes of ``path`` when it is a regular root-owned file no one else may write, of a bounded size."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return None, f"its {what} cannot be read ({exc.strerror})"
    if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        return None, f"its {what} {path} is not a regular root-owned file only root may write"
    if info.st_size > _SMALL_FILE_MAX_BYTES:
        return None, f"its {what} {path} holds {info.st_size:,} bytes, not a {what}"
    with open(path, "rb") as handle:
        return handle.read(_SMALL_FILE_MAX_BYTES + 1), ""


def _marker_problem(venv: Path, lock_text: str) -> str:
    data, problem = _root_file(venv / MARKER, "marker")
    if data is None:
        return problem
    try:
        report = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "its marker is not the check's JSON report"
    if not isinstance(report, dict) or report.get("ok") is not True or report.get("problems") != []:
        found = report.get("problems") if isinstance(report, dict) else None
        return f"its marker does not record a passed check ({'; '.join(map(str, found)) if isinstance(found, list) and found else 'ok is not true'})"
    recorded = report.get("lock_sha256")
    if recorded is not None and recorded != hashlib.sha256(lock_text.encode("utf-8")).hexdigest():
        return "its marker records the check of another lock"
    site = report.get("site_packages")
    if not isinstance(site, str) or not (site + "/").startswith(str(venv) + "/"):
        return f"its marker's site-packages {site!r} is not inside it"
    return ""


def _tree_problem(venv: Path) -> str:
    """Anything in the venv that is not root's alone (a link's own mode does not count)."""
    bad: List[str] = []
    for directory, dirnames, filenames in os.walk(venv):
        for name in [*dirnames, *filenames]:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if info.st_uid != 0 or (not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o022):
                bad.append(os.path.relpath(path, venv))
        if len(bad) >= _NAMED:
            break
    if bad:
        return f"{', '.join(bad[:_NAMED])} {'is' if len(bad) == 1 else 'are'} not root's alone (another owner, or writable by others)"
    return ""


def stray_files(site: Path) -> List[str]:
    """Files in ``site`` (site-packages) that no installed distribution's RECORD lists, bytecode caches left
    out: a module, a .pth or a sitecustomize.py put there by hand, which Python would load like any other."""
    listed = set()
    for record in site.glob("*.dist-info/RECORD"):
        with open(record, "rb") as handle:
            text = handle.read(_RECORD_MAX_BYTES).decode("utf-8", errors="replace")
        for row in csv.reader(io.StringIO(text)):
            if row:
                listed.add(os.path.normpath(os.path.join(site, row[0])))
    stray: List[str] = []
    for directory, dirnames, filenames in os.walk(site):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = os.path.join(directory, name)
            if path not in listed:
                stray.append(os.path.relpath(path, site))
    return stray


def kept_venv_problem(venv: Path, lock_text: str) -> str:
    """Why a complete venv of the store may not be switched to as it is ("" = it may, once the check runs
    again): a new venv's guarantees, read off the kept one. Its marker must be a root-owned report of a passed
    check (of this lock, when it says), its lock the wanted lock byte for byte, everything in it root's alone,
    and nothing in its site-packages that no installed package's RECORD lists. The import check itself
    (versions, imports, CUDA, kernels) is run again by the caller before the switch."""
    problem = _marker_problem(venv, lock_text)
    if problem:
        return problem
    data, problem = _root_file(venv / LOCK_NAME, "lock")
    if data is None:
        return problem
    if data != lock_text.encode("utf-8"):
        return f"its lock {venv / LOCK_NAME} is not the wanted lock (another venv's, or edited)"
    problem = _tree_problem(venv)
    if problem:
        return problem
    try:
        stray = stray_files(site_packages(venv))
    except (OSError, FileNotFoundError) as exc:
        return f"its site-packages cannot be listed ({exc})"
    if stray:
        more = f" and {len(stray) - _NAMED} more" if len(stray) > _NAMED else ""
        return f"its site-packages holds files no installed package lists: {', '.join(stray[:_NAMED])}{more}"
    return ""


def prune_plan(store: Path, current: str, keep: int, previous: str = "") -> List[Path]:
    """The store entries to remove: incomplete ones, and complete ones beyond the ``keep`` newest
    (``previous``, the venv served before a switch, counts as the newest: it is the rollback).
    The current venv, moved pre-existing ones (the operator's) and rejected ones (kept for inspection) are
    never removed."""
    complete: List[Tuple[Tuple[bool, float], Path]] = []
    remove: List[Path] = []
    if not store.is_dir():  # check mode on a fresh host: nothing built, nothing to remove
        return remove
    for entry in sorted(store.iterdir()):
        if entry.name == current or entry.name.startswith((PREEXISTING, REJECTED)) or entry.is_symlink() or not entry.is_dir():
            continue
        if is_complete(entry):
            complete.append(((entry.name == previous, (entry / MARKER).stat().st_mtime), entry))
        else:
            remove.append(entry)
    complete.sort(key=lambda item: item[0], reverse=True)
    return remove + [path for _, path in complete[keep:]]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Check the venv this python runs in against its lock.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check")
    check.add_argument("--lock", required=True)
    check.add_argument("--cuda", default="", help="expected torch.version.cuda ('' = not checked)")
    check.add_argument("--import", dest="imports", action="append", default=[])
    check.add_argument("--driver-import", dest="driver_imports", action="append", default=[])
    check.add_argument("--model-type", dest="model_types", action="append", default=[])
    report = run_check(parser.parse_args(argv))
    print(json.dumps(report, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
