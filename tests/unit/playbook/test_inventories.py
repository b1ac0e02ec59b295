"""The shipped inventories: the multi-host example serves the same launch profile as inventory/proxmox,
and both pass `sglang-deploy validate` (the server's and the router's pinned parsers)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PROXMOX_PROFILE = ROOT / "inventory" / "proxmox" / "group_vars" / "sglang_servers"
PROFILE_FILES = ("sglang_server.yml", "profiles.yml", "hf_model.yml", "nvidia_cuda.yml")


@pytest.mark.parametrize("name", PROFILE_FILES)
def test_the_multi_host_workers_link_the_proxmox_profile(name: str):
    """One way to share the profile: a link, never a copy that drifts."""
    multi = ROOT / "inventory" / "multi_host" / "group_vars" / "sglang_servers" / name
    assert multi.is_symlink() and multi.resolve() == (PROXMOX_PROFILE / name).resolve(), f"{multi} must link to {PROXMOX_PROFILE / name}"


@pytest.mark.parametrize("inventory", ["device", "rehearsal"])
def test_the_other_inventories_link_the_whole_profile(inventory: str):
    linked = ROOT / "inventory" / inventory / "group_vars" / "sglang_servers"
    assert linked.is_symlink() and linked.resolve() == PROXMOX_PROFILE.resolve()


@pytest.mark.parametrize("inventory", ["proxmox", "multi_host", "device", "rehearsal"])
def test_every_inventory_defines_the_api_key_once(inventory: str):
    """Once for all hosts (group_vars, read through the linked profile folders as Ansible reads them); a
    host may replace it on purpose (the rehearsal's generated key stands in for the vault)."""
    files = sorted(Path(top) / name for top, _, names in os.walk(ROOT / "inventory" / inventory / "group_vars", followlinks=True)
                   for name in names if name.endswith(".yml"))  # fmt: skip
    defining = [str(f.relative_to(ROOT)) for f in files if re.search(r"^sglang_server_api_key:", f.read_text(), re.M)]
    assert len(defining) == 1, defining


def test_the_lane_is_set_once_as_sglang_common_lane():
    """The ml-env's lock and the flags' parser come from one variable (roles/sglang_common)."""
    texts = [f.read_text() for f in (ROOT / "inventory").rglob("*.yml")]
    assert not any(re.search(r"^(sglang_server_lane|ml_env_lane|preflight_lane):", t, re.M) for t in texts)
    assert any(re.search(r"^sglang_common_lane: cu128$", t, re.M) for t in texts)


def _validate(inventory: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("sglang-deploy")), "validate", "-i", str(inventory)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "SGLANG_API_KEY": "a-key-for-the-test-0123456789", **(env or {})},
    )  # fmt: skip


def test_the_multi_host_inventory_validates_workers_and_router():
    done = _validate(ROOT / "inventory" / "multi_host")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_flag_the_router_does_not_know_fails_validate_before_any_host(tmp_path: Path):
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "multi_host", inventory)
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "router-01.yml").write_text("sglang_router_extra_flags: {no-such-router-flag: 1}\n")
    done = _validate(inventory)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "router-01" in out and "no-such-router-flag" in out and "sglang_router_extra_flags" in out, out


def test_the_tuned_profiles_validate_with_the_lanes_parser(tmp_path: Path):
    """inventory/proxmox with sglang_server_profile: tuned (BF16 KV, the planner's fraction): sglang 0.5.10.post1's
    own parser accepts the launch; tuned-mtp is refused before the parser on the default checkpoint, which ships
    no draft layer, and accepted on the restored one; an unknown profile name is refused naming the fix."""
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "proxmox", inventory)
    (inventory / "host_vars").mkdir()
    host_vars = inventory / "host_vars" / "glm5-01.yml"
    host_vars.write_text("sglang_server_profile: tuned\n")
    done = _validate(inventory)
    assert done.returncode == 0, done.stdout + done.stderr
    host_vars.write_text("sglang_server_profile: tuned-mtp\n")
    done = _validate(inventory)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "host glm5-01: sglang_server_profile 'tuned-mtp' drafts with" in out, out
    assert "lukealonso/GLM-5-NVFP4 (known checkpoint" in out and "draft layer 78" in out, out
    host_vars.write_text("sglang_server_profile: tuned-mtp\nhf_model_repo: festr2/GLM-5-NVFP4-MTP\n")
    done = _validate(inventory)
    assert done.returncode == 0, done.stdout + done.stderr
    host_vars.write_text("sglang_server_profile: tunned\n")
    done = _validate(inventory)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "host glm5-01" in out and "'tunned' is not one of sglang_server_profiles" in out, out


