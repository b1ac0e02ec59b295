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
records where each is read; tests/unit/test_jitcache.py keeps this list equal to it). Measured with
sglang 0.5.17 on an H200 (that directory's README.md): a start with the kept caches was ready after
26.3 s against 108.7 s cold; the caches that filled were PYTHONPYCACHEPREFIX, TRITON_CACHE_DIR,
FLASHINFER_WORKSPACE_BASE and TVM_FFI_CACHE_DIR.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sglang_deploy_host import systemd

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
# A key part nobody could read yet (no ml-env, no driver): spelled out, so it is a key of its own.
UNKNOWN = "unknown"


class JitCacheError(ValueError):
    """A cache setting that cannot be used; the message names the variable and the fix."""


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
    root: str, *, lock_digest: str, cuda_version: str, gpu_facts: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The cache settings of one server: ``{}`` without a root (no kept disk: the caches stay where each
    library puts them, in the service's home); else ``root`` (the unit may write under it), ``key``,
    ``key_parts``, ``dir`` (``<root>/<key>``), ``dirs`` (each cache's directory there, created by the
    role), ``link`` (``<root>/current``, pointed at ``dir`` by the role) and ``environment`` (variable ->
    its directory under ``link``, for the unit's ``Environment=``)."""
    if not root:
        return {}
    root = systemd.absolute_path("sglang_server_jit_cache_root", root)
    if root == "/":
        raise JitCacheError("sglang_server_jit_cache_root is /; set a directory on the kept disk, or \"\" for none")
    parts = key_parts(lock_digest, cuda_version, gpu_facts)
    directory = f"{root}/{key(parts)}"
    link = f"{root}/{LINK}"
    return {
        "root": root,
        "key": key(parts),
        "key_parts": parts,
        "dir": directory,
        "dirs": sorted({f"{directory}/{sub}" for sub in CACHE_VARIABLES.values()}),
        "link": link,
        "environment": {name: f"{link}/{sub}" for name, sub in CACHE_VARIABLES.items()},
    }
