"""CUDA toolkit versions: names, paths and what an installed toolkit says about itself.

The cuda_toolkit role installs toolkits side by side as NVIDIA's packages lay them out
(``cuda-toolkit-12-8`` -> ``/usr/local/cuda-12.8``) and then checks that each one reports the
release it was installed as. A toolkit speaks in three places: ``nvcc --version`` (a real host),
``ptxas --version`` (same banner, also shipped in the PyPI wheels) and ``version.json`` at the
toolkit root. This module parses all three; the role only feeds it command output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# A toolkit release as the role takes it: major.minor, e.g. "12.8".
_RELEASE = re.compile(r"^(\d+)\.(\d+)$")
# nvcc/ptxas banner line: "Cuda compilation tools, release 12.8, V12.8.93".
_BANNER = re.compile(r"Cuda compilation tools, release (\d+\.\d+), V(\d+\.\d+\.\d+)")
_DOTTED = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)*$")


class CudaVersionError(ValueError):
    """A version string or a tool's output that does not say what it should."""


def release(version: object) -> str:
    """Validate a toolkit release ("12.8") and return it normalised (no leading zeros).

    Only strings: YAML reads an unquoted 12.10 as the float 12.1, so a number is refused.
    """
    match = _RELEASE.match(version.strip()) if isinstance(version, str) else None
    if not match:
        raise CudaVersionError(
            f"{version!r} is not a CUDA toolkit release; write major.minor as a quoted string, e.g. \"12.8\""
        )
    return f"{int(match.group(1))}.{int(match.group(2))}"


def package_name(version: object) -> str:
    """NVIDIA's apt package of a toolkit release: "12.8" -> "cuda-toolkit-12-8"."""
    return "cuda-toolkit-" + release(version).replace(".", "-")


def package_suffix(version: object) -> str:
    """The "-12-8" that NVIDIA's per-release package names end with."""
    return release(version).replace(".", "-")


def home(version: object, prefix: str = "/usr/local") -> str:
    """Install root of a release: "12.8" -> "/usr/local/cuda-12.8" (CUDA_HOME for that release)."""
    return f"{prefix.rstrip('/')}/cuda-{release(version)}"


def release_of(dotted: str) -> str:
    """"12.8.93" or "12.8.1" -> "12.8"."""
    match = _DOTTED.match(str(dotted).strip())
    if not match:
        raise CudaVersionError(f"{dotted!r} is not a dotted version")
    return f"{int(match.group(1))}.{int(match.group(2))}"


@dataclass(frozen=True)
class ToolVersion:
    """What an nvcc/ptxas banner says: release "12.8" and full version "12.8.93"."""

    release: str
    version: str


def parse_banner(text: str, tool: str = "nvcc") -> ToolVersion:
    """Parse ``nvcc --version`` or ``ptxas --version`` output."""
    match = _BANNER.search(text or "")
    if not match:
        first = (text or "").strip().splitlines()[:1]
        raise CudaVersionError(
            f"{tool} --version printed no 'Cuda compilation tools, release X.Y, VX.Y.Z' line"
            f" (first line: {first[0] if first else '<empty>'!r})"
        )
    return ToolVersion(release=release(match.group(1)), version=match.group(2))


def parse_version_json(text: str) -> ToolVersion:
    """Parse a toolkit's ``version.json``: its "cuda" entry is the toolkit's own version."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as err:
        raise CudaVersionError(f"version.json is not JSON: {err}") from None
    entry = data.get("cuda") if isinstance(data, dict) else None
    version = entry.get("version") if isinstance(entry, dict) else None
    if not isinstance(version, str):
        raise CudaVersionError('version.json has no "cuda": {"version": ...} entry')
    return ToolVersion(release=release_of(version), version=version)


@dataclass
class ToolkitReport:
    """The outcome of checking one installed release against what it reports."""

    expected: str
    home: str
    sources: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.sources)

    def to_dict(self) -> dict[str, Any]:
        return {
            "expected": self.expected,
            "home": self.home,
            "sources": dict(self.sources),
            "problems": list(self.problems),
            "ok": self.ok,
        }


def check_toolkit(
    expected: object,
    *,
    prefix: str = "/usr/local",
    version_json: str | None = None,
    ptxas: str | None = None,
    nvcc: str | None = None,
) -> ToolkitReport:
    """Check that every source a toolkit has reports ``expected``.

    ``nvcc`` is authoritative where it exists (a real install). Without it (NVIDIA's wheels, the
    CI mirror) both ``version.json`` and ``ptxas`` must be present and agree: one alone could be a
    leftover of another release.
    """
    want = release(expected)
    report = ToolkitReport(expected=want, home=home(want, prefix))
    parsed: dict[str, ToolVersion] = {}
    for name, text, parse in (
        ("nvcc", nvcc, lambda t: parse_banner(t, "nvcc")),
        ("ptxas", ptxas, lambda t: parse_banner(t, "ptxas")),
        ("version.json", version_json, parse_version_json),
    ):
        if text is None:
            continue
        try:
            parsed[name] = parse(text)
        except CudaVersionError as err:
            report.problems.append(f"{report.home}: {err}")
    for name, tool in parsed.items():
        report.sources[name] = tool.version
        if tool.release != want:
            report.problems.append(f"{report.home}: {name} reports {tool.version} (release {tool.release}), not {want}")
    if "nvcc" not in parsed and not {"ptxas", "version.json"} <= parsed.keys():
        missing = sorted({"ptxas", "version.json"} - parsed.keys())
        report.problems.append(
            f"{report.home}: no bin/nvcc, and without it both bin/ptxas and version.json are needed;"
            f" missing or unreadable: {', '.join(missing)}"
        )
    return report
