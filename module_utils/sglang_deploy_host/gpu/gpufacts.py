#!/usr/bin/env python3
"""GPU facts from ``nvidia-smi``: typed, and usable as a script on a host without this package.

STDLIB ONLY, Python >= 3.9: the preflight role copies this file to
``/usr/local/libexec/sglang-deploy/gpufacts.py`` and runs it with the host's ``python3``; the
sglang unit runs ``gpufacts.py idle`` as ``ExecStartPre=``. On the control node it is imported as
``sglang_deploy.gpufacts`` (preflight logic, testinfra).

Three invocations are parsed (the fixtures in tests/fixtures/nvidia-smi/ hold their output):
  ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits``  index, name, memory, cc, ...
  ``nvidia-smi -q -x``          XML: ECC errors, remapped rows, retired pages, recovery action, processes
  ``nvidia-smi topo -p2p r``    peer-to-peer read matrix (ANSI underline codes in the header)

Script:
  gpufacts.py facts [--json] [--from-dir DIR]     print the facts (exit 0 once they are parsed)
  gpufacts.py idle --max-used-mib N [--from-dir DIR]
      exit 0 when no GPU runs a compute process and each uses < N MiB; else exit 1 naming each busy
      GPU, its used MiB and PIDs, and the fix. Also exit 1 when nvidia-smi cannot report a GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "memory.free",
    "compute_cap",
    "driver_version",
    "persistence_mode",
    "pstate",
)
QUERY_ARGS: tuple[str, ...] = (
    "--query-gpu=" + ",".join(QUERY_FIELDS),
    "--format=csv,noheader,nounits",
)
XML_ARGS: tuple[str, ...] = ("-q", "-x")
P2P_ARGS: tuple[str, ...] = ("topo", "-p2p", "r")

# Files in a fixture directory (--from-dir) holding each invocation's stdout; FILE.rc holds the
# exit status and FILE.stderr the error output, when they were not 0 / empty.
FIXTURE_FILES: dict[str, tuple[str, ...]] = {
    "query-gpu.csv": QUERY_ARGS,
    "nvidia-smi-q.xml": XML_ARGS,
    "topo-p2p-r.txt": P2P_ARGS,
}

# nvidia-smi(1), RETURN VALUE: "15 - The GPU has fallen off the bus or has otherwise become
# inaccessible"; 9 - the driver is not loaded; 6 - the query was unsuccessful.
EXIT_GPU_LOST = 15
# The shell's (and run_nvidia_smi's) status for a command that does not exist.
EXIT_NOT_FOUND = 127
# What nvidia-smi prints for a GPU it found on the PCI bus but cannot open (NVML error string).
_DEVICE_HANDLE_RE = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu)\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.[0-9A-Fa-f]):?\s*(.*)"
)
# Field values that mean "nvidia-smi could not read this from the GPU" (not merely "not supported").
_ERROR_VALUES = ("ERR!", "[GPU requires reset]", "[GPU is lost]", "[Unknown Error]")
_NA_VALUES = ("N/A", "[N/A]", "[Not Supported]", "Not Supported", "")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
P2P_OK = "OK"

DEFAULT_NVIDIA_SMI = "nvidia-smi"


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a GPU context (from ``-q -x``)."""

    pid: int
    type: str
    name: str
    used_memory_mib: int | None

    @property
    def is_compute(self) -> bool:
        """``C`` (compute) or ``C+G``; a pure graphics ``G`` process (a display server) is not."""
        return "C" in self.type.upper()


@dataclass
class Gpu:
    """One GPU. ``None`` where nvidia-smi reported N/A or nothing."""

    index: int
    bus_id: str
    name: str | None = None
    uuid: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_cap: str | None = None
    driver_version: str | None = None
    persistence_mode: bool | None = None
    pstate: str | None = None
    ecc_mode: str | None = None
    ecc_volatile_uncorrectable: int | None = None
    ecc_aggregate_uncorrectable: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    recovery_action: str | None = None
    processes: list[GpuProcess] = field(default_factory=list)
    # Why this GPU is not usable, in words (fallen off the bus, ERR! fields, ECC state).
    health_problems: list[str] = field(default_factory=list)

    @property
    def compute_processes(self) -> list[GpuProcess]:
        return [p for p in self.processes if p.is_compute]


@dataclass(frozen=True)
class P2PLink:
    gpu: int
    peer: int
    status: str


