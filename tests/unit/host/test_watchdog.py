"""The watchdog (module_utils/sglang_deploy_host/watchdog.py): its decisions tick by tick, and its
checks against the real parts that run here: the sglang HTTP stand-in over HTTP on 127.0.0.1 (ok,
empty, stall, a wrong key, flipped at run time through its mode file), gpufacts' parser over the
nvidia-smi stand-in and its fixtures. systemd does not run here: molecule/sglang_endpoint runs the
watchdog's unit against the real sglang unit (tests/infra/test_watchdog.py)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from conftest import StandinProcess as Standin

from sglang_deploy_host import watchdog as wd
from sglang_deploy_host.watch import model as watch_model
from sglang_deploy_host.watch import observe as watch_observe
from sglang_deploy_host.serving.systemd import env_file_line

KEY = "watchdog-test-key"
# The settings the unit passes (the role's defaults), for the tests that run the program itself.
SETTINGS = ["--failures", "3", "--backoff-initial", "600", "--backoff-max", "7200", "--stable", "3600",
            "--max-restarts-per-hour", "3", "--timeout", "60", "--start-grace", "2400"]  # fmt: skip
NVIDIA_SMI = ROOT / "tests" / "standin" / "nvidia-smi"
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
# A line as the NVIDIA driver writes it to the kernel log (the Xid catalog's format).
XID_79 = "NVRM: Xid (PCI:0000:06:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)"


def config(tmp_path: Path, **changes: object) -> watch_model.Config:
    values: dict = dict(unit="sglang.service", url="http://127.0.0.1:9", env_file=None, api_key_env=None,
                        expected_gpus=8, state_file=str(tmp_path / "state.json"), failures=3,
                        backoff_initial_s=300.0, backoff_max_s=1000.0, timeout_s=5.0, start_grace_s=600.0,
                        stable_s=3600.0, max_restarts_per_hour=3, service_user="root")  # fmt: skip
    values.update(changes)
    return watch_model.Config(**values)  # type: ignore[arg-type]


ACTIVE = watch_model.UnitState("active", "running", "inv-1", active_since=0.0)
GOOD = watch_model.Generation(True, "POST /generate: 4 token(s) in 0.1s")
HUNG = watch_model.Generation(False, "POST http://127.0.0.1:9/generate: no complete answer within 5 s")


def seen(generation: watch_model.Generation | None = GOOD, unit: watch_model.UnitState = ACTIVE, problems: list[str] | None = None,
         xids: list[str] | None = None) -> watch_model.Observation:  # fmt: skip
    return watch_model.Observation(unit, problems or [], "8 of 8 expected GPUs usable", xids or [], generation)


class Ticks:
    """Feeds observations through decide() as the timer would, one tick every ``interval`` s."""

    def __init__(self, cfg: watch_model.Config, interval: float = 60.0, mono: float = 10_000.0) -> None:
        self.cfg, self.state, self.now, self.mono, self.interval = cfg, watch_model.State(), 1_000_000.0, mono, interval

    def tick(self, observation: watch_model.Observation) -> watch_model.Decision:
        self.now += self.interval
        self.mono += self.interval
        decision = wd.decide(self.cfg, self.state, observation, self.now, self.mono)
        self.state = decision.state
        return decision


def words(decision: watch_model.Decision) -> list[str]:
    return [text.split(":", 2)[1].strip() for _priority, text in decision.lines]


# -- decisions -------------------------------------------------------------------------------------
def test_a_healthy_server_is_left_alone_and_the_watchdog_is_silent(tmp_path: Path) -> None:
    ticks = Ticks(config(tmp_path))
    first = ticks.tick(seen())
    assert words(first) == ["OK"] and not first.restart and first.status == 0
    for _ in range(10):
        later = ticks.tick(seen())
        assert later.lines == [] and not later.restart and later.status == 0
    assert ticks.state.generated_invocation == "inv-1" and ticks.state.failures == 0


def test_n_failures_in_a_row_restart_once_then_back_off_doubling_to_the_cap(tmp_path: Path) -> None:
    ticks = Ticks(config(tmp_path), interval=60.0)
    ticks.tick(seen())
    decisions = [ticks.tick(seen(HUNG)) for _ in range(3)]
    assert [d.restart for d in decisions] == [False, False, True]
    assert words(decisions[0]) == ["CHECK FAILED"] and "1/3" in decisions[0].lines[0][1]
    restart = decisions[2].lines[0][1]
    assert restart.startswith("sglang-watchdog: RESTART: sglang.service failed 3 checks in a row")
    assert "no complete answer within 5 s" in restart and "(back-off restart 1; the next one 300s" in restart
    assert "1 of 3 this hour" in restart
    # The restarted server generated once (so its failures count at once), then hangs again: 3 more
    # failures end 240 s after the restart, inside the 300 s back-off: held; restarted at 300 s.
    new_run = watch_model.UnitState("active", "running", "inv-2", active_since=ticks.mono)
    ticks.tick(seen(GOOD, new_run))
    assert ticks.state.restarts == 1, "one generation after a restart does not start the back-off over (flapping)"
    ticks.state.restarts, ticks.state.last_restart = 1, ticks.now - 60  # as if it had not generated
    held = [ticks.tick(seen(HUNG, new_run)) for _ in range(3)]
    assert [words(d) for d in held] == [["CHECK FAILED"], ["CHECK FAILED"], ["RESTART HELD"]]
    assert "back-off 300s" in held[2].lines[0][1] and not held[2].restart
    second = ticks.tick(seen(HUNG, new_run))  # 300 s after the restart: the back-off is over
    assert second.restart and "restart 2" in second.lines[0][1] and "the next one 600s" in second.lines[0][1]
    assert [wd.backoff_s(ticks.cfg, n) for n in (1, 2, 3, 4, 5)] == [300, 600, 1000, 1000, 1000]


@pytest.mark.parametrize("restarts", [1, 2, 3, 4])
def test_the_back_off_holds_a_restart_until_the_second_it_ends_and_no_longer(tmp_path: Path, restarts: int) -> None:
    """Both sides of the back-off, one second apart, on the injected clock: failures that complete 1 s before
    the pause ends are held; at its end they restart. And one failure fewer than the threshold never restarts."""
    cfg = config(tmp_path, failures=2)
    wait = wd.backoff_s(cfg, restarts)
    for since, restarted in ((wait - 1, False), (wait, True)):
        state = watch_model.State(restarts=restarts, last_restart=1_000_000.0 - since, failures=1, generated_invocation="inv-1")
        decision = wd.decide(cfg, state, seen(HUNG), 1_000_000.0, 50_000.0)
        assert decision.restart is restarted, (restarts, since)
        assert words(decision) == (["RESTART"] if restarted else ["RESTART HELD"])
    fewer = wd.decide(cfg, watch_model.State(failures=0, generated_invocation="inv-1"), seen(HUNG), 1_000_000.0, 50_000.0)
    assert not fewer.restart and words(fewer) == ["CHECK FAILED"] and fewer.state.failures == 1


def test_a_server_that_has_not_generated_since_its_start_gets_its_grace(tmp_path: Path) -> None:
    ticks = Ticks(config(tmp_path, start_grace_s=600.0), mono=0.0)
    loading = watch_model.UnitState("active", "running", "inv-9", active_since=0.0)
    decisions = [ticks.tick(seen(HUNG, loading)) for _ in range(9)]  # 60..540 s after its start
    assert words(decisions[0]) == ["WAITING"] and all(d.lines == [] for d in decisions[1:])
    assert not any(d.restart for d in decisions) and ticks.state.failures == 0
    after = [ticks.tick(seen(HUNG, loading)) for _ in range(3)]  # 600 s on: the failures count
    assert [d.restart for d in after] == [False, False, True]


def test_a_missing_gpu_is_reported_once_and_never_restarted(tmp_path: Path) -> None:
    ticks = Ticks(config(tmp_path))
    ticks.tick(seen())
    lost = ["7 usable GPU(s) of 8 listed, 8 expected", "nvidia-smi cannot open GPU 00000000:06:00.0: GPU is lost."]
    decisions = [ticks.tick(seen(None, problems=lost)) for _ in range(20)]
    assert not any(d.restart for d in decisions) and all(d.status == 1 for d in decisions)
    assert words(decisions[0]) == ["GPU PROBLEM"] and all(d.lines == [] for d in decisions[1:])
    line = decisions[0].lines[0][1]
    assert "7 usable GPU(s) of 8 listed, 8 expected" in line and "Not restarting sglang.service" in line
    assert "nvidia-smi -r -i" in line  # the fix, gpufacts' words
    back = ticks.tick(seen())
    assert words(back) == ["OK"], "a GPU that comes back (a host reset) is noticed"


def test_xid_lines_are_reported_and_those_that_need_a_reset_stop_restarts(tmp_path: Path) -> None:
    ticks = Ticks(config(tmp_path))
    ticks.tick(seen())
    soft = ticks.tick(seen(GOOD, xids=[XID_13]))
    assert words(soft) == ["GPU XID"] and "Xid 13 on 0000:01:00" in soft.lines[0][1] and soft.status == 0
    hard = ticks.tick(seen(None, xids=[XID_79, XID_79]))
    assert words(hard) == ["GPU XID", "GPU PROBLEM"] and not hard.restart
    assert "Xid 79 on 0000:06:00: the GPU needs a reset" in hard.lines[1][1]
    assert watch_observe.xid_codes([XID_79, XID_13, XID_79]) == [("0000:06:00", 79), ("0000:01:00", 13)]


def test_an_idle_unit_or_a_refused_key_is_not_restarted(tmp_path: Path) -> None:
    ticks = Ticks(config(tmp_path))
    idle = [ticks.tick(seen(None, watch_model.UnitState("failed", "failed"))) for _ in range(3)]
    assert words(idle[0]) == ["IDLE"] and idle[1].lines == [] and not any(d.restart for d in idle)
    refused = watch_model.Generation(False, "POST /generate: HTTP 401: the server refuses the API key", refused=True)
    decisions = [ticks.tick(seen(refused)) for _ in range(5)]
    assert all(words(d) == ["REFUSED"] and not d.restart for d in decisions)


# -- the generation, against the real stand-in ---------------------------------------------------
def _standin(tmp_path: Path, name: str, *args: str) -> Standin:
    return Standin(tmp_path / f"{name}.log", "--api-key", KEY, "--standin-load-delay", "0", *args)


def _env_file(tmp_path: Path, key: str = KEY) -> str:
    path = tmp_path / "sglang.env"
    path.write_text(env_file_line("SGLANG_API_KEY", key) + "\n")
    path.chmod(0o600)
    return str(path)


def test_generation_needs_a_real_token_within_the_deadline(tmp_path: Path) -> None:
    servers = {mode: _standin(tmp_path, mode, "--standin-mode", mode) for mode in ("ok", "empty", "stall")}
    try:
        cfg = {mode: config(tmp_path, url=s.url, timeout_s=2.0) for mode, s in servers.items()}
        ok = watch_observe.generate(cfg["ok"], KEY)
        assert ok.ok and "4 token(s)" in ok.what
        empty = watch_observe.generate(cfg["empty"], KEY)
        assert not empty.ok and not empty.refused and "no token generated (completion_tokens=0)" in empty.what
        started = time.monotonic()
        stalled = watch_observe.generate(cfg["stall"], KEY)
        assert not stalled.ok and not stalled.refused and "no complete answer within 2 s" in stalled.what
        assert time.monotonic() - started < 5
        wrong = watch_observe.generate(cfg["ok"], "another-key")
        assert not wrong.ok and wrong.refused and "HTTP 401" in wrong.what and "another-key" not in wrong.what
    finally:
        for server in servers.values():
            server.stop()


def test_the_stand_in_flips_into_a_mode_while_it_runs_and_a_restart_clears_it(tmp_path: Path) -> None:
    """What molecule does to the running unit: /health keeps answering 200, /generate hangs; a
    server started after the flip generates (as a restart clears a hung scheduler)."""
    mode_file = tmp_path / "standin-mode"
    before = _standin(tmp_path, "before", "--standin-mode-file", str(mode_file))
    try:
        cfg = config(tmp_path, url=before.url, timeout_s=2.0)
        assert watch_observe.generate(cfg, KEY).ok
        mode_file.write_text("stall\n")
        assert not watch_observe.generate(cfg, KEY).ok
        from sglang_deploy_host.serving import endpoint

        assert endpoint.Endpoint(before.url).get("/health_generate").status == 200
        time.sleep(0.05)
        after = _standin(tmp_path, "after", "--standin-mode-file", str(mode_file))
        try:
            assert watch_observe.generate(config(tmp_path, url=after.url, timeout_s=2.0), KEY).ok
        finally:
            after.stop()
    finally:
        before.stop()


# -- the GPUs, through the nvidia-smi stand-in -------------------------------------------------------
@pytest.mark.parametrize(
    ("fixture", "expected", "visible", "problem"),
    [("rtx-pro-6000-8gpu-passthrough", 8, None, None),
     ("rtx-pro-6000-8gpu-passthrough", 4, "0,1,2,3", None),
     ("rtx-pro-6000-8gpu-lost", 8, None, "7 usable GPU(s) of 8 listed, 8 expected"),
     ("rtx-pro-6000-8gpu-ecc", 8, None, "6 usable GPU(s) of 8 listed, 8 expected"),
     ("h200-1gpu", 8, None, "1 usable GPU(s) of 1 listed, 8 expected")],
)  # fmt: skip
def test_gpu_check_reads_nvidia_smi_as_preflight_does(
    fixture: str, expected: int, visible: str | None, problem: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NVIDIA_SMI_FIXTURE_DIR", str(FIXTURES / fixture))
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_LOG", str(tmp_path / "calls.log"))
    problems, summary = watch_observe.gpu_check(config(tmp_path, nvidia_smi=str(NVIDIA_SMI), expected_gpus=expected, visible_devices=visible))
    if problem is None:
        assert problems == [] and summary == f"{expected} of {expected} expected GPUs usable"
    else:
        assert problems[0] == problem
        # and why, where a GPU is listed but unusable: the lost GPU, the ECC state
        assert len(problems) == (1 if fixture == "h200-1gpu" else 5 if fixture.endswith("ecc") else 2), problems
    assert "topo" not in (tmp_path / "calls.log").read_text(), "the watchdog needs no P2P matrix"


def test_no_nvidia_smi_is_a_gpu_problem(tmp_path: Path) -> None:
    problems, _ = watch_observe.gpu_check(config(tmp_path, nvidia_smi=str(tmp_path / "none" / "nvidia-smi")))
    assert any("is not there" in p for p in problems) and problems[0].startswith("0 usable GPU(s)")


# -- one whole tick: the CLI, the state file, the key ------------------------------------------------
def _fake_systemctl(tmp_path: Path, active: str = "active", invocation: str = "inv-1") -> Path:
    """systemd does not run here: a systemctl that answers ``show`` and records ``restart``."""
    script = tmp_path / "systemctl"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = show ]; then printf "ActiveState={active}\\nSubState=running\\nInvocationID={invocation}\\n'
        'ActiveEnterTimestampMonotonic=1\\n"; exit 0; fi\n'
        f'echo "$@" >> {tmp_path}/systemctl.calls\n'
    )
    script.chmod(0o755)
    return script


def test_ticks_against_a_stalled_server_restart_it_and_never_show_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NVIDIA_SMI_FIXTURE_DIR", str(FIXTURES / "rtx-pro-6000-8gpu-passthrough"))
    mode_file = tmp_path / "standin-mode"
    server = _standin(tmp_path, "server", "--standin-mode-file", str(mode_file))
    try:
        cfg = config(tmp_path, url=server.url, env_file=_env_file(tmp_path), api_key_env="SGLANG_API_KEY",
                     nvidia_smi=str(NVIDIA_SMI), systemctl=str(_fake_systemctl(tmp_path)), journalctl="true",
                     failures=2, timeout_s=1.0, start_grace_s=0.0)  # fmt: skip
        assert wd.check(cfg) == 0 and wd.check(cfg) == 0
        mode_file.write_text("stall\n")
        assert [wd.check(cfg), wd.check(cfg)] == [1, 1]
        out = capsys.readouterr().out
        assert (tmp_path / "systemctl.calls").read_text() == "restart --no-block sglang.service\n"
        assert "sglang-watchdog: OK: sglang.service generates: POST /generate: 4 token(s)" in out
        assert "sglang-watchdog: CHECK FAILED: 1/2" in out and "sglang-watchdog: RESTART: sglang.service failed 2" in out
        assert KEY not in out and KEY not in (tmp_path / "state.json").read_text()
        state = json.loads((tmp_path / "state.json").read_text())
        assert (state["restarts"], state["failures"], state["last_result"]) == (1, 0, "RESTART")
    finally:
        server.stop()


def test_a_state_file_that_is_not_state_starts_afresh(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    state, why = wd.load_state(str(path))
    assert state == watch_model.State() and "unreadable" in why
    wd.save_state(str(path), watch_model.State(failures=2))
    assert wd.load_state(str(path)) == (watch_model.State(failures=2), None)
    assert wd.load_state(str(tmp_path / "none.json")) == (watch_model.State(), None)


def test_the_program_runs_from_the_files_the_role_installs(tmp_path: Path) -> None:
    """The package the role installs on a host (library/sglang_host_files.py: the watchdog and what it
    imports, nothing else) runs on its own; bad arguments are refused before anything is asked."""
    from sglang_deploy_host import interp

    package = tmp_path / "sglang_deploy_host"
    package.mkdir()
    for name in interp.package_closure("watchdog"):
        path = package.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(interp.source(name))
    assert {
        "__init__.py", "watchdog.py", "fs/__init__.py", "fs/files.py", "gpu/__init__.py", "gpu/gpufacts.py",
        "serving/__init__.py", "serving/endpoint.py", "serving/sglang_launcher.py", "serving/systemd.py",
        "serving/unit_flags.py", "watch/__init__.py", "watch/model.py", "watch/observe.py",
    } == {str(p.relative_to(package)) for p in package.rglob("*.py")}
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    helped = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                             "import runpy; sys.argv = ['w', '--help']; runpy.run_module('sglang_deploy_host.watchdog', run_name='__main__')",
                             str(tmp_path)], capture_output=True, text=True, timeout=30, check=False, env=env)  # fmt: skip
    assert helped.returncode == 0 and "check" in helped.stdout, helped.stderr
    bad = subprocess.run([sys.executable, "-m", "sglang_deploy_host.watchdog", "check", "--unit", "sglang; rm", "--service-user", "root", *SETTINGS,
                          "--url", "http://127.0.0.1:1", "--expected-gpus", "1", "--state-file", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=30, check=False, env=env, cwd="/")  # fmt: skip
    assert bad.returncode == 2 and "is not a service unit name" in bad.stderr


def test_the_watchdog_unit_is_named_after_the_server_unit() -> None:
    assert watch_model.unit_name("sglang") == watch_model.unit_name("sglang.service") == "sglang-watchdog"


# -- round 4: a flapping server, a bad state, bounds, a squatter, a busy server -----------------------
def _flap(ticks: Ticks, cycles: int) -> tuple[list[float], list[watch_model.Decision]]:
    """A server that generates once after each restart, then hangs: one good tick, one failed tick, again."""
    restarts, decisions = [], []
    for n in range(cycles):
        run = watch_model.UnitState("active", "running", f"inv-{n}", active_since=ticks.mono)
        decisions.append(ticks.tick(seen(GOOD, run)))
        decisions.append(ticks.tick(seen(HUNG, run)))
        restarts += [ticks.now] if decisions[-1].restart else []
    return restarts, decisions


def test_a_flapping_server_cannot_reset_the_back_off(tmp_path: Path) -> None:
    """One good generation after each restart used to start the back-off over: a restart every 2 minutes
    for ever. Now the pauses keep doubling."""
    ticks = Ticks(config(tmp_path, failures=1, backoff_initial_s=60.0, backoff_max_s=10_000.0, max_restarts_per_hour=100))
    ticks.tick(seen())
    restarts, _ = _flap(ticks, 10)
    assert [b - a for a, b in zip(restarts, restarts[1:])] == [120.0, 120.0, 240.0, 480.0]


def test_past_the_hourly_cap_the_watchdog_gives_up_once_until_the_hour_frees_a_restart(tmp_path: Path) -> None:
    ticks = Ticks(config(tmp_path, failures=1, backoff_initial_s=60.0, backoff_max_s=60.0, max_restarts_per_hour=3))
    ticks.tick(seen())
    restarts, decisions = _flap(ticks, 12)
    giving_up = [d for d in decisions if "GIVING UP" in words(d)]
    assert len(restarts) == 3 and len(giving_up) == 1 and not any(d.restart for d in giving_up)
    line = giving_up[0].lines[-1]
    assert line[0] == "crit" and "after 3 restarts in the last hour" in line[1] and "not restarting it again for" in line[1]
    assert "sglang_watchdog_giving_up{unit=\"sglang.service\"} 1" in wd.metrics_text(ticks.cfg, ticks.state, ticks.now)
    # An hour after the first restart the cap frees one again.
    ticks.now = restarts[0] + watch_model.HOUR_S
    again = ticks.tick(seen(HUNG, watch_model.UnitState("active", "running", "inv-x", active_since=0.0)))
    assert again.restart and "3 of 3 this hour" in again.lines[-1][1]
    assert "sglang_watchdog_restarts_total{unit=\"sglang.service\"} 4" in wd.metrics_text(ticks.cfg, again.state, ticks.now)


def test_only_a_stable_run_starts_the_back_off_over(tmp_path: Path) -> None:
    cfg = config(tmp_path, stable_s=600.0)
    ticks = Ticks(cfg, interval=60.0)
    ticks.state.restarts, ticks.state.last_result = 3, "RESTART"
    decisions = [ticks.tick(seen()) for _ in range(11)]  # 0 .. 600 s of generating
    assert ticks.state.restarts == 0 and "the restart back-off starts over" in decisions[-1].lines[0][1]
    assert all(d.lines == [] for d in decisions[1:-1])


@pytest.mark.parametrize(
    ("content", "why"),
    [("directory", "a directory"), ('{"failures": "3"}', "failures = '3'"), ('{"last_restart": NaN}', "last_restart"),
     ('{"restart_times": [1, "x"]}', "restart_times"), ('{"restarts": 1e30}', "restarts"), ("[]", "not a JSON object")],
)  # fmt: skip
def test_a_bad_state_starts_afresh_with_one_line_and_is_written_over(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "state.json"
    if content == "directory":
        path.mkdir()
    else:
        path.write_text(content)
    state, afresh = wd.load_state(str(path))
    assert state == watch_model.State() and afresh and why in afresh, afresh
    wd.save_state(str(path), watch_model.State(failures=1))
    assert wd.load_state(str(path)) == (watch_model.State(failures=1), None)


def test_a_clock_set_back_does_not_hold_restarts_for_the_size_of_the_step(tmp_path: Path) -> None:
    cfg = config(tmp_path, failures=1)
    state = watch_model.State(restarts=1, last_restart=1_000_000.0 + 86_400, restart_times=[1_000_000.0 + 86_400],
                     generated_invocation="inv-1")  # fmt: skip
    decision = wd.decide(cfg, state, seen(HUNG), 1_000_000.0, 50_000.0)
    assert words(decision)[:2] == ["CLOCK", "RESTART HELD"]
    assert decision.state.last_restart == 1_000_000.0 and "in 300s" in decision.lines[1][1]
    later = wd.decide(cfg, decision.state, seen(HUNG), 1_000_000.0 + 300, 50_300.0)
    assert later.restart


@pytest.mark.parametrize(("flag", "value"), [("--backoff-initial", "nan"), ("--backoff-max", "inf"), ("--timeout", "1e30"),
                                             ("--failures", "0"), ("--stable", "-5"), ("--max-restarts-per-hour", "x")])  # fmt: skip
def test_the_cli_refuses_nan_inf_and_numbers_beyond_any_use(tmp_path: Path, flag: str, value: str) -> None:
    argv = [sys.executable, "-m", "sglang_deploy_host.watchdog", "check", "--unit", "sglang.service", "--service-user", "root",
            "--url", "http://127.0.0.1:1", "--expected-gpus", "1", "--state-file", str(tmp_path / "s"), *SETTINGS, flag, value]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and flag in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "s").exists()


def _squatter(tmp_path: Path, uid: int) -> tuple[subprocess.Popen[str], int, Path]:
    """An HTTP server bound to a free loopback port as ``uid`` that records every request it receives."""
    seen_file = tmp_path / "squatter.requests"
    code = (
        "import http.server, os, socket, sys\n"
        f"os.setgid({uid}); os.setuid({uid})\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8)\n"
        "print(s.getsockname()[1], flush=True)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        f"        open({str(seen_file)!r}, 'a').write(str(self.headers))\n"
        "        self.send_response(500); self.end_headers(); self.wfile.write(str(self.headers).encode())\n"
        "    do_GET = do_POST\n"
        "srv = http.server.HTTPServer(('127.0.0.1', 0), H, bind_and_activate=False); srv.socket = s\n"
        "srv.serve_forever()\n"
    )
    os.chmod(tmp_path, 0o777)  # the unprivileged squatter writes what it receives here
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())  # type: ignore[union-attr]
    return proc, port, seen_file


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root: run as root")
def test_a_squatter_on_the_port_never_receives_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """While the unit loads, another local user binds the server's port first: the watchdog sees a socket
    that is not the service user's, sends nothing, says PORT TAKEN naming the owner, restarts nothing."""
    squatter, port, received = _squatter(tmp_path, 65534)
    try:
        assert watch_observe.listeners("127.0.0.1", port) == [("127.0.0.1", 65534)]
        cfg = config(tmp_path, url=f"http://127.0.0.1:{port}", env_file=_env_file(tmp_path), api_key_env="SGLANG_API_KEY",
                     nvidia_smi=str(NVIDIA_SMI), systemctl=str(_fake_systemctl(tmp_path)), journalctl="true",
                     failures=1, start_grace_s=0.0, service_user="root")  # fmt: skip
        os.environ["NVIDIA_SMI_FIXTURE_DIR"] = str(FIXTURES / "rtx-pro-6000-8gpu-passthrough")
        try:
            assert [wd.check(cfg) for _ in range(3)] == [1, 1, 1]
        finally:
            del os.environ["NVIDIA_SMI_FIXTURE_DIR"]
        out = capsys.readouterr().out
        assert out.count("sglang-watchdog: PORT TAKEN: ") == 1, out
        assert f"127.0.0.1:{port} by nobody" in out and "the API key is not sent" in out
        assert not received.exists(), "the squatter received a request"
        assert not (tmp_path / "systemctl.calls").exists(), "nothing restarted"
        # Nothing listening at all (the model still loads): nothing is sent either.
        assert "nothing listens on 127.0.0.1:1 yet" in watch_observe.generate(config(tmp_path, url="http://127.0.0.1:1"), KEY).what
    finally:
        squatter.kill()
        squatter.wait()


