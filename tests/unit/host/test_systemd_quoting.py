"""Quoting for ExecStart=, Environment= and EnvironmentFile=.

The end-to-end proof is in molecule (real systemd runs a probe unit with these words); here the
rules themselves.
"""

from __future__ import annotations

import pytest

from sglang_deploy_host.serving import systemd


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


# -- reading back: one module writes and reads every systemd form -----------------------------------
ODD_VALUES = ["plain", "s3cr%t $x", "k'e\"y $HOME `id` \\ %n", "\\$'", "'", "", "a b\tc", ";", "--flag=v"]


@pytest.mark.parametrize("value", ODD_VALUES)
def test_env_file_values_read_what_env_file_line_writes(value):
    """systemd's rules: in double quotes a backslash escapes " \\ $ ` (shlex keeps it before $ and `)."""
    assert systemd.env_file_values("# comment\n" + systemd.env_file_line("KEY", value) + "\n") == {"KEY": value}


def test_exec_start_argv_reads_back_what_exec_word_writes():
    argv = ["/venv/bin/python3", "-m", "mod", *ODD_VALUES]
    lines = [" ".join(systemd.exec_word(w) for w in argv[:3])]
    lines += ["    " + systemd.exec_word(w) for w in argv[3:]]
    unit = "[Service]\nExecStart=" + " \\\n".join(lines) + "\nRestart=no\n"
    assert systemd.exec_start_argv(unit) == argv


@pytest.mark.parametrize("value", ODD_VALUES)
def test_environment_reads_back_unit_lines_and_systemctl_show(value):
    line = "Environment=" + systemd.environment_assignment("NAME", value)
    assert systemd.environment("[Service]\n" + line + "\n") == {"NAME": value}


def test_environment_of_systemctl_show_output():
    # `systemctl show -p Environment --value` prints one line, quoting values that need it.
    line = 'NCCL_IB_DISABLE=1 "PATH=/a b/bin:/usr/bin" OMP_NUM_THREADS=8'
    assert systemd.environment(line) == {"NCCL_IB_DISABLE": "1", "PATH": "/a b/bin:/usr/bin", "OMP_NUM_THREADS": "8"}
