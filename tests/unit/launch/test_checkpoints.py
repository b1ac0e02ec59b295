"""A launch against the checkpoint it serves (src/sglang_deploy/launch/checkpoints.py): the known checkpoints before
any host is asked, the host's inspection once the weights are there, through the resolver the role calls and
through ``sglang-deploy plan --checkpoint``. The checkpoints are tests/fixtures/glm5_checkpoint.py's, whose
headers are GLM-5-NVFP4's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from server_inputs import inputs

from sglang_deploy.launch import checkpoints
from sglang_deploy.memory import architectures
from sglang_deploy.serving import server
from sglang_deploy.launch.config import LaunchConfig
from sglang_deploy_host.model import inspection as inspector

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from glm5_checkpoint import make_glm5_checkpoint, make_variants  # noqa: E402

PROFILES = yaml.safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/profiles.yml").read_text())
DEFAULT_REPO = yaml.safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/hf_model.yml").read_text())["hf_model_repo"]
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def inspected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The inspection of each synthetic checkpoint, as the sglang_checkpoint module returns it."""
    root = tmp_path_factory.mktemp("ckpt")
    out: dict[str, dict[str, Any]] = {name: inspector.inspect(path).to_dict() for name, path in make_variants(root).items()}
    out["_root"] = {"path": str(root)}
    return out


