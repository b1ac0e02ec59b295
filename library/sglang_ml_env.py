#!/usr/bin/python
"""Ansible module sglang_ml_env: the ml-env venv from a lock, built beside the old one, checked, switched."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_ml_env
short_description: Build the ml-env venv from a hashed lock with uv, check it, switch a symlink to it atomically
description:
  - Installs uv from hashed requirements into a small bootstrap venv (pip), then the lock with
    C(uv pip sync --require-hashes --no-build) into I(store)/<first 16 hex digits of the lock's
    sha256>, so a changed lock builds beside the serving venv and the same lock finds its venv again.
  - Checks the new venv in its own interpreter (every pin installed at exactly its version and
    nothing else, I(imports), torch's CUDA = the lock header's, I(model_types)) and runs the kernel
    proof (as sglang_kernel_proof) before anything points at it. Only then are group and other
    write taken off the venv, its marker written (the check's report) and I(path) switched to it
    by renaming a new symlink over the old one (atomic for readers).
  - A failed build or check removes the new venv and leaves I(path) where it was. A directory at
    I(path) (a venv made by hand) is moved into the store as C(preexisting-<UTC time>) when the
    switch happens, never deleted. Complete venvs beyond the current one and I(keep) others (the one
    served before first, then the newest) are removed, and so are incomplete ones.
  - The install tries the uv cache alone first (C(uv pip sync --offline)); when every wheel of the lock is
    in I(uv_cache_dir) (a rebuild with the kept disk's cache and an unchanged lock), nothing is fetched, by
    construction. Only when that fails does it run again with the index; I(uv) in the result says which ran
    and how many bytes the cache grew by (what was fetched) and held before (what was reused).
  - With the same lock, its venv complete and I(path) pointing at it, nothing runs but a few stat() calls.
  - A complete venv of the lock that I(path) does not point at (a rebuild whose I(store) sits on the kept disk, a
    rollback) is reused, not installed again, when its interpreter runs and is the same Python build as I(python)
    (C(sys.version) compared whole; otherwise it is stale and is built again) and it passes a new venv's checks
    again - its marker a root-owned report of a passed check of this lock, its lock the wanted one byte for byte,
    everything in it root's alone, no file in its site-packages that no installed package's RECORD lists, then
    the check itself (versions, imports, CUDA, kernels) run again. One that fails is set aside as
    C(rejected-<digest>-<UTC time>) (never pruned, the operator's to inspect) and the lock is built beside it.
    I(uv) says C(reused_venv).
  - Check mode reports what would happen (also on a fresh host) and touches nothing. Diff shows
    the symlink's target and the store's listing before and after.
  - Everything is created root-owned, directories 0755 (uv's cache 0700), with group and other
    write off, as root runs this code too and the service only reads it.
options:
  path:
    description: The symlink the server runs from (ml_env_path).
    type: path
    required: true
  store:
    description: Directory of the venvs, one per lock (ml_env_store).
    type: path
    required: true
  lock:
    description: Text of the lock (the output of C(sglang-deploy lock)); its header names its CUDA.
    type: str
    required: true
  lock_name:
    description: Where the lock came from, for messages (e.g. its file name).
    type: str
    default: the lock
  python:
    description: The host's Python the venvs are made from (ml_env_python).
    type: str
    required: true
  uv_venv:
    description: The bootstrap venv that holds uv (ml_env_uv_venv).
    type: path
    required: true
  uv_requirements:
    description: Text of uv's hashed requirements (pip install --require-hashes).
    type: str
    required: true
  uv_cache_dir:
    description: uv's download and wheel cache (ml_env_uv_cache_dir).
    type: path
    required: true
  index_url:
    description: Package index for pip and uv (ml_env_index_url).
    type: str
    required: true
  ca_bundle:
    description: CA bundle on the host that pip and uv trust ("" = their own roots).
    type: str
    default: ""
  keep:
    description: Complete venvs kept besides the current one (ml_env_keep).
    type: int
    default: 1
  timeout:
    description: Seconds the build (uv venv, install, check, kernel proof) may take before it is abandoned and removed.
    type: int
    default: 3600
  imports:
    description: Modules the new venv must import.
    type: list
    elements: str
    default: []
  driver_imports:
    description: Modules imported only where the NVIDIA driver's libcuda.so.1 loads.
    type: list
    elements: str
    default: []
  model_types:
    description: Model types the venv's transformers must know.
    type: list
    elements: str
    default: []
  kernel_packages:
    description: Packages whose objects must carry I(required_archs) (the kernel proof; none = no proof).
    type: list
    elements: str
    default: []
  required_archs:
    description: The lane's required_archs.
    type: list
    elements: str
    default: []
  kernel_exemptions:
    description: The lane's kernel_exemptions globs (relative to site-packages).
    type: list
    elements: str
    default: []
"""

