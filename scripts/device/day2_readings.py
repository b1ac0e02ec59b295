#!/usr/bin/env python3
"""Helper of scripts/device/day2-readings.sh (issues 24 and 25), standard library only (plus
sglang_deploy_host.serving.systemd to read the API key from the installed env file, as models_card does).

    day2_readings.py sizes K OUT.json [--manifest OUT.tsv.gz]   bytes and files of each cache under K
    day2_readings.py traffic URL ENV_FILE MODEL OUTDIR [--all-greedy --burst-deadline S]
                                                                  /metrics idle, traffic, during, after
    day2_readings.py probe URL ENV_FILE OUT.json [--timeout S]    one /generate with top_p 0.9: the first
                                                                  non-greedy sampling (flashinfer's JIT)
    day2_readings.py assemble R OUT.json                          jit-cache-starts.json from the starts

``sizes``: every directory directly under K is one cache (K/triton, K/home, ...): its bytes (st_size of
regular files, links not followed) and files, and a breakdown to depth 3 inside it (where the files are).
``traffic``: GET /metrics without a key (Prometheus' view; sglang lets /metrics and /health* through
its API-key check), then a few sequential /generate and streamed /v1/chat/completions, then a burst of
concurrent ones (more than --max-running-requests, so requests queue) while /metrics is scraped every
0.1 s (the page with the most running + queued requests is kept), then /metrics again after a pause.
The first call (2026-12-01 20:45) ran the defaults: its chats (temperature 0.7) joined a batch of greedy
requests, which made sglang sample with flashinfer's top-k/top-p kernels, JIT-compiled there and then (the
scheduler stopped for the whole 75 s burst deadline). ``--all-greedy`` (the second call) sends every request
greedy (temperature 0), so no batch needs those kernels, and waits for the burst to end before the
after-traffic page; ``probe`` then times that first non-greedy request on its own.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


# ----------------------------------------------------------------------------------------------- sizes
def _walk(root: Path):
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if path.is_symlink():
                continue
            yield path, st.st_size


def sizes(k: Path, manifest: Path | None) -> dict:
    caches, detail, rows = {}, {}, []
    for cache in sorted(p for p in k.iterdir() if p.is_dir()) if k.is_dir() else []:
        total, files, parts = 0, 0, {}
        for path, size in _walk(cache):
            total += size
            files += 1
            rel = path.relative_to(cache)
            rows.append(f"{cache.name}/{rel}\t{size}")
            key = "/".join(rel.parts[:-1][:3]) or "."
            part = parts.setdefault(key, [0, 0])
            part[0] += size
            part[1] += 1
        caches[cache.name] = {"bytes": total, "files": files}
        top = sorted(parts.items(), key=lambda kv: -kv[1][0])[:40]
        detail[cache.name] = {name: {"bytes": b, "files": f} for name, (b, f) in top}
    if manifest is not None:
        with gzip.open(manifest, "wt") as out:
            out.write("\n".join(sorted(rows)) + "\n")
    return {"dir": str(k), "at": time.time(), "caches": caches, "detail": detail}


def _manifest(path: Path) -> dict[str, int]:
    if not path.is_file():
        return {}
    with gzip.open(path, "rt") as f:
        return {line.split("\t")[0]: int(line.split("\t")[1]) for line in f if "\t" in line}


def added(before: Path, after: Path) -> dict:
    """Files in ``after`` and not in ``before`` (or of another size), per cache."""
    old, new = _manifest(before), _manifest(after)
    out: dict[str, dict[str, int]] = {}
    for name, size in new.items():
        if old.get(name) == size:
            continue
        entry = out.setdefault(name.split("/", 1)[0], {"bytes": 0, "files": 0})
        entry["bytes"] += size
        entry["files"] += 1
    return out


# ----------------------------------------------------------------------------------------------- traffic
class Client:
    def __init__(self, url: str, key: str):
        self.url, self.key = url.rstrip("/"), key

    def request(self, method: str, path: str, body: dict | None = None, auth: bool = True, timeout: float = 60,
                stream: bool = False) -> tuple[int, bytes, float]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth and self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                if stream:
                    chunks = []
                    for line in resp:
                        chunks.append(line)
                    payload = b"".join(chunks)
                else:
                    payload = resp.read()
                return resp.status, payload, time.monotonic() - t0
        except urllib.error.HTTPError as err:
            return err.code, err.read(), time.monotonic() - t0
        except Exception as err:  # noqa: BLE001 - recorded, never raised: the readings go on
            return -1, repr(err).encode(), time.monotonic() - t0


GAUGE = re.compile(r"^(?P<name>[^\s{#]+)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eEinfINFNa]+)")


def gauge_sum(page: str, suffix: str) -> float:
    total = 0.0
    for line in page.splitlines():
        m = GAUGE.match(line)
        if m and m.group("name").endswith(suffix):
            try:
                total += float(m.group("value"))
            except ValueError:
                pass
    return total


WORDS = ("the model server token request response health generate chat completion sglang triton kernel "
         "batch cache memory attention layer hello world user assistant system question answer").split()


def prompt(i: int, words: int) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words))


def api_key(env_file: Path) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "module_utils"))
    from sglang_deploy_host.serving import systemd  # noqa: PLC0415
    from sglang_deploy_host.serving import unit_flags  # noqa: PLC0415

    return systemd.env_file_values(env_file.read_text()).get(unit_flags.API_KEY_ENV, "")


def probe(url: str, env_file: Path, timeout: float) -> dict:
    """One non-greedy /generate (top_p 0.9) alone: sglang samples it with flashinfer's top-k/top-p kernels."""
    client = Client(url, api_key(env_file))
    body = {"text": prompt(1, 12), "sampling_params": {"max_new_tokens": 16, "temperature": 0.8, "top_p": 0.9}}
    t_wall = time.time()
    status, payload, secs = client.request("POST", "/generate", body, timeout=timeout)
    first = {"status": status, "seconds": round(secs, 2), "started_epoch": round(t_wall, 2), "timeout_s": timeout}
    if status != 200:
        first["body"] = payload[:300].decode("utf-8", "replace")
    status2, _, secs2 = client.request("POST", "/generate", body, timeout=60)
    return {"first_top_p_request": first, "second_top_p_request": {"status": status2, "seconds": round(secs2, 3)}}