# -- who holds the port, when the server binds a wildcard ------------------------------------------------------
# Tests bind 127.0.0.1 only, so the wildcard sockets (the shipped profile binds 0.0.0.0) are written into a copy of
# /proc/net: each line is the kernel's own line for a real loopback listener of this test, with its address and
# owner rewritten - the format is the kernel's, the addresses are the ones under test.
V4_WILDCARD, V4_LOOPBACK, V4_OTHER = "00000000", "0100007F", "0B0200C0"  # 0.0.0.0, 127.0.0.1, 192.0.2.11
V6_WILDCARD = "0" * 32
V6_LOOPBACK = "00000000000000000000000001000000"
V6_MAPPED_LOOPBACK = "0000000000000000FFFF00000100007F"


def test_proc_net_addresses_decode_as_the_kernel_writes_them() -> None:
    assert str(watch_observe._proc_net_address(V4_LOOPBACK)) == "127.0.0.1"
    assert str(watch_observe._proc_net_address(V4_OTHER)) == "192.0.2.11"
    assert str(watch_observe._proc_net_address(V4_WILDCARD)) == "0.0.0.0"
    assert str(watch_observe._proc_net_address(V6_WILDCARD)) == "::"
    assert str(watch_observe._proc_net_address(V6_LOOPBACK)) == "::1"
    assert watch_observe._proc_net_address(V6_MAPPED_LOOPBACK) == ipaddress.ip_address("::ffff:127.0.0.1")