@dataclass(frozen=True)
class Disk:
    """Space at a path (for /dev/shm and the weights directory), from ``os.statvfs``.

    ``measured_path`` is the nearest existing directory (the path itself may not exist yet);
    ``path_mib`` is what already lies under ``path`` (weights downloaded earlier count as there).
    """

    path: str
    measured_path: str
    size_mib: int
    free_mib: int
    path_mib: int


@dataclass
class GpuFacts:
    """Everything gpufacts knows about a host's GPUs."""

    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    p2p_read: list[P2PLink] = field(default_factory=list)
    # nvidia-smi failures: missing binary, driver not loaded, non-zero exit, unparsable output.
    errors: list[str] = field(default_factory=list)
    disks: list[Disk] = field(default_factory=list)
    # False when there is no nvidia-smi at all (a bare OS before the driver is installed).
    nvidia_smi_found: bool = True

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def healthy_gpus(self) -> list[Gpu]:
        return [g for g in self.gpus if not g.health_problems]

    def p2p_not_ok(self) -> list[P2PLink]:
        return [link for link in self.p2p_read if link.status != P2P_OK]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpu_count"] = self.gpu_count
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuFacts:
        """Inverse of :meth:`to_dict` (the preflight filter reads the host's JSON with this)."""
        gpus = []
        for raw in data.get("gpus", []):
            gpu_fields = {k: v for k, v in raw.items() if k != "processes"}
            gpu = Gpu(**gpu_fields)
            gpu.processes = [GpuProcess(**p) for p in raw.get("processes", [])]
            gpus.append(gpu)
        return cls(
            driver_version=data.get("driver_version"),
            cuda_version=data.get("cuda_version"),
            gpus=gpus,
            p2p_read=[P2PLink(**link) for link in data.get("p2p_read", [])],
            errors=list(data.get("errors", [])),
            disks=[Disk(**disk) for disk in data.get("disks", [])],
            nvidia_smi_found=bool(data.get("nvidia_smi_found", True)),
        )


# -- parsing -----------------------------------------------------------------------------------
def normalize_bus_id(bus_id: str) -> str:
    """``0000:0b:00.0`` and ``00000000:0B:00.0`` name the same GPU: 8-digit domain, upper case."""
    domain, sep, rest = bus_id.strip().partition(":")
    if not sep:
        return bus_id.strip().upper()
    return f"{int(domain, 16):08X}:{rest.upper()}"


def version_tuple(version: str) -> tuple[int, ...]:
    """``580.159.04`` -> (580, 159, 4), for comparing driver versions; ValueError if not dotted."""
    parts = version.strip().split(".")
    if not all(part.isdigit() for part in parts):
        raise ValueError(f"{version!r} is not a dotted version number")
    return tuple(int(part) for part in parts)


def _value(raw: str | None) -> str | None:
    if raw is None:
        return None
    text = raw.strip()
    return None if text in _NA_VALUES else text


def _int_mib(raw: str | None) -> int | None:
    """``143771``, ``143771 MiB`` -> 143771; N/A -> None."""
    text = _value(raw)
    if text is None:
        return None
    match = re.match(r"^(\d+)(?:\s*MiB)?$", text)
    return int(match.group(1)) if match else None


def _yes(raw: str | None) -> bool | None:
    text = _value(raw)
    if text is None:
        return None
    return text.lower() in ("yes", "enabled", "on", "true")


