"""Worker URLs written carelessly (issue 43, class 6; issue 44's `HTTPS://`): one worker written four ways is one
worker (the router lists it once, or refuses the list naming the duplicate), an upper-case scheme is https for every
rule that asks (the "https worker without a CA" refusal included), and a password holding `/` or `@` is never
printed."""

from __future__ import annotations

import pytest

from sglang_deploy.fleet import router
from sglang_deploy_host.serving import unit_flags

SECRET = "pa/ss@w0rd-never-shown"


@pytest.mark.parametrize(
    "spelling",
    ["http://10.0.0.1:8000", "http://10.0.0.1:8000/", "HTTP://10.0.0.1:8000", "http://10.0.0.1:08000", "Http://10.0.0.1:8000//"],
)
def test_every_spelling_of_a_worker_is_one_url(spelling: str) -> None:
    assert router.checked_worker_url(spelling, "x") == "http://10.0.0.1:8000"


def test_a_worker_listed_four_ways_is_refused_as_one_listed_four_times() -> None:
    from test_router import _resolve

    urls = ["http://10.0.0.1:8000", "http://10.0.0.1:8000/", "HTTP://10.0.0.1:8000", "http://10.0.0.1:08000"]
    with pytest.raises(router.RouterConfigError, match=r"sglang_router_worker_urls: several share a URL .*: http://10.0.0.1:8000"):
        _resolve(worker_urls=urls)
    workers = {f"w{n}": {"endpoint": {"worker_url": url}} for n, url in enumerate(urls)}
    with pytest.raises(router.RouterConfigError, match="the workers: several share a URL"):
        router.worker_urls(workers)


def test_the_default_port_is_written_out_and_hosts_are_lower_case() -> None:
    assert unit_flags.normalized_url("https://Proxy.LAB") == "https://proxy.lab:443"
    assert unit_flags.normalized_url("https://proxy.lab:443/") == "https://proxy.lab:443"
    assert unit_flags.normalized_url("http://[FD00::1]:8000/api/") == "http://[fd00::1]:8000/api"


def test_an_upper_case_https_worker_without_a_ca_is_refused() -> None:
    from test_router import _resolve

    with pytest.raises(router.RouterConfigError, match=r"the workers https://10.0.0.1:8000 speak TLS and no CA"):
        _resolve(worker_urls=["HTTPS://10.0.0.1:8000"])


@pytest.mark.parametrize("url", [f"http://user:{SECRET}@10.0.0.1:8000", f"http://user:{SECRET}@10.0.0.1:8000/x", f"http://u@{SECRET}@h:1"])
def test_a_password_with_a_slash_or_an_at_sign_is_never_shown(url: str) -> None:
    with pytest.raises(router.RouterConfigError) as raised:
        router.checked_worker_url(url, "sglang_router_worker_urls")
    message = str(raised.value)
    assert "<credentials>@" in message
    for piece in ("pa/ss", "w0rd", "never-shown"):
        assert piece not in message, message