def traffic(url: str, env_file: Path, model: str, outdir: Path, all_greedy: bool = False,
            burst_deadline: float = 75) -> dict:
    client = Client(url, api_key(env_file))
    outdir.mkdir(parents=True, exist_ok=True)
    report: dict = {"url": url, "model": model, "all_greedy": all_greedy, "burst_deadline_s": burst_deadline,
                    "requests": []}

    def scrape(name: str) -> str:
        status, body, secs = client.request("GET", "/metrics", auth=False, timeout=20)
        page = body.decode("utf-8", "replace")
        (outdir / f"metrics-{name}.txt").write_text(page)
        report[f"metrics_{name}"] = {"status": status, "bytes": len(body), "seconds": round(secs, 3),
                                     "running": gauge_sum(page, "num_running_reqs"),
                                     "queued": gauge_sum(page, "num_queue_reqs")}
        return page

    def record(kind: str, status: int, body: bytes, secs: float) -> None:
        entry = {"kind": kind, "status": status, "seconds": round(secs, 3), "bytes": len(body)}
        if status != 200:
            entry["body"] = body[:300].decode("utf-8", "replace")
        report["requests"].append(entry)

    def generate(i: int, words: int, max_new: int, ignore_eos: bool) -> None:
        body = {"text": prompt(i, words), "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                                              "ignore_eos": ignore_eos}}
        record("generate", *client.request("POST", "/generate", body, timeout=90))

    def chat(i: int, max_tokens: int) -> None:
        body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
                "temperature": 0 if all_greedy else 0.7, "messages": [{"role": "user", "content": prompt(i, 20)}]}
        record("chat_stream", *client.request("POST", "/v1/chat/completions", body, timeout=90, stream=True))

    # 1. idle, right after ready (the readiness gate's /health_generate requests have run)
    scrape("idle")
    # 2. a few sequential requests
    t0 = time.monotonic()
    for i in range(3):
        generate(i, 10 + 40 * i, 16, False)
    for i in range(2):
        chat(i, 32)
    # 3. a burst: 96 /generate (512 tokens each, ignore_eos) + 16 streamed chats at once, past
    #    --max-running-requests 64, with /metrics scraped every 0.1 s meanwhile
    best = {"score": -1.0, "page": ""}
    done = threading.Event()
    scrapes = []

    def scraper() -> None:
        while not done.is_set():
            status, body, _ = client.request("GET", "/metrics", auth=False, timeout=10)
            page = body.decode("utf-8", "replace")
            score = gauge_sum(page, "num_running_reqs") + gauge_sum(page, "num_queue_reqs")
            scrapes.append((round(time.monotonic() - t0, 2), status, score))
            if status == 200 and score > best["score"]:
                best.update(score=score, page=page)
            time.sleep(0.1)

    watcher = threading.Thread(target=scraper, daemon=True)
    watcher.start()
    workers = [threading.Thread(target=generate, args=(i, 8 + (i % 6) * 60, 512, True)) for i in range(96)]
    workers += [threading.Thread(target=chat, args=(i, 128)) for i in range(16)]
    burst0 = time.monotonic()
    for w in workers:
        w.start()
    deadline = burst0 + burst_deadline
    for w in workers:
        w.join(timeout=max(0.1, deadline - time.monotonic()))
    report["burst_unfinished"] = sum(w.is_alive() for w in workers)
    report["burst_seconds"] = round(time.monotonic() - burst0, 2)
    time.sleep(0.5)
    done.set()
    watcher.join(timeout=15)
    (outdir / "metrics-during-traffic.txt").write_text(best["page"])
    report["metrics_during_traffic"] = {"running_plus_queued": best["score"],
                                        "running": gauge_sum(best["page"], "num_running_reqs"),
                                        "queued": gauge_sum(best["page"], "num_queue_reqs"),
                                        "scrapes": len(scrapes)}
    report["scrape_series"] = scrapes
    # 4. after the traffic, once the gauges have had time to settle
    time.sleep(5 if all_greedy else 3)
    scrape("after-traffic")
    report["traffic_seconds"] = round(time.monotonic() - t0, 2)
    statuses: dict[str, int] = {}
    for r in report["requests"]:
        statuses[f"{r['kind']} {r['status']}"] = statuses.get(f"{r['kind']} {r['status']}", 0) + 1
    report["statuses"] = statuses
    (outdir / "traffic.json").write_text(json.dumps(report, indent=1))
    return report


