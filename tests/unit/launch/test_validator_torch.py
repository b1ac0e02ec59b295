"""Where the flag validator's CPU torch comes from: the ordered torch sources.

Discovery runs against a temporary pip configuration (PIP_CONFIG_FILE, every other PIP_* variable
removed) with find-links directories of empty files named like wheels, a file:// simple index and
a real HTTP server on 127.0.0.1 as the lane's CPU index; the real `pip config list` reads it and
the real pip fails in the all-sources test. The slow test builds the cu128 validator in a fresh
cache with no SGLANG_DEPLOY_VALIDATOR_TORCH* variable set (about 1-2 minutes).
"""

from __future__ import annotations

import functools
import http.server
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sglang_deploy.lanes.catalog import Lane, load_lane
from sglang_deploy.launch.validator_venv import (
    ENV_TORCH,
    ENV_TORCH_INDEX,
    BuildSpec,
    TorchSource,
    ValidatorError,
    build_spec,
    ensure_validator_env,
    torch_source,
    torch_sources,
)

PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"
OTHER_PY = f"cp{sys.version_info[0]}{sys.version_info[1] + 1}"
ARCH = platform.machine()
OTHER_ARCH = "aarch64" if ARCH != "aarch64" else "x86_64"
PYPI_LABEL = (
    "PyPI's build of torch==2.9.1 through pip's own configuration "
    "(the last resort: a CUDA build, several GB of nvidia-* wheels)"
)


