"""Which NVFP4 GEMM backend a launch runs on SM120, and whether the lane's flashinfer makes it safe.

flashinfer's CUTLASS GEMMs launch with Programmatic Dependent Launch, but until 0.6.7 their JIT build left
out ``-DCUTLASS_ENABLE_GDC_FOR_SM100=1``, which compiled the device-side waits to nothing: under concurrency
on SM120 (RTX PRO 6000, RTX 5090) an FP4 GEMM could read a tile before the previous kernel wrote it, and the
output got NaN blocks (flashinfer issue #2708, fixed by PR #2716; sglang's answer was to make ``auto`` pick
flashinfer_cudnn on SM120 in 0.5.10, PR #20047). 0.6.7 is the first flashinfer-python whose
``jit/gemm/core.py`` passes the flag to ``gen_gemm_sm120_module_cutlass_fp4`` (checked in the wheels of
0.6.4, 0.6.5, 0.6.6, 0.6.7, 0.6.7.post3 and 0.7.2). The lanes' locks pin 0.6.7.post3 (cu128) and 0.7.2
(cu130), so neither SM120 profile pins a backend; a lane or lock that goes back below 0.6.7 is refused here.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from sglang_deploy_host.stack import lockfile
from sglang_deploy.lanes import lock
from sglang_deploy.lanes.catalog import Lane
from sglang_deploy.launch.config import LaunchConfig

# The first flashinfer-python with the SM120 FP4 GEMM's PDL barriers compiled in (PR #2716).
FLASHINFER_FIXED = Version("0.6.7")
# The backend the bug is in, and the one sglang found safe on SM120 without the fix.
AFFECTED_BACKEND = "flashinfer_cutlass"
SAFE_BACKEND = "flashinfer_cudnn"


def flashinfer_versions(lane: Lane) -> dict[str, str]:
    """flashinfer-python as each of the lane's locks pins it (Python -> version; a lock without it is left out)."""
    found = {}
    for target in lock.targets(lane):
        text = lock.read_lock(lock.lock_path(target))
        pinned = lockfile.pins(text or "").get("flashinfer-python")
        if pinned:
            found[target.python] = pinned
    return found


def effective_backend(lane: Lane, config: LaunchConfig) -> str | None:
    """The FP4 GEMM backend the launch runs on SM120 (``auto`` as the lane's sglang resolves it; None when the
    lane does not say)."""
    requested = config.settings.fp4_gemm_backend or "auto"
    if requested == "auto":
        return lane.fp4_gemm_auto_sm120 or None
    return requested


def runs_fp4_gemms(config: LaunchConfig, checkpoint_quantization: str | None = None) -> bool:
    """The launch serves an NVFP4 model: ModelOpt FP4 asked for, or the checkpoint says NVFP4."""
    quantization = config.settings.quantization
    return (quantization is not None and "fp4" in quantization) or (checkpoint_quantization or "").upper() == "NVFP4"


def problem(lane: Lane, config: LaunchConfig, sm_major: int | None) -> str | None:
    """Why this NVFP4 launch may write NaN on this GPU (None: it may not): flashinfer_cutlass FP4 GEMMs on
    SM120 with a flashinfer from before the fix."""
    if sm_major != 12:
        return None
    backend = effective_backend(lane, config)
    if backend != AFFECTED_BACKEND:
        return None
    old = {python: pinned for python, pinned in flashinfer_versions(lane).items() if _older(pinned)}
    if not old:
        return None
    pinned = ", ".join(f"{v} (Python {p})" for p, v in sorted(old.items()))
    asked = config.settings.fp4_gemm_backend
    how = "the launch asks for it" if asked is not None and asked != "auto" else (
        "--fp4-gemm-backend auto resolves to it on SM120 in this lane")  # fmt: skip
    return (
        f"NVFP4 GEMMs would run on {AFFECTED_BACKEND} on SM120 ({how}), and lane {lane.name}'s lock pins "
        f"flashinfer-python {pinned}: before {FLASHINFER_FIXED} its CUTLASS GEMMs compile their launch barriers to "
        "nothing and write NaN tiles under concurrency (flashinfer #2708, fixed by #2716). Fix: set "
        f"fp4-gemm-backend: {SAFE_BACKEND} (sglang_server_flags_override), or re-lock the lane with flashinfer-python "
        f">= {FLASHINFER_FIXED}"
    )


def _older(pinned: str) -> bool:
    try:
        return Version(pinned) < FLASHINFER_FIXED
    except InvalidVersion:
        return True  # a pin this cannot read is not proof of the fix
