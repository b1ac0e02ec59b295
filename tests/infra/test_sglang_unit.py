"""The installed sglang unit: what the inventory renders, valid for systemd, enabled, least privilege."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from sglang_deploy.serving import jitcache
from sglang_deploy_host.serving import sglang_launcher, systemd, unit_flags

UNIT_DIR = "/etc/systemd/system"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_unit_is_byte_identical_to_render(host, rendered_dir: Path, unit_name: str) -> None:
    installed = host.file(f"{UNIT_DIR}/{unit_name}.service")
    assert installed.exists
    assert installed.content_string == (rendered_dir / f"{unit_name}.service").read_text()
    assert (installed.user, installed.group, installed.mode) == ("root", "root", 0o644)


def test_env_file_is_root_only_and_matches_render(host, rendered_dir: Path, env_file_path: str, unit_name: str) -> None:
    env_file = host.file(env_file_path)
    assert (env_file.user, env_file.group, env_file.mode) == ("root", "root", 0o600)
    # Compared by digest: a failing assertion must not print a secret.
    assert _sha256(env_file.content) == _sha256((rendered_dir / f"{unit_name}.env").read_bytes())
    assert host.file(str(Path(env_file_path).parent)).mode == 0o750


def test_systemd_analyze_verify_prints_nothing(host, unit_name: str) -> None:
    # systemd-analyze exits 0 on unknown keys and bad values: any output is a failure.
    result = host.run(f"systemd-analyze verify --man=no {UNIT_DIR}/{unit_name}.service 2>&1")
    assert result.rc == 0 and result.stdout.strip() == "", result.stdout


# `systemd-analyze security`'s exposure (0 = locked down, 10 = unprotected): 7.6 before the
# hardening of issue 11, 2.2 with it (README "Unit hardening"). A dropped directive shows here.
MAX_EXPOSURE = 3.0


def test_systemd_rates_the_unit_hardened(host, unit_name: str) -> None:
    result = host.run(f"systemd-analyze security --no-pager {unit_name}.service 2>&1")
    level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert level, result.stdout[-2000:]
    assert float(level.group(1)) <= MAX_EXPOSURE, result.stdout[-2000:]


def test_unit_is_enabled_and_loaded(host, unit_name: str) -> None:
    service = host.service(unit_name)
    assert service.is_enabled
    assert host.run(f"systemctl show -p LoadState --value {unit_name}.service").stdout.strip() == "loaded"


def test_service_user_is_a_system_user_in_gpu_groups(host, service_user: str) -> None:
    user = host.user(service_user)
    assert user.exists
    assert user.uid < 1000, "the service user should be a system user"
    assert user.shell in ("/usr/sbin/nologin", "/sbin/nologin")
    if host.group("video").exists:
        assert "video" in user.groups


def test_environment_and_execstart_as_systemd_parsed_them(host, rendered_dir: Path, unit_name: str) -> None:
    """systemd's own reading of the unit carries every Environment= and flag of the render."""
    rendered = (rendered_dir / f"{unit_name}.service").read_text()
    shown_env = host.run(f"systemctl show -p Environment --value {unit_name}.service").stdout
    for line in rendered.splitlines():
        if line.startswith("Environment="):
            assignment = line[len("Environment=") :].strip('"')
            assert assignment in shown_env, f"{assignment} missing from systemd's Environment"
    shown_exec = host.run(f"systemctl show -p ExecStart --value {unit_name}.service").stdout
    exec_words = rendered.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0].replace("\\\n", " ").split()
    for word in exec_words:
        if word.startswith("--"):
            assert f" {word}" in shown_exec, f"{word} missing from systemd's ExecStart"


