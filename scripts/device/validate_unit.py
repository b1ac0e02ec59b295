"""Validate a rendered unit's sglang flags with the sglang installed where this runs, through the
validator's own probe and checks (what ``sglang-deploy validate`` does with a lane's pinned sglang).

    PYTHONPATH=SGLANG_SITE:src:module_utils python3 scripts/device/validate_unit.py UNIT...

On the device machine the serving sglang (0.5.17) is no lane's pin: the lanes pin 0.5.10.post1 and
0.5.23, so ``sglang-deploy validate -i inventory/device`` judges the flags with 0.5.23's parser here,
and this script judges the very argv the unit starts with the very sglang that serves it, there.
Each UNIT is named by its directory (the render's host name); sglang is imported once for all.
Exit 0 all accepted, 1 one rejected (each problem named, with the fix), 2 one could not be validated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_deploy.launch import _validator_probe, validator
from sglang_deploy_host.serving import sglang_launcher, systemd

# The launcher adds ``--FLAG VALUE`` for every ``--env-flag FLAG=NAME`` from the environment; the
# parser sees a stand-in value of the same type (every such flag sglang has takes a string).
ENV_FLAG_VALUE = "from-the-environment"


def validate(unit: Path) -> int:
    host = unit.parent.name
    try:
        words, env_flags = sglang_launcher.split_command_line(systemd.exec_start_argv(unit.read_text()))
    except (OSError, ValueError) as err:
        print(f"validate_unit: {host}: {err}", file=sys.stderr)
        return 2
    flags = [*words, *(w for flag in env_flags for w in (f"--{flag}", ENV_FLAG_VALUE))]
    segments = validator.split_segments(flags)
    request = {"argv": flags, "segments": [list(s.tokens) for s in segments], "stand_ins": []}
    try:
        answer = validator.ProbeAnswer.from_json(_validator_probe.probe(request))
    except Exception as err:  # noqa: BLE001 -- sglang's import failing here is "cannot validate"
        print(f"validate_unit: {host}: sglang's parser could not run: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    result = validator.ValidationResult(
        answer.sglang_version, "device", validator.problems_from_answer(answer, segments), host
    )
    print(result.format())
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("units", type=Path, nargs="+", metavar="UNIT")
    args = parser.parse_args(argv)
    return max(validate(unit) for unit in args.units)


if __name__ == "__main__":
    sys.exit(main())
