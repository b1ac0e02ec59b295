"""A lane's SM120 rules (``lanes/<lane>.yml`` ``sm120_rules``) applied to one launch: what that lane's sglang does on
an RTX PRO 6000 Blackwell (SM12x) that the launch must respect, refused before any host changes with the rule's
source (render, validate, up: serving/server.py; the doctor names their start failures: observe/doctor_rules.yml).

The rules are data, read in the lane's pinned sglang; this module only knows how to apply each kind. A launch on
another GPU (or with no SM known) is not judged here: the rules are SM120's.
"""

from __future__ import annotations

from sglang_deploy.lanes.catalog import Lane
from sglang_deploy.launch.flagtable import LaunchSettings

SM120_MAJOR = 12
# Architectures (sglang_server_memory_plan.architecture) whose attention is DSA: their launch's DSA backends matter
# even when the flags leave them unset.
DSA_ARCHITECTURES = frozenset({"glm-5"})


def _fix(launch: LaunchSettings, field: str, value: str | None) -> str:
    action = f"set {launch.name_of(field)}: {value}" if value else f"remove {launch.name_of(field)}"
    return f"{action} (sglang_server_flags_override, or the profile's lanes.{launch.lane} entry)"


def resolved_kv_fp8(launch: LaunchSettings, sm_major: int) -> bool:
    """The pool is fp8_e4m3 for a DSA model: asked for, or ``auto`` on SM >= 10 (both lanes' sglang decide so)."""
    dtype = (launch.kv_cache_dtype or "auto").lower()
    return dtype == "fp8_e4m3" or (dtype == "auto" and sm_major >= 10)


def problem(lane: Lane, launch: LaunchSettings, sm_major: int | None, *, architecture: str | None = None) -> str | None:
    """The first SM120 rule of ``lane`` this launch breaks, as one message naming the flag, the lane, the choice to
    make and where the rule was read; None when it breaks none (or the GPU is not SM12x)."""
    if sm_major != SM120_MAJOR:
        return None
    rules = lane.sm120_rules
    head = f"lane {lane.name} (sglang {lane.sglang}) on SM120"
    backends = {"dsa_prefill_backend": launch.dsa_prefill_backend, "dsa_decode_backend": launch.dsa_decode_backend}
    for field, value in backends.items():
        if value is not None and value in rules.dsa_backends_without_sm120:
            return (
                f"{head}: {launch.name_of(field)} {value} has no SM120 kernels (source: "
                f"{rules.dsa_backends_without_sm120_source}). Fix: {_fix(launch, field, 'trtllm')}"
            )
    dsa = any(backends.values()) or (architecture or "") in DSA_ARCHITECTURES
    fp8 = resolved_kv_fp8(launch, sm_major)
    dtype = launch.kv_cache_dtype or "auto"
    if dsa and rules.dsa_kv_cache_dtypes and dtype not in rules.dsa_kv_cache_dtypes:
        return (
            f"{head}: a DSA model starts only with kv-cache-dtype {', '.join(rules.dsa_kv_cache_dtypes)}, not {dtype}: "
            f"sglang asserts at start (source: {rules.dsa_kv_cache_dtypes_source}). Fix: set kv-cache-dtype: bfloat16 "
            "(the profile 'tuned') or auto (fp8_e4m3 on this GPU)"
        )
    if dsa and rules.dsa_fp8_prefill and fp8:
        for field, allowed in (("dsa_prefill_backend", rules.dsa_fp8_prefill), ("dsa_decode_backend", rules.dsa_fp8_decode)):
            value = backends[field]
            if value is not None and value not in allowed:
                return (
                    f"{head}: with an fp8 KV pool (kv-cache-dtype {launch.kv_cache_dtype or 'auto'}) GLM's DSA attention "
                    f"takes only {', '.join(allowed)} for {launch.name_of(field)}, not {value}: sglang raises at start "
                    f"(source: {rules.dsa_fp8_source}). Fix: {_fix(launch, field, allowed[0])}, or kv-cache-dtype: "
                    "bfloat16 (the profile 'tuned')"
                )
    if not fp8:
        for field, value in backends.items():
            if value is not None and value in rules.dsa_fp8_only:
                return (
                    f"{head}: {launch.name_of(field)} {value} runs only with an fp8_e4m3 KV pool, not kv-cache-dtype "
                    f"{launch.kv_cache_dtype}: sglang raises at start (source: {rules.dsa_fp8_source}). "
                    f"Fix: {_fix(launch, field, 'trtllm')}"
                )
    if dsa and rules.dsa_bf16_auto_prefill and not fp8 and launch.dsa_prefill_backend is None:
        return (
            f"{head}: with a bf16 KV pool an unset {launch.name_of('dsa_prefill_backend')} becomes "
            f"{rules.dsa_bf16_auto_prefill}, which has no SM120 kernels ('Unsupported architecture'; source: "
            f"{rules.dsa_bf16_source}). Fix: {_fix(launch, 'dsa_prefill_backend', rules.dsa_bf16_pin)}"
        )
    if rules.allreduce_fusion_refused and launch.enable_flashinfer_allreduce_fusion and launch.tp > 1:
        return (
            f"{head}: {launch.name_of('enable_flashinfer_allreduce_fusion')} raises 'FlashInfer allreduce fusion requires "
            f"SM90 or SM10X NVIDIA GPUs' at start (source: {rules.allreduce_fusion_source}). "
            f"Fix: {_fix(launch, 'enable_flashinfer_allreduce_fusion', None)}"
        )
    cap = rules.decode_graph_max_bs
    if cap:
        explicit = max(launch.cuda_graph_bs) if launch.cuda_graph_bs else launch.cuda_graph_max_bs
        if explicit is not None and explicit > cap and not launch.disable_cuda_graph:
            return (
                f"{head}: {launch.name_of('cuda_graph_max_bs' if launch.cuda_graph_max_bs else 'cuda_graph_bs')} "
                f"captures decode graphs up to batch {explicit}, beyond the {cap} this lane's rules allow on a 96 GB card "
                f"(batch 512 ran out of memory in capture; source: {rules.decode_graph_source}). "
                f"Fix: {_fix(launch, 'cuda_graph_max_bs', str(cap))} or lower"
            )
        if explicit is None and launch.max_running_requests is None and launch.tp >= 4 and not launch.disable_cuda_graph:
            return (
                f"{head}: nothing caps the decode graphs, and this sglang sizes them up to batch 512 on a 96 GB card at "
                f"TP >= 4, which ran out of memory in capture (source: {rules.decode_graph_source}). Fix: set "
                f"max-running-requests (it caps the graphs; the seed's 64) or {launch.name_of('cuda_graph_max_bs')} <= {cap}"
            )
    return None