# ----------------------------------------------------------------------------------------------- assemble
MILESTONES = re.compile(r"Engine startup timings|Capture .* graph (begin|end)|Load weight end|ready to roll|"
                        r"Init torch distributed ends|Memory pool end|Uvicorn running")


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def assemble(r: Path, out: Path) -> dict:
    starts = [("a_cold_empty_K", "start-a"), ("b_warm_same_K", "start-b"), ("c_cold_fresh_K2", "start-c"),
              ("d_cold_empty_K_call2", "start-d"), ("e_warm_same_K_call2", "start-e")]
    result: dict = {}
    for label, name in starts:
        d = r / name
        if not d.is_dir():
            continue
        entry: dict = {}
        secs = d / "seconds-to-ready.txt"
        entry["seconds_to_ready"] = float(secs.read_text()) if secs.is_file() else None
        rc = d / "ready-rc.txt"
        entry["ready"] = rc.is_file() and rc.read_text().strip() == "0"
        for snap in ("at-ready", "after-stop", "after-traffic", "after-probe", "before-start"):
            data = _json(d / f"caches-{snap}.json")
            if data:
                key = "caches" if snap == "at-ready" else f"caches_{snap.replace('-', '_')}"
                entry[key] = data["caches"]
                entry.setdefault("cache_dir", data["dir"])
                if snap == "at-ready":
                    entry["caches_detail"] = data["detail"]
        if (d / "caches-before-start.tsv.gz").is_file():
            entry["added_during_start"] = added(d / "caches-before-start.tsv.gz", d / "caches-at-ready.tsv.gz")
        log = d / "sglang.log"
        if log.is_file():
            entry["log_milestones"] = [line.rstrip()[:400] for line in log.read_text(errors="replace").splitlines()
                                       if MILESTONES.search(line)][:20]
        probe_json = _json(d / "probe.json")
        if probe_json:
            entry["top_p_probe"] = probe_json
        wait = d / "wait-ready.txt"
        if wait.is_file():
            entry["wait_ready_verdict"] = (wait.read_text().strip().splitlines() or [""])[-1]
        result[label] = entry
    out.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sizes")
    p.add_argument("k", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--manifest", type=Path)
    p = sub.add_parser("traffic")
    p.add_argument("url")
    p.add_argument("env_file", type=Path)
    p.add_argument("model")
    p.add_argument("outdir", type=Path)
    p.add_argument("--all-greedy", action="store_true")
    p.add_argument("--burst-deadline", type=float, default=75)
    p = sub.add_parser("probe")
    p.add_argument("url")
    p.add_argument("env_file", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--timeout", type=float, default=200)
    p = sub.add_parser("assemble")
    p.add_argument("r", type=Path)
    p.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "sizes":
        data = sizes(args.k, args.manifest)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(" ".join(f"{n}={c['bytes']}B/{c['files']}f" for n, c in data["caches"].items()))
    elif args.cmd == "traffic":
        rep = traffic(args.url, args.env_file, args.model, args.outdir, args.all_greedy, args.burst_deadline)
        print(json.dumps({k: rep[k] for k in rep if k not in ("requests", "scrape_series")}, indent=1))
    elif args.cmd == "probe":
        res = probe(args.url, args.env_file, args.timeout)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res))
    else:
        res = assemble(args.r, args.out)
        for label, e in res.items():
            filled = {n: c for n, c in e.get("caches", {}).items() if c["files"]}
            print(f"{label}: ready={e['ready']} seconds_to_ready={e['seconds_to_ready']} filled={filled}")
            if "added_during_start" in e:
                print(f"   added during this start: {e['added_during_start']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