def resolve(checkpoint: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    values = inputs(**{"checkpoint_repo": DEFAULT_REPO, "checkpoint_revision": SHA, **overrides})
    return server.resolve(server.ServerInputs.from_vars(values), host="glm5-01", checkpoint=checkpoint).to_dict()


# -- the table ----------------------------------------------------------------------------------------------
def test_the_table_knows_the_default_checkpoint_lacks_its_draft_and_names_its_source() -> None:
    assert DEFAULT_REPO == "lukealonso/GLM-5-NVFP4"
    known = checkpoints.lookup(DEFAULT_REPO, SHA)
    assert known is not None and known.draft == "missing" and known.draft_layer == 78
    assert "festr2/GLM-5-NVFP4-MTP" in known.source and "layer 78" in known.source
    restored = checkpoints.lookup("festr2/GLM-5-NVFP4-MTP", SHA)
    assert restored is not None and restored.draft == "usable"
    assert checkpoints.lookup("someone/else", SHA) is None


def test_the_tables_draft_bytes_are_what_the_inspection_reads_for_the_same_layer(inspected: dict[str, Any]) -> None:
    restored = checkpoints.lookup("festr2/GLM-5-NVFP4-MTP", SHA)
    assert restored is not None and restored.draft_bytes == inspected["bf16"]["draft_bytes"]


# -- before any host is asked: the table ---------------------------------------------------------------
def test_tuned_mtp_on_the_default_checkpoint_is_refused_naming_layer_78_and_the_fix() -> None:
    with pytest.raises(server.ResolveError) as err:
        resolve(profile="tuned-mtp")
    message = str(err.value)
    assert message.startswith("host glm5-01: sglang_server_profile 'tuned-mtp' drafts with the checkpoint's own MTP layer")
    assert "lukealonso/GLM-5-NVFP4 (known checkpoint" in message and "draft layer 78" in message
    assert "Fix: serve a checkpoint with draft layer 78 restored in BF16 (e.g. festr2/GLM-5-NVFP4-MTP" in message
    assert "sglang_server_profile: tuned" in message


def test_the_same_checkpoint_without_speculative_flags_resolves_and_plans_normally() -> None:
    for profile in ("seed-004", "tuned"):
        result = resolve(profile=profile)
        assert result["checkpoint"]["speculative"] == "missing" and result["checkpoint"]["inspected"] is False
        assert result["warnings"] == [] and result["memory_plan"]["safe"] is not False
        assert "speculative-algorithm" not in result["flags"]


def test_speculative_flags_from_the_override_are_named_as_such() -> None:
    with pytest.raises(server.ResolveError, match=r"^host glm5-01: sglang_server_flags_override drafts"):
        resolve(flags_override={"speculative-algorithm": "NEXTN"})


def test_a_draft_model_of_its_own_is_not_this_checkpoints_layer() -> None:
    own = {"speculative-algorithm": "EAGLE", "speculative-draft-model-path": "/models/draft", "mem-fraction-static": "auto"}
    result = resolve(flags_override=own)
    assert result["flags"]["speculative-algorithm"] == "EAGLE" and result["warnings"] == []
    for algorithm in ("NGRAM", "EAGLE3"):
        override = {"speculative-algorithm": algorithm, "mem-fraction-static": "auto"}
        assert resolve(flags_override=override)["warnings"] == []


def test_the_restored_checkpoint_resolves_and_an_unknown_one_is_warned_about() -> None:
    restored = resolve(profile="tuned-mtp", checkpoint_repo="festr2/GLM-5-NVFP4-MTP")
    assert restored["flags"]["speculative-algorithm"] == "EAGLE" and restored["warnings"] == []
    assert restored["checkpoint"]["speculative"] == "usable"
    unknown = resolve(profile="tuned-mtp", checkpoint_repo="someone/GLM-5-NVFP4-other")
    assert unknown["checkpoint"] == {} and len(unknown["warnings"]) == 1
    assert "someone/GLM-5-NVFP4-other ships that layer is not known here" in unknown["warnings"][0]
    assert "sglang-deploy checkpoint DIR" in unknown["warnings"][0]


# -- on the host: the inspection judges -------------------------------------------------------------------
def test_the_hosts_inspection_wins_over_the_table_both_ways(inspected: dict[str, Any]) -> None:
    # The default repository, but these weights carry a restored draft (a graft): allowed.
    grafted = resolve(inspected["bf16"], profile="tuned-mtp")
    assert grafted["checkpoint"]["inspected"] is True and grafted["checkpoint"]["speculative"] == "usable"
    assert grafted["checkpoint"]["detail"] == "draft layer 78 is complete (19.9 GB, BF16/F32)"  # GLM-5's BF16 layer 78
    # The "restored" repository, but these weights lack the layer: refused, naming these weights.
    with pytest.raises(server.ResolveError) as err:
        resolve(inspected["missing"], profile="tuned-mtp", checkpoint_repo="festr2/GLM-5-NVFP4-MTP")
    assert "(its headers): draft layer 78 is missing (791 of its tensors absent" in str(err.value)


def test_a_quantized_draft_is_refused_with_what_sglang_would_do(inspected: dict[str, Any]) -> None:
    with pytest.raises(server.ResolveError) as err:
        resolve(inspected["nvfp4"], profile="tuned-mtp")
    assert "draft layer 78 is quantized" in str(err.value) and "the load fails, or the draft is garbage" in str(err.value)


def test_the_memory_plan_takes_the_drafts_real_bytes(inspected: dict[str, Any]) -> None:
    found = inspector.Inspection(**inspected["bf16"])
    result = resolve(inspected["bf16"], profile="tuned-mtp")
    real = (found.draft_bytes_per_gpu(8) + found.draft_embedding_and_head_bytes / 8) / 2**30
    assert result["memory_plan"]["inputs"]["draft_weights_gib_per_gpu"] == pytest.approx(real, abs=1e-4)
    assert result["memory_plan"]["inputs"]["effective_draft_weights_gib_per_gpu"] == pytest.approx(2.928, abs=1e-3)
    # Without speculative flags the draft takes nothing.
    plain = resolve(inspected["bf16"], profile="tuned")
    assert plain["memory_plan"]["inputs"]["effective_draft_weights_gib_per_gpu"] == 0


def test_the_draft_memory_is_the_checkpoints_bytes_not_the_architectures_estimate(tmp_path: Path) -> None:
    """The fixture's BF16 draft is built from the same shapes as the planner's estimate (equal to 2.5e-5 GiB), so a
    plan that used the estimate would pass the test above. Here the draft's routed experts are F32 (unquantized, so
    usable, and twice the bytes): the plan must follow the headers, gigabytes away from the estimate - through the
    resolver and through `plan --checkpoint`."""
    made = make_glm5_checkpoint(tmp_path / "f32", draft="bf16", draft_dtypes={
        name: "F32" for name in architectures.draft_layer_tensors(architectures.config("glm-5")) if ".mlp." in name
    })  # fmt: skip
    found = inspector.inspect(tmp_path / "f32")
    assert found.speculative == "usable" and found.draft_dtypes.get("F32")
    real = (found.draft_bytes_per_gpu(8) + found.draft_embedding_and_head_bytes / 8) / 2**30
    result = resolve(found.to_dict(), profile="tuned-mtp")
    planned = result["memory_plan"]["inputs"]["draft_weights_gib_per_gpu"]
    assert planned == pytest.approx(real, abs=1e-4) and real > 4.5, (planned, real)
    known = checkpoints.lookup("festr2/GLM-5-NVFP4-MTP", SHA)
    assert known is not None and known.draft_bytes is not None
    # The table's bytes for the same layer in BF16 are the architecture's estimate (the test above): gigabytes off.
    assert abs(real - known.draft_bytes / 8 / 2**30) > 1.0
    assert made["draft"] and sum(1 for spec in made["draft"].values() if spec[0] == "F32") > 100
    done = _plan("-i", "inventory/proxmox", "--profile", "tuned-mtp", "--checkpoint", str(tmp_path / "f32"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["inputs"]["effective_draft_weights_gib_per_gpu"] == round(real, 3)


def test_a_draft_layer_whose_experts_differ_in_dtype_is_named_as_the_draft(tmp_path: Path) -> None:
    make_glm5_checkpoint(tmp_path / "mixed", draft="bf16", draft_dtypes={
        name: "F32" for name in architectures.draft_layer_tensors(architectures.config("glm-5")) if ".mlp.experts." in name
    })  # fmt: skip
    found = inspector.inspect(tmp_path / "mixed")
    assert found.shared_experts_fusion == "dtypes-differ" and found.speculative == "usable"
    with pytest.raises(server.ResolveError) as err:
        resolve(found.to_dict(), profile="tuned-mtp")
    assert "the draft layer's shared expert and routed experts differ in dtype (the other layers' are U8)" in str(err.value)
    assert "Fix: add disable-shared-experts-fusion: true" in str(err.value)


def test_shared_expert_fusion_across_dtypes_needs_the_flag(inspected: dict[str, Any]) -> None:
    with pytest.raises(server.ResolveError) as err:
        resolve(inspected["shared-bf16"])
    message = str(err.value)
    assert "the shared expert is BF16 beside U8 routed experts" in message
    assert "Fix: add disable-shared-experts-fusion: true" in message
    fixed = resolve(inspected["shared-bf16"], flags_override={"disable-shared-experts-fusion": True})
    assert fixed["flags"]["disable-shared-experts-fusion"] is True


def test_sglang_0_5_23_turns_the_fusion_off_itself_so_the_cu130_lane_needs_no_flag(inspected: dict[str, Any]) -> None:
    """The checkpoint rule follows the lane: 0.5.23 disables shared-experts fusion when ModelOpt keeps the shared
    expert unquantized (lanes/cu130.yml shared_experts_fusion_auto_off, with its source); 0.5.10.post1 does not."""
    from sglang_deploy.lanes.catalog import load_lane

    assert "quant_blocks_shared_experts_fusion" in load_lane("cu130").shared_experts_fusion_auto_off
    assert load_lane("cu128").shared_experts_fusion_auto_off == ""
    done = resolve(inspected["shared-bf16"], lane="cu130")
    assert "disable-shared-experts-fusion" not in done["flags"] and done["lane"] == "cu130"
    assert done["checkpoint"]["shared_experts_fusion"] == "dtypes-differ"


def test_an_inspection_of_another_version_is_refused_not_misread(inspected: dict[str, Any]) -> None:
    with pytest.raises(server.ResolveError, match="not one this version reads"):
        resolve({**inspected["bf16"], "new_key": 1})


def test_self_drafting_reads_the_launch_object() -> None:
    def launch(**flags: Any) -> LaunchConfig:
        return LaunchConfig.from_vars({"model-path": "/m", **flags}, python="python3")

    assert checkpoints.self_drafting(launch(**{"speculative-algorithm": "eagle"})) == "eagle"
    assert checkpoints.self_drafting(launch(**{"speculative_algorithm": "NEXTN", "speculative-draft-model-path": "/m"})) == "NEXTN"
    assert checkpoints.self_drafting(launch(**{"speculative-algorithm": "EAGLE", "speculative-draft-model": "/d"})) is None
    assert checkpoints.self_drafting(launch()) is None


# -- plan --checkpoint ------------------------------------------------------------------------------------
def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_deploy.cli", "plan", *args], capture_output=True, text=True, timeout=120,
        check=False, cwd=ROOT,
    )  # fmt: skip


def test_plan_refuses_a_speculative_launch_on_a_draft_less_checkpoint(inspected: dict[str, Any]) -> None:
    path = Path(inspected["_root"]["path"]) / "missing"
    done = _plan("-i", "inventory/proxmox", "--profile", "tuned-mtp", "--checkpoint", str(path))
    assert done.returncode == 2 and "draft layer 78 is missing" in done.stderr and "Fix:" in done.stderr, done.stderr
    plain = _plan("-i", "inventory/proxmox", "--profile", "tuned", "--checkpoint", str(path), "--json")
    assert plain.returncode == 0, plain.stderr
    data = json.loads(plain.stdout)
    assert data["checkpoint"]["speculative"] == "missing" and data["recommended_mem_fraction_static"] == 0.92


def test_plan_takes_the_draft_weights_from_the_checkpoint(inspected: dict[str, Any]) -> None:
    path = Path(inspected["_root"]["path"]) / "bf16"
    done = _plan("-i", "inventory/proxmox", "--profile", "tuned-mtp", "--checkpoint", str(path), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    found = inspector.Inspection(**inspected["bf16"])
    real = round((found.draft_bytes_per_gpu(8) + found.draft_embedding_and_head_bytes / 8) / 2**30, 3)
    assert data["inputs"]["effective_draft_weights_gib_per_gpu"] == real
    assert any("its headers' bytes" in note for note in data["notes"])
    assert data["recommended_mem_fraction_static"] == 0.84
    # Without an inventory the checkpoint's config.json gives the shapes.
    bare = _plan("--checkpoint", str(path), "--gpu-memory-mib", "97887", "--sm-major", "12", "--tp-size", "8",
                 "--speculative-algorithm", "EAGLE", "--kv-cache-dtype", "bfloat16", "--json")  # fmt: skip
    assert bare.returncode == 0, bare.stderr
    assert json.loads(bare.stdout)["inputs"]["effective_draft_weights_gib_per_gpu"] == real


def test_plan_on_an_unreadable_checkpoint_says_why_with_exit_2(tmp_path: Path) -> None:
    done = _plan("-i", "inventory/proxmox", "--checkpoint", str(tmp_path / "nope"))
    assert done.returncode == 2 and "--checkpoint" in done.stderr and "does not exist" in done.stderr
