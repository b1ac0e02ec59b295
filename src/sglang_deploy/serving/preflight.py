"""Preflight: the checks that stop the seeds' failures before a 10-minute model load.

Input: the host's facts from ``gpufacts.py facts --json --disk /dev/shm --disk WEIGHTS_DIR`` (run on
the host by roles/preflight), the launch configuration the server will get (the same
:class:`~sglang_deploy.launch.config.LaunchConfig` the unit is rendered from) and the limits in
:class:`PreflightSettings`. Output: every :class:`Problem` at once, each naming the check, what was
found and the fix; the role prefixes the host and fails.

What counts as "NCCL will not try peer-to-peer" (check ``p2p``):
  * ``NCCL_P2P_DISABLE=1`` — the P2P transport is off; NCCL uses SHM (or NET) between GPUs.
  * ``NCCL_P2P_LEVEL=LOC`` (or ``0``) — P2P only within one GPU, i.e. never between two.
  Not accepted: ``NCCL_P2P_LEVEL=PHB`` (what the seeds ran with) and other levels. They let NCCL pick
  P2P for every pair whose PCIe path is within that level and then ask the driver
  (``cudaDeviceCanAccessPeer``). On the seed box the driver answers "no" (the ``NS`` in
  ``topo -p2p r``), so NCCL fell back to SHM and the seeds worked — but the setting itself still
  tries P2P, and a driver or hypervisor change that made the answer "yes" over a passthrough path
  without working peer access would give hangs or wrong all-reduce sums rather than an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sglang_deploy_host.gpu.gpufacts import HEALTH_FIX, IDLE_FIX, Disk, GpuFacts, busy_problems, health_problems, version_tuple
from sglang_deploy_host.gpu.gpufacts import visible_gpu_count as gpufacts_visible_gpu_count
from sglang_deploy.launch.config import LaunchConfig

# Minimum Linux driver of each CUDA toolkit release (NVIDIA CUDA Toolkit release notes, table
# "CUDA Toolkit and Corresponding Driver Versions", GA releases). Minor-version compatibility would
# run 12.x code on >= 525.60.13, but not PTX built by a newer toolkit, and the lanes JIT-compile
# (flashinfer, triton) with their own toolkit — so the GA driver is the floor.
CUDA_MIN_DRIVER: dict[str, str] = {
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

NCCL_P2P_OFF_LEVELS = ("LOC", "0")
CUSTOM_ALL_REDUCE_FLAG = "disable-custom-all-reduce"


class PreflightError(ValueError):
    """Settings that cannot be checked (bad variable values); the message names the variable."""


@dataclass(frozen=True)
class Problem:
    check: str
    found: str
    fix: str

    def message(self, host: str) -> str:
        return f"host {host}: preflight check {self.check} failed: {self.found}. Fix: {self.fix}"


@dataclass(frozen=True)
class PreflightSettings:
    """The role's variables, checked. ``min_driver`` empty = the lane CUDA release's floor."""

    compute_capability: str
    cuda: str
    min_driver: str = ""
    gpu_max_used_mib: int = 1024
    require_idle: bool = True
    shm_path: str = "/dev/shm"
    shm_min_free_mib: int = 8192
    weights_path: str = ""
    weights_min_gib: int = 0

    @property
    def driver_floor(self) -> str:
        if self.min_driver:
            return self.min_driver
        floor = CUDA_MIN_DRIVER.get(self.cuda)
        if floor is None:
            known = ", ".join(sorted(CUDA_MIN_DRIVER))
            raise PreflightError(
                f"no known minimum driver for CUDA {self.cuda} (known: {known}); set "
                "preflight_min_driver_version to the driver NVIDIA's release notes give for it"
            )
        return floor


def nccl_p2p_off(environment: Mapping[str, str]) -> bool:
    """Whether this environment keeps NCCL from trying peer-to-peer (see the module text)."""
    if environment.get("NCCL_P2P_DISABLE", "").strip() == "1":
        return True
    return environment.get("NCCL_P2P_LEVEL", "").strip().upper() in NCCL_P2P_OFF_LEVELS


def visible_gpu_count(facts: GpuFacts, environment: Mapping[str, str]) -> tuple[int, str]:
    """Usable GPUs the server will see, and how they were counted (gpufacts.visible_gpu_count: the
    watchdog on the host counts them the same way)."""
    return gpufacts_visible_gpu_count(facts, environment.get("CUDA_VISIBLE_DEVICES"))


def _gpus_of_launch(facts: GpuFacts, tp: int) -> set[int]:
    return {g.index for g in facts.healthy_gpus()[: max(tp, 1)]}


def _p2p_not_ok(facts: GpuFacts, tp: int) -> tuple[set[int], list[str]]:
    """The GPUs a launch of tp-size ``tp`` uses and the ``topo -p2p r`` statuses other than OK
    between them (none for one GPU: nothing to talk to)."""
    gpus = _gpus_of_launch(facts, tp)
    if tp <= 1:
        return gpus, []
    statuses = {
        link.status
        for link in facts.p2p_read
        if {link.gpu, link.peer} <= gpus and link.status != "OK"
    }
    return gpus, sorted(statuses)


def _lacks_custom_all_reduce_off(launch: LaunchConfig) -> bool:
    return not launch.settings.disable_custom_all_reduce


def _disk_at(facts: GpuFacts, path: str) -> Disk | None:
    return next((d for d in facts.disks if d.path == path), None)


# -- the checks ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckContext:
    """What every check reads. ``unit_active``: the service already runs, so its GPU use is
    expected."""

    facts: GpuFacts
    launch: LaunchConfig
    settings: PreflightSettings
    unit_active: bool = False
    # Read once up front, so a tp-size that is not a number fails evaluate() whichever checks run.
    tp: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp", self.launch.tp_size)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.launch.environment)


class Finding(NamedTuple):
    """One failure of a check; :func:`evaluate` makes it a :class:`Problem` under the check's
    name."""

    found: str
    fix: str


Check = Callable[[CheckContext], list[Finding]]


def _check_nvidia_smi(ctx: CheckContext) -> list[Finding]:
    if not ctx.facts.errors:
        return []
    return [
        Finding(
            "; ".join(ctx.facts.errors),
            "install and load the NVIDIA driver (the nvidia_driver role); after a driver "
            "upgrade reboot; exit 15 means a GPU fell off the bus (reset or reboot the VM)",
        )
    ]


def _check_gpu_health(ctx: CheckContext) -> list[Finding]:
    return [Finding(p, HEALTH_FIX.removeprefix("Fix: ")) for p in health_problems(ctx.facts)]


def _check_gpu_count(ctx: CheckContext) -> list[Finding]:
    count, how = visible_gpu_count(ctx.facts, ctx.env)
    if count >= ctx.tp:
        return []
    return [
        Finding(
            f"{how}, but the launch has tp-size {ctx.tp}",
            f"attach all GPUs to the VM (Proxmox hostpci entries) and check `nvidia-smi -L`, "
            f"or lower tp-size in sglang_server_flags_override to at most {count}",
        )
    ]


def _check_compute_capability(ctx: CheckContext) -> list[Finding]:
    wanted = ctx.settings.compute_capability
    other = {
        g.index: g.compute_cap
        for g in ctx.facts.gpus
        if g.compute_cap is not None and g.compute_cap != wanted
    }
    if not other:
        return []
    return [
        Finding(
            f"GPU compute capability {other} (index: cc), the lane's kernels are built for "
            f"{wanted}",
            "run on GPUs of that architecture, or pick a lane whose kernels carry this "
            "one and set preflight_compute_capability to it",
        )
    ]


def _check_driver(ctx: CheckContext) -> list[Finding]:
    floor = ctx.settings.driver_floor  # first: an unknown CUDA release is an error on every host
    found = ctx.facts.driver_version
    if found is None:
        # nvidia-smi failed: that is reported (check nvidia-smi), a missing version is no news.
        if ctx.facts.errors:
            return []
        return [Finding("nvidia-smi reported no driver version", "reinstall the driver")]
    if version_tuple(found) >= version_tuple(floor):
        return []
    return [
        Finding(
            f"driver {found} is older than {floor}, the minimum for CUDA {ctx.settings.cuda}",
            f"install driver >= {floor} (the nvidia_driver role's version variable) and "
            "reboot, or use a lane built for an older CUDA",
        )
    ]


def _check_p2p(ctx: CheckContext) -> list[Finding]:
    gpus, not_ok = _p2p_not_ok(ctx.facts, ctx.tp)
    if not not_ok:
        return []
    env = ctx.env
    missing = []
    if _lacks_custom_all_reduce_off(ctx.launch):
        missing.append(
            f"flag --{CUSTOM_ALL_REDUCE_FLAG} (sglang_server_flags: {CUSTOM_ALL_REDUCE_FLAG}: true)"
        )
    if not nccl_p2p_off(env):
        level = env.get("NCCL_P2P_LEVEL")
        missing.append(
            'NCCL_P2P_DISABLE: "1" in sglang_server_env'
            + (f" (NCCL_P2P_LEVEL={level} still lets NCCL try P2P)" if level else "")
        )
    if not missing:
        return []
    lacks = " and ".join(missing)
    return [
        Finding(
            f"nvidia-smi topo -p2p r reports {'/'.join(not_ok)} (not OK) between the "
            f"{len(gpus)} GPUs of tp-size {ctx.tp}, and the launch lacks {lacks}",
            f"add {lacks} (or set sglang_server_p2p_adjust: true to have them added for this "
            "run)",
        )
    ]


def _check_shm(ctx: CheckContext) -> list[Finding]:
    path = ctx.settings.shm_path
    need_mib = ctx.settings.shm_min_free_mib
    shm = _disk_at(ctx.facts, path)
    if shm is None:
        return [Finding(f"{path} was not measured", "run gpufacts.py facts with --disk " + path)]
    if shm.measured_path != path:
        return [
            Finding(f"{path} does not exist", "mount a tmpfs on /dev/shm (systemd does by default)")
        ]
    if shm.free_mib >= need_mib:
        return []
    return [
        Finding(
            f"{path} has {shm.free_mib} MiB free of {shm.size_mib} MiB, below {need_mib} MiB "
            "(NCCL's SHM transport and sglang's inter-process tensors live there)",
            f"remove stale files of killed servers (/dev/shm/nccl-*, /dev/shm/sem.*) or "
            f"enlarge it (`mount -o remount,size=32G {path}`; a container: --shm-size)",
        )
    ]


def _check_weights_disk(ctx: CheckContext) -> list[Finding]:
    path = ctx.settings.weights_path
    need_gib = ctx.settings.weights_min_gib
    if need_gib <= 0:  # no size given: nothing to check
        return []
    disk = _disk_at(ctx.facts, path)
    if disk is None:
        return [Finding(f"{path} was not measured", "run gpufacts.py facts with --disk PATH")]
    if disk.free_mib + disk.path_mib >= need_gib * 1024:
        return []
    return [
        Finding(
            f"{disk.measured_path} (for {path}) has {disk.free_mib // 1024} GiB free and "
            f"{disk.path_mib // 1024} GiB already under {path}; the weights need {need_gib} GiB",
            "free space there, or point the weights directory (preflight_weights_path and "
            "the model role's directory) at a filesystem with room",
        )
    ]


def _check_gpu_idle(ctx: CheckContext) -> list[Finding]:
    if not ctx.settings.require_idle or ctx.unit_active:
        return []
    return [
        Finding(p, IDLE_FIX.removeprefix("Fix: "))
        for p in busy_problems(ctx.facts, ctx.settings.gpu_max_used_mib)
    ]


# The checks, in the order evaluate() reports their problems. To add a check, write one function
# ``_check_NAME(ctx) -> list[Finding]`` above (it decides itself when it has nothing to say) and add
# one row here: ALL_CHECKS, the preflight_checks names the role accepts, and evaluate() follow.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("nvidia-smi", _check_nvidia_smi),
    ("gpu-health", _check_gpu_health),
    ("gpu-count", _check_gpu_count),
    ("compute-capability", _check_compute_capability),
    ("driver", _check_driver),
    ("p2p", _check_p2p),
    ("shm", _check_shm),
    ("weights-disk", _check_weights_disk),
    ("gpu-idle", _check_gpu_idle),
)
ALL_CHECKS: tuple[str, ...] = tuple(name for name, _ in CHECKS)
# Before a (re)start of the service: everything that can change while the host runs.
GPU_CHECKS: tuple[str, ...] = tuple(c for c in ALL_CHECKS if c != "weights-disk")


def evaluate(
    facts: GpuFacts,
    launch: LaunchConfig,
    settings: PreflightSettings,
    checks: Iterable[str] = ALL_CHECKS,
    unit_active: bool = False,
) -> list[Problem]:
    """Every failed check. ``unit_active``: the service already runs, so its GPU use is expected."""
    wanted = set(checks)
    unknown = wanted - set(ALL_CHECKS)
    if unknown:
        raise PreflightError(
            f"preflight_checks has unknown checks {sorted(unknown)}; known: {', '.join(ALL_CHECKS)}"
        )
    ctx = CheckContext(facts, launch, settings, unit_active)
    return [
        Problem(name, finding.found, finding.fix)
        for name, check in CHECKS
        if name in wanted
        for finding in check(ctx)
    ]


def p2p_adjustments(facts: GpuFacts, launch: LaunchConfig) -> dict[str, dict[str, Any]]:
    """Overrides that make the launch pass check ``p2p`` (``sglang_server_p2p_adjust: true``).

    ``{"flags": {...}, "env": {...}}``, which the server's resolver (server.py) merges over the flags
    and environment; empty mappings when nothing is needed.
    """
    flags: dict[str, Any] = {}
    env: dict[str, Any] = {}
    _, not_ok = _p2p_not_ok(facts, launch.tp_size)
    if not_ok:
        if _lacks_custom_all_reduce_off(launch):
            flags[CUSTOM_ALL_REDUCE_FLAG] = True
        if not nccl_p2p_off(dict(launch.environment)):
            env["NCCL_P2P_DISABLE"] = "1"
    return {"flags": flags, "env": env}


def settings_from_vars(
    *,
    compute_capability: Any,
    cuda: str,
    min_driver: Any = "",
    gpu_max_used_mib: Any = 1024,
    require_idle: Any = True,
    shm_path: Any = "/dev/shm",
    shm_min_free_mib: Any = 8192,
    weights_path: Any = "",
    weights_min_gib: Any = 0,
) -> PreflightSettings:
    """Settings from role variables; PreflightError naming the variable on a bad value."""

    def integer(name: str, value: Any) -> int:
        if isinstance(value, bool) or not str(value).strip().isdigit():
            raise PreflightError(f"{name}={value!r} is not a non-negative whole number")
        return int(value)

    if not isinstance(compute_capability, str) or not _is_dotted(compute_capability):
        raise PreflightError(
            f"preflight_compute_capability={compute_capability!r} is not a quoted major.minor "
            'string such as "12.0" (YAML reads an unquoted 12.0 as a number)'
        )
    if min_driver and not _is_dotted(str(min_driver)):
        raise PreflightError(f"preflight_min_driver_version={min_driver!r} is not a dotted version")
    return PreflightSettings(
        compute_capability=compute_capability,
        cuda=cuda,
        min_driver=str(min_driver or ""),
        gpu_max_used_mib=integer("preflight_gpu_max_used_mib", gpu_max_used_mib),
        require_idle=bool(require_idle),
        shm_path=str(shm_path),
        shm_min_free_mib=integer("preflight_shm_min_free_mib", shm_min_free_mib),
        weights_path=str(weights_path),
        weights_min_gib=integer("preflight_weights_min_gib", weights_min_gib),
    )


def _is_dotted(text: str) -> bool:
    try:
        version_tuple(text)
    except ValueError:
        return False
    return True