RETURN = r"""
venv:
  description: The lock's venv, I(path)'s target after this run (or in check mode, the one it would be).
  type: str
  returned: always
digest:
  description: The venv's name, the first 16 hex digits of the lock's sha256.
  type: str
  returned: always
switched:
  description: Whether I(path) now points elsewhere than before (a running server needs a restart).
  type: bool
  returned: always
previous:
  description: I(path)'s target before this run ("" if it was no symlink).
  type: str
  returned: always
actions:
  description: What was (in check mode, would be) done, one sentence each.
  type: list
  elements: str
  returned: always
removed:
  description: Store entries removed (in check mode, that would be removed).
  type: list
  elements: str
  returned: always
report:
  description: The check's report of the venv (its marker); empty in check mode before the venv exists.
  type: dict
  returned: always
uv:
  description: >-
    How this run's install used uv's cache (empty when nothing was installed): offline (true = installed from
    the cache alone, --offline, so 0 bytes were fetched), fetched_bytes (what the cache grew by), reused_bytes
    (what it held before), cache_dir; reused_venv true when a kept complete venv was switched to instead (nothing
    installed, nothing fetched).
  type: dict
  returned: always
"""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host import interp
from ansible.module_utils.sglang_deploy_host.stack import lockfile, mlenv

_UV_REQUIREMENTS = "uv-requirements.txt"
# Lines of a failed command's output kept in the message.
_TAIL_LINES = 25


# One step of a run: what it does (in the result and check mode's report), and the call that does it.
Step = Tuple[str, Callable[[], Optional[str]]]


class BuildError(Exception):
    """A step of the build failed; the message says which and why."""


class Deadline:
    """The build's time budget, shared by its steps."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self, step: str) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise BuildError(f"{step}: the build's {self.seconds} s (timeout) are spent")
        return left


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-_TAIL_LINES:])


def _run(argv: List[str], step: str, deadline: Deadline, env: Optional[Dict[str, str]] = None) -> str:
    """Run ``argv`` within the deadline; its stdout, or BuildError with its output's tail."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=deadline.left(step), cwd="/", check=False
        )
    except subprocess.TimeoutExpired:
        raise BuildError(f"{step}: did not finish within the build's {deadline.seconds} s (timeout)") from None
    except OSError as exc:
        raise BuildError(f"{step}: cannot run {argv[0]}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        raise BuildError(f"{step} failed (exit {proc.returncode}):\n{_tail(proc.stderr or proc.stdout)}")
    return proc.stdout


def _dir_fix(path: Path, mode: int) -> Optional[str]:
    """What must change for ``path`` to be a root-owned directory with ``mode`` (None: nothing)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return f"create {path} (root, {mode:04o})"
    if not stat.S_ISDIR(info.st_mode):
        raise BuildError(f"{path} exists but is not a directory; move it away")
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != (0, 0, mode):
        return f"set {path} to root:root {mode:04o} (was {info.st_uid}:{info.st_gid} {stat.S_IMODE(info.st_mode):04o})"
    return None


def _make_dir(path: Path, mode: int) -> None:
    """``path`` root-owned with ``mode``; parents made here are root-owned 0755 (traversable)."""
    for directory in reversed([p for p in path.parents if not p.exists()]):
        directory.mkdir()
        os.chown(directory, 0, 0)
        os.chmod(directory, 0o755)
    path.mkdir(exist_ok=True)
    os.chown(path, 0, 0)
    os.chmod(path, mode)


def _write(path: Path, text: str) -> None:
    """Write a 0644 file atomically."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def _take_write_off(root: Path) -> None:
    """``chmod -R go-w``: uv leaves its .lock world-writable; nothing root runs may be writable by others."""
    for directory, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o022:
                os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o022)
    os.chmod(root, stat.S_IMODE(root.stat().st_mode) & ~0o022)


