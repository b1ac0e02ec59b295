"""`sglang-deploy plan` reads what render reads and refuses what render refuses (hostile input, round 4):
`plan -i` goes through playbooks/plan_inputs.yml (the role's own inputs, every template rendered, the same
variable check); a memory-plan key render refuses, a profile without an inventory, a value the lane's
sglang does not take, a profile of the wrong shape and a draft beyond any GPU are one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from sglang_deploy import cli

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
    err = _one_line(_plan("-i", str(_inventory(tmp_path, sglang_server_memory_plan=plan_vars)), "--profile", "tuned-mtp"))
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
