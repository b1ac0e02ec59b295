"""The options of the modules that talk to a serving endpoint (sglang_bench, sglang_wait_ready,
sglang_correctness_gate): the API key is read on the host from the unit's environment file, so it is on no
command line and in no task's arguments; an https server's certificate is verified against the CA file.
Their argument spec: ``sglang_deploy_host.serving.endpoint.CLIENT_OPTIONS``."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  env_file:
    description: The unit's EnvironmentFile= holding the API key.
    type: path
  api_key_env:
    description: The key's variable in I(env_file).
    type: str
    default: SGLANG_API_KEY
  cafile:
    description:
      - The CA (PEM) an https server's certificate and name are verified against (sglang_server_resolved.endpoint.cafile);
        empty = the system's CA store. The check is never switched off.
    type: path
    default: ""
"""