def _link_target(path: Path) -> str:
    return os.readlink(path) if path.is_symlink() else ""


def _listing(store: Path) -> str:
    """The store, one entry a line, for the diff."""
    if not store.is_dir():
        return "(no store)\n"
    lines = [
        f"{entry.name} ({'complete' if mlenv.is_complete(entry) else 'incomplete'})"
        for entry in sorted(store.iterdir())
        if entry.is_dir() and not entry.is_symlink()
    ]
    return "".join(f"{line}\n" for line in lines) or "(empty)\n"


def _tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` (each inode once: uv hard-links within its cache)."""
    seen = set()
    total = 0
    for directory, _dirnames, filenames in os.walk(root):
        for name in filenames:
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:  # removed meanwhile (uv's own temporary files)
                continue
            if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def _python_build(python: str) -> Tuple[str, str]:
    """(``sys.version`` of ``python``, "") or ("", why it could not be read)."""
    argv = [python, "-I", "-c", "import sys; sys.stdout.write(sys.version)"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/", check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"{python} does not run ({exc})"
    if proc.returncode != 0 or not proc.stdout:
        return "", f"{python} does not run (exit {proc.returncode}: {_tail(proc.stderr)})"
    return proc.stdout, ""


def _read_report(venv: Path) -> Dict[str, Any]:
    try:
        report = json.loads((venv / mlenv.MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


class MlEnv:
    """One run of the module: the steps, planned from the host's state, then done in order."""

    def __init__(self, module: AnsibleModule) -> None:
        params = module.params
        self.module = module
        self.params = params
        self.path = Path(params["path"])
        self.store = Path(params["store"])
        self.lock = params["lock"]
        self.lock_name = params["lock_name"]
        self.uv_venv = Path(params["uv_venv"])
        self.digest = lockfile.venv_name(self.lock)
        self.venv = self.store / self.digest
        self.previous = _link_target(self.path)
        self.hand_made = self.path.is_dir() and not self.path.is_symlink()
        self.header = lockfile.header_fields(self.lock)
        self.deadline = Deadline(params["timeout"])  # planning takes milliseconds: the build has it all
        self.report: Dict[str, Any] = {}  # the check's report of a venv built now
        self.uv: Dict[str, Any] = {}  # how the install used uv's cache (build only)

    # --- plan ---------------------------------------------------------------------------------

    def inputs_problem(self) -> Optional[str]:
        """Bad input, found before anything on the host changes."""
        if self.params["keep"] < 0:
            return f"keep (ml_env_keep) is {self.params['keep']}; set it to 0 or more (previous venvs kept)"
        if not lockfile.pins(self.lock):
            return f"{self.lock_name} holds no name==version pins; use a lock made by `sglang-deploy lock`"
        if "cuda" not in self.header:
            return f"{self.lock_name} has no '# cuda:' header line; regenerate it with `sglang-deploy lock`"
        if "uv" not in lockfile.pins(self.params["uv_requirements"]):
            return "uv_requirements pins no uv==VERSION; regenerate it (see the file's header)"
        if self.path.is_symlink() or not self.path.exists() or self.path.is_dir():
            return None
        return f"{self.path} is neither a symlink nor a directory; move it away so the ml-env can be linked there"

    def directories(self) -> List[Tuple[Path, int]]:
        """Root-owned directories; uv's cache is root's alone (it holds what root installs)."""
        wanted = [(self.path.parent, 0o755), (self.store, 0o755), (self.uv_venv.parent, 0o755)]
        wanted.append((Path(self.params["uv_cache_dir"]), 0o700))
        return list(dict.fromkeys(wanted))

    def uv_installed(self) -> bool:
        """uv is in the bootstrap venv from exactly these requirements (written after pip succeeded)."""
        requirements = self.uv_venv / _UV_REQUIREMENTS
        try:
            return os.access(self.uv_venv / "bin" / "uv", os.X_OK) and requirements.read_text(
                encoding="utf-8"
            ) == self.params["uv_requirements"]
        except OSError:
            return False

    def prune_plan(self) -> List[Path]:
        return mlenv.prune_plan(self.store, self.digest, self.params["keep"], previous=Path(self.previous).name)

    def plan(self) -> List[Step]:
        """What this run must do, in order: (what it does, the call that does it)."""
        steps: List[Step] = []
        for path, mode in self.directories():
            fix = _dir_fix(path, mode)
            if fix:
                steps.append((fix, partial(_make_dir, path, mode)))
        if not self.uv_installed():
            version = lockfile.pins(self.params["uv_requirements"])["uv"]
            steps.append((f"install uv {version} into {self.uv_venv} (pip, hashes checked)", self.install_uv))
        build = (
            f"build venv {self.venv} from {self.lock_name} ({len(lockfile.pins(self.lock))} pinned packages, "
            f"Python {self.header.get('python', '?')}, CUDA {self.header['cuda']}), then check it"
        )
        if not mlenv.is_complete(self.venv):
            steps.append((build, self.build_or_remove))
        elif self.previous != str(self.venv):
            stale = self.stale_interpreter()
            untrusted = "" if stale else mlenv.kept_venv_problem(self.venv, self.lock)
            if stale:
                steps.append((f"{build} again: the complete one there is stale ({stale})", self.build_or_remove))
            elif untrusted:
                steps.append((f"{build} beside the kept one, set aside as {mlenv.REJECTED}{self.digest}-<UTC time> "
                              f"for inspection: {untrusted}", partial(self.reject_and_build, untrusted)))  # fmt: skip
            else:
                steps.append((f"reuse the complete venv {self.venv} (kept; same lock, same Python build) once it passes "
                              "a new venv's checks again", self.reuse))  # fmt: skip
        if self.hand_made:
            text = f"move the directory {self.path} into {self.store} as {mlenv.PREEXISTING}<UTC time>"
            steps.append((text, self.keep_preexisting))
        if self.previous != str(self.venv):
            steps.append((f"switch {self.path} from {self.previous or 'nothing'} to {self.venv}", self.switch))
        for entry in self.prune_plan():
            steps.append((f"remove {entry} (incomplete, or beyond keep)", partial(shutil.rmtree, entry)))
        return steps

    def stale_interpreter(self) -> str:
        """Why the lock's complete venv cannot be reused here ("" = it can): its interpreter must run and be
        this host's Python build, or its compiled packages and paths may not fit (a rebuilt OS, another Python)."""
        host, problem = _python_build(self.params["python"])
        if problem:
            return problem
        built, problem = _python_build(str(self.venv / "bin" / "python"))
        if problem:
            return f"its interpreter: {problem}"
        if built != host:
            first = built.splitlines()[0] if built else "?"
            return f"made by Python {first}, {self.params['python']} is {host.splitlines()[0]}"
        return ""

    # --- do -----------------------------------------------------------------------------------

    def reuse(self) -> str:
        """A kept complete venv of this lock, trusted only after the check a new one passes (run again now: the
        versions against the lock, the imports, torch's CUDA, the kernels); one that fails it is set aside and
        the lock built again."""
        try:
            report = self.check(self.venv / mlenv.LOCK_NAME)
        except BuildError as exc:
            report = {"problems": [str(exc)]}
        if report["problems"]:
            return self.reject_and_build("its check failed again: " + "; ".join(report["problems"]))
        self.report = _read_report(self.venv)
        self.uv = {
            "offline": True,
            "fetched_bytes": 0,
            "reused_bytes": 0,
            "cache_dir": self.params["uv_cache_dir"],
            "reused_venv": True,
        }
        return (
            f"reused {self.venv} (kept complete venv of {self.lock_name}, same Python build): nothing installed, "
            "its checks passed again"
        )

    def reject_and_build(self, why: str) -> str:
        """Set the kept venv aside (never pruned, the operator's to inspect) and build the lock beside it."""
        rejected = self.store / f"{mlenv.REJECTED}{self.digest}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%fZ}"
        os.rename(self.venv, rejected)
        built = self.build_or_remove()
        return f"set the kept {self.venv} aside as {rejected} ({why}); {built}"

    def install_uv(self) -> None:
        params = self.params
        try:
            if not (self.uv_venv / "bin" / "pip").exists():
                argv = [params["python"], "-m", "venv", str(self.uv_venv)]
                _run(argv, f"creating the bootstrap venv {self.uv_venv}", self.deadline)
            requirements = self.uv_venv / f".{_UV_REQUIREMENTS}.new"
            requirements.write_text(params["uv_requirements"], encoding="utf-8")
            # --isolated: no PIP_* variable or pip.conf points pip elsewhere.
            argv = [str(self.uv_venv / "bin" / "pip"), "install", "--isolated", "--disable-pip-version-check"]
            argv += ["--no-input", "--require-hashes", "--index-url", params["index_url"]]
            argv += ["--cert", params["ca_bundle"]] if params["ca_bundle"] else []
            _run([*argv, "-r", str(requirements)], f"installing uv into {self.uv_venv}", self.deadline)
        except BuildError as exc:
            raise BuildError(
                f"{exc}\nFix: the index (ml_env_index_url {params['index_url']}) or its CA (ml_env_ca_bundle), "
                f"or install python3-venv for {params['python']}; {self.path} was not touched."
            ) from None
        os.replace(requirements, self.uv_venv / _UV_REQUIREMENTS)  # marks uv installed from these

    def uv_env(self) -> Dict[str, str]:
        # uv reads no configuration file (--no-config); no UV_* variable may point it elsewhere either.
        env = {key: value for key, value in os.environ.items() if not key.startswith("UV_")}
        env.update(UV_CACHE_DIR=self.params["uv_cache_dir"], UV_PYTHON_DOWNLOADS="never")
        if self.params["ca_bundle"]:
            env["SSL_CERT_FILE"] = self.params["ca_bundle"]
        return env

    def build(self) -> Dict[str, Any]:
        """Install and check the lock's venv; its report. BuildError when anything failed."""
        params, venv, uv, deadline = self.params, self.venv, str(self.uv_venv / "bin" / "uv"), self.deadline
        if venv.exists():  # an interrupted run's half-built venv of this lock
            shutil.rmtree(venv)
        argv = [uv, "venv", "--no-config", "--no-python-downloads", "--python", params["python"], str(venv)]
        _run(argv, f"creating {venv}", deadline, self.uv_env())
        lock_file = venv / mlenv.LOCK_NAME
        _write(lock_file, self.lock)
        argv = [uv, "pip", "sync", "--no-config", "--require-hashes", "--no-build"]
        argv += ["--index-url", params["index_url"], "--python", str(venv / "bin" / "python"), str(lock_file)]
        self.uv = self.sync(argv)
        report = self.check(lock_file)
        if report["problems"]:
            raise BuildError(f"{venv} failed its checks: " + "; ".join(report["problems"]))
        _take_write_off(venv)
        report["lock_sha256"] = hashlib.sha256(self.lock.encode("utf-8")).hexdigest()
        _write(venv / mlenv.MARKER, json.dumps(report, sort_keys=True) + "\n")
        return report

    def sync(self, argv: List[str]) -> Dict[str, Any]:
        """``uv pip sync`` from the cache alone (--offline), else with the index; what the cache gave."""
        cache = Path(self.params["uv_cache_dir"])
        before = _tree_bytes(cache)
        step = f"installing {self.lock_name} into {self.venv} (uv pip sync)"
        try:
            _run([*argv, "--offline"], f"{step} from the uv cache alone", self.deadline, self.uv_env())
            offline = True
        except BuildError as exc:
            if str(exc).endswith("(timeout)") or "(timeout) are spent" in str(exc):
                raise
            _run(argv, step, self.deadline, self.uv_env())
            offline = False
        after = _tree_bytes(cache)
        return {
            "offline": offline,
            "reused_venv": False,
            "fetched_bytes": 0 if offline else max(after - before, 0),
            "reused_bytes": before,
            "cache_dir": str(cache),
        }

    def check(self, lock_file: Path) -> Dict[str, Any]:
        """mlenv's check in the venv's interpreter, then the kernel proof in this one."""
        params, deadline = self.params, self.deadline
        args = ["check", "--lock", str(lock_file)]
        # torch's CUDA build must be the lock's; a lock without torch has no CUDA build to check.
        args += ["--cuda", self.header["cuda"]] if "torch" in lockfile.pins(self.lock) else []
        args += [f"--import={name}" for name in params["imports"]]
        args += [f"--driver-import={name}" for name in params["driver_imports"]]
        args += [f"--model-type={name}" for name in params["model_types"]]
        step = f"checking {self.venv} with its python"
        try:
            proc = interp.run_module(
                str(self.venv / "bin" / "python"), "stack.mlenv", args, names=list(mlenv.CHECK_MODULES), timeout=deadline.left(step)
            )
        except subprocess.TimeoutExpired:
            raise BuildError(f"{step}: did not finish within the build's {deadline.seconds} s (timeout)") from None
        try:
            report: Dict[str, Any] = json.loads(proc.stdout)
        except ValueError:
            raise BuildError(f"{step}: exit {proc.returncode}, no report:\n{_tail(proc.stderr)}") from None
        if params["kernel_packages"]:
            proof = mlenv.kernel_proof(
                Path(report["site_packages"]),
                params["kernel_packages"],
                params["required_archs"],
                params["kernel_exemptions"],
            )
            report.update(kernel_objects=proof.required, kernel_archs=proof.archs, required_archs=params["required_archs"])
            report["problems"] = report["problems"] + proof.problems
        report["ok"] = not report["problems"]
        return report

    def keep_preexisting(self) -> str:
        """Move a hand-made venv at ``path`` into the store (kept for rollback, never pruned)."""
        moved = self.store / f"{mlenv.PREEXISTING}{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
        shutil.move(str(self.path), str(moved))  # the store may be another file system
        _write(moved / mlenv.MARKER, json.dumps({"preexisting": True, "moved_from": str(self.path)}) + "\n")
        return f"moved {self.path} to {moved}"

    def switch(self) -> None:
        """A new symlink renamed over the old one: readers see the old venv or the new, never none."""
        new = self.path.with_name(f".{self.path.name}.new")
        if new.is_symlink() or new.exists():
            new.unlink()
        new.symlink_to(self.venv)
        os.replace(new, self.path)

    def build_or_remove(self) -> str:
        """The build; when it fails, the new venv is removed and the error says where the ml-env points."""
        try:
            self.report = self.build()
            uv = self.uv
            source = "from the uv cache alone (--offline)" if uv["offline"] else "with the index"
            return (
                f"built {self.venv} from {self.lock_name} {source}: {uv['fetched_bytes']} bytes fetched, "
                f"{uv['reused_bytes']} bytes reused from {uv['cache_dir']}; checked it"
            )
        except (BuildError, OSError) as exc:
            shutil.rmtree(self.venv, ignore_errors=True)
            serving = f"still points at {self.previous}" if self.previous else "was not switched (nothing served before)"
            if self.hand_made:
                serving = "is still the directory it was (not moved)"
            raise BuildError(
                f"the venv for {self.lock_name}: {exc}\nIt was removed; {self.path} {serving}. "
                f"Fix the lock (sglang-deploy lock --lane {self.header.get('lane', 'LANE')}), the lane's "
                f"kernel_exemptions or the index (ml_env_index_url {self.params['index_url']}), and run again."
            ) from None
        except BaseException:
            shutil.rmtree(self.venv, ignore_errors=True)
            raise

    def run(self) -> None:
        module = self.module
        problem = self.inputs_problem()
        if problem:
            module.fail_json(msg=problem)
        before = {
            "target": self.previous or ("a directory" if self.hand_made else "absent"),
            "listing": _listing(self.store),
        }
        try:
            steps = self.plan()
        except BuildError as exc:
            module.fail_json(msg=str(exc))
        removed = [str(entry) for entry in self.prune_plan()]
        result: Dict[str, Any] = {
            "venv": str(self.venv),
            "digest": self.digest,
            "previous": self.previous,
            "actions": [text for text, _ in steps],
            "removed": removed,
            "switched": self.previous != str(self.venv),
            "report": _read_report(self.venv),
            "uv": {},
        }
        if module.check_mode:
            after = self.predicted_listing(before["listing"], removed)
            module.exit_json(changed=bool(steps), diff=self.diff(before, after), **result)
        done: List[str] = []
        for text, do in steps:
            try:
                outcome = do()
            except (BuildError, OSError) as exc:
                message = str(exc) if isinstance(exc, BuildError) else f"{text}: {exc}"
                failed = {**result, "actions": done, "removed": [], "switched": False}
                module.fail_json(msg=message, changed=bool(done), **failed)
            done.append(outcome if isinstance(outcome, str) else text)  # keep_preexisting, the build: what they did
        result["report"] = self.report or result["report"]
        result["uv"] = self.uv
        module.exit_json(changed=bool(done), diff=self.diff(before, _listing(self.store)), **{**result, "actions": done})

    def predicted_listing(self, listing: str, removed: List[str]) -> str:
        """The store's listing after the run, for check mode's diff."""
        gone = {Path(path).name for path in removed} | {self.digest}
        lines = [line for line in listing.splitlines() if line.split(" ", 1)[0] not in gone and not line.startswith("(")]
        lines.append(f"{self.digest} (complete)")
        if self.hand_made:
            lines.append(f"{mlenv.PREEXISTING}<UTC time> (complete)")
        return "".join(f"{line}\n" for line in sorted(lines))

    def diff(self, before: Dict[str, str], listing: str) -> List[Dict[str, str]]:
        """Before and after of the symlink's target and of the store's listing (only what differs)."""
        pairs = [
            (f"{self.path} (symlink target)", f"{before['target']}\n", f"{self.venv}\n"),
            (f"{self.store}/", before["listing"], listing),
        ]
        return [
            {"before_header": header, "after_header": header, "before": old, "after": new}
            for header, old, new in pairs
            if old != new
        ]


def main() -> None:
    strings = {"type": "list", "elements": "str", "default": []}
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "store": {"type": "path", "required": True},
            "lock": {"type": "str", "required": True},
            "lock_name": {"type": "str", "default": "the lock"},
            "python": {"type": "str", "required": True},
            "uv_venv": {"type": "path", "required": True},
            "uv_requirements": {"type": "str", "required": True},
            "uv_cache_dir": {"type": "path", "required": True},
            "index_url": {"type": "str", "required": True},
            "ca_bundle": {"type": "str", "default": ""},
            "keep": {"type": "int", "default": 1},
            "timeout": {"type": "int", "default": 3600},
            "imports": strings,
            "driver_imports": strings,
            "model_types": strings,
            "kernel_packages": strings,
            "required_archs": strings,
            "kernel_exemptions": strings,
        },
        supports_check_mode=True,
    )
    # What this module writes is read by the service user, whatever umask become left.
    os.umask(0o022)
    MlEnv(module).run()


if __name__ == "__main__":
    main()
