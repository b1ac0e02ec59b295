"""End-to-end quoting and secrets proof (CI only): real systemd runs the installed unit's ExecStart=
and Environment= in a oneshot copy whose python module is an argv probe (molecule prepare installs it
as sglang.launch_server). The argv must come back word for word; the API key must reach the module's
sys.argv from the 0600 env file through the launcher, and be in no argv, environment or log line.

Not part of playbooks/verify.yml: on a real host the module is the real server.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from seed_004 import PROFILE_ADDED_ENV, SEED_004_ENV, profile_flags  # noqa: E402

PROBE = "sglang-argv-probe"
API_KEY = "ci-test-key"  # molecule/sglang_server/inventory/host_vars
# What molecule/sglang_server/inventory/host_vars adds on top of the profile; the launcher appends
# --api-key with the env file's value (shown masked: the probe's output passed the launcher's mask).
EXTRA_FLAGS = [
    "--chat-template", "/var/lib/sglang/templates/a b %h $HOME \"q\" it's.jinja",
    "--api-key", "********",
]  # fmt: skip


@pytest.fixture(scope="module")
def probe_output(host, unit_name: str):
    unit = host.file(f"/etc/systemd/system/{unit_name}.service").content_string
    probe_unit = unit.replace("Type=exec", "Type=oneshot").replace("Restart=on-failure\n", "")
    path = f"/run/systemd/system/{PROBE}.service"
    host.run(f"cat > {path} <<'PROBE_EOF'\n{probe_unit}PROBE_EOF")
    try:
        assert host.run("systemctl daemon-reload").rc == 0
        started = host.run(f"timeout 60 systemctl start {PROBE}.service")
        assert started.rc == 0, started.stderr
        journal = host.run(f"journalctl -u {PROBE}.service -o json --no-pager").stdout
        entries = [json.loads(line) for line in journal.splitlines() if line.strip()]
        probes = [e for e in entries if str(e.get("MESSAGE", "")).startswith("ARGV-PROBE ")]
        assert probes, f"the probe printed nothing:\n{journal}"
        output = json.loads(probes[-1]["MESSAGE"][len("ARGV-PROBE ") :])
        output["uid"] = probes[-1]["_UID"]
        output["journal"] = journal
        return output
    finally:
        host.run(f"rm -f {path} && systemctl daemon-reload")


def test_systemd_hands_over_the_exact_argv(probe_output) -> None:
    assert probe_output["argv"] == profile_flags() + EXTRA_FLAGS


def test_the_api_key_reaches_sglang_but_no_argv_environment_or_log(probe_output) -> None:
    assert probe_output["api_key_sha256"] == hashlib.sha256(API_KEY.encode()).hexdigest()
    assert API_KEY not in " ".join(probe_output["cmdline"])  # /proc/PID/cmdline: world-readable
    assert "--env-flag" in probe_output["cmdline"] and "api-key=SGLANG_API_KEY" in probe_output["cmdline"]
    assert "SGLANG_API_KEY" not in probe_output["env"]  # sglang's workers inherit the environment
    assert API_KEY not in probe_output["journal"]
    assert "server_args=ServerArgs(api_key='********')" in probe_output["journal"]


def test_systemd_hands_over_the_profile_environment(probe_output) -> None:
    env = probe_output["env"]
    for name, value in {**SEED_004_ENV, **PROFILE_ADDED_ENV}.items():
        assert env.get(name) == value
    assert env["PATH"].startswith("/opt/sglang-deploy/ml-env/bin:")


def test_probe_ran_as_the_service_user(host, probe_output, service_user: str) -> None:
    assert probe_output["uid"] == str(host.user(service_user).uid)
    # HOME is the service's own directory under the data root (the root itself is root's alone):
    # sglang's caches (~/.cache: triton, flashinfer, deep_gemm JIT) must land where the service may write.
    home = probe_output["env"]["HOME"]
    assert home == "/var/lib/sglang/home"
    assert host.file(home).is_directory and host.file(home).user == service_user
    assert host.file("/var/lib/sglang").user == "root"
