"""The subcommands of ``sglang-deploy``, one module each; ``common`` holds what several of them share.

Each command module defines ``register(subparsers: argparse._SubParsersAction) -> None``, which adds
its parser(s) with ``set_defaults(func=...)`` (a function taking the parsed args and returning the
exit status). ``sglang_deploy.cli.COMMAND_MODULES`` lists the modules, in help order.
"""
