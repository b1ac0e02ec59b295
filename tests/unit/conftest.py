"""Shared fixtures: the repository root and the seed 004 profile as the inventory holds it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from seed_004 import (  # noqa: E402,F401  (re-exported for tests)
    PROFILE_ADDED_ENV,
    SEED_004_ENV,
    SEED_004_FLAGS,
    profile_flags,
)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "inventory" / "proxmox" / "group_vars" / "sglang_servers" / "sglang_server.yml"


@pytest.fixture(scope="session")
def profile() -> dict[str, Any]:
    return yaml.safe_load(PROFILE.read_text())
