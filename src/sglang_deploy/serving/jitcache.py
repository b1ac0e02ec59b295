"""The server's JIT caches on the kept disk: which variables point where, under which key.

A rebuild keeps the kept disk (the weights disk, ``sglang_common_cache_root`` on it) and throws the root
disk away. The server's compiled kernels and bytecode are kept there when the unit's environment points
every cache variable of the pinned stack into one directory: ``<root>/current``, a root-owned symlink the
sglang_server role points at ``<root>/<key>``. The key is a digest of everything that makes a compiled
kernel stale: the ml-env's lock (it pins sglang, torch, triton, flashinfer and the lock's CUDA), the CUDA
toolkit the server JIT-compiles with, the GPUs' compute capabilities and the driver. Any of them
changes: the link moves to a new, empty directory; the old one is never read. The unit itself names
only ``current``, so it is the same whether or not the host could be asked (``render`` asks none).

The variables are the ones the pinned versions read (tests/fixtures/real-sglang/day2/cache-env-vars.txt
records where each is read; tests/unit/serving/test_jitcache.py keeps this list equal to it). Measured with
sglang 0.5.17 on an H200 (that directory's README.md): a start with the kept caches was ready after
26.3 s against 108.7 s cold; the caches that filled were PYTHONPYCACHEPREFIX, TRITON_CACHE_DIR,
FLASHINFER_WORKSPACE_BASE and TVM_FFI_CACHE_DIR.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sglang_deploy_host.serving import systemd

# variable -> its directory under <root>/<key> (one each; DeepGEMM's two variables share one: sglang
# sets DG_JIT_CACHE_DIR from SGLANG_DG_CACHE_DIR when it loads DeepGEMM).
CACHE_VARIABLES: dict[str, str] = {
    "PYTHONPYCACHEPREFIX": "pycache",
    "TRITON_CACHE_DIR": "triton",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TVM_FFI_CACHE_DIR": "tvm-ffi",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "SGLANG_CACHE_DIR": "sglang",
    "SGLANG_DG_CACHE_DIR": "deep_gemm",
    "DG_JIT_CACHE_DIR": "deep_gemm",
    "CUDA_CACHE_PATH": "cuda",
    "CUTE_DSL_CACHE_DIR": "cute_dsl",
    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "fa_cute_dsl",
}
# Digits of the key's sha256 in the directory's name.
_KEY_CHARS = 16
# The symlink under the root the unit's variables go through: the current key's directory.
LINK = "current"
# mkdir where every Debian and Ubuntu has it (merged /usr or not).
MKDIR = "/bin/mkdir"
# A key part nobody could read yet (no ml-env, no driver): spelled out, so it is a key of its own.
UNKNOWN = "unknown"


class JitCacheError(ValueError):
    """A cache setting that cannot be used; the message names the variable and the fix."""


# Trees a cache root may not be in: system and virtual directories, and temporary ones (any user may create
# there first, and the unit's /tmp is its own, PrivateTmp=yes: nothing written there is kept).
NOT_FOR_CACHES = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run", "/sbin",
    "/sys", "/tmp", "/usr", "/var/lock", "/var/run", "/var/tmp",
)  # fmt: skip


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def location_problem(root: str, variable: str, *, kept_disk: str = "", home: str = "") -> str | None:
    """Why ``root`` cannot hold kept caches (None when it can): a system, virtual or temporary directory;
    inside the service's home (the service user could rename it or swap it for a link, and root manages
    directories in it); or not strictly below the kept disk's mount point (a rebuild would lose it)."""
    bad = next((top for top in NOT_FOR_CACHES if _within(root, top)), None)
    if bad is not None or root == "/":
        return (
            f"{variable} = {root} is in {bad or '/'}, a system, virtual or temporary directory (what is there is not "
            "kept, or not the caches' to write). Fix: a directory on the kept weights disk, e.g. "
            f"{(kept_disk or '/var/lib/sglang/models')}/.sglang-deploy-cache"
        )
    if home and (_within(root, home) or _within(home, root)):
        return (
            f"{variable} = {root} overlaps the service's home {home} (sglang_server_home): the service user may "
            "rename or replace what is in its home, and root manages the caches' directories. Fix: a directory on "
            f"the kept weights disk, e.g. {(kept_disk or '/var/lib/sglang/models')}/.sglang-deploy-cache"
        )
    if kept_disk and (root == kept_disk or not _within(root, kept_disk)):
        return (
            f"{variable} = {root} is not below the kept weights disk's mount point {kept_disk} "
            "(weights_disk_mount_point): a rebuild keeps only that disk. Fix: "
            f"{kept_disk}/.sglang-deploy-cache, or \"\" for no kept caches"
        )
    return None


