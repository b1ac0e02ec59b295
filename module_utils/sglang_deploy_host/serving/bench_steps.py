"""One step of a serving benchmark with sglang's own ``python -m sglang.bench_serving``, bounded.

STDLIB ONLY, Python >= 3.9: the module sglang_bench runs the steps on a serving host with the
ml-env's interpreter against the host's own server; ``sglang-deploy bench --endpoint`` runs the same
steps on the control node with the lane's validator venv. Both call :func:`run_step` with the
command that starts bench_serving there.

What every step is (checked in sglang 0.5.10.post1 ``bench_serving.py`` and
``benchmark/datasets/random.py``):

* ``--dataset-name random-ids`` with ``--random-range-ratio 1.0``: random token ids of exactly
  ``--random-input-len`` / ``--random-output-len`` tokens (the default ratio 0.0 draws lengths from
  1..N; ``random`` downloads ShareGPT from the hub). With the ``sglang`` backend the prompts go as
  token ids (``--tokenize-prompt``), so the server sees exactly that many input tokens.
* ``--max-concurrency C`` with ``--num-prompts`` >= 5 x C (sglang's guidance), ``--request-rate
  inf``, ``--warmup-requests`` (sent together before the measurement), a fixed ``--seed``.
* The API key reaches bench_serving only through its environment: its ``get_auth_headers`` sends
  ``Authorization: Bearer $OPENAI_API_KEY`` (a bare ``$API_KEY`` otherwise, which is removed). It is
  in no argv (``/proc/PID/cmdline`` is world-readable).
* bench_serving appends one JSON record per run to ``--output-file``; ``--output-details`` adds the
  per-request lists, of which only the errors are kept here (counted and sampled). The record holds
  the server's ``/server_info``: sglang returns every ServerArgs field there, ``api_key`` in clear,
  so :func:`redact` blanks the secret fields and any copy of the key before the record leaves
  the private temporary directory it was written to.

Nothing waits without a bound: before each step the server must answer ``/health_generate`` (a
dead server fails every later step in seconds, not at its timeout); a step that runs over its
timeout is killed (its process group) and reported with every request counted as failed.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from .endpoint import READY_PATH, SHORT_DEADLINE_S, Endpoint, EndpointError
from .unit_flags import host_cafile, served_model_name
from .unit_flags import base_url as server_url

# The sweep's default concurrencies; the server's --max-running-requests caps and tops it.
DEFAULT_CONCURRENCIES = (1, 8, 16, 32, 64)
# sglang's benchmark guidance: at least 5 prompts per concurrent slot, so the steady state dominates.
MIN_PROMPTS_PER_CONCURRENCY = 5
# Backends of bench_serving this tool offers: sglang's native /generate, and its OpenAI routes.
BACKENDS = ("sglang", "sglang-oai-chat", "sglang-oai")
# The sweep's defaults (lengths, seed, backend, step timeout) are the sglang_deploy_bench role's
# (roles/sglang_deploy_bench/defaults/main.yml): the role passes each to the module, the CLI reads them there.
BENCH_MODULE = "sglang.bench_serving"
# How a step starts bench_serving in a Python: aiohttp (its HTTP client) follows redirects by default, so a
# server that answers 3xx would have another server measured under its name. With redirects off, a 3xx
# is a failed request ("HTTP 307 ...") like any other non-200 answer. Then the module runs as __main__.
NO_REDIRECTS_RUNNER = (
    "import aiohttp, runpy\n"
    "_request = aiohttp.ClientSession._request\n"
    "async def _no_redirects(self, method, url, **kwargs):\n"
    "    kwargs['allow_redirects'] = False\n"
    "    return await _request(self, method, url, **kwargs)\n"
    "aiohttp.ClientSession._request = _no_redirects\n"
    "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
)


def bench_command(python: str) -> list:
    """The argv that starts bench_serving with ``python`` (redirects off, see NO_REDIRECTS_RUNNER)."""
    return [python, "-c", NO_REDIRECTS_RUNNER.format(module=BENCH_MODULE)]
# bench_serving's get_auth_headers(): Bearer $OPENAI_API_KEY, else the bare value of $API_KEY.
KEY_ENV = "OPENAI_API_KEY"
_OTHER_KEY_ENV = "API_KEY"
# ServerArgs fields that hold secrets; /server_info returns them in clear.
SECRET_FIELDS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password"})
REDACTED = "********"
# The per-request lists --output-details adds to a record (only "errors" is used, then dropped).
DETAIL_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
ERROR_SAMPLES = 3
_ERROR_SAMPLE_CHARS = 300
_TAIL_BYTES = 64 * 1024
_TAIL_LINES = 30
_KILL_GRACE_S = 5.0


class BenchError(ValueError):
    """Settings no step can run with (the message names the setting and the fix)."""


@dataclass(frozen=True)
class Step:
    """One point of the sweep: this many requests in flight, this many prompts in all."""

    concurrency: int
    num_prompts: int


@dataclass(frozen=True)
class Settings:
    """What every step of a sweep shares."""

    base_url: str
    model: str
    tokenizer: str
    backend: str
    input_len: int
    output_len: int
    seed: int
    # Seconds one step may take in all (bench_serving itself would wait up to 6 hours per request).
    timeout_s: float
    # Requests sent together before each step's measurement; None: as many as the step's concurrency
    # (warms the batch size that step runs at).
    warmup_requests: Optional[int] = None
    # The CA an https server's certificate is verified with ("" = the system store); bench_serving gets it too.
    cafile: str = ""

    def check(self) -> "Settings":
        check_numbers(self.backend, self.input_len, self.output_len, self.warmup_requests, self.timeout_s)
        if not self.tokenizer:
            raise BenchError("no tokenizer: give the model's tokenizer directory (random-ids needs its vocabulary)")
        return self


def check_numbers(
    backend: str, input_len: int, output_len: int, warmup_requests: Optional[int], timeout_s: float
) -> None:
    """BenchError for settings no step can run with (before any step runs)."""
    if backend not in BACKENDS:
        raise BenchError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    for name, value in (("input length", input_len), ("output length", output_len)):
        if value < 1:
            raise BenchError(f"{name} {value} must be at least 1 token")
    if warmup_requests is not None and warmup_requests < 0:
        raise BenchError(f"warm-up requests {warmup_requests} must be 0 or more")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise BenchError(f"step timeout {timeout_s!r} must be a positive number of seconds")


@dataclass
class StepResult:
    """What one step measured, or why it failed. ``record`` is bench_serving's JSONL record as it
    wrote it (secrets redacted, per-request lists left out); None when it wrote none."""

    concurrency: int
    num_prompts: int
    ok: bool
    failed_requests: int
    problem: Optional[str]
    error_samples: list = field(default_factory=list)
    record: Optional[dict] = None
    wall_s: float = 0.0
    # bench_serving's own arguments (the output file was a private temporary one, since removed).
    argv: list = field(default_factory=list)
    output_tail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def settings_from_flags(flags: Mapping[str, Any], tokenizer: Optional[str] = None, **options: Any) -> Settings:
    """Settings for a client on the server's own host, from its launch flags (the launch model's
    flag dict): its address (a wildcard bind means loopback), its served name, and the tokenizer
    it loads (``--tokenizer-path``, else the model directory) unless ``tokenizer`` is given."""
    path = tokenizer or next(
        (str(flags[name]) for name in ("tokenizer-path", "model-path", "model") if flags.get(name) not in (None, True, False, "")),
        "",
    )
    options.setdefault("cafile", host_cafile(flags))
    return Settings(base_url=server_url(flags), model=served_model_name(flags), tokenizer=path, **options).check()


def max_running_requests(flags: Mapping[str, Any]) -> Optional[int]:
    """The server's ``--max-running-requests``, None when the flags leave it to sglang."""
    value = flags.get("max-running-requests")
    if value in (None, True, False, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise BenchError(f"launch flag max-running-requests={value!r} is not a number") from None


def plan(
    concurrencies: Optional[Sequence[int]] = None,
    max_running_requests: Optional[int] = None,
    prompts_per_concurrency: int = MIN_PROMPTS_PER_CONCURRENCY,
) -> list:
    """The sweep's steps. Without ``concurrencies``: DEFAULT_CONCURRENCIES up to the server's
    ``--max-running-requests``, which is then the top step (concurrency beyond it only queues).
    Given ``concurrencies`` are run as given, in increasing order."""
    if prompts_per_concurrency < MIN_PROMPTS_PER_CONCURRENCY:
        raise BenchError(
            f"prompts per concurrency {prompts_per_concurrency} is below {MIN_PROMPTS_PER_CONCURRENCY}: "
            "with fewer prompts than 5 per slot the ramp-up and the tail dominate the numbers"
        )
    if max_running_requests is not None and max_running_requests < 1:
        raise BenchError(f"max-running-requests {max_running_requests} must be at least 1")
    if concurrencies:
        wanted = sorted(set(int(c) for c in concurrencies))
        if wanted[0] < 1:
            raise BenchError(f"concurrency {wanted[0]} must be at least 1")
    else:
        top = max_running_requests
        wanted = [c for c in DEFAULT_CONCURRENCIES if top is None or c < top] + ([top] if top else [])
    return [Step(c, c * prompts_per_concurrency) for c in wanted]


def bench_argv(settings: Settings, step: Step, output_file: str, *, progress_bar: bool) -> list:
    """bench_serving's own arguments for one step (no secret among them)."""
    argv = [
        "--backend", settings.backend,
        "--base-url", settings.base_url.rstrip("/"),
        "--model", settings.model,
        "--served-model-name", settings.model,
        "--tokenizer", settings.tokenizer,
        "--dataset-name", "random-ids",
        "--random-input-len", str(settings.input_len),
        "--random-output-len", str(settings.output_len),
        "--random-range-ratio", "1.0",
        "--num-prompts", str(step.num_prompts),
        "--max-concurrency", str(step.concurrency),
        "--request-rate", "inf",
        "--warmup-requests", str(step.concurrency if settings.warmup_requests is None else settings.warmup_requests),
        "--seed", str(settings.seed),
        "--ready-check-timeout-sec", "60",
        "--output-file", output_file,
        "--output-details",
    ]  # fmt: skip
    if settings.backend == "sglang":
        argv.append("--tokenize-prompt")
    if not progress_bar:
        argv.append("--disable-tqdm")
    return argv


def child_env(base: Mapping[str, str], api_key: str, cafile: str = "") -> dict:
    """bench_serving's environment: the key as the one variable it reads for a Bearer token (and no
    other key that happens to be set, which it would send to this server), the hub off (the
    tokenizer is a local directory; nothing is downloaded), output unbuffered for live progress, and the
    server's CA as what its clients trust (aiohttp reads SSL_CERT_FILE through OpenSSL, requests
    REQUESTS_CA_BUNDLE): an https server is verified, never taken on trust."""
    env = {k: v for k, v in base.items() if k not in (KEY_ENV, _OTHER_KEY_ENV)}
    if api_key:
        env[KEY_ENV] = api_key
    if cafile:
        env.update({"SSL_CERT_FILE": cafile, "REQUESTS_CA_BUNDLE": cafile})
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false"})  # fmt: skip
    return env


def redact(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with every SECRET_FIELDS entry that is set, and every copy of a secret in any
    string, replaced by REDACTED."""
    if isinstance(value, dict):
        return {
            key: REDACTED if key in SECRET_FIELDS and item not in (None, "") else redact(item, secrets)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item, secrets) for item in value]
    if isinstance(value, str):
        for secret in sorted((s for s in secrets if s), key=len, reverse=True):
            value = value.replace(secret, REDACTED)
    return value


def error_samples(errors: Sequence[Any]) -> list:
    """Up to ERROR_SAMPLES distinct request errors, one line each (a traceback's last line)."""
    samples: list = []
    for error in errors:
        lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
        if not lines:
            continue
        sample = lines[-1] if lines[0].startswith("Traceback") else " ".join(lines)
        sample = sample[:_ERROR_SAMPLE_CHARS]
        if sample not in samples:
            samples.append(sample)
        if len(samples) == ERROR_SAMPLES:
            break
    return samples


def _tail(raw: bytes) -> str:
    """The last lines of a program's output, a progress bar's carriage-return updates collapsed."""
    text = raw.decode("utf-8", "replace")
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    return "\n".join([line for line in lines if line][-_TAIL_LINES:])


def run_bounded(
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout_s: float,
    *,
    cwd: Optional[str] = None,
    echo: Optional[Callable[[bytes], None]] = None,
) -> "tuple[Optional[int], bytes]":
    """Run ``argv`` with stdout and stderr together, for at most ``timeout_s``; ``echo`` gets the
    output as it comes. Returns (exit status, None when it was killed at the deadline) and the
    output's last bytes. The program runs in its own session, so the kill takes its children too."""
    proc = subprocess.Popen(
        list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    tail = b""
    fd = proc.stdout.fileno()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill_group(proc)
                return None, tail
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            tail = (tail + chunk)[-_TAIL_BYTES:]
            if echo is not None:
                echo(chunk)
        return proc.wait(timeout=max(0.1, deadline - time.monotonic())), tail
    except subprocess.TimeoutExpired:  # closed its output but did not exit
        _kill_group(proc)
        return None, tail
    finally:
        proc.stdout.close()


def _kill_group(proc: "subprocess.Popen[bytes]") -> None:
    for sig, wait in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait if wait is not None else _KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(
    command: Sequence[str],
    settings: Settings,
    step: Step,
    api_key: str = "",
    *,
    base_env: Optional[Mapping[str, str]] = None,
    echo: Optional[Callable[[bytes], None]] = None,
) -> StepResult:
    """Run one step: ``command`` starts bench_serving (e.g. ``[python, "-m", "sglang.bench_serving"]``),
    its arguments follow. A step is ok when bench_serving exits 0, wrote its record, and every
    prompt completed; otherwise ``problem`` says why and ``failed_requests`` how many failed."""
    settings.check()
    unhealthy = _health_problem(settings.base_url, settings.cafile)
    if unhealthy is not None:
        return StepResult(
            concurrency=step.concurrency, num_prompts=step.num_prompts, ok=False, failed_requests=step.num_prompts,
            problem=f"server not healthy before the step, bench_serving not started: {unhealthy}",
        )  # fmt: skip
    workdir = tempfile.mkdtemp(prefix="sglang-bench-")  # 0700: the raw record has the key in it
    output_file = str(Path(workdir) / "result.jsonl")
    args = bench_argv(settings, step, output_file, progress_bar=echo is not None)
    secrets = [api_key]
    started = time.monotonic()
    try:
        rc, raw_tail = run_bounded(
            [*command, *args], child_env(os.environ if base_env is None else base_env, api_key, settings.cafile),
            settings.timeout_s, cwd=workdir, echo=echo,
        )  # fmt: skip
        record = _last_record(output_file)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall_s = round(time.monotonic() - started, 3)
    tail = redact(_tail(raw_tail), secrets)
    record = redact(record, secrets) if record is not None else None
    errors = record.pop("errors", []) if record is not None else []
    texts = record.get("generated_texts") if record is not None else None
    for name in DETAIL_FIELDS:
        if record is not None:
            record.pop(name, None)
    failed = sum(1 for error in errors if error)
    # A request that "succeeded" with an empty answer is no success (a server answering 200 with nothing):
    # bench_serving counts its *requested* length as output tokens, so the texts decide.
    empty = sum(1 for text, error in zip(texts or [], errors or [""] * len(texts or [])) if not error and not text)
    samples = redact(error_samples(errors), secrets)
    problem = None
    if rc is None:
        problem = f"timed out after {settings.timeout_s:g} s (bench_serving killed; nothing measured)"
    elif rc != 0 or record is None:
        last = tail.splitlines()[-1] if tail else "(no output)"
        problem = f"bench_serving exited {rc} without a result: {last}"
    else:
        completed = int(record.get("completed") or 0)
        failed = max(failed + empty, step.num_prompts - completed + empty)
        counted = int(record.get("total_output_tokens") or 0)
        # What the answers really hold (bench_serving retokenizes them); a server's own detokenizer and
        # the client's tokenizer differ a little (real runs: within 8 %), never by half.
        real = int(record.get("total_output_tokens_retokenized", counted) or 0)
        if not real:
            problem = f"no output tokens: the server answered {completed} of {step.num_prompts} requests with nothing"
            failed = step.num_prompts
        elif real < counted / 2:
            problem = (f"the answers hold {real} tokens of the {counted} bench_serving counts: the server did not "
                       "generate what was asked, the throughput would be made up")  # fmt: skip
            failed = step.num_prompts
        elif empty:
            problem = f"{failed} of {step.num_prompts} requests failed ({empty} answered without a token)"
        elif failed:
            problem = f"{failed} of {step.num_prompts} requests failed"
    if record is None:
        failed = step.num_prompts
    return StepResult(
        concurrency=step.concurrency, num_prompts=step.num_prompts, ok=problem is None, failed_requests=failed,
        problem=problem, error_samples=samples, record=record, wall_s=wall_s, argv=args, output_tail=tail,
    )  # fmt: skip


def _health_problem(url: str, cafile: str = "") -> Optional[str]:
    """Why the server at ``url`` cannot be measured now (``/health_generate`` not 200), or None."""
    try:
        status = Endpoint(url, cafile=cafile).get(READY_PATH, timeout=SHORT_DEADLINE_S).status
    except (EndpointError, ValueError) as err:
        return str(err)
    return None if status == 200 else f"GET {url.rstrip('/')}{READY_PATH} answered {status}"


def _last_record(path: str) -> Optional[dict]:
    try:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return None
    try:
        record = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
