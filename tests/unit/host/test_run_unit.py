"""scripts/device/run_unit.py and the unit readers it uses (sglang_deploy_host.serving.systemd): a rendered
unit's ExecStartPre=, ExecStart= and environment, as systemd would run them, where there is no systemd."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from sglang_deploy_host.serving import systemd

ROOT = Path(__file__).resolve().parents[3]

UNIT = """\
[Service]
Type=exec
User=sglang
WorkingDirectory={home}
EnvironmentFile=-{env_file}
Environment="A=1" "PCT=50%%"
Environment="PATH=/opt/venv/bin:/usr/bin:/bin"
ExecStartPre=-/bin/false ignored
ExecStartPre={python} -c "open('pre', 'w').write('ran')"
ExecStart={python} -c "import os, time; print('A=' + os.environ['A'], 'KEY=' + os.environ['SGLANG_API_KEY'], flush=True); time.sleep(60)" \\
    --flag 100%%
TimeoutStopSec=5
"""


def _run_unit():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("run_unit", ROOT / "scripts" / "device" / "run_unit.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def unit(tmp_path: Path) -> Path:
    env_file = tmp_path / "sglang.env"
    env_file.write_text("SGLANG_API_KEY='s3cret value'\nA=from-file\n")
    path = tmp_path / "sglang.service"
    path.write_text(UNIT.format(home=tmp_path / "home", env_file=env_file, python=sys.executable))
    return path


def test_readers_give_exec_start_pre_with_its_prefix_and_plain_directives(unit: Path) -> None:
    text = unit.read_text()
    pre = systemd.exec_start_pre(text)
    assert pre[0] == (["/bin/false", "ignored"], True)
    assert pre[1][1] is False and pre[1][0][0] == sys.executable
    assert systemd.exec_start_argv(text)[-2:] == ["--flag", "100%"]
    assert systemd.directive(text, "User") == "sglang"
    assert systemd.directive(text, "TimeoutStopSec") == "5"
    assert systemd.directive(text, "Restart") is None
    with pytest.raises(ValueError, match="prefix"):
        systemd.exec_start_pre("ExecStartPre=+/bin/true\n")


def test_environment_is_systemds_base_then_environment_then_the_env_file(unit: Path) -> None:
    env = _run_unit().unit_environment(unit.read_text(), environ={"NCCL_NVLS_ENABLE": "0", "SECRET_HERE": "x"})
    assert env["A"] == "from-file"  # EnvironmentFile= wins over Environment=
    assert env["PCT"] == "50%" and env["PATH"] == "/opt/venv/bin:/usr/bin:/bin"
    assert env["SGLANG_API_KEY"] == "s3cret value"
    assert env["USER"] == "sglang" and env["HOME"].endswith("home") and env["LANG"] == "C.UTF-8"
    assert env["NCCL_NVLS_ENABLE"] == "0"  # the device machine's rule passes through
    assert "SECRET_HERE" not in env  # nothing else of the caller's environment


def test_a_missing_required_env_file_is_refused(tmp_path: Path) -> None:
    text = "[Service]\nEnvironmentFile=/nonexistent/sglang.env\nExecStart=/bin/true\n"
    run_unit = _run_unit()
    with pytest.raises(run_unit.UnitError, match="does not exist"):
        run_unit.unit_environment(text)


def test_start_runs_pre_then_the_server_in_its_own_session_and_stop_ends_it(unit: Path, tmp_path: Path) -> None:
    run_unit = _run_unit()
    log, pid_file = tmp_path / "sglang.log", tmp_path / "pid"
    pid = run_unit.start(unit, log, pid_file)
    try:
        assert (tmp_path / "home" / "pre").read_text() == "ran"  # ExecStartPre= ran in WorkingDirectory=
        assert os.getpgid(pid) == pid  # a session of its own, as systemd's control group
        deadline = time.monotonic() + 20
        while "A=from-file" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "A=from-file KEY=s3cret value" in log.read_text()
        assert "ExecStartPre=-/bin/false" not in log.read_text()  # the prefix is not part of the argv
    finally:
        message = run_unit.stop(unit, pid_file)
    assert "stopped on SIGTERM" in message
    assert run_unit.stop(unit, pid_file).endswith("had already exited")