def _kernel_line(port: int) -> str:
    """/proc/net/tcp's line for this process's listener on 127.0.0.1:``port``."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"{V4_LOOPBACK}:{port:04X}" and fields[3] == "0A":
            return line
    raise AssertionError(f"no listener on 127.0.0.1:{port} in /proc/net/tcp")


def _proc_net(tmp_path: Path, port: int, sockets: list[tuple[str, int]]) -> str:
    """A /proc/net copy whose tcp (IPv4 addresses) and tcp6 (IPv6) list ``sockets`` (hex address, uid) on ``port``."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        template = _kernel_line(listener.getsockname()[1]).split()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    tables = {"tcp": header, "tcp6": header}
    for number, (address, uid) in enumerate(sockets):
        fields = [f"{number}:", f"{address}:{port:04X}", f"{'0' * len(address)}:0000", *template[3:7], str(uid), *template[8:]]
        tables["tcp6" if len(address) == 32 else "tcp"] += "   " + " ".join(fields) + "\n"
    directory = tmp_path / "proc-net"
    directory.mkdir(exist_ok=True)
    for name, text in tables.items():
        (directory / name).write_text(text)
    return str(directory)


@pytest.mark.parametrize(
    ("sockets", "host", "expected"),
    [
        ([(V4_WILDCARD, 0)], "127.0.0.1", [("0.0.0.0", 0)]),
        ([(V6_WILDCARD, 0)], "127.0.0.1", [("::", 0)]),  # dual-stack [::] takes IPv4 too
        ([(V6_MAPPED_LOOPBACK, 0)], "127.0.0.1", [(str(ipaddress.ip_address("::ffff:127.0.0.1")), 0)]),
        ([(V6_WILDCARD, 0)], "::1", [("::", 0)]),
        ([(V4_WILDCARD, 0)], "::1", []),  # an IPv4 wildcard takes no IPv6 connection
        ([(V6_LOOPBACK, 0)], "127.0.0.1", []),
        ([(V4_OTHER, 0)], "127.0.0.1", []),  # another address of the host
        ([(V4_LOOPBACK, 0), (V4_WILDCARD, 65534)], "127.0.0.1", [("127.0.0.1", 0), ("0.0.0.0", 65534)]),
    ],
)  # fmt: skip
def test_listeners_find_every_socket_a_connection_could_reach(tmp_path: Path, sockets: list[tuple[str, int]], host: str,
                                                              expected: list[tuple[str, int]]) -> None:  # fmt: skip
    assert watch_observe.listeners(host, 8000, _proc_net(tmp_path, 8000, sockets)) == expected
    assert watch_observe.listeners(host, 8001, _proc_net(tmp_path, 8000, sockets)) == []  # another port