def parse_query_csv(text: str) -> tuple[list[Gpu], list[str]]:
    """GPUs from the ``--query-gpu`` CSV, and the lines that report an unreachable GPU.

    A GPU that has fallen off the bus appears as an ``Unable to determine the device handle``
    line (then it gets a placeholder entry with a health problem) or with ``ERR!``/``[GPU is
    lost]`` fields.
    """
    gpus: list[Gpu] = []
    errors: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        lost = _DEVICE_HANDLE_RE.search(line)
        if lost:
            bus_id = normalize_bus_id(lost.group(1))
            if any(g.bus_id == bus_id for g in gpus):
                continue
            reason = lost.group(2).strip() or "device handle unavailable"
            gpus.append(
                Gpu(
                    index=-1,
                    bus_id=bus_id,
                    health_problems=[f"nvidia-smi cannot open GPU {bus_id}: {reason}"],
                )
            )
            continue
        row = next(csv.reader([line], skipinitialspace=True))
        if len(row) != len(QUERY_FIELDS):
            errors.append(
                f"unexpected --query-gpu line (want {len(QUERY_FIELDS)} fields): {line!r}"
            )
            continue
        values = dict(zip(QUERY_FIELDS, (cell.strip() for cell in row)))
        bad = [f"{name}={val}" for name, val in values.items() if val in _ERROR_VALUES]
        try:
            index = int(values["index"])
        except ValueError:
            errors.append(f"--query-gpu line without a GPU index: {line!r}")
            continue
        gpu = Gpu(
            index=index,
            bus_id=normalize_bus_id(values["pci.bus_id"]),
            name=_value(values["name"]),
            uuid=_value(values["uuid"]),
            memory_total_mib=_int_mib(values["memory.total"]),
            memory_used_mib=_int_mib(values["memory.used"]),
            compute_cap=_value(values["compute_cap"]),
            driver_version=_value(values["driver_version"]),
            persistence_mode=_yes(values["persistence_mode"]),
            pstate=_value(values["pstate"]),
        )
        if bad:
            gpu.health_problems.append(
                f"nvidia-smi reports errors for GPU {index} ({gpu.bus_id}): {', '.join(bad)}"
            )
        gpus.append(gpu)
    # Unreachable GPUs get indices after the reachable ones, so every GPU has a distinct index.
    next_index = max((g.index for g in gpus), default=-1) + 1
    for gpu in gpus:
        if gpu.index < 0:
            gpu.index = next_index
            next_index += 1
    return gpus, errors


def _text(elem: ET.Element | None, path: str) -> str | None:
    if elem is None:
        return None
    found = elem.find(path)
    return None if found is None or found.text is None else found.text.strip()


def _count(raw: str | None) -> int | None:
    text = _value(raw)
    return int(text) if text is not None and text.isdigit() else None


def _uncorrectable(elem: ET.Element | None) -> int | None:
    """Sum of uncorrectable ECC counters under ``volatile``/``aggregate``.

    Drivers >= 575 (H200/Blackwell) report ``sram_uncorrectable_*``/``dram_uncorrectable``; older
    ones ``double_bit/total``. ``None`` when ECC counters are N/A (ECC off or not supported).
    """
    if elem is None:
        return None
    counts = [_count(c.text) for c in elem if "uncorrectable" in c.tag]
    double_bit = _count(_text(elem, "double_bit/total"))
    if double_bit is not None:
        counts.append(double_bit)
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def parse_query_xml(text: str) -> tuple[dict[str, dict[str, Any]], dict[str, str | None]]:
    """Per-GPU details from ``nvidia-smi -q -x`` keyed by normalized bus id, and the log's header."""
    root = ET.fromstring(text)
    header = {
        "driver_version": _value(_text(root, "driver_version")),
        "cuda_version": _value(_text(root, "cuda_version")),
    }
    details: dict[str, dict[str, Any]] = {}
    for gpu in root.findall("gpu"):
        bus_id = normalize_bus_id(gpu.get("id") or _text(gpu, "pci/pci_bus_id") or "")
        processes = []
        for proc in gpu.findall("processes/process_info"):
            pid = _count(_text(proc, "pid"))
            if pid is None:
                continue
            processes.append(
                GpuProcess(
                    pid=pid,
                    type=_text(proc, "type") or "",
                    name=_text(proc, "process_name") or "",
                    used_memory_mib=_int_mib(_text(proc, "used_memory")),
                )
            )
        ecc = gpu.find("ecc_errors")
        details[bus_id] = {
            "name": _value(_text(gpu, "product_name")),
            "uuid": _value(_text(gpu, "uuid")),
            "persistence_mode": _yes(_text(gpu, "persistence_mode")),
            "memory_total_mib": _int_mib(_text(gpu, "fb_memory_usage/total")),
            "memory_used_mib": _int_mib(_text(gpu, "fb_memory_usage/used")),
            "ecc_mode": _value(_text(gpu, "ecc_mode/current_ecc")),
            "ecc_volatile_uncorrectable": _uncorrectable(
                ecc.find("volatile") if ecc is not None else None
            ),
            "ecc_aggregate_uncorrectable": _uncorrectable(
                ecc.find("aggregate") if ecc is not None else None
            ),
            "sram_threshold_exceeded": _yes(_text(ecc, "aggregate/sram_threshold_exceeded")),
            "retired_pages_pending": _yes(_text(gpu, "retired_pages/pending_retirement")),
            "remapped_rows_pending": _yes(_text(gpu, "remapped_rows/remapped_row_pending")),
            "remapped_rows_failure": _yes(_text(gpu, "remapped_rows/remapped_row_failure")),
            "recovery_action": _value(_text(gpu, "gpu_recovery_action")),
            "processes": processes,
        }
    return details, header