def key_parts(
    lock_digest: str, cuda_version: str, gpu_facts: Mapping[str, Any] | None
) -> dict[str, str]:
    """What makes a compiled kernel stale, each as text: the lock's digest (the ml-env's venv name),
    the server's CUDA, the GPUs' compute capabilities (sorted, distinct) and the driver."""
    facts = gpu_facts or {}
    caps = sorted({str(g.get("compute_cap")) for g in facts.get("gpus", []) if g.get("compute_cap")})
    driver = facts.get("driver_version") or next(
        (g.get("driver_version") for g in facts.get("gpus", []) if g.get("driver_version")), None
    )
    return {
        "lock": lock_digest or UNKNOWN,
        "cuda": cuda_version or UNKNOWN,
        "compute_caps": ",".join(caps) or UNKNOWN,
        "driver": str(driver) if driver else UNKNOWN,
    }


def key(parts: Mapping[str, str]) -> str:
    """The directory name of these parts: the first digits of the sha256 of their sorted JSON."""
    text = json.dumps(dict(parts), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_KEY_CHARS]


def resolve(
    root: str,
    *,
    lock_digest: str,
    cuda_version: str,
    gpu_facts: Mapping[str, Any] | None,
    kept_disk: str = "",
    home: str = "",
    cache_root: str = "",
) -> dict[str, Any]:
    """The cache settings of one server: ``{}`` without a root (no kept disk: the caches stay where each
    library puts them, in the service's home); else ``root`` (the unit may write under it), ``key``,
    ``key_parts``, ``dir`` (``<root>/<key>``, created by the role, owned by the service), ``link``
    (``<root>/current``, pointed at ``dir`` by the role), ``environment`` (variable -> its directory under
    ``link``, for the unit's ``Environment=``), ``dirs`` (those directories) and ``exec_start_pre`` (the
    unit's ``ExecStartPre=`` that creates them as the service user: root never acts inside the service's
    directory, where the service could have planted a link)."""
    places = [("sglang_common_cache_root", cache_root), ("sglang_server_jit_cache_root", root)]
    for variable, place in places:  # both are checked by their own name: the first is the usual source
        if not place:
            continue
        problem = location_problem(systemd.absolute_path(variable, place), variable, kept_disk=kept_disk, home=home)
        if problem:
            raise JitCacheError(problem)
    if not root:
        return {}
    root = systemd.absolute_path("sglang_server_jit_cache_root", root)
    parts = key_parts(lock_digest, cuda_version, gpu_facts)
    directory = f"{root}/{key(parts)}"
    link = f"{root}/{LINK}"
    dirs = sorted({f"{link}/{sub}" for sub in CACHE_VARIABLES.values()})
    return {
        "root": root,
        "key": key(parts),
        "key_parts": parts,
        "dir": directory,
        "link": link,
        "environment": {name: f"{link}/{sub}" for name, sub in CACHE_VARIABLES.items()},
        "dirs": dirs,
        "exec_start_pre": " ".join(systemd.exec_word(word) for word in [MKDIR, "-p", "-m", "0700", *dirs]),
    }