@pytest.mark.parametrize("wildcard", [V4_WILDCARD, V6_WILDCARD])
def test_a_healthy_server_on_a_wildcard_is_its_own_and_a_squatter_there_is_port_taken(tmp_path: Path, wildcard: str) -> None:
    """The shipped profile binds 0.0.0.0 and the watchdog calls 127.0.0.1: the server's wildcard socket is the
    service user's (the key is sent, nothing restarted); another user's socket on the wildcard or [::] beside
    it is PORT TAKEN - a slip either way restarts a healthy server forever or hands the key to a squatter."""
    cfg = config(tmp_path, url="http://127.0.0.1:8000", service_user="root")
    own = _proc_net(tmp_path, 8000, [(wildcard, 0)])
    assert watch_observe.port_owner_problem(watch_model.Config(**{**cfg.__dict__, "proc_net": own})) is None
    taken = _proc_net(tmp_path, 8000, [(V4_LOOPBACK, 0), (wildcard, 65534)])
    problem = watch_observe.port_owner_problem(watch_model.Config(**{**cfg.__dict__, "proc_net": taken}))
    assert problem is not None and problem.port_taken and not problem.ok
    shown = "0.0.0.0" if wildcard == V4_WILDCARD else "[::]"
    assert f"({shown}:8000 by nobody)" in problem.what and "the API key is not sent" in problem.what
    nothing = _proc_net(tmp_path, 8000, [])
    idle = watch_observe.port_owner_problem(watch_model.Config(**{**cfg.__dict__, "proc_net": nothing}))
    assert idle is not None and not idle.port_taken and "nothing listens on 127.0.0.1:8000 yet" in idle.what


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root: run as root")
def test_the_key_is_masked_in_every_line_even_when_the_server_echoes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server (here the service user's own: root in this test) that answers 500 with the request's
    headers: the journal line quotes its answer, and the key in it is masked."""
    echo, port, _ = _squatter(tmp_path, 0)
    try:
        cfg = config(tmp_path, url=f"http://127.0.0.1:{port}", env_file=_env_file(tmp_path), api_key_env="SGLANG_API_KEY",
                     nvidia_smi=str(NVIDIA_SMI), systemctl=str(_fake_systemctl(tmp_path)), journalctl="true",
                     failures=1, start_grace_s=0.0)  # fmt: skip
        os.environ["NVIDIA_SMI_FIXTURE_DIR"] = str(FIXTURES / "rtx-pro-6000-8gpu-passthrough")
        try:
            wd.check(cfg)
        finally:
            del os.environ["NVIDIA_SMI_FIXTURE_DIR"]
        out = capsys.readouterr().out
        assert "HTTP 500" in out and "Bearer ********" in out, out
        assert KEY not in out
    finally:
        echo.kill()
        echo.wait()


def test_a_busy_server_is_not_restarted_and_a_stalled_one_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both time out on /generate; the busy one's token counters move (a long prefill), the stalled one's
    do not. Over HTTP against the stand-in, whose /metrics is sglang's names."""
    results = {}
    for mode in ("busy", "stall"):
        server = _standin(tmp_path, mode, "--standin-mode", mode, "--enable-metrics")
        try:
            cfg = config(tmp_path, url=server.url, env_file=_env_file(tmp_path), api_key_env="SGLANG_API_KEY",
                         nvidia_smi=str(NVIDIA_SMI), systemctl=str(_fake_systemctl(tmp_path)), journalctl="true",
                         failures=2, timeout_s=1.0, start_grace_s=0.0, state_file=str(tmp_path / f"{mode}.json"))  # fmt: skip
            os.environ["NVIDIA_SMI_FIXTURE_DIR"] = str(FIXTURES / "rtx-pro-6000-8gpu-passthrough")
            try:
                results[mode] = [wd.check(cfg) for _ in range(3)]
            finally:
                del os.environ["NVIDIA_SMI_FIXTURE_DIR"]
        finally:
            server.stop()
    out = capsys.readouterr().out
    assert results["busy"] == [0, 0, 0] and out.count("sglang-watchdog: BUSY: ") == 1 and "tokens during the check" in out
    assert results["stall"] == [1, 1, 1] and "sglang-watchdog: RESTART: " in out
    assert (tmp_path / "systemctl.calls").read_text().count("restart") == 1  # the stalled one only


def test_parse_progress_reads_sglangs_counters_and_nothing_else() -> None:
    page = (ROOT / "tests/fixtures/real-sglang/day2/sglang-0.5.17-metrics-after-traffic.txt").read_text()
    seen_ = watch_observe.parse_progress(page)
    assert seen_.tokens is not None and seen_.tokens > 0 and seen_.running == 0.0
    assert watch_observe.parse_progress("garbage\nsglang:realtime_tokens_total{mode=\"x\"} NaN\n") == watch_model.Progress()


def _hanging(tmp_path: Path, name: str, body: str) -> str:
    script = tmp_path / name
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def test_every_outside_answer_is_bounded_in_time_and_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi that hangs or floods, systemctl that hangs: each is stopped at its bound, and the whole
    tick ends within its budget (TICK_EXTRA_S, shrunk here to 4 s) with no traceback."""
    flood = _hanging(tmp_path, "nvidia-smi-flood", "exec yes garbage")
    problems, _ = watch_observe.gpu_check(config(tmp_path, nvidia_smi=flood))
    assert any("printed more than" in p for p in problems), problems
    monkeypatch.setattr(wd, "TICK_EXTRA_S", 4.0)
    cfg = config(tmp_path, nvidia_smi=_hanging(tmp_path, "nvidia-smi-hang", "sleep 600"),
                 systemctl=_hanging(tmp_path, "systemctl-hang", "sleep 600"),
                 journalctl=_hanging(tmp_path, "journalctl-hang", "sleep 600"), timeout_s=1.0)  # fmt: skip
    started = time.monotonic()
    status = wd.check(cfg)
    assert time.monotonic() - started < 1.0 + 4.0 + 2.0 and status in (0, 1)
    assert watch_observe.unit_state(cfg, watch_observe.Budget(0.5)).active_state == "unknown"


V6_MAPPED_OTHER = "0000000000000000FFFF00000B0200C0"  # ::ffff:192.0.2.11


def _table(*lines: str) -> str:
    return "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" + "".join(
        f"   {line}\n" for line in lines
    )


def test_listeners_read_what_they_can_and_pass_over_the_rest(tmp_path: Path) -> None:
    """Either table may be missing (a kernel without IPv6); a line not in LISTEN, cut short or garbled is passed
    over and the lines after it still count; a line of the kernel's first eight fields is enough."""
    port = f"{8000:04X}"
    only_v6 = tmp_path / "only-v6"
    only_v6.mkdir()
    (only_v6 / "tcp6").write_text(_table(f"0: {V6_WILDCARD}:{port} {'0' * 32}:0000 0A 0:0 00:0 0 0 0 1"))
    assert watch_observe.listeners("127.0.0.1", 8000, str(only_v6)) == [("::", 0)]
    only_v4 = tmp_path / "only-v4"
    only_v4.mkdir()
    (only_v4 / "tcp").write_text(_table(
        f"0: {V4_LOOPBACK}:{port} 0B0200C0:D431 01 0:0 00:0 0 65534 0 1",  # an established connection, not a listener
        f"1: {V4_LOOPBACK}:{port} 00000000:0000 0A 0:0 00:0 0",  # cut short: seven fields
        f"2: {V4_LOOPBACK}:ZZZZ 00000000:0000 0A 0:0 00:0 0 65534",  # a port that is no number
        f"3: {V4_LOOPBACK}:{port} 00000000:0000 0A 0:0 00:0 0 nobody",  # a uid that is no number
        f"4: {V4_LOOPBACK}:{port} 00000000:0000 0A 0:0 00:0 0 0",  # the first eight fields: a listener of root
        f"5: {V4_WILDCARD}:{port} 00000000:0000 0A 0:0 00:0 0 65534 0 1",
    ))  # fmt: skip
    assert watch_observe.listeners("127.0.0.1", 8000, str(only_v4)) == [("127.0.0.1", 0), ("0.0.0.0", 65534)]


def test_an_ipv4_mapped_socket_of_another_address_does_not_reach_the_server(tmp_path: Path) -> None:
    assert watch_observe.listeners("127.0.0.1", 8000, _proc_net(tmp_path, 8000, [(V6_MAPPED_OTHER, 65534)])) == []


def test_who_holds_the_port_is_asked_of_the_urls_port_or_its_schemes(tmp_path: Path) -> None:
    for url, port in (("https://127.0.0.1/", 443), ("http://127.0.0.1/", 80), ("http://127.0.0.1:8000/", 8000)):
        cfg = config(tmp_path, url=url, service_user="root")
        held = _proc_net(tmp_path, port, [(V4_LOOPBACK, 0)])
        assert watch_observe.port_owner_problem(watch_model.Config(**{**cfg.__dict__, "proc_net": held})) is None, url
        elsewhere = _proc_net(tmp_path, port + 1, [(V4_LOOPBACK, 0)])
        idle = watch_observe.port_owner_problem(watch_model.Config(**{**cfg.__dict__, "proc_net": elsewhere}))
        assert idle is not None and not idle.ok and not idle.refused and not idle.port_taken, url
        assert idle.what == f"nothing listens on 127.0.0.1:{port} yet (the key is sent only to root's socket)"


def test_what_the_watchdog_cannot_check_is_a_refusal_never_a_key_sent(tmp_path: Path) -> None:
    """A service user that does not exist, a host that is no IP address, someone else on the port: the key is not
    sent, and a restart cannot fix it (refused, with its fix)."""
    missing = watch_observe.port_owner_problem(config(tmp_path, url="http://127.0.0.1:8000", service_user="no-such-user-4817"))
    assert missing is not None and (missing.ok, missing.refused, missing.port_taken) == (False, True, False)
    assert missing.what == "the service user 'no-such-user-4817' does not exist: the key is not sent"
    assert missing.fix == "run the role again (it creates the user)"
    named = watch_observe.port_owner_problem(config(tmp_path, url="http://localhost:8000", service_user="root"))
    assert named is not None and (named.ok, named.refused, named.port_taken) == (False, True, False)
    assert named.what.startswith("localhost is not an IP address") and "sglang_server_flags host" in named.fix
    cfg = config(tmp_path, url="http://127.0.0.1:8000", service_user="root")
    taken = watch_observe.port_owner_problem(watch_model.Config(**{**cfg.__dict__, "proc_net": _proc_net(tmp_path, 8000, [(V4_WILDCARD, 65534)])}))
    assert taken is not None and (taken.ok, taken.refused, taken.port_taken) == (False, True, True)


def test_a_garbled_sample_is_passed_over_and_the_rest_still_count() -> None:
    page = "\n".join([
        "# HELP sglang:realtime_tokens_total tokens",
        'sglang:realtime_tokens_total{mode="decode"} 1e',  # not a number
        'sglang:realtime_tokens_total{mode="prefill"} 30',
        'sglang:realtime_tokens_total{mode="decode"} 12',
        "sglang:num_running_reqs -1",  # no count is negative
        "sglang:num_running_reqs +Inf",
        "sglang:num_running_reqs 2",
        "sglang:num_queue_reqs 0",
    ])  # fmt: skip
    assert watch_observe.parse_progress(page) == watch_model.Progress(42.0, 2.0, 0.0)


# -- the decision at its edges ---------------------------------------------------------------------------------
def test_the_hourly_window_holds_the_last_hour_to_the_second() -> None:
    state = watch_model.State(restart_times=[1000.0, 1001.0, 4600.0, 4601.0])
    assert wd.restarts_in_the_last_hour(state, 4600.0) == [1001.0, 4600.0]  # an hour ago: out; now: in; ahead: out


def test_a_clock_step_is_a_time_over_a_minute_ahead_or_a_hold_over_an_hour_ahead(tmp_path: Path) -> None:
    cfg, now = config(tmp_path), 1_000_000.0
    calm = [watch_model.State(last_restart=now + 60), watch_model.State(restart_times=[now - 30]), watch_model.State(healthy_since=now + 60),
            watch_model.State(giving_up_until=now + watch_model.HOUR_S)]  # fmt: skip
    for state in calm:
        assert watch_model.CLOCK not in words(wd.decide(cfg, state, seen(), now, 50_000.0)), state
    for state in (watch_model.State(last_restart=now + 61), watch_model.State(restart_times=[now + 61]), watch_model.State(giving_up_until=now + watch_model.HOUR_S + 1)):
        assert watch_model.CLOCK in words(wd.decide(cfg, state, seen(), now, 50_000.0)), state


def test_a_gpu_problem_is_said_once_and_again_when_it_changes_or_comes_back(tmp_path: Path) -> None:
    ticks = Ticks(config(tmp_path))
    lost3, lost4 = seen(problems=["GPU 3 is lost"]), seen(problems=["GPU 4 is lost"])
    idle = seen(None, watch_model.UnitState("inactive", "dead", "inv-1", active_since=None))
    said = [words(ticks.tick(observation)) for observation in (lost3, lost3, lost4, lost4, idle, lost4)]
    assert said == [[watch_model.GPU_PROBLEM], [], [watch_model.GPU_PROBLEM], [], [watch_model.IDLE], [watch_model.GPU_PROBLEM]]


def test_port_taken_is_said_once_per_owner(tmp_path: Path) -> None:
    def taken(owner: str) -> watch_model.Generation:
        return watch_model.Generation(False, f"the port is held by someone other than root (0.0.0.0:8000 by {owner})", True,
                             "stop it", port_taken=True)  # fmt: skip

    ticks = Ticks(config(tmp_path))
    said = [words(ticks.tick(seen(generation))) for generation in (taken("nobody"), taken("nobody"), taken("www-data"), GOOD, taken("nobody"))]
    assert said == [[watch_model.PORT_TAKEN], [], [watch_model.PORT_TAKEN], [watch_model.OK], [watch_model.PORT_TAKEN]]


def test_a_good_run_counts_from_its_own_first_generation(tmp_path: Path) -> None:
    """Generating, then the unit stopped (IDLE): the next good run is a new one, and the back-off starts over only
    after --stable seconds of it, not of the run before the stop."""
    cfg, now = config(tmp_path, stable_s=600.0), 1_000_000.0
    after_idle = wd.decide(cfg, watch_model.State(restarts=2, healthy_since=now - 5000, last_result=watch_model.IDLE), seen(), now, 50_000.0)
    assert (after_idle.state.restarts, after_idle.state.healthy_since) == (2, now)
    unknown_start = wd.decide(cfg, watch_model.State(restarts=2, last_result=watch_model.OK), seen(), now, 50_000.0)
    assert (unknown_start.state.restarts, unknown_start.state.healthy_since) == (2, now)
    stable = wd.decide(cfg, watch_model.State(restarts=2, healthy_since=now - 600, last_result=watch_model.OK), seen(), now, 50_000.0)
    assert stable.state.restarts == 0
    assert stable.lines[-1][1] == "sglang-watchdog: OK: sglang.service has generated for 600s: the restart back-off starts over"
    almost = wd.decide(cfg, watch_model.State(restarts=2, healthy_since=now - 599, last_result=watch_model.OK), seen(), now, 50_000.0)
    assert almost.state.restarts == 2 and almost.lines == []


def test_the_lines_of_a_busy_a_held_and_a_given_up_server_give_their_figures(tmp_path: Path) -> None:
    cfg, now = config(tmp_path, failures=1, backoff_initial_s=300.0), 1_000_000.0
    base = watch_model.State(generated_invocation="inv-1")
    busy = [watch_model.Observation(ACTIVE, [], "8 of 8", [], HUNG, watch_model.Progress(100.0), watch_model.Progress(130.0, running, queued))
            for running, queued in ((2.0, None), (None, 3.0))]  # fmt: skip
    lines = [wd.decide(cfg, base, observation, now, 50_000.0).lines[0][1] for observation in busy]
    assert lines[0].endswith("but it is working: 30 tokens during the check, 2 running. Not counted")
    assert lines[1].endswith("but it is working: 30 tokens during the check, 3 queued. Not counted")
    held = wd.decide(cfg, watch_model.State(restarts=1, last_restart=now - 100, restart_times=[now - 100], generated_invocation="inv-1"),
                     seen(HUNG), now, 50_000.0)  # fmt: skip
    assert "restarted 100s ago (restart 1; back-off 300s): the next restart in 200s at the earliest" in held.lines[-1][1]
    full = watch_model.State(restarts=3, last_restart=now - 10, restart_times=[now - 3000, now - 2000, now - 10], generated_invocation="inv-1")
    given_up = wd.decide(cfg, full, seen(HUNG), now, 50_000.0)
    assert words(given_up) == [watch_model.GIVING_UP] and "not restarting it again for 600s" in given_up.lines[0][1]
    assert given_up.state.giving_up_until == now + 600
    # Said once per hold; at the second the hold ends (a hold from another hour, a clock put right) it is said again.
    held_on = wd.decide(cfg, given_up.state, seen(HUNG), now + 60, 50_060.0)
    assert held_on.lines == [] and held_on.state.last_result == watch_model.GIVING_UP
    at_its_end = wd.decide(cfg, watch_model.State(**{**given_up.state.__dict__, "giving_up_until": now + 60}), seen(HUNG), now + 60, 50_060.0)
    assert words(at_its_end) == [watch_model.GIVING_UP]


def test_the_start_grace_counts_from_the_units_own_start(tmp_path: Path) -> None:
    cfg = config(tmp_path, start_grace_s=2400.0)
    started = watch_model.UnitState("active", "running", "inv-2", active_since=49_000.0)
    waiting = wd.decide(cfg, watch_model.State(generated_invocation="inv-1"), seen(HUNG, started), 1_000_000.0, 50_000.0)
    assert words(waiting) == [watch_model.WAITING] and "started 1000s ago" in waiting.lines[0][1]
    late = wd.decide(cfg, watch_model.State(generated_invocation="inv-1"), seen(HUNG, started), 1_000_000.0, 51_400.0)
    assert words(late) == [watch_model.FAILED]


def test_a_line_carries_its_priority_under_systemd_only(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    wd.emit("err", "sglang-watchdog: RESTART: two\nlines")
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    wd.emit("err", "sglang-watchdog: RESTART: x")
    wd.emit("info", "sglang-watchdog: IDLE: y")
    assert capsys.readouterr().out == "sglang-watchdog: RESTART: two lines\n<3>sglang-watchdog: RESTART: x\n<6>sglang-watchdog: IDLE: y\n"


def test_a_line_is_out_before_the_tick_can_be_killed() -> None:
    """systemd's timeout kills a tick that hangs: each line is already in the journal (written through, not held in
    the pipe's buffer until a clean exit)."""
    code = "import os; from sglang_deploy_host import watchdog as wd; wd.emit('err', 'sglang-watchdog: RESTART: x'); os._exit(1)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "module_utils"), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONUNBUFFERED", None)  # as under systemd: stdout a pipe, block-buffered
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.stdout == "sglang-watchdog: RESTART: x\n", done.stderr