def parse_p2p(text: str) -> list[P2PLink]:
    """Pairs from ``nvidia-smi topo -p2p r`` (header underlined with ANSI codes; ``X`` = self)."""
    lines = [_ANSI_RE.sub("", line) for line in text.splitlines()]
    header: list[int] = []
    links: list[P2PLink] = []
    for line in lines:
        cells = [c.strip() for c in line.split("\t")]
        words = [c for c in cells if c]
        if not words:
            if header:
                break  # the blank line before the legend ends the matrix
            continue
        if not header and all(re.fullmatch(r"GPU\d+", w) for w in words):
            header = [int(w[3:]) for w in words]
            continue
        if header and re.fullmatch(r"GPU\d+", words[0]):
            gpu = int(words[0][3:])
            for peer, status in zip(header, words[1:]):
                if peer != gpu:
                    links.append(P2PLink(gpu=gpu, peer=peer, status=status))
    return links


_HEALTH_RULES: tuple[tuple[str, str], ...] = (
    ("retired_pages_pending", "page retirement pending (a reboot/reset retires the pages)"),
    ("remapped_rows_pending", "row remapping pending (reset the GPU to apply it)"),
    ("remapped_rows_failure", "row remapping failed (the GPU needs service)"),
    ("sram_threshold_exceeded", "SRAM uncorrectable error threshold exceeded"),
)


def merge(
    gpus: list[Gpu],
    details: dict[str, dict[str, Any]],
    header: dict[str, str | None],
    p2p: list[P2PLink],
    errors: list[str],
) -> GpuFacts:
    """One :class:`GpuFacts` from the three sources; the CSV's list of GPUs is authoritative."""
    facts = GpuFacts(
        driver_version=header.get("driver_version"),
        cuda_version=header.get("cuda_version"),
        gpus=sorted(gpus, key=lambda g: g.index),
        p2p_read=p2p,
        errors=list(errors),
    )
    for gpu in facts.gpus:
        extra = details.get(gpu.bus_id)
        if extra is None:
            continue
        for key in ("name", "uuid", "persistence_mode", "memory_total_mib", "memory_used_mib"):
            if getattr(gpu, key) is None:
                setattr(gpu, key, extra[key])
        gpu.ecc_mode = extra["ecc_mode"]
        gpu.ecc_volatile_uncorrectable = extra["ecc_volatile_uncorrectable"]
        gpu.ecc_aggregate_uncorrectable = extra["ecc_aggregate_uncorrectable"]
        gpu.retired_pages_pending = extra["retired_pages_pending"]
        gpu.remapped_rows_pending = extra["remapped_rows_pending"]
        gpu.remapped_rows_failure = extra["remapped_rows_failure"]
        gpu.recovery_action = extra["recovery_action"]
        gpu.processes = list(extra["processes"])
        where = f"GPU {gpu.index} ({gpu.bus_id})"
        if gpu.ecc_volatile_uncorrectable:
            gpu.health_problems.append(
                f"{where}: {gpu.ecc_volatile_uncorrectable} uncorrectable ECC errors since the last "
                "driver load"
            )
        for key, words in _HEALTH_RULES:
            if extra.get(key):
                gpu.health_problems.append(f"{where}: {words}")
        if gpu.recovery_action and gpu.recovery_action.lower() != "none":
            gpu.health_problems.append(
                f"{where}: driver asks for recovery action {gpu.recovery_action!r}"
            )
    if facts.driver_version is None:
        facts.driver_version = next(
            (g.driver_version for g in facts.gpus if g.driver_version), None
        )
    return facts


# -- running nvidia-smi ------------------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    stdout: str
    stderr: str
    rc: int


# The status run_bounded gives a command it stopped: past its deadline (as timeout(1) says), over its cap.
EXIT_TIMED_OUT = 124
EXIT_TOO_LONG = 125
# What nvidia-smi may print: ``-q -x`` for 8 GPUs is ~0.3 MB; anything far beyond is not an answer.
NVIDIA_SMI_MAX_BYTES = 32 * 1024 * 1024
NVIDIA_SMI_TIMEOUT_S = 120.0


