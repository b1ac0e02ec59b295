"""Quoting for ExecStart=, Environment= and EnvironmentFile=.

The end-to-end proof is in molecule (real systemd runs a probe unit with these words); here the
rules themselves.
"""

from __future__ import annotations

import pytest

from sglang_deploy import systemd


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("lukealonso/GLM-5-NVFP4", "lukealonso/GLM-5-NVFP4"),
        ("0.92", "0.92"),
        ("a b", '"a b"'),
        ("100%", "100%%"),
        ("$HOME", '"$$HOME"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("it's", '"it\'s"'),
        ("back\\slash", '"back\\\\slash"'),
        ("line\nbreak", '"line\\nbreak"'),
        (";", "\\;"),
        ("", '""'),
    ],
)
def test_exec_word(word, quoted):
    assert systemd.exec_word(word) == quoted


def test_environment_assignment_escapes_specifiers_and_quotes():
    assert systemd.environment_assignment("NCCL_P2P_LEVEL", "PHB") == '"NCCL_P2P_LEVEL=PHB"'
    assert systemd.environment_assignment("X", 'a "b" 5%') == '"X=a \\"b\\" 5%%"'


def test_env_file_line_keeps_values_literal():
    assert systemd.env_file_line("SGLANG_API_KEY", "s3cr$t %x") == "SGLANG_API_KEY='s3cr$t %x'"
    assert systemd.env_file_line("K", "it's $x") == 'K="it\'s \\$x"'
    with pytest.raises(ValueError, match="newline"):
        systemd.env_file_line("K", "a\nb")


@pytest.mark.parametrize("name", ["1A", "A-B", "", "A B"])
def test_bad_names_are_rejected(name):
    for call in (
        lambda: systemd.environment_assignment(name, "x"),
        lambda: systemd.env_file_line(name, "x"),
    ):
        with pytest.raises(ValueError, match="not an environment variable name"):
            call()
