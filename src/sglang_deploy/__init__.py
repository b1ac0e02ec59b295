"""sglang-deploy: the logic behind the Ansible roles (launch model, validation, planning, parsing).

Roles and filter plugins are thin adapters onto this package; a rule needed by both a role and
the CLI lives here, once.
"""

__version__ = "0.1.0"