def run_bounded(argv: Sequence[str], timeout: float, max_bytes: int) -> Output:
    """``argv``'s output, bounded in time and bytes: past ``timeout`` seconds, or once stdout and stderr
    together pass ``max_bytes``, the command and everything it started (its own session) are killed, and the
    status says so (EXIT_TIMED_OUT, EXIT_TOO_LONG; EXIT_NOT_FOUND when it does not exist). Decoded as UTF-8
    with bad bytes replaced: a garbled answer is text, never an exception."""
    deadline = time.monotonic() + max(timeout, 0.0)
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
    except FileNotFoundError:
        return Output("", f"{argv[0]}: not found", EXIT_NOT_FOUND)
    except OSError as err:
        return Output("", f"{argv[0]}: cannot run it ({err.strerror})", EXIT_NOT_FOUND)
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    total, status = 0, None
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            selector.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                status = EXIT_TIMED_OUT
                break
            for key, _ in selector.select(timeout=min(left, 1.0)):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                chunks[key.fd].append(data)
                total += len(data)
            if total > max_bytes:
                status = EXIT_TOO_LONG
                break
    if status is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        rc = proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
    except subprocess.TimeoutExpired:  # the streams closed, the process did not end: stop it too
        os.killpg(proc.pid, signal.SIGKILL)
        rc, status = proc.wait(), EXIT_TIMED_OUT
    for stream in (proc.stdout, proc.stderr):
        stream.close()  # type: ignore[union-attr]
    out, err = (b"".join(chunks[fd])[:max_bytes].decode("utf-8", "replace") for fd in (out_fd, err_fd))
    if status == EXIT_TIMED_OUT:
        return Output(out, f"{' '.join(argv)}: no answer within {timeout:.0f} s (stopped)", EXIT_TIMED_OUT)
    if status == EXIT_TOO_LONG:
        return Output("", f"{' '.join(argv)}: printed more than {max_bytes:,} bytes (stopped): not an answer", EXIT_TOO_LONG)
    return Output(out, err, rc)


def run_nvidia_smi(args: Sequence[str], nvidia_smi: str = DEFAULT_NVIDIA_SMI, timeout: float = NVIDIA_SMI_TIMEOUT_S) -> Output:
    done = run_bounded([nvidia_smi, *args], timeout, NVIDIA_SMI_MAX_BYTES)
    if done.rc == EXIT_NOT_FOUND:
        return Output("", f"{nvidia_smi}: not found (is the NVIDIA driver installed?)", EXIT_NOT_FOUND)
    return done


def read_fixture(directory: Path, name: str) -> Output:
    path = directory / name
    if not path.is_file():
        return Output("", f"fixture {path} missing", 2)
    rc_file = directory / (name + ".rc")
    err_file = directory / (name + ".stderr")
    return Output(
        path.read_text(encoding="utf-8"),
        err_file.read_text(encoding="utf-8") if err_file.is_file() else "",
        int(rc_file.read_text(encoding="utf-8").strip()) if rc_file.is_file() else 0,
    )


def _failure(args: Sequence[str], out: Output) -> str:
    said = " ".join((out.stderr or out.stdout).split())[:500]
    meaning = {
        EXIT_GPU_LOST: " (a GPU has fallen off the bus or is otherwise inaccessible)",
        9: " (the NVIDIA driver is not loaded)",
    }.get(out.rc, "")
    return f"nvidia-smi {' '.join(args)} exited {out.rc}{meaning}: {said}"


