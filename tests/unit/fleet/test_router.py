"""sglang_deploy.fleet.router (the sglang_router role's and rolling.yml's logic) and the router's lock."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from sglang_deploy.fleet import router
from sglang_deploy.serving import server as server_module

ROLE = ROOT / "roles" / "sglang_router"
LOCKS = sorted((ROLE / "files" / "locks").glob("smg-py*.txt"))
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def _settings(**changes: object) -> dict[str, object]:
    base = {k.removeprefix("sglang_router_"): v for k, v in DEFAULTS.items()}
    base["worker_urls"] = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    base["venv"] = "/opt/sglang-deploy/router-venv"
    base["metrics_address"] = "10.0.0.9"
    base.update(changes)
    return base


# The role's __sglang_router_unit from its defaults (vars/main.yml lists the same keys).
UNIT = {
    **{key: DEFAULTS[f"sglang_router_{key}"] for key in (
        "name", "user", "group", "home", "config_dir", "unit_dir", "libexec_dir", "hardening", "stop_timeout_sec",
        "restart_sec", "start_limit_burst", "start_limit_interval_sec", "limit_nofile")},
    "read_write_paths": [DEFAULTS["sglang_router_home"]],
}  # fmt: skip


def _resolve(api_key: str = "router-key-0123456789", **changes: object) -> dict[str, object]:
    return router.resolve(_settings(**changes), UNIT, host="r1", api_key=api_key)


def _server(host: str, **overrides: object) -> dict[str, object]:
    from server_inputs import resolve

    return resolve(host=host, **overrides)


def test_worker_urls_are_the_workers_published_urls_in_order():
    resolved = {"w2": _server("w2", advertise_address="10.0.0.2"), "w1": _server("w1", advertise_address="fd00::1")}
    assert router.worker_urls(resolved) == ["http://10.0.0.2:8000", "http://[fd00::1]:8000"]
    # the port is the worker's own launch: profile and override included (resolved once, server.py)
    moved = _server("w1", advertise_address="10.0.0.1", flags_override={"port": 9000})
    assert router.worker_urls({"w1": moved}) == ["http://10.0.0.1:9000"]


def test_a_worker_never_resolved_is_named_with_the_fix():
    with pytest.raises(router.RouterConfigError, match=r"worker w3 has no resolved server .* Fix: run `sglang-deploy validate"):
        router.worker_urls({"w1": _server("w1"), "w3": None})


def test_worker_urls_refuses_duplicates():
    same = {"a": _server("a", advertise_address="h"), "b": _server("b", advertise_address="h")}
    with pytest.raises(router.RouterConfigError, match="share a URL"):
        router.worker_urls(same)


@pytest.mark.parametrize("bad", ["w1:8000", "http://w1:0", "http://w1:8000/x\n", ""])
def test_a_worker_url_given_by_hand_is_checked_whole(bad):
    with pytest.raises(router.RouterConfigError, match="sglang_router_worker_urls"):
        router.checked_worker_url(bad, "sglang_router_worker_urls")


def test_flag_argv_shapes_and_secrets():
    assert router.flag_argv({"w": True, "n": None, "d": [1, 2], "e": 3, "f_g": "x"}) == [
        "--w", "--d", "1", "2", "--e", "3", "--f-g", "x"]
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


def test_exec_start_is_quoted_for_systemd_one_flag_per_line():
    text = _resolve(health_check_endpoint="/h%x$y")["exec_start"]
    assert '"/h%%x$$y"' in text
    # systemd's double quoting reads like a shell's for these words (continuation lines joined).
    words = shlex.split(text.replace("\\\n", " ").replace("%%", "%").replace("$$", "$"))
    assert words[:4] == ["/opt/sglang-deploy/router-venv/bin/python3", "/usr/local/libexec/sglang-router/sglang_launcher.py",
                         "--module", "smg.launch_router"]
    assert words[words.index("--host"):][:2] == ["--host", "0.0.0.0"]
    assert all(line.endswith(" \\") for line in text.splitlines()[:-1])


def test_the_router_runs_through_the_servers_launcher_key_in_process_colour_stripped():
    resolved = _resolve()
    argv = resolved["argv"]
    assert "--strip-ansi" in argv
    assert argv[argv.index("--env-flag") + 1] == "api-key=SGLANG_ROUTER_API_KEY"
    assert "router-key-0123456789" not in json.dumps(resolved)
    assert resolved["api_key_env"] == "SGLANG_ROUTER_API_KEY"
    assert router.env_file_lines("router-key-0123456789") == ["SGLANG_ROUTER_API_KEY='router-key-0123456789'"]
    assert resolved["unit"]["env_file"] == "/etc/sglang-router/sglang-router.env"
    # the router host reaches itself on loopback (it binds 0.0.0.0); its metrics where they bind
    assert resolved["url"] == f"http://127.0.0.1:{DEFAULTS['sglang_router_port']}"
    assert resolved["metrics_url"] == f"http://127.0.0.1:{DEFAULTS['sglang_router_prometheus_port']}/metrics"
    assert resolved["metrics_target"] == f"10.0.0.9:{DEFAULTS['sglang_router_prometheus_port']}"


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"state": "restarted"}, ["sglang_router_state"]),
        ({"port": 70000}, ["sglang_router_port"]),
        ({"prometheus_port": "x"}, ["sglang_router_prometheus_port"]),
        ({"name": "../x"}, ["sglang_router_name"]),
    ],
)
def test_bad_router_settings_name_the_host_and_variable(changes, words):
    settings, unit = _settings(), dict(UNIT)
    for key, value in changes.items():
        (unit if key in unit else settings)[key] = value
    with pytest.raises(router.RouterConfigError) as err:
        router.resolve(settings, unit, host="r1", api_key="router-key-0123456789")
    assert str(err.value).startswith("host r1: ") and all(w in str(err.value) for w in words), str(err.value)


def test_exposure():
    assert router.exposure_problem("0.0.0.0", 29000, "", False)
    assert router.exposure_problem("0.0.0.0", 29000, "k", False) is None
    assert router.exposure_problem("127.0.0.1", 29000, "", False) is None
    assert router.exposure_problem("::1", 29000, "", False) is None
    assert router.exposure_problem("[::1]", 29000, "", False) is None
    assert router.exposure_problem("0.0.0.0", 29000, "", True) is None
    with pytest.raises(router.RouterConfigError, match="sglang_router_allow_unauthenticated"):
        _resolve(api_key="")


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
    # Lines as the router (smg) prints them on its --prometheus-port.
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
    groups = router.file_sd({"w1": "http://10.0.0.1:8000"}, {"r1": "10.0.0.9:29000"}, {"env": "prod"})
    assert groups == [
        {"targets": ["10.0.0.1:8000"], "labels": {"env": "prod", "job": "sglang-worker", "instance_name": "w1"}},
        {"targets": ["10.0.0.9:29000"], "labels": {"env": "prod", "job": "sglang-router", "instance_name": "r1"}},
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"metrics_address": '10.0.0.9"\n- targets: [evil:1]'}, "sglang_router_metrics_address = '10.0.0.9\"\\n- targets"),
     ({"metrics_address": "host name"}, "is not a host name or an IP address"),
     ({"file_sd_path": "/etc/prometheus/targets.json\n"}, "sglang_router_file_sd_path"),
     ({"file_sd_path": "/etc/prometheus/../shadow"}, "ending in .json"),
     ({"file_sd_path": "/etc/prometheus/a b.json"}, "of plain characters"),
     ({"file_sd_path": "relative.json"}, "ending in .json")],
)  # fmt: skip
def test_what_prometheus_is_handed_is_checked_whole_before_any_host(changes: dict[str, object], message: str):
    with pytest.raises(router.RouterConfigError) as err:
        _resolve(**changes)
    assert str(err.value).startswith("host r1: ") and message in str(err.value)
    assert _resolve(metrics_address="fd00::9")["metrics_target"] == "[fd00::9]:29000"
    assert _resolve(file_sd_path="/srv/x/../prom/t.json")["file_sd_path"] == "/srv/prom/t.json"


def test_the_targets_file_is_written_only_over_a_file_of_ours(tmp_path: Path):
    from sglang_deploy_host.watch import file_sd

    groups = router.file_sd({"w1": "http://10.0.0.1:8000"}, {"r1": "10.0.0.9:29000"})
    path = tmp_path / "sd" / "sglang-targets.json"
    assert file_sd.write(str(path), groups, "v")["changed"] and json.loads(path.read_text()) == groups
    assert path.stat().st_mode & 0o777 == 0o644
    assert not file_sd.write(str(path), groups, "v")["changed"]  # ours, unchanged
    moved = router.file_sd({"w1": "http://10.0.0.3:8000"}, {})
    assert file_sd.write(str(path), moved, "v")["changed"]  # ours: replaced
    other = tmp_path / "other.json"
    other.write_text('[{"targets": ["node:9100"], "labels": {"job": "node"}}]\n')
    for victim, why in ((other, "did not write"), (tmp_path / "sd", "not a regular file")):
        target = tmp_path / "link.json" if victim.is_dir() else victim
        if victim.is_dir():
            target.symlink_to(victim)
        before = victim.read_text() if victim.is_file() else None
        with pytest.raises(file_sd.FileSdError, match=why):
            file_sd.write(str(target), groups, "sglang_router_file_sd_path")
        assert before is None or victim.read_text() == before
    with pytest.raises(file_sd.FileSdError, match="is not host:port"):
        file_sd.write(str(path), [{"targets": ["10.0.0.1:8000\n"], "labels": {}}], "v")
    with pytest.raises(file_sd.FileSdError, match="is not a plain label"):
        file_sd.write(str(path), [{"targets": ["h:1"], "labels": {"job": 'x"\ny'}}], "v")


def test_locks_pin_the_default_version_with_hashes():
    assert {p.name for p in LOCKS} == {"smg-py3.11.txt", "smg-py3.12.txt"}
    for path in LOCKS:
        text = path.read_text()
        pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", text, flags=re.M)
        assert ("smg", DEFAULTS["sglang_router_version"]) in pins
        # Every pinned requirement is followed by at least one hash.
        blocks = re.split(r"^(?=[A-Za-z0-9_.-]+==)", text, flags=re.M)[1:]
        assert len(blocks) == len(pins)
        assert all("--hash=sha256:" in block for block in blocks)


def test_policy_choices_match_argument_specs():
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert tuple(specs["sglang_router_policy"]["choices"]) == router.POLICIES


@pytest.fixture(scope="module")
def router_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the role's own lock for this Python installed (hashes required), as the role builds it."""
    lock = ROLE / "files" / "locks" / f"smg-py{sys.version_info.major}.{sys.version_info.minor}.txt"
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
    """The role's rendered argv through the pinned router's (smg's) own parser, in a venv of its lock."""
    argv = router.flag_argv(_resolve()["flags"])
    probe = (
        "import json, sys\n"
        "from smg.launch_router import parse_router_args\n"
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


@pytest.mark.parametrize("url", ["http://user:pass@10.0.0.1:8000", "http://10.0.0.1:8000\n", "http://10.0.0.1:8000 x", "ftp://10.0.0.1"])
def test_a_worker_url_with_credentials_or_control_characters_never_reaches_execstart(url):
    """Before: credentials in sglang_router_worker_url(s) landed in the router unit's ExecStart=."""
    with pytest.raises(router.RouterConfigError) as err:
        router.checked_worker_url(url, "sglang_router_worker_urls")
    assert "pass" not in str(err.value)
    with pytest.raises(router.RouterConfigError, match="sglang_router_worker_urls") as err:
        _resolve(worker_urls=[url])
    assert "pass" not in str(err.value)
    with pytest.raises(server_module.ResolveError, match="sglang_server_advertise_url") as err:
        _server("w1", advertise_url=url)
    assert "pass" not in str(err.value)


@pytest.mark.parametrize("version", ["0.3.2", "0.2.1"])
def test_an_inventory_still_naming_sglang_router_gets_the_way_to_smg(version: str) -> None:
    with pytest.raises(router.RouterConfigError, match=r"sglang_router_version .* is a release of sglang-router") as err:
        _resolve(version=version)
    assert "remove sglang_router_version from the inventory" in str(err.value)
    with pytest.raises(router.RouterConfigError, match="is not a release number"):
        _resolve(version="1.13.0\n")
    assert _resolve()["flags"]["policy"] == "cache_aware"


def test_a_worker_is_in_rotation_only_healthy_and_knowing_its_model() -> None:
    """smg 1.13 lists a worker added without the workers' key healthy but with model `unknown`, and routes
    the served model's requests elsewhere (seen against stand-ins): the rollout waits for the model."""
    url = "http://10.0.0.1:8000"
    entry = {"id": "w1", "url": url, "is_healthy": True, "model_id": "glm-5"}
    assert router.worker_in_rotation({"workers": [entry]}, url)
    assert not router.worker_in_rotation({"workers": [{**entry, "model_id": "unknown"}]}, url)
    assert not router.worker_in_rotation({"workers": [{**entry, "is_healthy": False}]}, url)
    assert not router.worker_in_rotation({"workers": []}, url)
    assert router.worker_addition(url, "k" * 20) == {"url": url, "api_key": "k" * 20}
    assert router.worker_addition(url, "") == {"url": url}
    with pytest.raises(router.RouterConfigError):
        router.worker_addition("http://u:p@10.0.0.1:8000", "")



def test_workers_with_another_key_than_the_routers_are_named_never_their_keys(tmp_path: Path) -> None:
    assert router.workers_with_another_key("k" * 24, {"w1": "k" * 24, "w2": "j" * 24, "w3": ""}) == ["w2", "w3"]
    assert router.workers_with_another_key("", {"w1": "x"}) == []
    # Through Ansible, before any host changes: validate on inventory/multi_host with the router's key apart.
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "multi_host", inventory)
    (inventory / "group_vars" / "all" / "keys.yml").write_text(
        "sglang_server_api_key: worker-key-0123456789abcdef\nsglang_router_api_key: router-key-0123456789abcdef\n"
    )
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), "playbooks/resolve.yml"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CACHE_PLUGIN": "memory"},
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "host router-01: the router sends its key (sglang_router_api_key) to its workers, and" in output
    assert "glm5-01, glm5-02, glm5-03 have another sglang_server_api_key" in output
    assert "worker-key-0123456789abcdef" not in output and "router-key-0123456789abcdef" not in output


