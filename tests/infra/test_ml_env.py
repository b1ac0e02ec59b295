"""The ml-env the ml_env role built: the lane's lock, installed exactly, on the lane's CUDA, behind a
symlink, with the kernel proof that sglang-kernel carries the lane's GPU architecture.

What it should be comes from the package's lane data and committed locks (the same files the role
installs), read with the same code (sglang_deploy_host.stack.lockfile, mlenv); the kernel proof is the
project's sglang_kernel_proof module, run on the host through Ansible. Used by molecule/ml_env and,
against a real inventory, by the verify playbook.
Environment: SGLANG_DEPLOY_LANE (default cu128), SGLANG_DEPLOY_ML_ENV (default
/opt/sglang-deploy/ml-env), SGLANG_DEPLOY_ML_ENV_STORE (default: the symlink's path + .d; on the kept disk
when the inventory has one), SGLANG_DEPLOY_ML_ENV_KEEP (default 1).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from sglang_deploy.lanes.catalog import Lane, load_lane
from sglang_deploy.lanes.lock import LockTarget, lock_path
from sglang_deploy_host.stack import lockfile
from sglang_deploy_host.stack.mlenv import LOCK_NAME, MARKER, PREEXISTING

ML_ENV = os.environ.get("SGLANG_DEPLOY_ML_ENV", "/opt/sglang-deploy/ml-env")
STORE = os.environ.get("SGLANG_DEPLOY_ML_ENV_STORE", ML_ENV + ".d")
KEEP = int(os.environ.get("SGLANG_DEPLOY_ML_ENV_KEEP", "1"))
PYTHON = f"{ML_ENV}/bin/python"


@pytest.fixture(scope="module")
def lane() -> Lane:
    return load_lane(os.environ.get("SGLANG_DEPLOY_LANE", "cu128"))


def _venv_json(host, code: str) -> object:  # type: ignore[no-untyped-def]
    """Run ``code`` (which prints JSON) with the ml-env's python, from / so no local module shadows."""
    result = host.run(f"cd / && {PYTHON} -c {shlex.quote(code)}")
    assert result.rc == 0, f"{PYTHON} failed:\n{result.stderr}"
    return json.loads(result.stdout)


# One interpreter start for every import check (each costs seconds: torch, sglang), run as an
# unprivileged user: read-only is not unreadable, the service user must import the stack.
STACK_PROBE = (
    "import json, torch, transformers, sglang, flashinfer; "
    "from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES as names; "
    "print(json.dumps({'torch': [torch.__version__, torch.version.cuda], "
    "'transformers': [transformers.__version__, 'glm_moe_dsa' in names], "
    "'sglang': sglang.__version__, 'flashinfer': flashinfer.__version__}))"
)


@pytest.fixture(scope="module")
def stack(host) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """What the stack reports when the user ``nobody`` imports it with the ml-env's python."""
    # With a writable home, as the service user has one (flashinfer makes its JIT workspace there on import).
    home = host.check_output("mktemp -d")
    try:
        host.check_output(f"chown nobody {shlex.quote(home)}")
        result = host.run(
            f"cd / && runuser -u nobody -- env HOME={shlex.quote(home)} {PYTHON} -c {shlex.quote(STACK_PROBE)}"
        )
    finally:
        host.run(f"rm -rf {shlex.quote(home)}")
    assert result.rc == 0, f"user nobody could not import the stack with {PYTHON}:\n{result.stderr[-2000:]}"
    found = json.loads(result.stdout)
    assert isinstance(found, dict)
    return found


@pytest.fixture(scope="module")
def lock_text(host, lane: Lane) -> str:  # type: ignore[no-untyped-def]
    """The committed lock for the ml-env's Python."""
    python = _venv_json(host, "import json, sys; print(json.dumps('%d.%d' % sys.version_info[:2]))")
    path = lock_path(LockTarget(lane, str(python)))
    assert path.is_file(), f"the ml-env runs Python {python}, for which lane {lane.name} has no lock"
    return path.read_text(encoding="utf-8")


def test_ml_env_is_a_symlink_to_the_venv_of_the_lock(host, lock_text: str) -> None:  # type: ignore[no-untyped-def]
    link = host.file(ML_ENV)
    assert link.is_symlink
    digest = lockfile.venv_name(lock_text)
    assert link.linked_to == f"{STORE}/{digest}"
    venv = host.file(f"{STORE}/{digest}")
    assert venv.is_directory and venv.user == "root"
    assert host.file(f"{STORE}/{digest}/{LOCK_NAME}").content_string == lock_text
    report = json.loads(host.file(f"{STORE}/{digest}/{MARKER}").content_string)
    assert report["ok"] is True and report["problems"] == []
    # The role's own kernel proof ran before the switch.
    assert any(name.endswith("common_ops.abi3.so") for name in report["kernel_objects"]), report


