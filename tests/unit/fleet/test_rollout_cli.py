"""``sglang-deploy rollout``: its arguments, and the refusals that change nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from sglang_deploy import cli
from sglang_deploy.commands import rollout
from sglang_deploy.playbook.runner import PlaybookRun


def test_rollout_is_registered_and_needs_an_inventory(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["rollout", "-i", "inv", "--serial", "2", "--drain-timeout", "30"])
    assert args.serial == 2 and args.drain_timeout == 30 and args.limit is None
    with pytest.raises(SystemExit):
        parser.parse_args(["rollout"])
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["rollout", "-i", "inv", "--serial", bad])


def test_the_cli_defaults_are_the_roles_own(tmp_path: Path) -> None:
    """--serial and doctor's --unit read the roles' defaults (the one place they are written): a changed role
    default changes the CLI's."""
    project = tmp_path / "project"
    (project / "roles").mkdir(parents=True)
    (project / "site.yml").write_text("---\n")
    for role, text in (("sglang_rolling", "sglang_rolling_serial: 3\n"), ("sglang_server", "sglang_server_name: llm\n"),
                       ("sglang_deploy_bench", (ROOT / "roles/sglang_deploy_bench/defaults/main.yml").read_text())):
        (project / "roles" / role / "defaults").mkdir(parents=True)
        (project / "roles" / role / "defaults" / "main.yml").write_text(text)
    os.environ["SGLANG_DEPLOY_PROJECT"] = str(project)
    try:
        parser = cli.build_parser()
    finally:
        del os.environ["SGLANG_DEPLOY_PROJECT"]
    assert parser.parse_args(["rollout", "-i", "inv"]).serial == 3
    assert parser.parse_args(["doctor"]).unit == "llm"
    shipped = cli.build_parser()
    defaults = {**yaml.safe_load((ROOT / "roles/sglang_rolling/defaults/main.yml").read_text()),
                **yaml.safe_load((ROOT / "roles/sglang_server/defaults/main.yml").read_text())}  # fmt: skip
    assert shipped.parse_args(["rollout", "-i", "inv"]).serial == defaults["sglang_rolling_serial"]
    assert shipped.parse_args(["doctor"]).unit == defaults["sglang_server_name"]


def test_rollout_refuses_an_inventory_without_routers(capsys):
    assert cli.main(["rollout", "-i", str(ROOT / "inventory" / "proxmox")]) == 2
    assert "no hosts in sglang_routers" in capsys.readouterr().err


def test_multi_host_example_has_workers_and_a_router():
    from sglang_deploy.playbook.runner import serving_hosts

    inventory = [str(ROOT / "inventory" / "multi_host")]
    assert len(serving_hosts(inventory)) >= 2
    assert serving_hosts(inventory, pattern="sglang_routers")


# --- --serial against the number of workers (issue 22) ------------------------------------------------


def _workers_and_router(tmp_path: Path, workers: int = 3) -> Path:
    """``workers`` workers and one router, every host local (nothing is contacted before the refusal)."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    # One key for workers and router (the router binds 0.0.0.0 by default: resolving it needs one).
    key = "rollout-test-key-0123456789"
    inventory = {
        "all": {"vars": {"sglang_server_api_key": key, "sglang_router_api_key": key}},
        "sglang_servers": {"hosts": {f"w{n}": dict(local) for n in range(1, workers + 1)}},
        "sglang_routers": {"hosts": {"router-01": dict(local)}},
    }
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


@pytest.fixture()
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict]:
    """Records each run_playbook call of the rollout instead of running it."""
    calls: list[dict] = []

    def fake_run_playbook(playbook: str, inventories: list[str], **kwargs: object) -> PlaybookRun:
        calls.append({"playbook": playbook, **kwargs})
        return PlaybookRun(rc=0, status="successful", artifacts=tmp_path, failures=())

    monkeypatch.setattr(rollout, "run_playbook", fake_run_playbook)
    return calls


@pytest.mark.parametrize(
    "args, rolling, staying",
    [
        (["--serial", "3"], 3, 0),
        (["--serial", "7"], 3, 0),
        (["--serial", "3", "-l", "w1:w2:w3"], 3, 0),
        (["--serial", "4", "-l", "sglang_servers"], 3, 0),
    ],
    ids=["serial-equals-workers", "serial-above-workers", "limit-naming-every-worker", "limit-the-group"],
)
def test_a_serial_that_takes_every_worker_out_at_once_is_refused_before_anything_runs(
    tmp_path: Path, started: list[dict], capsys: pytest.CaptureFixture[str], args: list[str], rolling: int, staying: int
) -> None:
    inventory = _workers_and_router(tmp_path)
    assert cli.main(["rollout", "-i", str(inventory), *args]) == 2
    assert started == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    serial = args[1]
    assert err.startswith(f"sglang-deploy rollout: --serial {serial} would take all 3 workers out of the routers")
    assert f"({rolling} rolling, {staying} staying in service)" in err
    assert "the largest allowed serial is 2 (workers - 1)" in err and "Fix: --serial 2" in err


@pytest.mark.parametrize(
    "args, serial",
    [(["--serial", "2"], 2), (["--serial", "5", "-l", "w1:w2"], 5), ([], 1)],
    ids=["workers-minus-one", "limit-leaves-a-worker-serving", "default"],
)
def test_a_serial_that_leaves_a_worker_serving_runs(
    tmp_path: Path, started: list[dict], args: list[str], serial: int
) -> None:
    inventory = _workers_and_router(tmp_path)
    assert cli.main(["rollout", "-i", str(inventory), *args]) == 0
    assert [call["extravars"]["sglang_rolling_serial"] for call in started] == [serial]


def test_the_playbook_itself_refuses_a_serial_of_every_worker(tmp_path: Path) -> None:
    """Plain ansible-playbook (no CLI): the play's first task stops the rollout before any worker is touched."""
    inventory = _workers_and_router(tmp_path, workers=2)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "playbooks/rolling.yml", "-i", str(inventory),
         "-e", "sglang_rolling_serial=2", "-e", "sglang_rolling_others_timeout=2"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "sglang_rolling_serial=2 would take 2 of the 2 workers out of the routers at once" in output, output
    assert "Fix: sglang_rolling_serial 1 or less" in output
    assert "Require every other worker healthy" not in output  # no worker's roll started
