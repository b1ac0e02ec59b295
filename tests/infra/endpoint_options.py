"""pytest plugin for tests/infra/test_endpoint.py (and test_service.py): where the endpoint is.

Loaded with ``-p endpoint_options`` (molecule: the scenario's verifier options; playbooks/verify.yml;
``sglang-deploy verify``). Without ``--sglang-endpoint`` the suites take URL, served model name and
API key from the host's render of the inventory (conftest's ``rendered_dir``), so they check what the
inventory asks for. ``--sglang-endpoint URL --sglang-model NAME`` point the endpoint suite at any
server instead (then no host is needed); the API key is read from the environment variable named by
``--sglang-api-key-env`` so it never appears in a command line.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglang-deploy endpoint")
    group.addoption("--sglang-endpoint", help="base URL of the server (default: from the host's render)")
    group.addoption("--sglang-model", help="served model name /v1/models must list (with --sglang-endpoint)")
    group.addoption(
        "--sglang-api-key-env",
        default="SGLANG_API_KEY",
        help="environment variable holding the API key for --sglang-endpoint (default SGLANG_API_KEY)",
    )
    group.addoption("--sglang-probes", help="YAML probes file replacing the default correctness probes")
    group.addoption(
        "--sglang-cafile",
        default="",
        help="the CA (PEM, on this machine) an https server's certificate is verified with "
        "(sglang_server_tls_cafile; default: the system's CA store)",
    )
    group.addoption(
        "--sglang-connect-host",
        help="address the control node uses for a host whose server binds every interface "
        "(default: the host's ansible_host, else 127.0.0.1)",
    )
    group.addoption(
        "--sglang-libexec-dir",
        default="/usr/local/libexec/sglang-deploy",
        help="where the role installed gpufacts.py on the host",
    )
