"""``sglang-deploy rollout``: its arguments, and the refusals that change nothing."""

from __future__ import annotations

import pytest
from conftest import ROOT

from sglang_deploy import cli


def test_rollout_is_registered_and_needs_an_inventory(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["rollout", "-i", "inv", "--serial", "2", "--drain-timeout", "30"])
    assert args.serial == 2 and args.drain_timeout == 30 and args.limit is None
    with pytest.raises(SystemExit):
        parser.parse_args(["rollout"])
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["rollout", "-i", "inv", "--serial", bad])


def test_rollout_refuses_an_inventory_without_routers(capsys):
    assert cli.main(["rollout", "-i", str(ROOT / "inventory" / "proxmox")]) == 2
    assert "no hosts in sglang_routers" in capsys.readouterr().err


def test_multi_host_example_has_workers_and_a_router():
    from sglang_deploy.runner import serving_hosts

    inventory = [str(ROOT / "inventory" / "multi_host")]
    assert len(serving_hosts(inventory)) >= 2
    assert serving_hosts(inventory, pattern="sglang_routers")