def test_tls_files_are_judged_before_any_host_and_a_vaulted_key_is_read(tmp_path: Path) -> None:
    """inventory/multi_host with TLS (sglang_server_tls_*): `validate` (the validate play's sglang_validate_tls,
    Ansible itself) passes a good certificate whose key is in ansible-vault, and refuses an expired one
    naming the host, the variable and the file, with no host contacted (the addresses are RFC 5737's)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import datetime

    from tls_certs import NOW, TestCA, write

    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "multi_host", inventory)
    ca = TestCA()
    names = ["127.0.0.1", "192.0.2.11", "192.0.2.12", "192.0.2.13"]
    good = write(tmp_path / "tls", ca, ca.issue(names))
    password = tmp_path / "vault-password"
    password.write_text("a-test-vault-password\n")
    password.chmod(0o600)
    subprocess.run(
        [str(Path(sys.executable).with_name("ansible-vault")), "encrypt", "--vault-password-file", str(password), str(good["keyfile"])],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert good["keyfile"].read_bytes().startswith(b"$ANSIBLE_VAULT;")
    good["keyfile"].chmod(0o644)  # a vault file's mode guards ciphertext only
    tls_vars = inventory / "group_vars" / "sglang_servers" / "tls.yml"
    tls_vars.write_text("".join(f"sglang_server_tls_{kind}: {path}\n" for kind, path in good.items()))
    env = {"ANSIBLE_VAULT_PASSWORD_FILE": str(password)}
    done = _validate(inventory, env)
    assert done.returncode == 0, done.stdout + done.stderr
    # Another vault's password: refused naming the host, the variable, the file and the fix - no traceback.
    wrong = tmp_path / "wrong-vault-password"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    done = _validate(inventory, {"ANSIBLE_VAULT_PASSWORD_FILE": str(wrong)})
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in out, out
    assert (f"host glm5-01: sglang_server_tls_keyfile={good['keyfile']}: cannot read it (an ansible-vault file this run "
            "cannot decrypt") in out and "Fix: run with the vault password that encrypted it" in out, out  # fmt: skip
    expired = write(tmp_path / "expired", ca, ca.issue(names, not_before=NOW - datetime.timedelta(days=90),
                                                      not_after=NOW - datetime.timedelta(days=1)))  # fmt: skip
    tls_vars.write_text("".join(f"sglang_server_tls_{kind}: {path}\n" for kind, path in expired.items()))
    done = _validate(inventory, env)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    for host in ("glm5-01", "glm5-02", "glm5-03"):
        assert f"host {host}: sglang_server_tls_certfile={expired['certfile']}: the certificate expired on" in out, out


def test_a_quality_reference_is_judged_before_any_host(tmp_path: Path) -> None:
    """inventory/proxmox with sglang_server_quality_reference (issue 42): `validate` (the validate play's
    sglang_validate_quality) reads the reference whole and passes one recorded for the served model (glm-5);
    it refuses one recorded for another model, a malformed one and a relative path, naming the host, the
    variable, the file and the fix - with no host contacted. The references are recorded on the stand-in."""
    from conftest import StandinProcess

    from sglang_deploy_host.serving import endpoint, quality, quality_reference

    references = {}
    for model in ("glm-5", "glm-5.1"):
        server = StandinProcess(tmp_path / f"{model}.log", "--served-model-name", model, "--standin-load-delay", "0")
        try:
            references[model] = quality.record(endpoint.Endpoint(server.url), model, quality_reference.load_prompt_set())
        finally:
            server.stop()
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "proxmox", inventory)
    (inventory / "quality").mkdir()
    good, other, broken = (inventory / "quality" / name for name in ("glm-5.json", "glm-5.1.json", "broken.json"))
    good.write_text(json.dumps(references["glm-5"]))
    other.write_text(json.dumps(references["glm-5.1"]))
    broken.write_text(json.dumps({**references["glm-5"], "prompts": "none"}))
    quality_vars = inventory / "group_vars" / "sglang_servers" / "quality.yml"
    quality_vars.write_text(f"sglang_server_quality_reference: {good}\n")
    done = _validate(inventory)
    assert done.returncode == 0, done.stdout + done.stderr
    for path, expected in (
        (other, f"host glm5-01: sglang_server_quality_reference={other} was recorded for the served model 'glm-5.1', "
                "this host serves 'glm-5'. Fix: record a reference for this model"),
        (broken, f"host glm5-01: sglang_server_quality_reference={broken}: {broken}: prompts must be a list of 1 to 64"),
        ("quality/glm-5.json", "sglang_server_quality_reference=quality/glm-5.json: not an absolute path"),
    ):  # fmt: skip
        quality_vars.write_text(f"sglang_server_quality_reference: {path}\n")
        done = _validate(inventory)
        out = done.stdout + done.stderr
        assert done.returncode != 0 and expected in " ".join(out.split()), out


def test_init_writes_the_proxmox_layout_into_a_new_directory_and_it_validates(tmp_path: Path) -> None:
    """`sglang-deploy init DIR` from any directory: the proxmox inventory as shipped (comments, placeholders, no
    secret), DIR 0700; `validate -i DIR` passes on it; a non-empty DIR or a file is refused, nothing written."""
    cli = str(Path(sys.executable).with_name("sglang-deploy"))
    site = tmp_path / "new-site"
    done = subprocess.run([cli, "init", str(site)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "next: put your node's and VM's addresses in hosts.yml" in done.stderr
    shipped = sorted(p.relative_to(ROOT / "inventory" / "proxmox") for p in (ROOT / "inventory" / "proxmox").rglob("*") if p.is_file())
    written = sorted(p.relative_to(site) for p in site.rglob("*") if p.is_file())
    assert written == shipped and all((site / p).read_bytes() == (ROOT / "inventory" / "proxmox" / p).read_bytes() for p in shipped)
    assert (site.stat().st_mode & 0o777) == 0o700
    done = _validate(site)
    assert done.returncode == 0, done.stdout + done.stderr
    (site / "hosts.yml").write_text("# mine\n")
    for target in (site, site / "hosts.yml"):
        refused = subprocess.run([cli, "init", str(target)], capture_output=True, text=True, timeout=120, check=False)
        assert refused.returncode == 2 and "Fix: name a new" in refused.stderr, refused.stderr
    assert (site / "hosts.yml").read_text() == "# mine\n"
