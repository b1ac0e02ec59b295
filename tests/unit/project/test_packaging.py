"""The package builds without setuptools' warnings (scripts/setup printed 40 lines of them) and the
wheel carries every data file the CLI reads at run time."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT


def test_the_wheel_builds_quietly_with_its_data_files(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "warning" not in output.lower(), output
    (wheel,) = tmp_path.glob("sglang_deploy-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = [
        *(f"sglang_deploy/{p.relative_to(ROOT / 'src' / 'sglang_deploy')}" for p in (ROOT / "src" / "sglang_deploy").rglob("*")
          if p.suffix in {".yml", ".txt", ".json"} and "__pycache__" not in p.parts),
        *(f"sglang_deploy_host/{p.relative_to(ROOT / 'module_utils' / 'sglang_deploy_host')}"
          for p in (ROOT / "module_utils" / "sglang_deploy_host").rglob("*.yml")),
    ]  # fmt: skip
    assert wanted and not [name for name in wanted if name not in names]
