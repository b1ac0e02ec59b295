"""Code that runs on the managed hosts as well as on the control node: STDLIB ONLY, Python >= 3.9.

One source, two ways in: the ``sglang_deploy`` CLI and the Ansible plugins import it as the package
``sglang_deploy_host`` (installed with the project); Ansible ships it to hosts inside each module
that imports ``ansible.module_utils.sglang_deploy_host.<domain>.<name>`` (ansible.cfg: ``module_utils``).

By domain: ``fs`` (bounded reads, paths root may act on, block devices), ``model`` (safetensors headers, the
checkpoint's inspection, the weights), ``gpu`` (GPU facts, fatbins, the driver, PCI devices, NCCL), ``stack``
(the ml-env venv and its lock), ``serving`` (the unit, the launcher, the HTTP client, the gates, the quality
check, bench_serving's steps) and ``watch`` (the watchdog's parts; ``watchdog`` here is its program, which the
watchdog unit runs as ``python3 -m sglang_deploy_host.watchdog``); ``interp`` runs this package's code with
another interpreter. A domain imports ``fs`` and the domains below it, never one above
(tests/unit/host/test_host_package.py holds the order). Modules import each other relatively
(``from ..fs.files import ...``), which works both ways. The few that systemd runs on a host as scripts
(gpu/gpufacts, serving/sglang_launcher, serving/unitcheck) import nothing from here, so a single file is a
whole program; the ``sglang_host_files`` module installs them from this same source.
"""
