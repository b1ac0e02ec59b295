"""The server's JIT caches on the kept disk (src/sglang_deploy/serving/jitcache.py, through server.resolve).

The variables are checked against what the device run recorded: tests/fixtures/real-sglang/day2/
cache-env-vars.txt (where the pinned sglang 0.5.17 stack reads each one) and jit-cache-starts.json
(the directories each pointed at, one per cache, and which filled)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from conftest import ROOT
from server_inputs import facts, inputs

from sglang_deploy.serving import jitcache, server

DAY2 = ROOT / "tests" / "fixtures" / "real-sglang" / "day2"
ROOT_DIR = "/var/lib/sglang/models/.sglang-deploy-cache/jit"
DIGEST = "0123456789abcdef"


def recorded_variables() -> set[str]:
    """Every cache-directory variable the device run found read in the pinned versions' source."""
    text = (DAY2 / "cache-env-vars.txt").read_text()
    headers = set(re.findall(r"^## ([A-Z_]+)$", text, re.MULTILINE))
    # TRITON_HOME is a home (the service keeps its own); SGLANG_USE_CUSTOM_TRITON_KERNEL_CACHE is a switch.
    assert {"TRITON_HOME", "SGLANG_USE_CUSTOM_TRITON_KERNEL_CACHE"} <= headers
    headers -= {"TRITON_HOME", "SGLANG_USE_CUSTOM_TRITON_KERNEL_CACHE"}
    # The driver's and CPython's, recorded in sections of their own.
    assert re.search(r"^ +\d+ CUDA_CACHE_PATH$", text, re.MULTILINE)
    assert "## PYTHONPYCACHEPREFIX: sys.pycache_prefix = /x" in text
    return headers | {"CUDA_CACHE_PATH", "PYTHONPYCACHEPREFIX"}


def test_the_unit_points_exactly_the_recorded_cache_variables_at_the_kept_disk() -> None:
    assert set(jitcache.CACHE_VARIABLES) == recorded_variables()
    # The same directories the device run measured (jit-cache-starts.json), HOME aside.
    starts = json.loads((DAY2 / "jit-cache-starts.json").read_text())
    assert set(jitcache.CACHE_VARIABLES.values()) == set(starts["a_cold_empty_K"]["caches"]) - {"home"}


def resolved(**jit: Any) -> dict[str, Any]:
    cache = {"root": ROOT_DIR, "lock_digest": DIGEST, "cuda_version": "12.8", **jit}
    return server.resolve(
        server.ServerInputs.from_vars(inputs(jit_cache=cache)), host="gpu1", gpu_facts=facts("h200-1gpu")
    ).to_dict()


def test_every_cache_variable_goes_through_the_link_to_the_keyed_directory_which_the_unit_may_write() -> None:
    result = resolved()
    cache = result["jit_cache"]
    assert cache["key_parts"] == {"lock": DIGEST, "cuda": "12.8", "compute_caps": "9.0", "driver": "580.159.04"}
    assert re.fullmatch(r"[0-9a-f]{16}", cache["key"]) and cache["dir"] == f"{ROOT_DIR}/{cache['key']}"
    assert cache["link"] == f"{ROOT_DIR}/current"
    for name, sub in jitcache.CACHE_VARIABLES.items():
        assert result["environment"][name] == f"{ROOT_DIR}/current/{sub}"
        assert f'"{name}={ROOT_DIR}/current/{sub}"' in result["launch"]["environment_assignments"]
    assert result["unit"]["read_write_paths"] == ["/var/lib/sglang/home", ROOT_DIR]
    # The directories are made by the unit as the service user (ExecStartPre=), behind root's link: root never
    # acts inside the service's directory, where the service could have planted a link.
    assert sorted(cache["dirs"]) == sorted({f"{ROOT_DIR}/current/{sub}" for sub in jitcache.CACHE_VARIABLES.values()})
    assert cache["exec_start_pre"] == "/bin/mkdir -p -m 0700 " + " ".join(cache["dirs"])


def test_the_unit_is_the_same_whether_or_not_the_host_was_asked() -> None:
    # `render` (and verify's comparison with it) resolves from the inventory alone: no GPU facts, no
    # ml-env to read. The key differs; what the unit holds does not.
    asked = resolved()
    unasked = server.resolve(
        server.ServerInputs.from_vars(inputs(jit_cache={"root": ROOT_DIR, "lock_digest": "", "cuda_version": "12.8"})),
        host="gpu1",
    ).to_dict()
    assert unasked["jit_cache"]["key"] != asked["jit_cache"]["key"]
    assert (unasked["launch"], unasked["unit"]) == (asked["launch"], asked["unit"])


@pytest.mark.parametrize(
    "change",
    [{"lock_digest": "fedcba9876543210"}, {"cuda_version": "13.0"}],
)
def test_a_new_lock_or_cuda_is_a_new_empty_directory_never_the_old_one(change: dict[str, str]) -> None:
    assert resolved()["jit_cache"]["key"] == resolved()["jit_cache"]["key"]
    assert resolved(**change)["jit_cache"]["key"] != resolved()["jit_cache"]["key"]


def test_another_gpu_or_driver_is_a_new_key() -> None:
    h200 = facts("h200-1gpu")
    base = jitcache.key(jitcache.key_parts(DIGEST, "12.8", h200))
    other_driver = {**h200, "driver_version": "590.1.2", "gpus": [{**g, "driver_version": "590.1.2"} for g in h200["gpus"]]}
    other_arch = {**h200, "gpus": [{**g, "compute_cap": "12.0"} for g in h200["gpus"]]}
    assert jitcache.key(jitcache.key_parts(DIGEST, "12.8", other_driver)) != base
    assert jitcache.key(jitcache.key_parts(DIGEST, "12.8", other_arch)) != base
    # Unknown parts (no ml-env or driver yet) are spelled out: a key of their own.
    assert jitcache.key_parts("", "12.8", None) == {
        "lock": "unknown", "cuda": "12.8", "compute_caps": "unknown", "driver": "unknown"}  # fmt: skip


