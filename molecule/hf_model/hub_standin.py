#!/usr/bin/env python3
"""Stand-in for the Hugging Face hub (CI only): serves one directory as one repository at one commit.

Only the calls the hf_model role and `hf download` (huggingface_hub 2.x, commit-sha revision into
--local-dir) make: repository info with file sizes, the recursive tree listing, and HEAD/GET of
/resolve/ with the hub's headers (X-Repo-Commit, ETag, Content-Length) and byte ranges for resume.
Every request must carry `Authorization: Bearer <token>` (the token the role is given), so a
successful fetch proves the token reached hf download. Each request is appended to a log as JSON.

    python3 hub_standin.py --dir DIR --repo ORG/NAME --revision SHA --token TOKEN --log FILE [--port 8712] [--rate B/s]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def make_handler(
    root: Path, repo: str, revision: str, token: str, log: Path, rate: int
) -> type[BaseHTTPRequestHandler]:
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    digests = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in files.items()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
            return

        def _record(self, status: int) -> None:
            entry = {"method": self.command, "path": self.path, "status": status,
                     "range": self.headers.get("Range"), "authorized": self._authorized()}
            with log.open("a") as handle:
                handle.write(json.dumps(entry) + "\n")

        def _authorized(self) -> bool:
            return self.headers.get("Authorization") == f"Bearer {token}"

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self._record(status)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "HEAD":
                return
            # Throttled in 64 KiB pieces so a fetch lasts long enough for the role to report progress.
            for start in range(0, len(body), 65536):
                self.wfile.write(body[start:start + 65536])
                if rate:
                    time.sleep(65536 / rate)

        def _json(self, data: object) -> None:
            self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

        def _route(self) -> None:
            if not self._authorized():
                self._send(401, b'{"error": "Invalid credentials"}', {"Content-Type": "application/json"})
                return
            path = unquote(urlsplit(self.path).path)
            if path in (f"/api/models/{repo}/revision/{revision}", f"/api/models/{repo}"):
                self._json({"id": repo, "sha": revision,
                            "siblings": [{"rfilename": n, "size": p.stat().st_size} for n, p in files.items()]})
                return
            if path.startswith(f"/api/models/{repo}/tree/{revision}"):
                self._json([{"type": "file", "path": n, "size": p.stat().st_size,
                             "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for n, p in files.items()])
                return
            prefix = f"/{repo}/resolve/{revision}/"
            name = path[len(prefix):] if path.startswith(prefix) else None
            if name not in files:
                self._send(404, b'{"error": "Entry not found"}', {"Content-Type": "application/json",
                                                                  "X-Error-Code": "EntryNotFound"})
                return
            data = files[name].read_bytes()
            headers = {"X-Repo-Commit": revision, "ETag": f'"{digests[name]}"',
                       "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
            wanted = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if wanted and self.command == "GET":
                start = int(wanted.group(1))
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                self._send(206, data[start:], headers)
                return
            headers["Content-Length"] = str(len(data))
            self._send(200, data, headers)

        do_GET = _route  # noqa: N815 - BaseHTTPRequestHandler's naming
        do_HEAD = _route  # noqa: N815

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--token", default=os.environ.get("HUB_STANDIN_TOKEN", ""))
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8712)
    parser.add_argument("--rate", type=int, default=0, help="bytes per second per download (0 = unthrottled)")
    args = parser.parse_args()
    handler = make_handler(args.dir, args.repo, args.revision, args.token, args.log, args.rate)
    ThreadingHTTPServer(("127.0.0.1", args.port), handler).serve_forever()


if __name__ == "__main__":
    main()
