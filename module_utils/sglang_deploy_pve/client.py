"""The proxmox_vm role's way to a Proxmox VE API: proxmoxer, as community.proxmox's modules use it.

Control node only (the role's modules run delegated to localhost); not part of sglang_deploy_host,
which is stdlib-only code for any host. The parameters are community.proxmox's own
(``proxmox_auth_argument_spec``: api_host, api_port, api_user, api_token_id, api_token_secret,
api_password, validate_certs), so one set of inventory values drives both kinds of module. A CA file
for a self-signed node reaches requests through REQUESTS_CA_BUNDLE (the role's ``environment:``).

Every failure becomes PveApiError with a one-line reason a caller prefixes with host, node and VM.
"""

from __future__ import annotations

import time
from typing import Any, Callable

try:
    import requests
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import AuthenticationError, ResourceException

    HAS_PROXMOXER = True
    PROXMOXER_ERROR = ""
except ImportError as exc:  # reported by the module, naming the fix
    HAS_PROXMOXER = False
    PROXMOXER_ERROR = str(exc)

# How community.proxmox's modules take their credentials: a password, or a token whose id and secret come together.
AUTH_RULES: dict[str, Any] = {
    "required_one_of": [("api_password", "api_token_id")],
    "required_together": [("api_token_id", "api_token_secret")],
}


def module_argument_spec(auth_spec: dict[str, Any], **own: dict[str, Any]) -> dict[str, Any]:
    """A role module's argument spec: community.proxmox's ``auth_spec`` (proxmox_auth_argument_spec()), the
    node every call goes to, the inventory host its messages name, then the module's ``own`` options."""
    spec = dict(auth_spec)
    spec.update(node={"type": "str", "required": True}, inventory_hostname={"type": "str", "default": ""})
    spec.update(own)
    return spec


# Seconds one API request may take (proxmoxer's default of 5 is short for a busy node).
REQUEST_TIMEOUT_S = 30
# Between two looks at a running task.
TASK_POLL_S = 1.0


class PveApiError(Exception):
    """An API call that failed: ``status`` is the HTTP status (0: no answer at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class PveClient:
    """A logged-in API connection and the few calls every role module needs."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.host = str(params["api_host"])
        self.port = int(params.get("api_port") or 8006)
        self.user = str(params["api_user"])
        self.token_id = params.get("api_token_id") or ""
        self.password_login = bool(params.get("api_password")) and not self.token_id
        who = f"{self.user}!{self.token_id}" if self.token_id else self.user
        self.where = f"the API at https://{self.host}:{self.port} as {who}"
        auth: dict[str, Any] = {"user": self.user, "port": self.port}
        if self.token_id:
            auth.update(token_name=self.token_id, token_value=params.get("api_token_secret") or "")
        else:
            auth.update(password=params.get("api_password") or "")
        self.api = self.call(
            lambda: ProxmoxAPI(
                self.host, verify_ssl=bool(params.get("validate_certs")), timeout=REQUEST_TIMEOUT_S, **auth
            )
        )

    @property
    def root_password_login(self) -> bool:
        """root@pam logged in with a password: the only login PVE lets set args and raw hostpci."""
        return self.password_login and self.user == "root@pam"

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run one proxmoxer call; every failure becomes PveApiError with what it means."""
        try:
            return fn()
        except ResourceException as exc:
            detail = str(exc.content or exc.status_message or "").strip()
            if exc.errors:
                detail += f" ({exc.errors})"
            raise PveApiError(int(exc.status_code), f"{exc.status_code} {detail}".strip()) from None
        except AuthenticationError as exc:
            raise PveApiError(401, f"401 {exc}") from None
        except requests.exceptions.SSLError as exc:
            raise PveApiError(0, f"TLS verification failed: {_first_line(exc)}") from None
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise PveApiError(0, f"no answer: {_first_line(exc)}") from None
        except requests.exceptions.RequestException as exc:
            # Never its text: requests quotes the request's headers in some (InvalidHeader), the token among
            # them, and a module's traceback is not censored by no_log.
            raise PveApiError(0, f"the request could not be sent ({type(exc).__name__})") from None

    def get(self, resource: str, **params: Any) -> Any:
        return self.call(lambda: self.api(resource).get(**params))

    def post(self, resource: str, **data: Any) -> Any:
        return self.call(lambda: self.api(resource).post(**data))

    def put(self, resource: str, **data: Any) -> Any:
        return self.call(lambda: self.api(resource).put(**data))

    def wait(self, node: str, upid: Any, timeout_s: float) -> None:
        """Wait for a task (a UPID; None: the call was synchronous) and raise unless it ended OK."""
        if not upid:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.get(f"nodes/{node}/tasks/{upid}/status")
            if status.get("status") == "stopped":
                exit_status = str(status.get("exitstatus") or "")
                if exit_status == "OK" or exit_status.startswith("WARNINGS"):
                    return
                raise PveApiError(500, f"task {upid} failed: {exit_status}")
            if time.monotonic() > deadline:
                raise PveApiError(0, f"task {upid} still running after {timeout_s:.0f} s")
            time.sleep(TASK_POLL_S)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def unreachable_fix(client_where: str, node: str) -> str:
    """The fix for a node whose API does not answer or whose certificate does not verify."""
    return (
        f"{client_where} (node {node}). Fix: check proxmox_api_host / proxmox_api_port of {node} in the inventory, "
        "that pveproxy runs there and port 8006 is reachable from this machine; for the node's self-signed "
        "certificate copy its /etc/pve/pve-root-ca.pem here and set proxmox_api_ca_path"
    )


def credentials_fix(client_where: str, node: str) -> str:
    return (
        f"{client_where} (node {node}) refused the credentials. Fix: proxmox_api_user is USER@REALM, "
        "proxmox_api_token_id the token's name only (not USER@REALM!NAME), and the secret comes from "
        "vault_proxmox_api_token_secret or PROXMOX_TOKEN_SECRET (pveum user token list USER@REALM shows the token)"
    )
