"""The flag validator's venv as a cache: where it lives for each torch source, when it counts as built,
and that a build cut off (a timeout, a signal, a kill) leaves no pip running.

No test here downloads anything: the builds are either recorded (``_build`` replaced) or run a fake
Python whose "venv creation" hangs (a shell script that starts a child and waits).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_deploy.launch import validator_venv
from sglang_deploy.lanes.catalog import Lane, load_lane
from sglang_deploy.launch.validator_venv import ENV_PYTHON, ENV_TORCH, ENV_TORCH_INDEX, BuildSpec, ValidatorError, build_spec

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(scope="module")
def cu128() -> Lane:
    return load_lane("cu128")


@pytest.fixture
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_TORCH, ENV_TORCH_INDEX, ENV_PYTHON):
        monkeypatch.delenv(name, raising=False)


# --- where each torch source's venv lives ---------------------------------------------------------------


def test_the_default_discovery_keeps_the_path_existing_caches_have(cu128: Lane, tmp_path: Path) -> None:
    spec = build_spec(cu128, {})
    assert validator_venv.validator_dir(spec, tmp_path) == tmp_path / "validators" / f"sglang-{cu128.sglang}-py{PY}"


@pytest.mark.parametrize(
    "environ",
    [
        {ENV_TORCH: "torch==2.9.1+cpu"},
        {ENV_TORCH_INDEX: "https://download.pytorch.org/whl/cpu"},  # the lane's own index, forced: still forced
        {ENV_TORCH_INDEX: ""},
        {ENV_TORCH: "torch==2.9.1+cpu", ENV_TORCH_INDEX: "https://mirror.example/cpu"},
    ],
    ids=["torch", "lane-index-forced", "empty-index", "torch-and-index"],
)
def test_a_forced_torch_source_has_a_venv_of_its_own(cu128: Lane, tmp_path: Path, environ: dict[str, str]) -> None:
    default = validator_venv.validator_dir(build_spec(cu128, {}), tmp_path)
    forced = validator_venv.validator_dir(build_spec(cu128, environ), tmp_path)
    assert forced.parent == default.parent
    assert forced.name.startswith(f"{default.name}-torch-") and forced != default
    assert validator_venv.validator_dir(build_spec(cu128, dict(environ)), tmp_path) == forced  # stable


def test_two_forced_sources_do_not_share_a_venv(cu128: Lane, tmp_path: Path) -> None:
    names = {
        validator_venv.validator_dir(build_spec(cu128, environ), tmp_path).name
        for environ in (
            {ENV_TORCH: "torch==2.9.1+cpu"},
            {ENV_TORCH: "torch==2.9.0+cpu"},
            {ENV_TORCH: "torch==2.9.1+cpu", ENV_TORCH_INDEX: "https://mirror.example/cpu"},
        )
    }
    assert len(names) == 3


@pytest.fixture
def recorded_builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replaces the (minutes long) build by one that writes what a finished build leaves: the venv's
    python and its marker."""
    builds: list[Path] = []

    def fake_build(spec: BuildSpec, final: Path, stand_ins: Any) -> None:
        builds.append(final)
        (final / "bin").mkdir(parents=True)
        (final / "bin" / "python").touch()
        marker = {**spec.marker(), "torch_source": "recorded"}
        (final / "sglang-deploy-validator.json").write_text(json.dumps(marker), encoding="utf-8")

    monkeypatch.setattr(validator_venv, "_build", fake_build)
    return builds


def test_a_forced_source_and_the_default_discovery_each_keep_their_venv(
    cu128: Lane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_override: None, recorded_builds: list[Path]
) -> None:
    """Two processes alternating (CI's forced CPU wheel, a user's default discovery) build once each,
    instead of rebuilding one venv in turn."""
    used = []
    for forced in (False, True, False, True):
        if forced:
            monkeypatch.setenv(ENV_TORCH, "torch==2.9.1+cpu")
        else:
            monkeypatch.delenv(ENV_TORCH, raising=False)
        used.append(validator_venv.ensure_validator_env(cu128, tmp_path))
    assert len(recorded_builds) == 2
    assert used[0] == used[2] == tmp_path / "validators" / f"sglang-{cu128.sglang}-py{PY}"
    assert used[1] == used[3] != used[0]
    assert {p.name for p in (tmp_path / "validators").iterdir()} == {
        used[0].name, f"{used[0].name}.lock", used[1].name, f"{used[1].name}.lock"
    }


def test_a_venv_built_before_this_change_is_still_built(
    cu128: Lane, tmp_path: Path, no_override: None, recorded_builds: list[Path]
) -> None:
    """The marker a cached validator has (format 2, the default discovery) keeps matching: no rebuild."""
    final = tmp_path / "validators" / f"sglang-{cu128.sglang}-py{PY}"
    (final / "bin").mkdir(parents=True)
    (final / "bin" / "python").touch()
    marker = {
        "format": 2, "python_version": PY, "sglang": cu128.sglang, "torch": cu128.validator.torch,
        "torch_index": cu128.validator.torch_index, "torch_explicit": False,
        "packages": list(cu128.validator.packages), "torch_source": "the lane's CPU index",
    }  # fmt: skip
    (final / "sglang-deploy-validator.json").write_text(json.dumps(marker), encoding="utf-8")
    assert validator_venv.ensure_validator_env(cu128, tmp_path) == final
    assert recorded_builds == []


