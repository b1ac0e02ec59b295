"""The flag table: typed rows, each lane's spelling, a flag a lane lacks refused naming the flag, the lane and the choice."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from sglang_deploy.lanes.catalog import lane_names, load_lane
from sglang_deploy.launch import flagtable
from sglang_deploy.launch.config import LaunchConfig, LaunchConfigError, merge_flags, profile_flags
from sglang_deploy.launch.flagtable import FlagSpec, FlagTableError, LaunchSettings, SecretRef, parse_table, table
from sglang_deploy_host.serving import unit_flags

PY = "/opt/sglang-deploy/ml-env/bin/python3"


def launch(flags: dict[str, Any], lane: str = "cu128") -> LaunchConfig:
    return LaunchConfig.from_vars(flags, python=PY, lane=lane, secret_env_names=["K"])


def test_every_row_is_a_typed_field_and_every_field_a_row() -> None:
    rows = {spec.field for spec in table().specs}
    assert rows == flagtable.SETTINGS_FIELDS


def test_the_secret_rows_are_the_servers_secret_flags_the_host_masks() -> None:
    """The host's launcher and the exposure rule read unit_flags.SECRET_FLAGS (stdlib-only host code); the table's
    secret rows are sglang's of them."""
    secrets = {spec.name for spec in table().specs if spec.type == "secret"}
    assert secrets == {"api-key", "admin-api-key", "ssl-keyfile-password"}
    assert secrets <= unit_flags.SECRET_FLAGS


def test_every_recorded_choice_list_belongs_to_a_choice_row_in_its_lane_spelling() -> None:
    for name in lane_names():
        lane = load_lane(name)
        for flag, _choices in lane.choices:
            spec = table().spec(flag)
            assert spec is not None and spec.type == "choice", (name, flag)
            assert spec.spelling(name) == flag, (name, flag)


@pytest.mark.parametrize(
    ("written", "lane", "rendered"),
    [
        ("nsa-prefill-backend", "cu128", "nsa-prefill-backend"),
        ("nsa-prefill-backend", "cu130", "dsa-prefill-backend"),
        ("dsa_decode_backend", "cu128", "nsa-decode-backend"),
        ("--dsa-decode-backend", "cu130", "dsa-decode-backend"),
        ("cuda-graph-max-bs", "cu130", "cuda-graph-max-bs-decode"),
        ("cuda-graph-max-bs-decode", "cu128", "cuda-graph-max-bs"),
        ("cuda-graph-bs", "cu130", "cuda-graph-bs-decode"),
        ("disable-piecewise-cuda-graph", "cu130", "disable-prefill-cuda-graph"),
        ("tp", "cu130", "tp-size"),  # an abbreviation is rendered in full
        ("tensor-parallel-size", "cu130", "tensor-parallel-size"),  # an alias as written
        ("model", "cu130", "model"),
        ("some-new-flag", "cu130", "some-new-flag"),  # not in the table: as written, the parser judges it
    ],
)
def test_a_flag_is_rendered_in_the_lanes_spelling(written: str, lane: str, rendered: str) -> None:
    value: Any = [1, 2] if "bs" in written and "max" not in written else (True if "disable" in written else "8")
    config = launch({written: value}, lane)
    assert [flag.name for flag in config.flags] == [rendered]
    assert config.lane == lane and config.to_dict()["lane"] == lane


def test_a_flag_the_lane_lacks_is_refused_naming_the_flag_the_lane_and_the_choice() -> None:
    assert launch({"enable-nan-detection": True}, "cu128").settings.enable_nan_detection
    with pytest.raises(LaunchConfigError) as err:
        launch({"enable-nan-detection": True}, "cu130")
    message = str(err.value)
    assert message.startswith("sglang_server_flags['enable-nan-detection']: lane cu130's sglang has no --enable-nan-detection")
    assert "Fix: remove it (null in the profile or sglang_server_flags_override)" in message
    assert "SGLANG_ENABLE_NAN_LOGITS_CHECK=1" in message
    # Left out (null), it is no flag at all.
    assert launch({"enable-nan-detection": None}, "cu130").flags == ()