def test_only_root_can_change_the_code_root_runs(host, lock_text: str) -> None:  # type: ignore[no-untyped-def]
    """The service runs the ml-env, and root runs it too (checks, verify, nccl-check): no file, the
    symlink or any directory above it may belong to or be writable by anyone but root."""
    venv = f"{STORE}/{lockfile.venv_name(lock_text)}"
    inside = host.run(f"find {venv} \\( ! -user root -o ! -group root -o -perm /022 \\) ! -type l -print -quit")
    assert inside.rc == 0 and inside.stdout.strip() == "", f"writable by others or not root's: {inside.stdout.strip()}"
    path = Path(ML_ENV)
    assert host.file(ML_ENV).user == "root"
    for directory in [*_up_to_a_mount_point(host, Path(STORE)), *path.parents]:
        entry = host.file(str(directory))
        assert entry.user == "root", f"{directory} belongs to {entry.user}"
        assert not entry.mode & 0o022, f"{directory} is writable by others ({entry.mode:o})"
        assert entry.mode & 0o001, f"{directory} cannot be traversed by the service ({entry.mode:o})"


def _up_to_a_mount_point(host, path: Path) -> list[Path]:  # type: ignore[no-untyped-def]
    """``path`` and its parents up to the first mount point (the kept disk, when the store is there): who
    owns the directory above a mount point cannot rename or remove it (EBUSY), so the chain ends there."""
    chain = [path, *path.parents]
    for index, directory in enumerate(chain):
        if host.mount_point(str(directory)).exists:
            return chain[: index + 1]
    return chain


def test_an_unprivileged_user_can_run_the_ml_env(stack: dict[str, object]) -> None:
    """Read-only is not unreadable: the service user (here: nobody) imports the stack."""
    assert set(stack) == {"torch", "transformers", "sglang", "flashinfer"}


def test_store_holds_only_checked_venvs_within_keep(host) -> None:  # type: ignore[no-untyped-def]
    """Besides hand-made venvs the role moved there (the operator's, never pruned)."""
    entries = host.file(STORE).listdir()
    built = [name for name in entries if not name.startswith(PREEXISTING)]
    assert 1 <= len(built) <= 1 + KEEP, entries
    for name in entries:
        assert host.file(f"{STORE}/{name}/{MARKER}").is_file, f"{STORE}/{name} was never checked"


def test_installed_versions_equal_the_lock(host, lock_text: str) -> None:  # type: ignore[no-untyped-def]
    pins = lockfile.pins(lock_text)
    installed = _venv_json(
        host,
        "import json; from importlib import metadata; "
        "print(json.dumps({d.metadata['Name']: d.version for d in metadata.distributions()}))",
    )
    assert isinstance(installed, dict)
    assert {lockfile.normalize(name): version for name, version in installed.items()} == pins
    assert len(pins) > 100  # the real lane, not a stand-in


def test_torch_is_the_lanes_cuda_build(stack: dict[str, object], lane: Lane) -> None:
    assert stack["torch"] == [f"{lane.torch}+cu{lane.cuda.replace('.', '')}", lane.cuda]


def test_transformers_knows_glm_moe_dsa(stack: dict[str, object], lane: Lane) -> None:
    assert stack["transformers"] == [lane.transformers, True]


def test_sglang_and_flashinfer_import(stack: dict[str, object], lane: Lane) -> None:
    assert stack["sglang"] == lane.sglang and isinstance(stack["flashinfer"], str)


def test_kernel_proof_sglang_kernel_carries_the_lanes_archs(host, lane: Lane) -> None:  # type: ignore[no-untyped-def]
    """Parsed from the objects' .nv_fatbin sections on the host (the sglang_kernel_proof module).
    Every sgl_kernel object with cubins carries each required arch, except the lane's documented
    exemptions, which must still lack them and must all be found (so the list stays true)."""
    args = {
        "path": ML_ENV,
        "packages": ["sgl_kernel"],
        "required_archs": list(lane.required_archs),
        "exemptions": [exemption.object for exemption in lane.kernel_exemptions],
    }
    try:
        proof = host.ansible("sglang_kernel_proof", json.dumps(args), check=True)
    except host.ansible.AnsibleException as exc:
        pytest.fail(f"kernel proof failed: {exc.result.get('msg', exc.result)}")
    print(json.dumps(proof["archs"], indent=1))  # the proof's findings, in the test log
    assert any(name.endswith("common_ops.abi3.so") for name in proof["required"]), proof["archs"]