def test_what_a_killed_build_left_is_not_taken_as_built(
    cu128: Lane, tmp_path: Path, no_override: None, recorded_builds: list[Path]
) -> None:
    """A build killed after its marker was written but before the swap: its staging directory looks
    complete, yet only the final path counts, and the next build removes the leftover."""
    final = tmp_path / "validators" / f"sglang-{cu128.sglang}-py{PY}"
    leftover = final.with_name(f".{final.name}.x1y2.building")
    (leftover / "bin").mkdir(parents=True)
    (leftover / "bin" / "python").touch()
    (leftover / "sglang-deploy-validator.json").write_text(json.dumps(build_spec(cu128, {}).marker()))
    assert validator_venv.ensure_validator_env(cu128, tmp_path) == final
    assert recorded_builds == [final]
    validator_venv.new_staging(final)  # what the real build does first
    assert not leftover.exists()


# --- a build cut off leaves no pip running ----------------------------------------------------------------


# A Python whose `-m venv` (the build's first step) starts a child and waits: pip and what pip starts.
FAKE_PYTHON = """\
#!/bin/sh
case "$1" in
  -c) echo {py}; exit 0 ;;
esac
sleep 600 &
echo $! > "$FAKE_PIDS/child.tmp" && mv "$FAKE_PIDS/child.tmp" "$FAKE_PIDS/child"
echo $$ > "$FAKE_PIDS/leader.tmp" && mv "$FAKE_PIDS/leader.tmp" "$FAKE_PIDS/leader"
wait
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped by whoever adopted it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def hanging_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_override: None) -> Iterator[Path]:
    """SGLANG_DEPLOY_VALIDATOR_PYTHON is the fake; yields the directory its pids are written to. Kills
    whatever of it is left at the end (this test's processes only, by their pids)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(py=PY))
    fake.chmod(0o755)
    monkeypatch.setenv(ENV_PYTHON, str(fake))
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    yield pids
    for name in ("leader", "child"):
        if (pids / name).exists() and _alive(pid := int((pids / name).read_text())):
            os.kill(pid, signal.SIGKILL)


def _started(pids: Path, timeout: float = 30) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while not ((pids / "leader").exists() and (pids / "child").exists()):
        assert time.monotonic() < deadline, "the fake venv step did not start"
        time.sleep(0.05)
    return int((pids / "leader").read_text()), int((pids / "child").read_text())


def _gone(*pids: int, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _as_in_a_terminal() -> None:
    """The builder as a command typed in a terminal has it: SIGINT at its default, which Python turns into
    KeyboardInterrupt. A test run started in the background of a script (CI's static checks: bash gives
    an ``&`` job SIGINT ignored) would hand its ignored SIGINT down, and Python keeps an ignored SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


BUILDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sglang_deploy.lanes.catalog import load_lane
    from sglang_deploy.launch.validator_venv import ensure_validator_env
    ensure_validator_env(load_lane("cu128"), Path(sys.argv[1]))
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_a_build_killed_from_outside_leaves_no_pip_running(
    cu128: Lane, tmp_path: Path, hanging_python: Path, signum: signal.Signals
) -> None:
    """`timeout` (SIGTERM), Ctrl-C (SIGINT) or a hard kill (subprocess' own timeout: SIGKILL) of the
    process building the venv. SIGTERM/SIGINT: its build step and what that started are gone; SIGKILL
    (no handler runs): the step itself is (the kernel's parent-death signal)."""
    builder = subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(tmp_path / "cache")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=_as_in_a_terminal,
    )  # fmt: skip
    try:
        leader, child = _started(hanging_python)
        os.kill(builder.pid, signum)
        builder.communicate(timeout=30)
        assert builder.returncode != 0
        assert not _gone(leader), "the build step outlived the process that ran it"
        if signum != signal.SIGKILL:
            assert not _gone(child), "what the build step started outlived it"
    finally:
        builder.kill()
        builder.communicate()
    final = validator_venv.validator_dir(build_spec(cu128, os.environ), tmp_path / "cache")
    assert not final.exists()  # nothing half-built at the path that counts


def test_a_build_step_cut_off_by_a_timeout_is_killed_with_what_it_started(
    tmp_path: Path, hanging_python: Path
) -> None:
    """A timeout inside the process (Ansible's task timeout: an alarm that raises) kills the step's
    whole process group, not only the step, before the exception goes on."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError("the task's timeout")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 2.0)
        with pytest.raises(TimeoutError):
            validator_venv.run_step("creating a venv", [os.environ[ENV_PYTHON], "-m", "venv", str(tmp_path / "venv")])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    leader, child = _started(hanging_python, timeout=0)
    assert not _gone(leader, child)


def test_a_signal_the_process_ignores_does_not_stop_the_step(tmp_path: Path) -> None:
    """The build kills its step only for a signal that would end this process: one it ignores leaves both."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        started = time.monotonic()
        command = [sys.executable, "-c", "import os, signal, time; time.sleep(0.5); os.kill(os.getppid(), signal.SIGTERM); time.sleep(1)"]
        validator_venv.run_step("a step that outlasts an ignored signal", command)
        assert time.monotonic() - started >= 1.4
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_signal_whose_handler_returns_still_fails_the_build(tmp_path: Path) -> None:
    """A handler that returns (it only logs) must not let the build go on as if the killed step failed:
    a torch source would be taken as broken and the next one (GBs) tried."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        command = [sys.executable, "-c", "import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); time.sleep(20)"]
        with pytest.raises(ValidatorError, match="interrupted by SIGTERM"):
            validator_venv.run_step("a step", command)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM]
