"""Code that runs on the managed hosts as well as on the control node: STDLIB ONLY, Python >= 3.9.

One source, two ways in: the ``sglang_deploy`` CLI and the Ansible plugins import it as the package
``sglang_deploy_host`` (installed with the project); Ansible ships it to hosts inside each module
that imports ``ansible.module_utils.sglang_deploy_host.<name>`` (ansible.cfg: ``module_utils``).
Modules here import each other relatively (``from .systemd import ...``), which works both ways.
The few that systemd runs on a host as scripts (gpufacts, sglang_launcher, unitcheck) import
nothing from here, so a single file is a whole program; the ``sglang_host_files`` module installs
them from this same source.
"""
