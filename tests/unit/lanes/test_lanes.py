"""Stack lanes are data: the shipped lane files, their checked values, and the loader's errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_deploy.lanes import catalog
from sglang_deploy.lanes.catalog import DEFAULT_LANE, LaneError, lane_names, load_lane

CU128 = """\
name: cu128
cuda: "12.8"
sglang: "0.5.10.post1"
torch: "2.9.1"
sglang_kernel: "0.4.1"
transformers: "5.3.0"
required_archs: ["sm_120"]
validator:
  torch: "torch==2.9.1"
  torch_index: ""
  packages: ["triton==3.5.1"]
  stand_ins: []
"""


@pytest.fixture
def lane_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the loader at a scratch lane directory."""
    monkeypatch.setattr(catalog, "_lane_dir", lambda: tmp_path)
    return tmp_path


def test_shipped_lanes() -> None:
    assert lane_names() == ["cu128", "cu130"]
    assert DEFAULT_LANE in lane_names()


@pytest.mark.parametrize(
    ("name", "pins", "cuda"),
    [
        ("cu128", ("0.5.10.post1", "2.9.1", "0.4.1", "5.3.0"), "12.8"),
        ("cu130", ("0.5.23", "2.14.1", "0.4.10", "5.19.0"), "13.0"),
    ],
)
def test_lane_matches_pypi_metadata_of_its_sglang(name: str, pins: tuple[str, ...], cuda: str) -> None:
    lane = load_lane(name)
    assert (lane.sglang, lane.torch, lane.sglang_kernel, lane.transformers) == pins
    assert lane.cuda == cuda


def test_cu128_requires_sm_120_cubins() -> None:
    assert load_lane("cu128").required_archs == ("sm_120",)


@pytest.mark.parametrize("name", lane_names())
def test_validator_spec_follows_the_lane(name: str) -> None:
    """The validator's default torch is the lane's (CPU build); triton is a hard import of sglang."""
    lane = load_lane(name)
    assert lane.validator.torch == f"torch=={lane.torch}"
    assert lane.validator.torch_index == "https://download.pytorch.org/whl/cpu"
    assert any(p.startswith("triton==") for p in lane.validator.packages)
    assert not any(p.split("=")[0] in {"torch", "sglang"} for p in lane.validator.packages)


def test_unknown_lane_lists_the_known_ones() -> None:
    with pytest.raises(LaneError, match=r"unknown lane 'cu999'; known lanes: cu128, cu130"):
        load_lane("cu999")


def test_a_new_file_is_a_new_lane(lane_dir: Path) -> None:
    (lane_dir / "cu128.yml").write_text(CU128)
    (lane_dir / "cu999.yml").write_text(CU128.replace("name: cu128", "name: cu999"))
    assert lane_names() == ["cu128", "cu999"]
    assert load_lane("cu999").validator.packages == ("triton==3.5.1",)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (CU128.replace('cuda: "12.8"', "cuda: 12.8"), r"cuda must be a quoted string, got float"),
        (
            CU128.replace("transformers:", "transformer:"),
            r"missing transformers; unknown transformer",
        ),
        (CU128.replace("  stand_ins: []\n", ""), r"validator: missing stand_ins"),
        (CU128.replace('["sm_120"]', '"sm_120"'), r"required_archs must be a list of strings"),
        (CU128.replace("name: cu128", "name: cu12"), r"name is 'cu12', expected 'cu128'"),
        ("- just a list\n", r"expected a mapping, got list"),
    ],
)
def test_malformed_lane_files_name_file_and_key(lane_dir: Path, text: str, error: str) -> None:
    (lane_dir / "cu128.yml").write_text(text)
    with pytest.raises(LaneError, match=rf"lanes/cu128\.yml.*{error}"):
        load_lane("cu128")