def wheel(version: str, python: str = PY, arch: str = ARCH, name: str = "torch") -> str:
    return f"{name}-{version}-{python}-{python}-manylinux_2_28_{arch}.whl"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def pip_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Writes pip's only configuration file: PIP_CONFIG_FILE (then pip skips the user's own) and
    no PIP_* variable of this machine (PIP_FIND_LINKS ...), nor a validator override."""
    for name in list(os.environ):
        if name.startswith("PIP_") or name in (ENV_TORCH, ENV_TORCH_INDEX):
            monkeypatch.delenv(name)
    conf = tmp_path / "pip.conf"
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    conf.write_text("", encoding="utf-8")
    return lambda text: conf.write_text(text, encoding="utf-8")


@pytest.fixture
def cpu_index(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 with a torch page: a reachable lane CPU index."""
    root = tmp_path / "www"
    (root / "cpu" / "torch").mkdir(parents=True)
    (root / "cpu" / "torch" / "index.html").write_text(
        f'<a href="{wheel("2.9.1+cpu")}">{wheel("2.9.1+cpu")}</a>', encoding="utf-8"
    )
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/cpu"
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_index() -> str:
    """An index URL on a 127.0.0.1 port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/cpu"


@pytest.fixture(scope="module")
def cu128() -> Lane:
    return load_lane("cu128")


def spec_with_index(lane: Lane, index: str) -> BuildSpec:
    """The lane's spec (no override) with ``index`` as the lane's CPU index ("" = none)."""
    return build_spec(replace(lane, validator=replace(lane.validator, torch_index=index)), {})


def find_links(directory: Path, *names: str) -> Path:
    directory.mkdir()
    for name in names:
        (directory / name).touch()
    return directory


def test_reachable_lane_index_first_then_the_lanes_cpu_wheel_then_pypi(
    cu128: Lane, tmp_path: Path, pip_conf: Callable[[str], None], cpu_index: str
) -> None:
    wheels = find_links(
        tmp_path / "wheels",
        wheel("2.13.0+cpu"),  # newer, but the lane pins 2.9.1
        wheel("2.9.1+cpu"),
        wheel("2.9.1+cpu", python=OTHER_PY),
        wheel("2.9.1+cpu", arch=OTHER_ARCH),
        wheel("2.9.1"),  # PyPI's CUDA build
        wheel("2.9.1+cu128"),
        wheel("0.24.1+cpu", name="torchvision"),
        "README.txt",
    )
    pip_conf(f"[global]\nfind-links = {wheels}\n")
    assert torch_sources(spec_with_index(cu128, cpu_index), sys.executable) == [
        TorchSource(
            f"the lane's CPU index {cpu_index}", ("--index-url", cpu_index, "torch==2.9.1")
        ),
        TorchSource(
            f"the CPU wheel {wheels / wheel('2.9.1+cpu')} in pip's find-links {wheels}",
            (str(wheels / wheel("2.9.1+cpu")),),
        ),
        TorchSource(PYPI_LABEL, ("torch==2.9.1",)),
    ]


def test_unreachable_lane_index_is_skipped_and_the_newest_cpu_wheel_is_next(
    cu128: Lane, tmp_path: Path, pip_conf: Callable[[str], None], closed_index: str
) -> None:
    """No wheel has the lane's version: the newest fitting one, here on a file:// simple index
    (relative links, as a PEP 503 mirror writes them) named in the install section."""
    wheels = find_links(tmp_path / "wheels", wheel("2.12.0+cpu"), wheel("2.12.1"))
    page = tmp_path / "simple" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    links = [wheel("2.13.0+cpu").replace("+", "%2B"), wheel("2.14.0+cpu", python=OTHER_PY)]
    page.write_text(
        "".join(f'<a href="../../files/{name}#sha256=00">{name}</a>\n' for name in links),
        encoding="utf-8",
    )
    index = (tmp_path / "simple").as_uri()
    pip_conf(f"[global]\nfind-links = {wheels}\n[install]\nextra-index-url = {index}\n")
    started = time.monotonic()
    spec = spec_with_index(cu128, closed_index)
    lane_index, cpu_wheel, pypi = torch_sources(spec, sys.executable)
    assert time.monotonic() - started < 5
    assert lane_index.label == f"the lane's CPU index {closed_index}"
    assert (
        lane_index.skipped == f"cannot read {closed_index}/torch/ ([Errno 111] Connection refused)"
    )
    newest = tmp_path / "files" / wheel("2.13.0+cpu")
    assert cpu_wheel == TorchSource(
        f"the CPU wheel {newest} in pip's index {index}", (str(newest),)
    )
    assert pypi == TorchSource(PYPI_LABEL, ("torch==2.9.1",))


def test_an_unresolvable_lane_index_is_skipped_within_seconds(
    cu128: Lane, tmp_path: Path, pip_conf: Callable[[str], None]
) -> None:
    spec = spec_with_index(cu128, "http://torch-index.invalid/cpu")
    started = time.monotonic()
    first = torch_sources(spec, sys.executable)[0]
    assert time.monotonic() - started < 10
    assert first.skipped is not None
    assert first.skipped.startswith("cannot read http://torch-index.invalid/cpu/torch/ (")


def test_pip_find_links_variable_wins_over_the_file_as_in_pip(
    cu128: Lane, tmp_path: Path, pip_conf: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    in_file = find_links(tmp_path / "file-links", wheel("2.9.1+cpu"))
    in_env = find_links(tmp_path / "env-links", wheel("2.10.0+cpu"))
    pip_conf(f"[global]\nfind-links = {in_file}\n")
    monkeypatch.setenv("PIP_FIND_LINKS", str(in_env))
    cpu_wheel, _ = torch_sources(spec_with_index(cu128, ""), sys.executable)
    assert cpu_wheel.pip_args == (str(in_env / wheel("2.10.0+cpu")),)


def test_no_fitting_wheel_names_where_it_looked(
    cu128: Lane, tmp_path: Path, pip_conf: Callable[[str], None]
) -> None:
    wheels = find_links(tmp_path / "wheels", wheel("2.9.1+cpu", python=OTHER_PY))
    missing = tmp_path / "missing"
    pip_conf(f"[global]\nfind-links = {wheels} {missing}\n")
    cpu_wheel, _ = torch_sources(spec_with_index(cu128, ""), sys.executable)
    assert cpu_wheel.label == "a CPU torch wheel in pip's find-links and indexes"
    assert cpu_wheel.skipped == (
        f"none for Python {sys.version_info[0]}.{sys.version_info[1]} ({PY}) on {ARCH} in "
        f"{wheels}, {missing} ([Errno 2] No such file or directory: '{missing}')"
    )


def test_an_explicit_torch_is_the_only_source(cu128: Lane) -> None:
    spec = build_spec(cu128, {ENV_TORCH: "torch==2.13.0+cpu"})
    assert torch_sources(spec, sys.executable) == [
        TorchSource(
            "torch==2.13.0+cpu from pip's own configuration "
            f"(set by {ENV_TORCH} / {ENV_TORCH_INDEX})",
            ("torch==2.13.0+cpu",),
        )
    ]


def test_all_sources_failing_lists_every_attempt_and_the_fix(
    cu128: Lane, tmp_path: Path, pip_conf: Callable[[str], None], closed_index: str
) -> None:
    """The real pip fails at once: its only index is an empty local one."""
    empty = find_links(tmp_path / "wheels")
    (tmp_path / "simple").mkdir()
    pip_conf(f"[global]\nfind-links = {empty}\nindex-url = {(tmp_path / 'simple').as_uri()}\n")
    lane = replace(cu128, validator=replace(cu128.validator, torch_index=closed_index))
    cache = tmp_path / "cache"
    with pytest.raises(ValidatorError) as failed:
        ensure_validator_env(lane, cache)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    lines = str(failed.value).splitlines()
    assert lines[0] == (
        f"building the flag validator failed: no torch source worked for Python {python} on {ARCH}:"
    )
    assert lines[1] == (
        f"  1. the lane's CPU index {closed_index}: cannot read {closed_index}/torch/ "
        "([Errno 111] Connection refused)"
    )
    assert lines[2].startswith(
        f"  2. a CPU torch wheel in pip's find-links and indexes: none for Python {python} ({PY})"
    )
    assert lines[3].startswith(f"  3. {PYPI_LABEL}: pip failed (exit 1): ERROR: ")
    assert "torch==2.9.1" in lines[3]
    assert lines[4].startswith(f"Fix: put a CPU torch wheel for Python {python} on {ARCH}")
    assert "`pip config set global.find-links DIR`" in lines[4] and ENV_TORCH in lines[4]
    assert [p.name for p in (cache / "validators").iterdir()] == [
        f"sglang-{cu128.sglang}-py{python}.lock"
    ]


@pytest.mark.slow
def test_a_cold_build_finds_a_torch_by_itself(
    cu128: Lane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's promise: no variable set, a fresh cache, this machine's own pip configuration
    (CI's image: the PyTorch index unreachable, a CPU wheel in pip's find-links)."""
    monkeypatch.delenv(ENV_TORCH, raising=False)
    monkeypatch.delenv(ENV_TORCH_INDEX, raising=False)
    spec = build_spec(cu128, os.environ)
    expected = next(s for s in torch_sources(spec, sys.executable) if s.skipped is None)
    env = ensure_validator_env(cu128, tmp_path)
    assert torch_source(env) == expected.label
    assert ensure_validator_env(cu128, tmp_path) == env  # reused: the marker matches