def test_the_inventorys_environment_wins_and_no_kept_disk_keeps_todays_unit() -> None:
    mine = server.resolve(
        server.ServerInputs.from_vars(
            inputs(env={"TRITON_CACHE_DIR": "/srv/triton"}, jit_cache={"root": ROOT_DIR, "lock_digest": DIGEST})
        ),
        host="gpu1",
    ).to_dict()
    assert mine["environment"]["TRITON_CACHE_DIR"] == "/srv/triton"
    assert mine["environment"]["TVM_FFI_CACHE_DIR"].startswith(ROOT_DIR + "/")
    for jit in (None, {"root": "", "lock_digest": DIGEST}):
        plain = server.resolve(server.ServerInputs.from_vars(inputs(jit_cache=jit)), host="gpu1").to_dict()
        assert plain["jit_cache"] == {}
        assert not set(jitcache.CACHE_VARIABLES) & set(plain["environment"])
        assert plain["unit"]["read_write_paths"] == ["/var/lib/sglang/home"]


@pytest.mark.parametrize("root", ["relative/jit", "/", "/var/lib/sglang/../jit", "/a b"])
def test_a_bad_root_is_one_error_naming_host_and_variable(root: str) -> None:
    with pytest.raises(server.ResolveError, match=r"host gpu1: .*sglang_server_jit_cache_root"):
        server.resolve(server.ServerInputs.from_vars(inputs(jit_cache={"root": root})), host="gpu1")


KEPT = "/var/lib/sglang/models"


@pytest.mark.parametrize(
    ("variable", "root", "why"),
    [
        ("sglang_server_jit_cache_root", "/etc/sglang-jit", "is in /etc, a system, virtual or temporary directory"),
        ("sglang_server_jit_cache_root", "/proc/self/cwd", "is in /proc, a system"),
        # Any user may create there first, and the unit's /tmp is private (PrivateTmp=yes): nothing persists.
        ("sglang_server_jit_cache_root", "/tmp/jit", "is in /tmp, a system"),
        ("sglang_common_cache_root", "/var/tmp/cache", "is in /var/tmp, a system"),
        ("sglang_server_jit_cache_root", "/var/lib/sglang/home/jit", "overlaps the service's home /var/lib/sglang/home"),
        ("sglang_common_cache_root", "/var/lib/sglang", "overlaps the service's home"),
        ("sglang_server_jit_cache_root", "/srv/jit", f"is not below the kept weights disk's mount point {KEPT}"),
        ("sglang_server_jit_cache_root", KEPT, "is not below the kept weights disk's mount point"),
    ],
)
def test_render_refuses_a_cache_root_that_would_not_be_kept_or_is_not_the_caches(variable: str, root: str, why: str) -> None:
    jit = {"root": f"{KEPT}/.c/jit", "kept_disk": KEPT, "cache_root": f"{KEPT}/.c", "lock_digest": DIGEST}
    jit["root" if variable == "sglang_server_jit_cache_root" else "cache_root"] = root
    with pytest.raises(server.ResolveError) as caught:
        server.resolve(server.ServerInputs.from_vars(inputs(jit_cache=jit)), host="gpu1")
    message = str(caught.value)
    assert message.startswith(f"host gpu1: {variable} = {root} {why}"), message
    assert "Fix: " in message


def test_a_cache_root_on_the_kept_disk_is_taken() -> None:
    jit = {"root": f"{KEPT}/.sglang-deploy-cache/jit", "kept_disk": KEPT, "cache_root": f"{KEPT}/.sglang-deploy-cache"}
    resolved = server.resolve(server.ServerInputs.from_vars(inputs(jit_cache=jit)), host="gpu1").to_dict()
    assert resolved["jit_cache"]["root"] == f"{KEPT}/.sglang-deploy-cache/jit"


def test_the_unit_waits_for_the_disks_of_the_model_and_the_kept_caches() -> None:
    """RequiresMountsFor=: the model's directory and the caches' root (the ml-env's kept venvs live beside the
    JIT caches), so a weights disk that did not mount (nofail) stops the unit naming the mount."""
    model = "/var/lib/sglang/models/zai-org--GLM-5/0123abcd"
    cache = {"root": ROOT_DIR, "lock_digest": DIGEST, "cuda_version": "12.8"}

    def mounts(**changes: Any) -> list[str]:
        return server.resolve(server.ServerInputs.from_vars(inputs(**changes)), host="gpu1").to_dict()["unit"][
            "requires_mounts_for"
        ]

    # "model": the seed's spelling of --model-path
    assert mounts(flags_override={"model": model}, jit_cache=cache) == [model, ROOT_DIR]
    assert mounts(flags_override={"model": model}) == [model]  # no kept disk: the model's directory alone
    assert mounts(flags_override={"model": "zai-org/GLM-5"}) == []  # a hub id: nothing on a disk to wait for


def test_a_model_path_the_unit_can_only_quote_gets_no_mount_dependency() -> None:
    """sglang takes a model path with a space (ExecStart quotes it); RequiresMountsFor= cannot, so it is left out."""
    result = server.resolve(
        server.ServerInputs.from_vars(inputs(flags_override={"model": "/srv/my models/glm"})), host="gpu1"
    ).to_dict()
    assert result["unit"]["requires_mounts_for"] == []
    assert "'/srv/my models/glm'" in result["launch"]["exec_start"] or '"/srv/my models/glm"' in result["launch"]["exec_start"]
