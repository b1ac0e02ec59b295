"""Model weights on a host after the hf_model role: complete, as the source listed them, read-only to the server.

Every `<models root>/<org>--<name>/<revision>.manifest.json` the role recorded names a model directory;
each must hold every listed file at its listed size and pass the role's own completeness check: the
`sglang_weights_info` module (library/), run on the host through testinfra's Ansible backend in check
mode. Used by molecule (hf_model scenario) and by playbooks/verify.yml against a real host. The models
root and the token file follow the role's defaults; SGLANG_DEPLOY_MODELS_ROOT / SGLANG_DEPLOY_HF_TOKEN_FILE
override them, and SGLANG_DEPLOY_EXPECT_HF_TOKEN=1 requires the token file.
"""

from __future__ import annotations

import json
import os

import pytest

MODELS_ROOT = os.environ.get("SGLANG_DEPLOY_MODELS_ROOT", "/var/lib/sglang/models")
TOKEN_FILE = os.environ.get("SGLANG_DEPLOY_HF_TOKEN_FILE", "/etc/sglang-deploy/hf_token")


def _manifests(host) -> list[str]:  # type: ignore[no-untyped-def]
    found = host.run("find %s -mindepth 2 -maxdepth 2 -name '*.manifest.json' -type f", MODELS_ROOT)
    assert found.rc == 0, found.stderr
    paths = sorted(found.stdout.split())
    assert paths, f"no model recorded under {MODELS_ROOT}: the hf_model role has not run"
    return paths


def _load(host, manifest_path: str) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(host.file(manifest_path).content_string)


def _weights_info(host, model_dir: str, manifest: str) -> dict:  # type: ignore[no-untyped-def]
    """The role's module on the host (read-only, so check mode): where model_dir stands against manifest."""
    return dict(host.ansible("sglang_weights_info", f"dest={model_dir} manifest={manifest}", check=True))


def test_every_recorded_model_is_complete_by_the_roles_check(host):
    for manifest in _manifests(host):
        model_dir = manifest.removesuffix(".manifest.json")
        info = _weights_info(host, model_dir, manifest)
        assert info["complete"] is True, f"{model_dir}: {info['problems_brief']}"
        assert info["missing_bytes"] == 0 and info["progress"]["bytes"] >= info["total_bytes"]
        assert any(name.endswith(".safetensors") for name in info["files"]), f"{model_dir}: no safetensors shard"


def test_every_listed_file_has_the_source_size_and_server_readable_modes(host):
    for manifest_path in _manifests(host):
        manifest = _load(host, manifest_path)
        model_dir = manifest_path.removesuffix(".manifest.json")
        assert model_dir.endswith("/" + manifest["revision"])
        assert model_dir.split("/")[-2] == manifest["repo"].replace("/", "--")
        assert manifest["total_bytes"] == sum(manifest["files"].values())
        directory = host.file(model_dir)
        assert directory.is_directory and directory.mode == 0o755
        owner = directory.user
        for name, size in manifest["files"].items():
            target = host.file(f"{model_dir}/{name}")
            assert target.is_file, f"{name} missing in {model_dir}"
            assert target.size == size, f"{name}: {target.size} bytes, the source has {size}"
            assert target.user == owner
            # Readable by the server's user, writable by nobody but the owner.
            assert target.mode & 0o444 == 0o444 and target.mode & 0o022 == 0, f"{name}: mode {oct(target.mode)}"


def test_index_names_only_shards_that_are_there(host):
    for manifest_path in _manifests(host):
        model_dir = manifest_path.removesuffix(".manifest.json")
        index = json.loads(host.file(f"{model_dir}/model.safetensors.index.json").content_string)
        shards = set(index["weight_map"].values())
        assert shards and shards <= set(_load(host, manifest_path)["files"])


@pytest.fixture()
def damaged_copy(host):  # type: ignore[no-untyped-def]
    """A scratch copy of the first recorded model with its last shard cut short (removed afterwards)."""
    manifest_path = _manifests(host)[0]
    model_dir = manifest_path.removesuffix(".manifest.json")
    shard = sorted(n for n in _load(host, manifest_path)["files"] if n.endswith(".safetensors"))[-1]
    scratch = host.run("mktemp -d").stdout.strip()
    assert host.run("cp -a %s/. %s/", model_dir, scratch).rc == 0
    assert host.run("truncate --size=-1 %s/%s", scratch, shard).rc == 0
    yield scratch, shard, manifest_path
    host.run("rm -rf %s", scratch)


def test_roles_check_on_the_host_finds_a_shard_one_byte_short(host, damaged_copy):
    scratch, shard, manifest = damaged_copy
    info = _weights_info(host, scratch, manifest)
    assert info["complete"] is False
    assert [(p["name"], p["state"]) for p in info["problems"]] == [(shard, "truncated")]
    assert info["missing_files"] == [shard] and info["missing_bytes"] == 1


def test_hub_token_is_only_in_a_root_only_file(host):
    """The token of a hub/mirror fetch lands in a 0600 file that only its owner can open, nowhere else."""
    token_file = host.file(TOKEN_FILE)
    if os.environ.get("SGLANG_DEPLOY_EXPECT_HF_TOKEN") == "1":
        assert token_file.exists, f"{TOKEN_FILE} missing although this host fetched with a token"
    if token_file.exists:
        assert token_file.mode == 0o600
        assert host.file(os.path.dirname(TOKEN_FILE)).mode & 0o044 == 0
        token = token_file.content_string.strip()
        assert token
        # Not in any file the role wrote for everyone to read.
        leaked = host.run("grep -rlF -- %s %s", token, MODELS_ROOT)
        assert leaked.rc == 1, f"token found in: {leaked.stdout}"
