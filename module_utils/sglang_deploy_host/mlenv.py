#!/usr/bin/env python3
"""On-host helper of the ml_env role (stdlib only: the host does not have sglang_deploy).

  check  run by the NEW venv's python: every pin of the lock installed at exactly that version and
         nothing else, the imports work, torch's CUDA is the lane's, transformers knows the model
         types, and (kernel proof, with --fatbin) every shared object of the kernel packages that
         has cubins carries each --require-arch, except the lane's --kernel-exempt globs.
         Prints a JSON report; exit 1 when anything is wrong.
  prune  keep the current venv and the ``--keep`` newest other complete ones in the store; remove
         older complete ones and every incomplete (never checked) one. Prints JSON.

A venv is complete when the role wrote its marker (MARKER) after ``check`` passed.
"""

from __future__ import annotations

import argparse
import ctypes
import fnmatch
import importlib
import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

MARKER = ".sglang-deploy-ml-env.json"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HEADER_FIELD = re.compile(r"^# (cuda|inputs-sha256): (\S+)$", re.MULTILINE)


def normalize(name: str) -> str:
    """PEP 503 name normalization (Sglang_Kernel == sglang-kernel)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> dict[str, str]:
    """``name==version`` pins of a hashed requirements file (continuation and comment lines skipped)."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        match = _PIN.match(line)
        if match:
            pins[normalize(match.group(1))] = match.group(2)
    return pins


def header_fields(text: str) -> dict[str, str]:
    """The fields ``sglang-deploy lock`` writes into the header (cuda, inputs-sha256)."""
    return dict(_HEADER_FIELD.findall(text))


def compare_versions(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    """Every difference between the lock and what is installed, one sentence each."""
    problems = []
    for name, version in sorted(pins.items()):
        have = installed.get(name)
        if have is None:
            problems.append(f"{name}=={version} is in the lock but not installed")
        elif have != version:
            problems.append(f"{name} is {have}, the lock pins {version}")
    problems += [
        f"{name}=={installed[name]} is installed but not in the lock"
        for name in sorted(set(installed) - set(pins))
    ]
    return problems


def installed_versions() -> dict[str, str]:
    from importlib import metadata

    return {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()}


def driver_present() -> bool:
    """Whether the NVIDIA driver's libcuda.so.1 loads (kernels packages link it at import)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def kernel_objects(site_packages: Path, packages: list[str], exempt: list[str]) -> tuple[list[Path], list[str]]:
    """The packages' shared objects the proof requires archs of, and problems (a package without any)."""
    objects: list[Path] = []
    problems: list[str] = []
    for package in packages:
        found = sorted(p for p in (site_packages / package).rglob("*.so*") if p.is_file())
        if not found:
            problems.append(f"kernel package {package} has no shared objects in {site_packages}")
        objects += [
            p for p in found if not any(fnmatch.fnmatch(str(p.relative_to(site_packages)), g) for g in exempt)
        ]
    return objects, problems


def kernel_proof(
    site_packages: Path, packages: list[str], exempt: list[str], archs: list[str], fatbin: str
) -> tuple[list[str], list[str]]:
    """Run fatbin.py --require on the kernel objects; return the objects checked and the problems."""
    objects, problems = kernel_objects(site_packages, packages, exempt)
    checked = [str(p.relative_to(site_packages)) for p in objects]
    for arch in archs if objects else []:
        proc = subprocess.run(
            [sys.executable, fatbin, "--require", arch, *map(str, objects)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            problems.append(f"kernel proof for {arch} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return checked, problems


def run_check(args: argparse.Namespace) -> dict[str, object]:
    lock_text = Path(args.lock).read_text(encoding="utf-8")
    pins = parse_lock(lock_text)
    problems = [] if pins else [f"{args.lock} holds no name==version pins"]
    problems += compare_versions(pins, installed_versions())
    imported: list[str] = []
    skipped: dict[str, str] = {}
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
            import torch

            torch_cuda = torch.version.cuda
        except Exception as exc:
            problems.append(f"cannot read torch.version.cuda: {type(exc).__name__}: {exc}")
        else:
            if torch_cuda != args.cuda:
                problems.append(f"torch.version.cuda is {torch_cuda!r}, the lane needs {args.cuda!r}")
    if args.model_types:
        try:
            from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        except Exception as exc:
            problems.append(f"cannot read transformers' model types: {type(exc).__name__}: {exc}")
        else:
            problems += [
                f"transformers does not know model type {model_type!r}"
                for model_type in args.model_types
                if model_type not in CONFIG_MAPPING_NAMES
            ]
    kernels: list[str] = []
    if args.fatbin:
        kernels, kernel_problems = kernel_proof(
            Path(sysconfig.get_paths()["purelib"]),
            args.kernel_packages,
            args.kernel_exempt,
            args.require_archs,
            args.fatbin,
        )
        problems += kernel_problems
    return {
        "ok": not problems,
        "kernel_objects": kernels,
        "required_archs": list(args.require_archs),
        "problems": problems,
        "python": ".".join(map(str, sys.version_info[:2])),
        "packages": len(pins),
        "imported": imported,
        "not_imported": skipped,
        "torch_cuda": torch_cuda,
        "model_types": list(args.model_types),
        "lock": header_fields(lock_text),
    }


def prune_plan(store: Path, current: str, keep: int) -> list[Path]:
    """The store entries to remove: incomplete ones, and complete ones beyond the ``keep`` newest."""
    complete: list[tuple[float, Path]] = []
    remove: list[Path] = []
    if not store.is_dir():  # check mode on a fresh host: nothing built, nothing to remove
        return remove
    for entry in sorted(store.iterdir()):
        if entry.name == current or not entry.is_dir() or entry.is_symlink():
            continue
        marker = entry / MARKER
        if marker.is_file():
            complete.append((marker.stat().st_mtime, entry))
        else:
            remove.append(entry)
    complete.sort(key=lambda item: item[0], reverse=True)
    remove += [path for _, path in complete[keep:]]
    return remove


def run_prune(args: argparse.Namespace) -> dict[str, object]:
    store = Path(args.store)
    removed = [str(path) for path in prune_plan(store, args.current, args.keep)]
    if not args.dry_run:
        for path in removed:
            shutil.rmtree(path)
    return {"removed": removed, "dry_run": args.dry_run}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check")
    check.add_argument("--lock", required=True)
    check.add_argument("--cuda", default="", help="expected torch.version.cuda ('' = not checked)")
    check.add_argument("--import", dest="imports", action="append", default=[])
    check.add_argument("--driver-import", dest="driver_imports", action="append", default=[])
    check.add_argument("--model-type", dest="model_types", action="append", default=[])
    check.add_argument("--fatbin", default="", help="fatbin.py for the kernel proof ('' = no proof)")
    check.add_argument("--require-arch", dest="require_archs", action="append", default=[])
    check.add_argument("--kernel-package", dest="kernel_packages", action="append", default=[])
    check.add_argument("--kernel-exempt", action="append", default=[], help="glob under site-packages")
    prune = sub.add_parser("prune")
    prune.add_argument("--store", required=True)
    prune.add_argument("--current", required=True)
    prune.add_argument("--keep", type=int, required=True)
    prune.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    report = run_check(args) if args.command == "check" else run_prune(args)
    print(json.dumps(report, sort_keys=True))
    return 0 if report.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