def test_jit_caches_on_the_kept_disk_are_the_services_and_writable_by_the_unit(
    host, rendered_dir: Path, unit_name: str, service_user: str
) -> None:
    """With a kept disk (sglang_common_cache_root) every JIT cache variable of the unit names a directory
    under <root>/current, root's link to this stack's <root>/<key>: the role makes the key's directory, the
    service's alone (0700); the unit's ExecStartPre= makes the caches in it as the service, at each start, so
    a host whose server never started (the rehearsal: no GPU) has none yet (src/sglang_deploy/serving/jitcache.py)."""
    rendered = (rendered_dir / f"{unit_name}.service").read_text()
    caches = dict(re.findall(r'^Environment="(' + "|".join(jitcache.CACHE_VARIABLES) + r')=([^"]+)"$', rendered, re.M))
    if not caches:
        pytest.skip("no kept disk here (sglang_common_cache_root is empty): the caches stay in the home")
    assert set(caches) == set(jitcache.CACHE_VARIABLES)
    links = {str(Path(path).parent) for path in caches.values()}
    assert len(links) == 1 and links.pop().endswith(f"/{jitcache.LINK}"), caches
    link = host.file(str(Path(next(iter(caches.values()))).parent))
    root = str(Path(link.path).parent)
    # The link's own owner (testinfra's File.user follows it to the directory).
    assert link.is_symlink and host.check_output(f"stat -c %U:%G {link.path}") == "root:root"
    assert re.fullmatch(r"[0-9a-f]{16}", link.linked_to.rsplit("/", 1)[-1]), link.linked_to
    assert host.file(root).user == "root"
    writable = host.run(f"systemctl show -p ReadWritePaths --value {unit_name}.service").stdout.split()
    assert root in writable, writable
    key_dir = host.file(link.linked_to)
    assert key_dir.is_directory and (key_dir.user, key_dir.mode) == (service_user, 0o700), link.linked_to
    mkdir = f"ExecStartPre={jitcache.MKDIR} -p -m 0700 "
    made_at_start = [sorted(line[len(mkdir) :].split()) for line in rendered.splitlines() if line.startswith(mkdir)]
    assert made_at_start == [sorted(set(caches.values()))], made_at_start
    assert host.run(f"runuser -u {service_user} -- test -w {link.linked_to}").rc == 0  # it can make them
    for path in caches.values():
        directory = host.file(path)
        if directory.exists:  # made by a start
            assert directory.is_directory and (directory.user, directory.mode) == (service_user, 0o700), path


def test_tls_files_are_readable_by_the_service_and_nobody_else(host, rendered_dir: Path, unit_name: str, service_user: str) -> None:
    """With TLS (sglang_server_tls_*) the unit names the certificate, key and CA the role installed: the
    directory and key root's, readable by the service's group only (0750, 0640), the certificate and CA
    public; the service can read each, another user cannot read the key (roles/sglang_server/tasks/tls.yml).
    Without TLS the unit names none of them (no half of a TLS setup)."""
    flag_words, _ = sglang_launcher.split_command_line(systemd.exec_start_argv((rendered_dir / f"{unit_name}.service").read_text()))
    flags = unit_flags.flags_from_argv(flag_words)
    if not unit_flags.serves_tls(flags):
        assert not {"ssl-certfile", "ssl-keyfile", "ssl-ca-certs", "ssl-keyfile-password"} & set(flags), flags
        return
    group = host.user(service_user).group
    key, cert, ca = (host.file(str(flags[name])) for name in ("ssl-keyfile", "ssl-certfile", "ssl-ca-certs"))
    directory = host.file(str(Path(key.path).parent))
    assert (directory.user, directory.group, directory.mode) == ("root", group, 0o750)
    assert (key.user, key.group, key.mode) == ("root", group, 0o640)
    for public in (cert, ca):
        assert (public.user, public.group, public.mode) == ("root", group, 0o644), public.path
    for path in (key.path, cert.path, ca.path):
        assert host.run(f"runuser -u {service_user} -- test -r {path}").rc == 0, f"{service_user} cannot read {path}"
    assert host.run(f"runuser -u nobody -- test -r {key.path}").rc != 0, f"{key.path} is readable by other users"
