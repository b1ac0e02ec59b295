"""The nvidia_driver role's result: NVIDIA's repository signed-by its key, the open-module driver of
one branch installed, pinned and held, nouveau blacklisted, nvidia-persistenced enabled.

Used by molecule/nvidia_cuda (local signed mirror, stand-in packages of the real names) and by
playbooks/verify.yml on a real host. SGLANG_DEPLOY_NVIDIA_REPO_URI, when set, is the repository
URI the source must name (the scenario's mirror); otherwise the source's own URI is checked.
"""

from __future__ import annotations

import os
import re

import pytest

REPO_NAME = os.environ.get("SGLANG_DEPLOY_NVIDIA_REPO_NAME", "nvidia-cuda")
SOURCES = f"/etc/apt/sources.list.d/{REPO_NAME}.sources"
PIN_FILE = "/etc/apt/preferences.d/nvidia-driver-branch.pref"
# The packages a driver branch consists of (same list as roles/nvidia_driver/vars/main.yml).
BRANCH_PACKAGE = re.compile(
    r"^(nvidia-\S+|libnvidia-\S+|libcuda1|libnvcuvid1|libnvoptix1|libxnvctrl\S*|cuda-drivers\S*"
    r"|firmware-nvidia-gsp|xserver-xorg-video-nvidia)$"
)


def deb822(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
        if match:
            fields[match.group(1)] = match.group(2).strip()
    return fields


@pytest.fixture(scope="module")
def source(host) -> dict[str, str]:  # type: ignore[no-untyped-def]
    file = host.file(SOURCES)
    assert file.exists, f"{SOURCES} is missing"
    return deb822(file.content_string)


@pytest.fixture(scope="module")
def branch(host) -> str:  # type: ignore[no-untyped-def]
    match = re.search(r"^Pin: version (\d+)\.\*$", host.file(PIN_FILE).content_string, re.MULTILINE)
    assert match, f"{PIN_FILE} has no 'Pin: version <branch>.*' line"
    return match.group(1)


@pytest.fixture(scope="module")
def installed(host) -> dict[str, str]:  # type: ignore[no-untyped-def]
    out = host.check_output(r"dpkg-query -W -f='${db:Status-Status}\t${Package}\t${Version}\n'")
    return {name: version for status, name, version in (l.split("\t") for l in out.splitlines()) if status == "installed"}


def test_source_is_signed_by_its_keyring(host, source):
    assert source.get("Types") == "deb"
    assert source.get("Suites") == "/", "NVIDIA's repositories are flat ('/' suite)"
    expected_uri = os.environ.get("SGLANG_DEPLOY_NVIDIA_REPO_URI")
    if expected_uri:
        assert source.get("URIs") == expected_uri
    keyring = source.get("Signed-By", "")
    assert keyring.startswith("/"), f"Signed-By must name a keyring file, got {keyring!r}"
    key = host.file(keyring)
    assert key.exists and key.user == "root" and not key.mode & 0o022
    assert key.content_string.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


def test_apt_accepted_the_signed_index(host, source):
    # apt keeps a repository's InRelease, marks its indexes Trusted and lists the repository in its
    # policy only after the signature checked out against Signed-By.
    uri = source["URIs"]
    blocks = [deb822(b) for b in host.check_output("apt-get indextargets").split("\n\n")]
    packages = [b for b in blocks if b.get("Repo-URI") == uri and b.get("Created-By") == "Packages"]
    assert packages, f"apt has no Packages index for {uri}"
    for block in packages:
        assert block.get("Trusted") == "yes", block
        in_release = re.sub(r"Packages$", "InRelease", block["Filename"])
        assert host.file(in_release).exists, f"{in_release} is missing"
    assert f"{uri.rstrip('/')}  Packages" in host.check_output("apt-cache policy")


def test_branch_pin(host, branch):
    text = host.file(PIN_FILE).content_string
    assert "Pin-Priority: 1000" in text
    assert int(branch) >= 580


def test_open_module_driver_installed_on_the_branch(installed, branch):
    driver = {n: v for n, v in installed.items() if BRANCH_PACKAGE.match(n)}
    assert any("open" in n for n in driver), f"no open-kernel-module package installed: {sorted(driver)}"
    off_branch = {n: v for n, v in driver.items() if not re.match(rf"^(\d+:)?{branch}\.", v)}
    # Other NVIDIA tools (e.g. nvidia-container-toolkit) have their own versions; driver packages do not.
    off_branch = {n: v for n, v in off_branch.items() if not n.startswith("nvidia-container")}
    assert not off_branch, f"driver packages off branch {branch}: {off_branch}"


def test_candidate_stays_on_the_branch(host, installed, branch):
    opened = sorted(n for n in installed if BRANCH_PACKAGE.match(n) and "open" in n)
    policy = host.check_output(f"apt-cache policy {opened[0]}")
    candidate = re.search(r"Candidate: (\S+)", policy)
    assert candidate and re.match(rf"^(\d+:)?{branch}\.", candidate.group(1)), policy


def test_driver_packages_held(host, installed, branch):
    of_branch = sorted(n for n, v in installed.items() if BRANCH_PACKAGE.match(n) and re.match(rf"^(\d+:)?{branch}\.", v))
    assert of_branch
    selections = dict(l.split() for l in host.check_output(f"dpkg --get-selections {' '.join(of_branch)}").splitlines())
    assert {n: selections.get(n) for n in of_branch} == {n: "hold" for n in of_branch}


def test_nouveau_blacklisted(host):
    out = host.run("grep -hE '^[[:space:]]*blacklist[[:space:]]+nouveau[[:space:]]*$' /etc/modprobe.d/*.conf")
    assert out.rc == 0 and out.stdout.strip(), "no 'blacklist nouveau' in /etc/modprobe.d"


def test_persistence_daemon_enabled(host):
    unit = host.service("nvidia-persistenced.service")
    assert unit.is_enabled
    exec_start = host.check_output("systemctl show -p ExecStart --value nvidia-persistenced.service")
    path = re.search(r"path=(\S+)", exec_start)
    assert path and host.file(path.group(1)).is_file and host.file(path.group(1)).mode & 0o111
