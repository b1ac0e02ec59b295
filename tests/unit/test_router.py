"""sglang_deploy.router (the sglang_router role's and rolling.yml's logic) and the router's lock."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from sglang_deploy import router

ROLE = ROOT / "roles" / "sglang_router"
LOCKS = sorted((ROLE / "files" / "locks").glob("sglang-router-py*.txt"))
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def _settings(**changes: object) -> dict[str, object]:
    base = {k.removeprefix("sglang_router_"): v for k, v in DEFAULTS.items()}
    base["worker_urls"] = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    base.update(changes)
    return base


def test_worker_url_from_flags_host_and_override():
    assert router.worker_url("w1", {"ansible_host": "10.0.0.1", "sglang_server_flags": {"port": 8000}}) == "http://10.0.0.1:8000"
    merged = {"ansible_host": "10.0.0.1", "sglang_server_flags": {"port": 8000}, "sglang_server_flags_override": {"port": 9000}}
    assert router.worker_url("w1", merged) == "http://10.0.0.1:9000"
    assert router.worker_url("w1", {}) == "http://w1:30000"
    assert router.worker_url("w1", {"ansible_host": "fd00::1"}) == "http://[fd00::1]:30000"
    assert router.worker_url("w1", {"sglang_router_worker_address": "127.0.0.1", "ansible_host": "x"}) == "http://127.0.0.1:30000"
    assert router.worker_url("w1", {"sglang_router_worker_url": "https://w1.example:443/"}) == "https://w1.example:443"


@pytest.mark.parametrize("bad", [{"sglang_server_flags": {"port": 0}}, {"sglang_server_flags": {"port": "x"}},
                                 {"sglang_server_flags": {"port": True}}, {"sglang_router_worker_url": "w1:8000"}])
def test_worker_url_refuses_nonsense(bad):
    with pytest.raises(router.RouterConfigError):
        router.worker_url("w1", bad)


def test_worker_urls_refuses_duplicates():
    hostvars = {"a": {"ansible_host": "h"}, "b": {"ansible_host": "h"}}
    with pytest.raises(router.RouterConfigError, match="share a URL"):
        router.worker_urls(["a", "b"], hostvars)


def test_flag_argv_shapes_and_secrets():
    assert router.flag_argv({"a": True, "b": False, "c": None, "d": [1, 2], "e": 3, "f_g": "x"}) == [
        "--a", "--d", "1", "2", "--e", "3", "--f-g", "x"]
    for secret in ("api-key", "api_key", "--control-plane-api-keys", "redis-url"):
        with pytest.raises(router.RouterConfigError, match="secret"):
            router.flag_argv({secret: "k"})
    with pytest.raises(router.RouterConfigError):
        router.flag_argv({"x": float("nan")})


def test_router_flags_defaults_and_extra():
    flags = router.router_flags(_settings(extra_flags={"retry-max-retries": 3, "log-level": None}))
    assert flags["policy"] == "cache_aware"
    assert flags["worker-urls"] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert flags["prometheus-host"] == "127.0.0.1"
    assert flags["retry-max-retries"] == 3 and "log-level" not in flags
    with pytest.raises(router.RouterConfigError, match="policy"):
        router.router_flags(_settings(policy="fastest"))
    with pytest.raises(router.RouterConfigError, match="no worker"):
        router.router_flags(_settings(worker_urls=[]))


def test_exec_args_are_quoted_for_systemd():
    text = router.exec_args(_settings(health_check_endpoint="/h%x$y"))
    assert '"/h%%x$$y"' in text
    # systemd's double quoting reads like a shell's for these words.
    words = shlex.split(text.replace("%%", "%").replace("$$", "$"))
    assert words[:2] == ["--host", "0.0.0.0"]


def test_exposure():
    assert router.exposure_problem("0.0.0.0", "", False)
    assert router.exposure_problem("0.0.0.0", "k", False) is None
    assert router.exposure_problem("127.0.0.1", "", False) is None
    assert router.exposure_problem("::1", "", False) is None
    assert router.exposure_problem("0.0.0.0", "", True) is None


def test_in_flight_reads_v1_loads():
    # The shape of sglang 0.5.10.post1's GET /v1/loads (srt/entrypoints/v1_loads.py), two DP ranks.
    answer = {
        "timestamp": "2026-12-01T00:00:00+00:00", "version": "0.5.10.post1", "dp_rank_count": 2,
        "loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 1, "num_total_reqs": 3},
                  {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": 4, "num_total_reqs": 4}],
        "aggregate": {"total_running_reqs": 2, "total_waiting_reqs": 5, "total_reqs": 7},
    }
    assert router.in_flight(answer) == 7
    assert router.in_flight({"loads": [], "aggregate": {}}) == 0
    for bad in ({"loads": "x"}, {"loads": [{"num_running_reqs": -1}]}, {"loads": [{"num_waiting_reqs": 1.5}]}):
        with pytest.raises(ValueError):
            router.in_flight(bad)


def test_in_flight_reads_the_deprecated_get_load():
    assert router.in_flight([{"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 1}, {"num_reqs": 3, "num_waiting_reqs": 0}]) == 6
    assert router.in_flight({"num_reqs": 0}) == 0
    for bad in ("x", [1], [{"num_reqs": -1}], [{"num_reqs": True}]):
        with pytest.raises(ValueError):
            router.in_flight(bad)


def test_circuit_states_from_the_routers_metrics():
    # Lines as sglang-router 0.3.2 prints them on its --prometheus-port.
    text = (
        "# HELP smg_worker_cb_state Circuit breaker state\n# TYPE smg_worker_cb_state gauge\n"
        'smg_worker_cb_state{worker="http://127.0.0.1:18501"} 0\n'
        'smg_worker_cb_state{worker="http://127.0.0.1:18502/"} 1\n'
        'smg_worker_health{worker="http://127.0.0.1:18502"} 1\n'
    )
    assert router.circuit_states(text) == {"http://127.0.0.1:18501": 0, "http://127.0.0.1:18502": 1}
    assert router.circuits_closed(["http://127.0.0.1:18501"], text)
    assert not router.circuits_closed(["http://127.0.0.1:18501", "http://127.0.0.1:18502"], text)
    # Half-open (on trial) is not closed either; a worker without the metric counts as closed.
    assert not router.circuits_closed(["http://h:1"], 'smg_worker_cb_state{worker="http://h:1"} 2\n')
    assert router.circuits_closed(["http://h:2"], text)


def test_worker_entry():
    answer = {"workers": [{"id": "a", "url": "http://h:1/", "is_healthy": True}]}
    assert router.worker_entry(answer, "http://h:1")["id"] == "a"
    assert router.worker_entry(answer, "http://h:2") is None
    with pytest.raises(ValueError):
        router.worker_entry({"nope": 1}, "http://h:1")


def test_file_sd():
    groups = router.file_sd({"w1": "http://10.0.0.1:8000"}, {"r1": ("10.0.0.9", 29000)}, {"env": "prod"})
    assert groups == [
        {"targets": ["10.0.0.1:8000"], "labels": {"env": "prod", "job": "sglang-worker", "instance_name": "w1"}},
        {"targets": ["10.0.0.9:29000"], "labels": {"env": "prod", "job": "sglang-router", "instance_name": "r1"}},
    ]


def test_locks_pin_the_default_version_with_hashes():
    assert {p.name for p in LOCKS} == {"sglang-router-py3.11.txt", "sglang-router-py3.12.txt"}
    for path in LOCKS:
        text = path.read_text()
        pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", text, flags=re.M)
        assert ("sglang-router", DEFAULTS["sglang_router_version"]) in pins
        # Every pinned requirement is followed by at least one hash.
        blocks = re.split(r"^(?=[A-Za-z0-9_.-]+==)", text, flags=re.M)[1:]
        assert len(blocks) == len(pins)
        assert all("--hash=sha256:" in block for block in blocks)


def test_policy_choices_match_argument_specs():
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert tuple(specs["sglang_router_policy"]["choices"]) == router.POLICIES


def test_launcher_refuses_a_key_in_argv():
    result = subprocess.run(
        [sys.executable, str(ROLE / "files" / "sglang_router_launch.py"), "--api-key", "secret"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 2 and "must not be in argv" in result.stderr


@pytest.fixture(scope="module")
def router_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the role's own lock for this Python installed (hashes required), as the role builds it."""
    lock = ROLE / "files" / "locks" / f"sglang-router-py{sys.version_info.major}.{sys.version_info.minor}.txt"
    if not lock.is_file():
        pytest.fail(f"no router lock for this Python: {lock}")
    venv = tmp_path_factory.mktemp("router") / "venv"
    uv = Path(sys.executable).with_name("uv")
    subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "--require-hashes",
         "--no-deps", "-r", str(lock)],
        check=True, timeout=600,
    )
    return venv