def collect(
    nvidia_smi: str = DEFAULT_NVIDIA_SMI,
    from_dir: Path | None = None,
    runner: Callable[[Sequence[str]], Output] | None = None,
    p2p: bool = True,
) -> GpuFacts:
    """Run the three invocations and parse them (``p2p=False``: the first two only, for a health
    check that does not need the peer-to-peer matrix).

    ``from_dir`` replays a fixture directory; ``runner`` (nvidia-smi's arguments -> Output) runs
    them elsewhere, e.g. through testinfra's ``host.run`` on a remote host.
    """

    def get(name: str) -> Output:
        args = FIXTURE_FILES[name]
        if runner is not None:
            return runner(args)
        return read_fixture(from_dir, name) if from_dir else run_nvidia_smi(args, nvidia_smi)

    errors: list[str] = []
    query = get("query-gpu.csv")
    # A lost GPU makes nvidia-smi exit non-zero while it still reports the others: parse both
    # streams; the device-handle lines become GPUs with health problems.
    gpus, parse_errors = parse_query_csv(query.stdout + "\n" + query.stderr)
    if query.rc != 0:
        errors.append(_failure(QUERY_ARGS, query))
    errors.extend(e for e in parse_errors if query.rc == 0)
    details: dict[str, dict[str, Any]] = {}
    header: dict[str, str | None] = {}
    xml_out = get("nvidia-smi-q.xml")
    if xml_out.stdout.strip():
        try:
            details, header = parse_query_xml(xml_out.stdout)
        except ET.ParseError as err:
            errors.append(f"nvidia-smi -q -x output is not XML ({err})")
    if xml_out.rc != 0:
        errors.append(_failure(XML_ARGS, xml_out))
    links: list[P2PLink] = []
    if p2p:
        p2p_out = get("topo-p2p-r.txt")
        links = parse_p2p(p2p_out.stdout) if p2p_out.rc == 0 else []
        if p2p_out.rc != 0:
            errors.append(_failure(P2P_ARGS, p2p_out))
    facts = merge(gpus, details, header, links, errors)
    facts.nvidia_smi_found = query.rc != EXIT_NOT_FOUND
    return facts


# The Cache Directory Tagging Specification's first bytes (https://bford.info/cachedir/): uv tags its cache
# so, and the weights_disk role the kept disk's cache root. What lies under such a directory is no weights.
CACHEDIR_TAG = "CACHEDIR.TAG"
CACHEDIR_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"


def is_tagged_cache(directory: str) -> bool:
    """Whether ``directory`` holds a CACHEDIR.TAG with the specification's signature (43 bytes read)."""
    try:
        with open(os.path.join(directory, CACHEDIR_TAG), "rb") as tag:
            return tag.read(len(CACHEDIR_SIGNATURE)) == CACHEDIR_SIGNATURE
    except OSError:
        return False


def measure_disk(path: str) -> Disk:
    """Filesystem size/free space for ``path`` (its nearest existing parent) and bytes under it, without
    the caches under it (directories tagged with CACHEDIR.TAG: the kept disk's caches beside the weights)."""
    target = Path(path)
    measured = target
    while not measured.exists() and measured != measured.parent:
        measured = measured.parent
    stat = os.statvfs(measured)
    mib = 1024 * 1024
    under = 0
    if target.exists():
        for root, dirs, files in os.walk(target):
            dirs[:] = [d for d in dirs if not is_tagged_cache(os.path.join(root, d))]
            for name in files:
                try:
                    under += os.lstat(os.path.join(root, name)).st_blocks * 512
                except OSError:
                    continue  # a file removed while walking
    return Disk(
        path=path,
        measured_path=str(measured),
        size_mib=stat.f_blocks * stat.f_frsize // mib,
        free_mib=stat.f_bavail * stat.f_frsize // mib,
        path_mib=under // mib,
    )


# -- idle check --------------------------------------------------------------------------------
def health_problems(facts: GpuFacts) -> list[str]:
    """GPUs that cannot run a server: none found, fallen off the bus, ECC/remap state, ERR! fields."""
    problems: list[str] = []
    if not facts.gpus:
        said = f": {'; '.join(facts.errors)}" if facts.errors else ""
        problems.append("no GPU reported by nvidia-smi" + said)
    for gpu in facts.gpus:
        problems.extend(gpu.health_problems)
    return problems


def visible_gpu_count(facts: GpuFacts, visible: str | None) -> tuple[int, str]:
    """Usable GPUs a server with ``CUDA_VISIBLE_DEVICES=visible`` (None: unset) sees, and how they
    were counted (indices or UUIDs, as CUDA reads the variable)."""
    healthy = facts.healthy_gpus()
    if visible is None:
        return len(healthy), f"{len(healthy)} usable GPU(s) of {facts.gpu_count} listed"
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    usable = {str(g.index) for g in healthy} | {g.uuid for g in healthy if g.uuid}
    count = sum(1 for v in wanted if v in usable)
    return count, f"{count} usable GPU(s) in CUDA_VISIBLE_DEVICES={visible}"


