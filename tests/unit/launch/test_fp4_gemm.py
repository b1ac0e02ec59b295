"""NVFP4 GEMMs on SM120 (src/sglang_deploy/launch/fp4_gemm.py): flashinfer_cutlass is refused only with a flashinfer
from before the fix for NaN under concurrency; the shipped lanes carry the fix, so the profiles pin nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_inputs import facts, resolve

from sglang_deploy.lanes import lock
from sglang_deploy.launch import fp4_gemm
from sglang_deploy.serving import server
from sglang_deploy.lanes.catalog import load_lane, lane_names
from sglang_deploy.launch.config import LaunchConfig


@pytest.mark.parametrize("name", lane_names())
def test_every_lanes_lock_pins_a_flashinfer_with_the_fix(name: str) -> None:
    lane = load_lane(name)
    versions = fp4_gemm.flashinfer_versions(lane)
    assert set(versions) == set(lane.lock.pythons)  # type: ignore[union-attr]
    assert all(not fp4_gemm._older(v) for v in versions.values()), versions
    assert lane.fp4_gemm_auto_sm120 in ("flashinfer_cudnn", "flashinfer_cutlass")


def test_what_auto_runs_on_sm120_is_the_lanes_sglang_choice() -> None:
    config = LaunchConfig.from_vars({"model-path": "/m", "quantization": "modelopt_fp4"}, python="python3")
    assert fp4_gemm.effective_backend(load_lane("cu128"), config) == "flashinfer_cudnn"  # 0.5.10: NaN seen, cudnn
    assert fp4_gemm.effective_backend(load_lane("cu130"), config) == "flashinfer_cutlass"  # 0.5.23: cutlass again
    asked = LaunchConfig.from_vars({"model-path": "/m", "fp4-gemm-backend": "cutlass"}, python="python3")
    assert fp4_gemm.effective_backend(load_lane("cu128"), asked) == "cutlass"


def test_the_shipped_profile_on_the_rtx_pro_6000_needs_no_pin() -> None:
    box = facts("rtx-pro-6000-8gpu-passthrough")
    for lane in ("cu128", "cu130"):
        flags = resolve(gpu_facts=box, lane=lane, flags_override={"nsa-decode-backend": None, "nsa-prefill-backend": None})["flags"]
        assert "fp4-gemm-backend" not in flags


@pytest.fixture()
def old_flashinfer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped locks copied with flashinfer-python set back to 0.6.6 (the last release without the fix)."""
    for path in lock.lock_dir().glob("*.txt"):
        text = path.read_text()
        for pinned in ("0.6.7.post3", "0.7.2"):
            text = text.replace(f"flashinfer-python=={pinned} ", "flashinfer-python==0.6.6 ")
        (tmp_path / path.name).write_text(text)
    monkeypatch.setattr(lock, "lock_dir", lambda: tmp_path)
    return tmp_path


def test_an_old_flashinfer_refuses_cutlass_on_sm120_only(old_flashinfer: Path) -> None:
    assert set(fp4_gemm.flashinfer_versions(load_lane("cu130")).values()) == {"0.6.6"}
    box = facts("rtx-pro-6000-8gpu-passthrough")
    cu130 = {"lane": "cu130", "flags_override": {"nsa-decode-backend": None, "nsa-prefill-backend": None}}
    with pytest.raises(server.ResolveError) as err:
        resolve(gpu_facts=box, **cu130)
    message = str(err.value)
    assert message.startswith("host glm5-01: NVFP4 GEMMs would run on flashinfer_cutlass on SM120 (--fp4-gemm-backend auto")
    assert "flashinfer-python 0.6.6 (Python 3.11), 0.6.6 (Python 3.12)" in message and "#2708" in message
    assert "Fix: set fp4-gemm-backend: flashinfer_cudnn" in message
    # The fix it names works; the cu128 lane's auto is cudnn already; asking for cutlass there is refused too.
    fixed = {"nsa-decode-backend": None, "nsa-prefill-backend": None, "fp4-gemm-backend": "flashinfer_cudnn"}
    assert resolve(gpu_facts=box, lane="cu130", flags_override=fixed)["flags"]["fp4-gemm-backend"] == "flashinfer_cudnn"
    assert resolve(gpu_facts=box)["flags"].get("fp4-gemm-backend") is None
    with pytest.raises(server.ResolveError, match=r"\(the launch asks for it\)"):
        resolve(gpu_facts=box, flags_override={"fp4-gemm-backend": "flashinfer_cutlass"})
    # Not SM120 (the H200), or not an FP4 model: nothing to refuse.
    assert resolve(gpu_facts=facts("h200-1gpu"), **{**cu130, "flags_override": {**cu130["flags_override"], "tp-size": 1}})
    assert resolve(gpu_facts=box, **{**cu130, "flags_override": {**cu130["flags_override"], "quantization": None}})