def test_settings_are_typed_and_name_the_flag_as_rendered() -> None:
    config = launch(
        {"tp": 8, "mem-fraction-static": "0.85", "nsa-decode-backend": "trtllm", "cuda-graph-bs": [1, 2, 64],
         "disable-cuda-graph": True, "api-key": {"env": "K"}, "port": "9000"}, "cu130",
    )  # fmt: skip
    settings = config.settings
    assert settings.tp_size == 8 and settings.tp == 8 and settings.mem_fraction_static == 0.85
    assert settings.dsa_decode_backend == "trtllm" and settings.cuda_graph_bs == (1, 2, 64)
    assert settings.disable_cuda_graph is True and settings.api_key == SecretRef("K") and settings.port == 9000
    assert settings.name_of("dsa_decode_backend") == "dsa-decode-backend"
    assert settings.name_of("tp_size") == "tp-size"
    # Unset: the table's spelling in the lane.
    assert settings.name_of("cuda_graph_max_bs") == "cuda-graph-max-bs-decode"
    assert launch({}, "cu128").settings.name_of("cuda_graph_max_bs") == "cuda-graph-max-bs"
    assert LaunchSettings().tp == 1 and not LaunchSettings(mem_fraction_static=0.9).fraction_is_placeholder
    assert LaunchSettings(mem_fraction_static="auto").fraction_is_placeholder


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"tp-size": "eight"}, "sglang_server_flags['tp-size'] = 'eight' is not an integer"),
        ({"tp-size": 0}, "sglang_server_flags['tp-size'] = '0' is out of bounds: want an integer >= 1. Fix:"),
        ({"tp-size": 1}, None),
        ({"port": 65536}, "is out of bounds: want a TCP port, 1-65535"),
        ({"port": 65535}, None),
        ({"chunked-prefill-size": -1}, None),
        ({"chunked-prefill-size": 1}, None),
        ({"chunked-prefill-size": 0}, "is out of bounds: want a token count >= 1, or -1 (no chunking)"),
        ({"chunked-prefill-size": -2}, "is out of bounds"),
        ({"mem-fraction-static": 0}, "is out of bounds: want a fraction between 0 and 1 (or auto)"),
        ({"mem-fraction-static": 0.99}, None),
        ({"mem-fraction-static": 1}, "is out of bounds"),
        ({"mem-fraction-static": "nan"}, "is not a number. Fix: a number or 'auto'"),
        ({"mem-fraction-static": "most"}, "is not a number"),
        ({"mem-fraction-static": "auto"}, None),
        ({"max-running-requests": "{{ n }}"}, "is a Jinja template nothing evaluated here"),
        ({"model": "{{ sglang_common_model_dir }}"}, None),  # a path as written; Ansible templates it
        ({"cuda-graph-bs": [1, "x"]}, "['cuda-graph-bs'] = 'x' is not an integer"),
        ({"enable-metrics": "yes"}, "it is a bare switch. Fix: true to set it"),
        ({"tp-size": True}, "is true, but it takes a value (int)"),
        ({"tp-size": [8, 8]}, "is a list, but it takes one value (int)"),
        ({"tp-size": {"env": "HOST"}}, "reads ${HOST}, but the planner and the lane's rules need its value here"),
        ({"host": {"env": "HOST"}}, None),  # a text read at start: nothing here reads it
    ],
)
def test_a_value_of_the_wrong_type_or_out_of_bounds_is_refused(flags: dict[str, Any], message: str | None) -> None:
    env = {"HOST": "x"}
    if message is None:
        LaunchConfig.from_vars(flags, python=PY, env=env)
        return
    with pytest.raises(LaunchConfigError) as err:
        LaunchConfig.from_vars(flags, python=PY, env=env)
    assert message in str(err.value)


def test_an_override_replaces_a_flag_in_any_spelling_in_place() -> None:
    merged = merge_flags({"tp-size": 8, "nsa-prefill-backend": "trtllm", "port": 1}, {"dsa-prefill-backend": "x", "tp_size": 4})
    assert list(merged) == ["tp_size", "dsa-prefill-backend", "port"] and merged["tp_size"] == 4
    assert list(merge_flags({"tp-size": 8}, {"tp": 4, "tp_size": 8})) == ["tp", "tp_size"]  # replaced once
    # Within one mapping two spellings stay a conflict.
    with pytest.raises(LaunchConfigError, match="'tensor-parallel-size' and 'tp-size' both set"):
        launch({"tp-size": 8, "tensor-parallel-size": 8})
    # The environment is no flag: its names are its own.
    assert merge_flags({"A_B": "1"}, {"A-B": "2"}, variable="sglang_server_env") == {"A_B": "1", "A-B": "2"}


