"""`sglang-deploy plan` reads what render reads and refuses what render refuses (hostile input, round 4):
`plan -i` goes through playbooks/plan_inputs.yml (the role's own inputs, every template rendered, the same
variable check); a memory-plan key render refuses, a profile without an inventory, a value the lane's
sglang does not take, a profile of the wrong shape and a draft beyond any GPU are one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from sglang_deploy import cli
from sglang_deploy.launch.config import LaunchConfig
from sglang_deploy.memory.plan_inputs import PlanSources, plan_inputs
from sglang_deploy.memory.planner import PlanError

SEED_BOX = ["--gpu-memory-mib", "97887", "--tp-size", "8", "--weights-gib-per-gpu", "50", "--kv-bytes-per-token", "1000"]


def _plan(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "plan", *argv], cwd=ROOT, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


def _inventory(tmp_path: Path, **group_vars: object) -> Path:
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "proxmox", inventory)
    profile = inventory / "group_vars" / "sglang_servers" / "sglang_server.yml"
    data = yaml.safe_load(profile.read_text())
    data.update(group_vars)
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    return inventory


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_plan_refuses_the_memory_plan_key_render_refuses(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/sglang_server.yml").read_text())
    plan_vars = dict(data["sglang_server_memory_plan"])
    plan_vars["weights_gib_per_gpus"] = plan_vars.pop("weights_gib_per_gpu", 50)
    err = _one_line(_plan("-i", str(_inventory(tmp_path, sglang_server_memory_plan=plan_vars))))
    assert "sglang_server_memory_plan has unknown keys ['weights_gib_per_gpus']" in err
    assert "did you mean weights_gib_per_gpu?" in err


def test_a_profile_needs_an_inventory() -> None:
    err = _one_line(_plan("--profile", "tuned", *SEED_BOX))
    assert "--profile 'tuned' needs -i" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--speculative-algorithm", "NONSENSE"], "--speculative-algorithm 'NONSENSE' is not a value sglang 0.5.10.post1 takes"),
     (["--kv-cache-dtype", "fp9"], "--kv-cache-dtype 'fp9' is not a value sglang 0.5.10.post1 takes"),
     (["--lane", "cu130", "--speculative-algorithm", "DFLASH"], "the memory planner models only EAGLE")],
)  # fmt: skip
def test_values_the_lanes_sglang_does_not_take_or_the_planner_does_not_model_are_refused(
    argv: list[str], message: str
) -> None:
    err = _one_line(_plan(*SEED_BOX, *argv))
    assert message in err, err
    assert "Fix: " in err or "EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM" in err


@pytest.mark.parametrize(
    ("group_vars", "message"),
    [({"sglang_server_profile": ["tuned"]}, "sglang_server_profile = ['tuned'] is not a profile's name (a list)"),
     ({"sglang_server_profiles": ["tuned"], "sglang_server_profile": "tuned"}, "sglang_server_profiles must be a mapping"),
     ({"sglang_server_profile": "tuned", "sglang_server_profiles": {"tuned": "fast"}},
      "sglang_server_profiles['tuned'] must be a mapping of flag changes")],
)  # fmt: skip
def test_a_profile_of_the_wrong_shape_is_one_error(tmp_path: Path, group_vars: dict, message: str) -> None:
    err = _one_line(_plan("-i", str(_inventory(tmp_path, **group_vars))))
    assert "host glm5-01: " + message in err, err


def test_a_draft_or_any_size_beyond_any_gpu_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/sglang_server.yml").read_text())
    plan_vars = {**data["sglang_server_memory_plan"], "draft_weights_gib_per_gpu": 1e30}
    # The restored checkpoint: plan judges the launch as render does, and tuned-mtp on the default one (no draft layer)
    # is refused before any size is read.
    inventory = _inventory(tmp_path, sglang_server_memory_plan=plan_vars, hf_model_repo="festr2/GLM-5-NVFP4-MTP")
    err = _one_line(_plan("-i", str(inventory), "--profile", "tuned-mtp"))
    assert "draft_weights_gib_per_gpu = 1e+30 must be a number >= 0 and at most 1e+12" in err
    rc = cli.main(["plan", *SEED_BOX, "--max-total-tokens", str(10**400)])
    out = capsys.readouterr()
    assert rc == 2 and "max_total_tokens = 10000000000000000000... must be an integer >= 1 and at most 1e+12" in out.err


@pytest.mark.parametrize("host", ["h200", "glm5-dsa-mtp", "mtp-trained"])
def test_plan_reads_templated_group_variables_as_render_does(host: str) -> None:
    """inventory/device's hosts take their flags from group templates (a profile per group, overrides built
    with combine): ansible-inventory hands those over as unrendered text; the role's inputs are rendered."""
    done = _plan("-i", "inventory/device", "--host", host, "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["notes"][0] == f"launch flags of {host} from inventory/device" and plan["safe"] is True


def test_plan_refuses_a_misspelt_variable_as_render_does(tmp_path: Path) -> None:
    err = _one_line(_plan("-i", str(_inventory(tmp_path, sglang_server_flag_override={"port": 9000}))))
    assert "sglang_server_flag_override" in err and "Did you mean sglang_server_flags_override?" in err


def test_plan_and_render_launch_the_same_auto_fraction(tmp_path: Path) -> None:
    """One road (plan_inputs.py): the fraction render writes into ExecStart for `auto` is the one `plan -i`
    recommends, for the same host and profile."""
    inventory = _inventory(tmp_path, sglang_server_profile="tuned")
    done = _plan("-i", str(inventory), "--json")
    assert done.returncode == 0, done.stderr
    recommended = json.loads(done.stdout)["recommended_mem_fraction_static"]
    rendered = subprocess.run(
        [str(Path(sys.executable).with_name("sglang-deploy")), "render", "-i", str(inventory), "--out",
         str(tmp_path / "out"), "--no-validate"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "SGLANG_API_KEY": "a-key-for-the-test-0123456789"},
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    unit = (tmp_path / "out" / "glm5-01" / "sglang.service").read_text()
    assert recommended is not None and f" --mem-fraction-static {recommended} " in unit, (recommended, unit)


GLM5_BOX = {"architecture": "glm-5", "gpu_memory_mib": 97887, "sm_major": 12, "weights_gib_per_gpu": 60.95}
TUNED_FLAGS = {"tp-size": 8, "mem-fraction-static": "auto", "kv-cache-dtype": "auto", "quantization": "modelopt_fp4"}
# The typed launch the road reads (LaunchConfig.settings), as render and up build it.
TUNED = LaunchConfig.from_vars(TUNED_FLAGS, python="/py").settings


def _facts(total_mib: int, used_mib: int = 0, cap: str = "12.0") -> dict[str, object]:
    gpu = {"memory_total_mib": total_mib, "memory_used_mib": used_mib, "compute_cap": cap}
    return {"gpus": [gpu] * 8}


def test_later_sources_win_in_the_documented_order() -> None:
    """flags < architecture < sglang_server_memory_plan < draft < GPU facts < overrides."""
    road = PlanSources(launch=TUNED, lane="cu128", plan_vars={**GLM5_BOX, "page_size": 32})
    inputs, notes = plan_inputs(road, no_memory_fix="x")
    assert inputs.page_size == 32 and inputs.gpu_memory_mib == 97887 and inputs.tp_size == 8  # the plan var's page
    assert any("rules of sglang" in note for note in notes)
    measured, _ = plan_inputs(replace(road, gpu_facts=_facts(95000, used_mib=700)), no_memory_fix="x")
    assert measured.gpu_memory_mib == 95000 and not measured.gpu_memory_used_mib  # facts beat the declared size
    counted, _ = plan_inputs(replace(road, gpu_facts=_facts(95000, 700), count_used_memory=True), no_memory_fix="x")
    assert counted.gpu_memory_used_mib == 700
    drafted, _ = plan_inputs(replace(road, draft={"draft_weights_gib_per_gpu": 2.928}), no_memory_fix="x")
    assert drafted.draft_weights_gib_per_gpu == 2.928
    overridden, _ = plan_inputs(
        replace(road, gpu_facts=_facts(95000), overrides={"gpu_memory_mib": 80000.0, "tp_size": 4}), no_memory_fix="x"
    )
    assert overridden.gpu_memory_mib == 80000.0 and overridden.tp_size == 4


def test_the_road_refuses_what_it_cannot_read() -> None:
    with pytest.raises(PlanError, match=r"sglang_server_memory_plan has unknown keys \['page_sise'\] \(page_sise: did you mean page_size\?\)"):
        plan_inputs(PlanSources(launch=TUNED, lane="cu128", plan_vars={**GLM5_BOX, "page_sise": 1}), no_memory_fix="x")
    with pytest.raises(PlanError, match=r"^sglang_server_memory_plan.architecture: unknown architecture 'glm-4'"):
        plan_inputs(PlanSources(launch=TUNED, lane="cu128", plan_vars={"architecture": "glm-4"}), no_memory_fix="x")
    with pytest.raises(PlanError, match=r"^--architecture: unknown architecture 'glm-4'"):
        plan_inputs(PlanSources(launch=TUNED, lane="cu128", architecture="glm-4"), no_memory_fix="x")
    with pytest.raises(PlanError, match=r"^no GPU memory size\. Fix: set it$"):
        plan_inputs(PlanSources(launch=TUNED, lane="cu128", plan_vars={"architecture": "glm-5", "sm_major": 12}), no_memory_fix="set it")
    with pytest.raises(PlanError, match="lane"):
        plan_inputs(PlanSources(launch=TUNED, lane="cu999", plan_vars=GLM5_BOX), no_memory_fix="x")


def test_a_key_no_planner_input_has_is_a_plan_error_not_a_crash() -> None:
    """An override (the CLI's, the role's) naming no PlanInputs field is one PlanError, as a typo in the plan
    variable is - never a TypeError's traceback."""
    road = PlanSources(launch=TUNED, lane="cu128", plan_vars=GLM5_BOX, overrides={"gpu_memory_mb": 80000.0})
    with pytest.raises(PlanError, match="gpu_memory_mb"):
        plan_inputs(road, no_memory_fix="x")
