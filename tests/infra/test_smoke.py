"""Smoke suite for the molecule plumbing (molecule/default): systemd runs and manages units."""

import pytest


def test_systemd_is_pid_1(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"


def test_system_is_debian_12(host):
    info = host.system_info
    assert (info.distribution, info.codename) == ("debian", "bookworm")


def test_smoke_unit_enabled_and_active(host):
    unit = host.service("molecule-smoke.service")
    assert unit.is_enabled
    assert unit.is_running or host.run("systemctl is-active molecule-smoke.service").stdout.strip() == "active"


def test_smoke_unit_ran(host):
    marker = host.file("/run/molecule-smoke.marker")
    assert marker.exists
    assert marker.content_string.strip() == "smoke ok"


@pytest.mark.parametrize("unit", ["dbus.service", "systemd-journald.service"])
def test_core_units_running(host, unit):
    assert host.service(unit).is_running