def test_a_profile_lanes_entry_applies_on_its_lane_only() -> None:
    profiles = {"p": {"kv-cache-dtype": "bfloat16", "lanes": {"cu130": {"enable-metrics": None, "dsa-prefill-backend": "y"}}}}
    base = {"enable-metrics": True, "nsa-prefill-backend": "trtllm"}
    assert profile_flags(base, "p", profiles, "cu128") == {**base, "kv-cache-dtype": "bfloat16"}
    on_130 = profile_flags(base, "p", profiles, "cu130")
    assert on_130 == {"enable-metrics": None, "dsa-prefill-backend": "y", "kv-cache-dtype": "bfloat16"}
    for bad in ({"lanes": ["cu130"]}, {"lanes": {"cu130": "x"}}):
        with pytest.raises(LaunchConfigError, match=r"\['lanes'\] must map lane names to flag changes"):
            profile_flags(base, "p", {"p": bad}, "cu130")
    # A misspelt lane would never apply: refused on every lane, naming the known ones.
    with pytest.raises(LaunchConfigError, match=r"\['lanes'\] names cu13, which is no lane \(known: cu128, cu130\)"):
        profile_flags(base, "p", {"p": {"lanes": {"cu13": {"x": 1}}}}, "cu128")
    assert profile_flags(base, "p", {"p": {"lanes": {"cu130": None}}}, "cu130") == base


def test_amending_a_launch_keeps_its_lane_and_checks_the_change() -> None:
    config = launch({"nsa-decode-backend": "trtllm", "mem-fraction-static": "auto"}, "cu130")
    amended = config.amended(flags={"mem-fraction-static": 0.84}, env={"A": "1"})
    assert [f.name for f in amended.flags] == ["dsa-decode-backend", "mem-fraction-static"]
    assert amended.settings.mem_fraction_static == 0.84 and dict(amended.environment) == {"A": "1"}
    assert config.amended() is config
    removed = amended.amended(flags={"nsa_decode_backend": None}, env={"A": None})
    assert [f.name for f in removed.flags] == ["mem-fraction-static"] and removed.environment == ()
    added = config.amended(flags={"tp": 8, "api-key": {"env": "K"}})
    assert [f.name for f in added.flags][-2:] == ["tp-size", "api-key"] and added.settings.tp == 8
    with pytest.raises(LaunchConfigError, match="reads \\$\\{NOPE\\}"):
        config.amended(flags={"api-key": {"env": "NOPE"}})
    with pytest.raises(LaunchConfigError, match="no --enable-nan-detection"):
        config.amended(flags={"enable-nan-detection": True})
    with pytest.raises(LaunchConfigError, match="out of bounds"):
        config.amended(flags={"mem-fraction-static": 2})


def test_bounds_in_words_and_at_their_edges() -> None:
    spec = FlagSpec("n", "int", minimum=2, maximum=4)
    assert spec.bounds() == "an integer >= 2 and <= 4" and FlagSpec("n", "int", minimum=1).bounds() == "an integer >= 1"
    assert [spec.holds(v) for v in (1, 2, 4, 5)] == [False, True, True, False]
    assert FlagSpec("t", "text").bounds() == "" and FlagSpec("f", "fraction").bounds() == "a fraction between 0 and 1"
    assert FlagSpec("u", "int", also=(-1,), minimum=1).holds(-1)
    with pytest.raises(FlagTableError, match="also must be a list of integers"):
        _table({"type": "int", "also": ["x"]})


