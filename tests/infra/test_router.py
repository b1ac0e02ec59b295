"""testinfra suite for an sglang-router host (roles/sglang_router): the hardened unit, the secret kept
out of argv, the router's health, its workers listed and healthy, and a chat through it.

Run by molecule/sglang_router and by playbooks/verify.yml against each host of sglang_routers
(other hosts are skipped). Expectations come from the environment:
  SGLANG_ROUTER_TEST_URL      the router as reached on its host (default http://127.0.0.1:30080)
  SGLANG_ROUTER_TEST_WORKERS  comma-separated worker URLs the router must list healthy
  SGLANG_ROUTER_TEST_MODEL    the served model name for the chat
  SGLANG_ROUTER_TEST_UNIT     the unit's name (default sglang-router)
The API key is read on the host from the unit's 0600 environment file, never passed in.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

UNIT = os.environ.get("SGLANG_ROUTER_TEST_UNIT", "sglang-router")
URL = os.environ.get("SGLANG_ROUTER_TEST_URL", "http://127.0.0.1:30080").rstrip("/")
WORKERS = [u.rstrip("/") for u in os.environ.get("SGLANG_ROUTER_TEST_WORKERS", "").split(",") if u]
MODEL = os.environ.get("SGLANG_ROUTER_TEST_MODEL", "default")
ENV_FILE = f"/etc/{UNIT}/{UNIT}.env"

# Runs on the host with its python3: GET/POST to the router with the key from the env file.
_CLIENT = r"""
import json, shlex, sys, urllib.request, urllib.error
method, url, env_file, body = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
key = ""
try:
    for line in open(env_file):
        if line.startswith("SGLANG_ROUTER_API_KEY="):
            key = shlex.split(line.split("=", 1)[1])[0]  # systemd EnvironmentFile= quoting
except OSError:
    pass
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = "Bearer " + key
req = urllib.request.Request(url, data=body.encode() if body else None, headers=headers, method=method)
try:
    with urllib.request.urlopen(req, timeout=120) as answer:
        status, text = answer.status, answer.read(4 << 20).decode()
except urllib.error.HTTPError as err:
    status, text = err.code, err.read(4096).decode(errors="replace")
print(json.dumps({"status": status, "body": text}))
"""


@pytest.fixture()
def is_router(host) -> None:  # type: ignore[no-untyped-def]
    groups = host.ansible.get_variables().get("group_names", [])
    if "sglang_routers" not in groups:
        pytest.skip("not a router host")


def _call(host, method: str, path: str, body: str = "") -> tuple[int, str]:  # type: ignore[no-untyped-def]
    result = host.run("python3 -c %s %s %s %s %s", _CLIENT, method, URL + path, ENV_FILE, body)
    assert result.rc == 0, result.stderr
    answer = json.loads(result.stdout)
    return answer["status"], answer["body"]


def test_unit_is_running_as_its_own_user(host, is_router) -> None:  # type: ignore[no-untyped-def]
    service = host.service(UNIT)
    assert service.is_running and service.is_enabled
    user = host.check_output("systemctl show -p User --value %s", UNIT)
    assert user and user != "root"
    unit_text = host.file(f"/etc/systemd/system/{UNIT}.service").content_string
    assert unit_text.splitlines()[0].startswith("#"), "the unit must start with the ansible_managed comment"
    for directive in ("NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=", "PrivateDevices=yes"):
        assert directive in unit_text


# The server unit's limit (tests/infra/test_sglang_unit.py): the router's unit is hardened the same way.
MAX_EXPOSURE = 3.0


def test_systemd_verifies_and_rates_the_unit_hardened(host, is_router) -> None:  # type: ignore[no-untyped-def]
    verify = host.run(f"systemd-analyze verify --man=no /etc/systemd/system/{UNIT}.service 2>&1")
    assert verify.rc == 0 and verify.stdout.strip() == "", verify.stdout
    result = host.run(f"systemd-analyze security --no-pager {UNIT}.service 2>&1")
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert level and float(level.group(1)) <= MAX_EXPOSURE, result.stdout[-2000:]


def test_the_journal_has_no_colour_codes(host, is_router) -> None:  # type: ignore[no-untyped-def]
    """The router colours its log whatever NO_COLOR says; the launcher's --strip-ansi removes it."""
    journal = host.check_output("journalctl -u %s --no-pager -o cat", UNIT)
    assert journal.strip(), "the router logged nothing"
    assert "\x1b[" not in journal, [line for line in journal.splitlines() if "\x1b[" in line][:3]


def test_env_file_is_root_only_and_key_not_in_argv(host, is_router) -> None:  # type: ignore[no-untyped-def]
    env = host.file(ENV_FILE)
    assert env.user == "root" and env.mode == 0o600
    pid = host.check_output("systemctl show -p MainPID --value %s", UNIT)
    argv = host.check_output("tr '\\0' ' ' < /proc/%s/cmdline", pid)
    assert "--api-key" not in argv
    key_line = [line for line in host.check_output("cat %s", ENV_FILE).splitlines() if line.startswith("SGLANG_ROUTER_API_KEY=")]
    if key_line:
        # systemd's EnvironmentFile= quoting (module_utils systemd.env_file_line), read as a shell would
        key = shlex.split(key_line[0].split("=", 1)[1])[0]
        assert key not in argv
        assert key not in host.check_output("journalctl -u %s --no-pager -o cat", UNIT)


def test_router_health(host, is_router) -> None:  # type: ignore[no-untyped-def]
    assert _call(host, "GET", "/health")[0] == 200
    status, body = _call(host, "GET", "/readiness")
    assert status == 200, body


def test_worker_api_needs_the_key(host, is_router) -> None:  # type: ignore[no-untyped-def]
    result = host.run("python3 -c %s %s %s %s %s", _CLIENT, "GET", URL + "/workers", "/nonexistent", "")
    if "SGLANG_ROUTER_API_KEY=" in host.check_output("cat %s", ENV_FILE):
        assert json.loads(result.stdout)["status"] == 401


def test_workers_listed_and_healthy(host, is_router) -> None:  # type: ignore[no-untyped-def]
    status, body = _call(host, "GET", "/workers")
    assert status == 200, body
    workers = json.loads(body)["workers"]
    listed = {w["url"].rstrip("/"): w["is_healthy"] for w in workers}
    for url in WORKERS:
        assert listed.get(url) is True, f"{url} not healthy in the router: {listed}"
    # smg lists a worker whose model it could not ask (no key) as `unknown` and never routes the model to it.
    models = {w["url"].rstrip("/"): w.get("model_id", MODEL) for w in workers}
    for url in WORKERS:
        assert models.get(url) == MODEL, f"the router does not know {url} serves {MODEL}: {models}"


def test_a_generation_without_the_key_is_refused(host, is_router) -> None:  # type: ignore[no-untyped-def]
    if "SGLANG_ROUTER_API_KEY=" not in host.check_output("cat %s", ENV_FILE):
        return  # an unauthenticated router the inventory allows on purpose
    request = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    result = host.run("python3 -c %s %s %s %s %s", _CLIENT, "POST", URL + "/v1/chat/completions", "/nonexistent", request)
    assert json.loads(result.stdout)["status"] == 401, result.stdout


def test_chat_through_the_router(host, is_router) -> None:  # type: ignore[no-untyped-def]
    request = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 64, "temperature": 0}
    status, body = _call(host, "POST", "/v1/chat/completions", json.dumps(request))
    assert status == 200, body
    message = json.loads(body)["choices"][0]["message"]
    assert "Paris" in (message.get("content") or "") + (message.get("reasoning_content") or "")
