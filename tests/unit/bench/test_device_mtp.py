"""The MTP evidence run's parts that run here (scripts/device/mtp-evidence.sh runs them on the GPU): the
inventory/device device_mtp hosts render the tuned profiles' own speculative settings, and
scripts/device/train_tiny_mtp.py writes a draft layer that the inspection - the code the role runs before
the unit starts - reads as sglang's loader would (the smoke size, on the CPU, with the cu128 lane's
validator venv: torch, transformers and safetensors are there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from sglang_deploy.launch import validator_venv
from sglang_deploy.lanes.catalog import load_lane
from sglang_deploy_host.model import inspection
from sglang_deploy_host.serving import systemd

PROFILES = yaml.safe_load((ROOT / "inventory/proxmox/group_vars/sglang_servers/profiles.yml").read_text())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("render")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("sglang-deploy")), "render", "-i", "inventory/device", "-l", "device_mtp",
         "--out", str(out), "--no-validate"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "SGLANG_API_KEY": "a-key-for-the-test-0123456789"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("WARNING mtp-") == 3 and "is not known here" in done.stderr  # the three tuned-mtp hosts
    return out


def _argv(rendered: Path, host: str) -> list[str]:
    unit = (rendered / host / "sglang.service").read_text()
    return systemd.exec_start_argv(unit)


def test_the_mtp_hosts_run_the_tuned_mtp_profiles_speculative_settings(rendered: Path) -> None:
    mtp = PROFILES["sglang_server_profiles"]["tuned-mtp"]
    for host, model in (("mtp-trained", "tiny-mtp"), ("mtp-nodraft", "tiny-mtp-nodraft"), ("mtp-specv2", "tiny-mtp")):
        argv = _argv(rendered, host)
        for name in ("speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"):
            assert argv[argv.index(f"--{name}") + 1] == str(mtp[name]), (host, name)
        assert argv[argv.index("--kv-cache-dtype") + 1] == "bfloat16"
        assert argv[argv.index("--model") + 1] == f"/var/lib/sglang/models/{model}"
    off = _argv(rendered, "mtp-off")
    assert not any(word.startswith("--speculative") for word in off) and off[off.index("--kv-cache-dtype") + 1] == "bfloat16"
    assert "SGLANG_ENABLE_SPEC_V2=True" in (rendered / "mtp-specv2" / "sglang.service").read_text()
    assert "SGLANG_ENABLE_SPEC_V2" not in (rendered / "mtp-trained" / "sglang.service").read_text()


@pytest.mark.slow
def test_the_training_script_writes_a_draft_the_inspection_reads(tmp_path: Path) -> None:
    python = validator_venv._venv_python(validator_venv.ensure_validator_env(load_lane("cu128")))
    # A fixed number of steps, not a time budget: a CI machine busy with molecule trains a third of the steps
    # in the same seconds (a draft at 0.28 agreement), the same seeded run everywhere (~12 s alone here).
    done = subprocess.run(
        [str(python), str(ROOT / "scripts/device/train_tiny_mtp.py"), str(tmp_path), "--size", "smoke", "--steps", "600",
         "--device", "cpu"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    # The target learns the rule, and its draft predicts its next-next token, in the BF16 files too.
    assert report["target_next_token_accuracy_bf16_files"] > 0.9 and report["draft_top1_agreement_bf16_files"] > 0.8, report
    with_draft = inspection.inspect(tmp_path / "tiny-mtp")
    assert with_draft.speculative == "usable" and with_draft.architecture == "DeepseekV3ForCausalLM"
    assert len(with_draft.draft_tensors_present) == report["draft_tensors"] and with_draft.draft_bytes == report["draft_bytes"]
    without = inspection.inspect(tmp_path / "tiny-mtp-nodraft")
    assert without.speculative == "missing" and without.draft_tensors_missing == with_draft.draft_tensors_present


def test_the_quality_evidence_hosts_change_one_thing_each(rendered: Path) -> None:
    """inventory/device's q-* hosts (the quality check's evidence, docs/quality.md): mtp-off's launch with one change
    each - a restart (none), an FP8 E5M2 or E4M3 KV cache, a RoPE base the weights were not trained with."""
    off = _argv(rendered, "mtp-off")

    def changes(host: str) -> dict[str, str]:
        argv = _argv(rendered, host)
        flags = {word: argv[i + 1] for i, word in enumerate(argv[:-1]) if word.startswith("--") and not argv[i + 1].startswith("--")}
        base = {word: off[i + 1] for i, word in enumerate(off[:-1]) if word.startswith("--") and not off[i + 1].startswith("--")}
        assert [w for w in argv if w.startswith("--")] == [w for w in off if w.startswith("--")] + [
            w for w in argv if w.startswith("--") and w not in off], host
        return {k: v for k, v in flags.items() if base.get(k) != v and k != "--api-key"}

    assert changes("q-restart") == {}
    assert changes("q-kv-fp8-e5m2") == {"--kv-cache-dtype": "fp8_e5m2"}
    assert changes("q-kv-fp8-e4m3") == {"--kv-cache-dtype": "fp8_e4m3"}
    drift = changes("q-rope-drift")
    assert json.loads(drift["--json-model-override-args"]) == {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}


def test_the_tiny_models_prompt_set_speaks_its_language(tmp_path: Path) -> None:
    """scripts/device/quality_prompts_tiny.py: the shipped set's shape (5 short prompts, one over 8,192 tokens) in the
    tiny model's tokN words, each continuation going on from its prompt and changing stride twice; the same file on
    every run; a valid prompt set."""
    from sglang_deploy_host.serving import quality_reference

    script = ROOT / "scripts" / "device" / "quality_prompts_tiny.py"
    for name in ("a.yml", "b.yml"):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / name)], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.yml").read_bytes() == (tmp_path / "b.yml").read_bytes()
    prompts = quality_reference.load_prompt_set(tmp_path / "a.yml")
    assert [p.name for p in prompts.prompts] == ["short-1", "short-2", "short-3", "short-4", "short-5", "long-context"]
    assert len(prompts.prompts[-1].prompt.split()) >= 8192 and prompts.prompts[-1].min_prompt_tokens == 8192
    sys.path.insert(0, str(ROOT / "scripts" / "device"))
    from progressions import SPECIALS, VOCAB

    span = VOCAB - SPECIALS
    for prompt in prompts.prompts:
        ids = [int(word.removeprefix("tok")) for word in (prompt.prompt + prompt.continuation).split()]
        assert all(SPECIALS <= i < VOCAB for i in ids)
        steps = [(b - a) % span for a, b in zip(ids[-33:], ids[-32:])]  # the continuation's strides
        assert sum(1 for a, b in zip(steps, steps[1:]) if a != b) == 2, (prompt.name, steps)