def test_default_argv_parses_with_the_pinned_router(router_venv: Path):
    """The role's rendered argv through the pinned sglang-router's own parser, in a venv of its lock."""
    argv = shlex.split(router.exec_args(_settings()).replace("%%", "%").replace("$$", "$"))
    probe = (
        "import json, sys\n"
        "from sglang_router.launch_router import parse_router_args\n"
        "a = parse_router_args(sys.argv[1:])\n"
        "print(json.dumps({'policy': a.policy, 'worker_urls': a.worker_urls, 'prometheus_port': a.prometheus_port}))\n"
    )
    done = subprocess.run([str(router_venv / "bin" / "python"), "-c", probe, *argv],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    args = json.loads(done.stdout.strip().splitlines()[-1])
    assert args["policy"] == "cache_aware"
    assert args["worker_urls"] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert args["prometheus_port"] == DEFAULTS["sglang_router_prometheus_port"]


def test_worker_url_reads_the_port_of_the_hosts_launch_profile():
    host = {"ansible_host": "10.0.0.1", "sglang_server_flags": {"port": 8000},
            "sglang_server_profile": "alt", "sglang_server_profiles": {"alt": {"port": 8100}, "other": {"port": 1}}}  # fmt: skip
    assert router.worker_url("w1", host) == "http://10.0.0.1:8100"
    assert router.worker_url("w1", {**host, "sglang_server_flags_override": {"port": 9000}}) == "http://10.0.0.1:9000"
    assert router.worker_url("w1", {**host, "sglang_server_profile": ""}) == "http://10.0.0.1:8000"


@pytest.mark.parametrize("url", ["http://user:pass@10.0.0.1:8000", "http://10.0.0.1:8000\n", "http://10.0.0.1:8000 x", "ftp://10.0.0.1"])
def test_a_worker_url_with_credentials_or_control_characters_never_reaches_execstart(url):
    """Before: credentials in sglang_router_worker_url(s) landed in the router unit's ExecStart=."""
    with pytest.raises(router.RouterConfigError) as err:
        router.worker_url("w1", {"sglang_router_worker_url": url})
    assert "pass" not in str(err.value)
    with pytest.raises(router.RouterConfigError, match="sglang_router_worker_urls"):
        router.exec_args(_settings(worker_urls=[url]))