TLS = {"certfile": "/inv/tls/w.crt", "keyfile": "/inv/tls/w.key", "cafile": "/inv/tls/ca.crt", "dir": "/etc/ssl/sglang"}


def test_https_workers_are_verified_with_each_workers_ca(router_venv: Path) -> None:
    """Workers serving TLS publish https URLs and their CA (control-node file); the router installs each CA once
    and hands smg its path (--ca-cert-paths), which smg's own parser takes."""
    workers = {
        "w1": _server("w1", advertise_address="10.0.0.1", tls=TLS),
        "w2": _server("w2", advertise_address="10.0.0.2", tls=TLS),
        "w3": _server("w3", advertise_address="10.0.0.3", tls={**TLS, "cafile": "/inv/tls/other-ca.crt"}),
    }
    assert router.worker_urls(workers) == ["https://10.0.0.1:8000", "https://10.0.0.2:8000", "https://10.0.0.3:8000"]
    cafiles = router.worker_cafiles(workers)
    assert cafiles == ["/inv/tls/ca.crt", "/inv/tls/other-ca.crt"]
    resolved = _resolve(worker_urls=router.worker_urls(workers), worker_cafiles=cafiles)
    assert resolved["worker_cafiles"] == [
        {"source": "/inv/tls/ca.crt", "dest": "/etc/ssl/sglang-router/worker-ca-1.crt"},
        {"source": "/inv/tls/other-ca.crt", "dest": "/etc/ssl/sglang-router/worker-ca-2.crt"},
    ]
    assert resolved["tls_dir"] == "/etc/ssl/sglang-router"
    probe = "import sys\nfrom smg.launch_router import parse_router_args\nprint(parse_router_args(sys.argv[1:]).ca_cert_paths)\n"
    done = subprocess.run([str(router_venv / "bin" / "python"), "-c", probe, *router.flag_argv(resolved["flags"])],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str([e["dest"] for e in resolved["worker_cafiles"]])
    # Plain workers: no CA, no flag, nothing to install.
    plain = _resolve()
    assert plain["worker_cafiles"] == [] and "ca-cert-paths" not in plain["flags"] and plain["tls_dir"] == ""


def test_https_workers_without_a_known_ca_are_refused_naming_the_fix() -> None:
    with pytest.raises(router.RouterConfigError, match=r"host r1: the workers https://10.0.0.1:8000 speak TLS and no CA"):
        _resolve(worker_urls=["https://10.0.0.1:8000", "http://10.0.0.2:8000"])
    # A router given its own CAs (extra flags) is the operator's choice.
    flags = _resolve(worker_urls=["https://10.0.0.1:8000"], extra_flags={"ca-cert-paths": ["/etc/ssl/corp.pem"]})["flags"]
    assert flags["ca-cert-paths"] == ["/etc/ssl/corp.pem"]


def test_a_router_key_sglang_would_print_escaped_is_refused_without_showing_it():
    with pytest.raises(router.RouterConfigError) as err:
        _resolve(api_key="router key'0123456789")
    message = str(err.value)
    assert message.startswith("host r1: sglang_router_api_key holds a space or tab at character 7, a quote or backslash at character 11")
    assert "router key" not in message and "0123456789" not in message, message


def test_each_routers_endpoints_come_from_its_resolution_and_an_unresolved_one_is_named():
    resolved = {"r1": {"url": "https://r1:30000", "metrics_url": "http://r1:29000/metrics"},
                "r2": {"url": "http://r2:30000", "metrics_url": "http://r2:29000/metrics"}}  # fmt: skip
    assert router.router_endpoints(resolved) == {
        "r1": {"url": "https://r1:30000", "metrics": "http://r1:29000/metrics"},
        "r2": {"url": "http://r2:30000", "metrics": "http://r2:29000/metrics"},
    }
    for unresolved in (None, {"metrics_url": "http://r3:29000/metrics"}, "r3"):
        with pytest.raises(router.RouterConfigError, match=r"router r3 has no resolved router .* Fix: run `sglang-deploy validate"):
            router.router_endpoints({**resolved, "r3": unresolved})


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b"])
def test_a_router_flag_holding_a_control_character_is_refused(bad):
    with pytest.raises(router.RouterConfigError, match="a router argument holds a control character"):
        router.flag_argv({"log-dir": bad})
    with pytest.raises(router.RouterConfigError, match="a router argument holds a control character"):
        router.flag_argv({"policy": ["x", bad]})