def _table(entry: dict[str, Any]) -> flagtable.FlagTable:
    return parse_table({"flags": {"x-flag": entry}})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"type": "number"}, "a type not in"),
        ({"type": "int", "colour": 1}, "unknown keys ['colour']"),
        ({"type": "int", "planner": "maybe"}, "a planner role not in"),
        ({"type": "int", "lanes": {"cu130": None}}, "lanes ['cu130'] lack it but `absent` says no choice"),
        ({"type": "int", "lanes": ["cu130"]}, "lanes must map lane names to strings"),
        ({"type": "int", "aliases": "x"}, "aliases must be a list of names"),
        ({"type": "fraction", "placeholder": ["auto"]}, "placeholder must be [our value, a value sglang parses]"),
    ],
)
def test_a_malformed_table_is_refused_naming_the_entry(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(FlagTableError) as err:
        _table(entry)
    assert "flags['x-flag']" in str(err.value) and message in str(err.value)


def test_one_spelling_for_two_rows_and_an_empty_table_are_refused() -> None:
    with pytest.raises(FlagTableError, match="'b' names both a and c"):
        parse_table({"flags": {"a": {"type": "int", "aliases": ["b"]}, "c": {"type": "int", "aliases": ["b"]}}})
    with pytest.raises(FlagTableError, match="expected a mapping 'flags'"):
        parse_table({"flags": {}})
    with pytest.raises(FlagTableError, match="must be a mapping"):
        parse_table({"flags": {"a": "int"}})


def test_the_shipped_table_parses_as_written_and_its_lane_rows_name_known_lanes() -> None:
    from importlib import resources

    data = yaml.safe_load(resources.files("sglang_deploy.launch").joinpath("flag_table.yml").read_text())
    assert parse_table(data) == table()
    for spec in table().specs:
        for lane, _ in (*spec.lanes, *spec.absent, *spec.source):
            assert lane in lane_names(), (spec.name, lane)
        renamed = [lane for lane, spelling in spec.lanes if spelling != spec.name]
        assert all(lane in dict(spec.source) for lane in renamed), f"{spec.name}: a lane difference without its source"


def test_a_spec_without_a_lane_row_is_spelled_as_named() -> None:
    spec = FlagSpec("a-b", "int")
    assert spec.spelling("cu130") == "a-b" and spec.field == "a_b" and spec.absent_fix("cu130") == "remove it"
    assert dataclasses.replace(spec, lanes=(("cu130", None),)).spelling("cu130") is None


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"type": "int", "lanes": {"cu130": 5}}, "lanes must map lane names to strings"),
        ({"type": "int", "lanes": {5: "x"}}, "lanes must map lane names to strings"),
        ({"type": "int", "absent": {"cu130": None}}, "absent must map lane names to strings"),
        ({"type": "int", "source": {"cu130": None}}, "source must map lane names to strings"),
    ],
)
def test_a_lane_mapping_holds_names_and_strings_only_lanes_may_be_null(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(FlagTableError, match=message):
        _table(entry)


def test_unset_settings_are_off_and_the_planner_reads_only_its_rows_set() -> None:
    empty = LaunchSettings()
    switches = [spec.field for spec in table().specs if spec.type == "switch"]
    assert switches and all(getattr(empty, name) is False for name in switches)
    assert empty.planner_inputs() == {} and "names=" not in repr(empty)
    typed = LaunchSettings(tp_size=8, disable_cuda_graph=True, enable_dp_attention=False, enable_metrics=True, host="h")
    assert typed.planner_inputs() == {"tp_size": 8, "disable_cuda_graph": True}
    assert LaunchSettings(lane="cu130").name_of("not_in_the_table") == "not-in-the-table"
    # A flag the table does not know is passed over, not the end of the reading.
    assert flagtable.settings_of({"some-new-flag": "1", "tp-size": "8"}, "cu128").tp_size == 8


def test_the_flags_host_code_reads_from_a_rendered_unit_are_spelled_alike_in_every_lane() -> None:
    """Host code (stdlib only: it cannot read the table) reads a few flags by name from the rendered command line
    (unit_flags.target_from_render, base_url, bench's concurrency cap). Each is a table row spelled the same in every
    lane, so a lane switch never changes what the host reads; a new such lookup must be one too."""
    import re

    from conftest import ROOT

    read = set()
    for path in [*(ROOT / "module_utils").rglob("*.py"), *(ROOT / "library").glob("*.py")]:
        read |= set(re.findall(r'flags(?:\.get\(|\[)"([a-z0-9-]+)"', path.read_text(encoding="utf-8")))
    read |= {"served-model-name", "model-path", "model"}  # unit_flags.served_model_name's loop
    assert {"port", "host", "ssl-certfile", "ssl-ca-certs", "api-key", "enable-metrics", "max-running-requests"} <= read
    for name in read:
        spec = table().spec(name)
        assert spec is not None, name
        assert name in spec.aliases or all(spec.spelling(lane) == name for lane in lane_names()), name