def busy_problems(facts: GpuFacts, max_used_mib: int) -> list[str]:
    """GPUs holding compute processes or at least ``max_used_mib`` MiB; empty when all are free."""
    problems: list[str] = []
    for gpu in facts.gpus:
        busy = gpu.compute_processes
        used = gpu.memory_used_mib
        if busy or (used is not None and used >= max_used_mib):
            pids = ", ".join(f"{p.pid} ({p.name or '?'})" for p in busy) or "none visible"
            problems.append(
                f"GPU {gpu.index} ({gpu.bus_id}) is busy: {used if used is not None else '?'} MiB used "
                f"(limit {max_used_mib} MiB), compute processes: {pids}"
            )
    return problems


HEALTH_FIX = (
    "Fix: a GPU in this state cannot serve: reset it (`nvidia-smi -r -i INDEX` with nothing running "
    "on it) or reboot the VM (for passthrough, reset or reboot on the Proxmox host too); if it comes "
    "back, the GPU or its slot needs service."
)
IDLE_FIX = (
    "Fix: stop the stale server and whatever else holds the GPUs, e.g. `systemctl stop sglang`, then "
    "`pkill -9 -f sglang` for leftover workers (as the seeds did), and check that "
    "`nvidia-smi --query-gpu=index,memory.used --format=csv` shows 0 MiB on every GPU. "
    "A process invisible here (another container or VM) must be stopped where it runs."
)


# -- script ------------------------------------------------------------------------------------
def _human(facts: GpuFacts) -> str:
    lines = [f"driver {facts.driver_version}  CUDA {facts.cuda_version}  GPUs {facts.gpu_count}"]
    for g in facts.gpus:
        lines.append(
            f"GPU {g.index} {g.bus_id} {g.name} cc {g.compute_cap} "
            f"{g.memory_used_mib}/{g.memory_total_mib} MiB persistence "
            f"{'on' if g.persistence_mode else 'off'} processes {len(g.processes)}"
        )
        lines.extend("  problem: " + p for p in g.health_problems)
    not_ok = facts.p2p_not_ok()
    if not facts.p2p_read:
        p2p = "no GPU pairs reported"
    elif not_ok:
        p2p = ", ".join(sorted({link.status for link in not_ok})) + f" on {len(not_ok)} pairs"
    else:
        p2p = f"OK on all {len(facts.p2p_read)} pairs"
    lines.append("P2P read: " + p2p)
    lines.extend("error: " + e for e in facts.errors)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufacts.py", description=__doc__.splitlines()[0])
    parser.add_argument("--nvidia-smi", default=DEFAULT_NVIDIA_SMI, help="nvidia-smi to run")
    parser.add_argument("--from-dir", type=Path, help="read recorded output (fixture dir) instead")
    sub = parser.add_subparsers(dest="command", required=True)
    facts_cmd = sub.add_parser("facts", help="print the GPU facts")
    facts_cmd.add_argument("--json", action="store_true", help="as JSON")
    facts_cmd.add_argument(
        "--disk", action="append", default=[], help="also measure free space at PATH (repeatable)"
    )
    idle_cmd = sub.add_parser("idle", help="exit 0 only when every GPU is free for a new server")
    idle_cmd.add_argument(
        "--max-used-mib", type=int, required=True, help="used memory limit per GPU"
    )
    # Accept the global options after the subcommand too (ExecStartPre lines read better that way).
    for cmd in (facts_cmd, idle_cmd):
        cmd.add_argument("--nvidia-smi", dest="nvidia_smi_sub", help=argparse.SUPPRESS)
        cmd.add_argument("--from-dir", dest="from_dir_sub", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    nvidia_smi = args.nvidia_smi_sub or args.nvidia_smi
    from_dir = args.from_dir_sub or args.from_dir
    facts = collect(nvidia_smi=nvidia_smi, from_dir=from_dir)
    if args.command == "facts":
        facts.disks = [measure_disk(path) for path in args.disk]
        print(json.dumps(facts.to_dict(), indent=2, sort_keys=True) if args.json else _human(facts))
        return 0
    unhealthy = health_problems(facts)
    busy = busy_problems(facts, args.max_used_mib)
    if not unhealthy and not busy:
        print(f"gpufacts: {facts.gpu_count} GPU(s) idle (each < {args.max_used_mib} MiB used)")
        return 0
    report = ["gpufacts: GPUs are not free for a new server:"]
    report += [f"  - {p}" for p in unhealthy + busy]
    report += [HEALTH_FIX] if unhealthy else []
    report += [IDLE_FIX] if busy else []
    sys.stderr.write("\n".join(report) + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
