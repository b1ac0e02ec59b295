"""A secret hidden in a flag's name (issue 43, class 2), and a YAML 1.1 ``no`` that would drop a flag (class 6): the "a secret is never a flag" rule sees through an ``=`` in
the name, leading dashes, underscores and argparse's abbreviations, for the server's flags (through the whole
resolver, the override included) and the router's extra flags; a refusal never prints what follows an ``=``; a
name that is not letters, digits and dashes is refused with its unprintable characters shown escaped."""

from __future__ import annotations

import pytest
from server_inputs import resolve

from sglang_deploy.fleet import router
from sglang_deploy.launch import config as launch_config
from sglang_deploy.launch.config import LaunchConfigError
from sglang_deploy_host.serving import unit_flags

SECRET = "s3cr3t-VALUE-never-shown"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"api-key={SECRET}", "the flag name 'api-key=...' holds '='"),
        (f"--admin-api-key={SECRET}", "the flag name '--admin-api-key=...' holds '='"),
        (f"--tp-size={SECRET}", "the flag name '--tp-size=...' holds '='"),
        ("api-k", "'api-k' abbreviates the secret flag --api-key"),
        ("--api_ke", "'--api_ke' abbreviates the secret flag --api-key"),
        ("admin-api", "'admin-api' abbreviates the secret flag --admin-api-key"),
        ("ssl-keyfile-pass", "'ssl-keyfile-pass' abbreviates the secret flag --ssl-keyfile-password"),
        ("tp size", "'tp size' is not a flag name"),
        ("tp\x1b[31m", "'tp?[31m' is not a flag name"),
        ("Tp-Size", "'Tp-Size' is not a flag name"),
    ],
)  # fmt: skip
def test_a_name_that_hides_a_secret_or_is_no_name_is_refused_through_the_resolver(name: str, expected: str) -> None:
    with pytest.raises((LaunchConfigError, ValueError)) as raised:
        resolve(flags_override={name: True})
    message = str(raised.value)
    assert expected in message and "sglang_server_flags" in message, message
    assert SECRET not in message and "\x1b" not in message


@pytest.mark.parametrize("name", ["tp-size", "--tp_size", "tp", "ssl-keyfile", "api-key-x-not-secret", "b"])
def test_names_that_hide_nothing_are_left_to_the_parser(name: str) -> None:
    # ssl-keyfile is a real flag, which argparse takes before the abbreviation of ssl-keyfile-password.
    assert unit_flags.flag_name_problem(name, "v") is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"redis-url=redis://user:{SECRET}@10.0.0.9", "the flag name 'redis-url=...' holds '='"),
        ("tenant-api", "'tenant-api' abbreviates the secret flag --tenant-api-key"),
        ("--mesh-tls", "'--mesh-tls' abbreviates the secret flag --mesh-tls-key"),
        (f"--control-plane-api-keys={SECRET}", "holds '='"),
    ],
)  # fmt: skip
def test_the_router_extra_flags_follow_the_same_rule(name: str, expected: str) -> None:
    with pytest.raises(router.RouterConfigError) as raised:
        router.flag_argv({name: True})
    assert expected in str(raised.value) and "sglang_router_extra_flags" in str(raised.value)
    assert SECRET not in str(raised.value)


def test_the_shown_name_stops_at_the_equals_sign_and_is_printable() -> None:
    assert unit_flags.shown_flag_name(f"api-key={SECRET}") == "api-key=..."
    assert unit_flags.shown_flag_name("a\nb\tc") == "a?b?c"
    assert len(unit_flags.shown_flag_name("x" * 500)) == 80


@pytest.mark.parametrize("value", [False])
def test_false_is_no_flag_value_for_the_server_or_the_router(value: bool) -> None:
    """Ansible's YAML 1.1 reads `no`, `off`, `false` as false: a flag dropped for it would be a launch nobody asked
    for. null removes a flag; true is a bare switch; a quoted 'no' is a value."""
    with pytest.raises(ValueError, match=r"host glm5-01: sglang_server_flags\['enable-metrics'\] is false, which is neither"):
        resolve(flags_override={"enable-metrics": value})
    with pytest.raises(router.RouterConfigError, match=r"sglang_router_extra_flags\['log-json'\] is false"):
        router.flag_argv({"log_json": value})
    assert "--enable-metrics" not in resolve(flags_override={"enable-metrics": None})["launch"]["flag_argv"]
    assert router.flag_argv({"log-level": "no"}) == ["--log-level", "no"]


# -- the normalizer, directly (issue 44: it had no test of its own) -----------------------------------------
@pytest.mark.parametrize(
    ("raw", "name"),
    [("tp-size", "tp-size"), ("--tp-size", "tp-size"), ("tp_size", "tp-size"), ("--tp_size", "tp-size"),
     ("-tp_size", "tp-size"), ("  --mem_fraction_static ", "mem-fraction-static"), ("x", "x")],
)  # fmt: skip
def test_every_spelling_of_a_flag_is_one_name(raw: str, name: str) -> None:
    assert launch_config.flag_name(raw) == name
    assert launch_config.normalized_flags({raw: 1}) == {name: 1}


def test_the_later_spelling_of_one_flag_wins_and_a_group_is_set_once() -> None:
    assert launch_config.normalized_flags({"tp_size": 4, "--tp-size": 8}) == {"tp-size": 8}
    with pytest.raises(LaunchConfigError, match=r"'tp-size' is set twice .*one sglang option: --tensor-parallel-size"):
        launch_config.LaunchConfig.from_vars({"tp": 4, "tp_size": 8}, python="/py")
    with pytest.raises(LaunchConfigError, match=r"'ep-size' and 'expert-parallel-size' both set"):
        launch_config.LaunchConfig.from_vars({"expert_parallel_size": 8, "--ep_size": 8}, python="/py")


def test_a_flag_written_in_any_spelling_or_alias_is_read_as_its_typed_field() -> None:
    config = launch_config.LaunchConfig.from_vars(
        {"--speculative_algorithm": "EAGLE", "tp": 8, "mem_fraction_static": 0.9, "ep": 8}, python="/py"
    )
    typed = config.settings
    assert (typed.speculative_algorithm, typed.tp_size, typed.ep_size, typed.mem_fraction_static) == ("EAGLE", 8, 8, 0.9)
    assert typed.speculative_num_steps is None and config.tp_size == 8
    for spelling in ("tp-size", "tensor-parallel-size", "tp"):
        assert launch_config.TABLE.spec(launch_config.flag_name(spelling)) is launch_config.TABLE.spec("tp-size"), spelling
    for raw, value in (("tensor_parallel_size", 4), ("--tp-size", 2)):
        assert launch_config.LaunchConfig.from_vars({raw: value}, python="/py").settings.tp_size == value
    assert launch_config.TABLE.spec("speculative") is None  # no prefix lookup: the parser judges abbreviations
    assert config.flag_argv()[:2] == ["--speculative-algorithm", "EAGLE"] and "--tp-size" in config.flag_argv()
