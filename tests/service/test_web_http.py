"""The web view over real loopback sockets: embedded and `lowtide serve`, its
endpoints, the secret's login, and the refusal of a non-loopback bind without one."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import TrackerService
from lowtide.service.auth import web_token
from lowtide.service.web.app import COOKIE
from tests.service.conftest import SECRET
from tests.service.procs import serve, write_graph

pytestmark = pytest.mark.socket


def fetch(
    url: str, target: str, method: str = "GET", **headers: str
) -> tuple[http.client.HTTPResponse, bytes]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, target, headers=headers)
        reply = conn.getresponse()
        return reply, reply.read()
    finally:
        conn.close()


def request(url: str, target: str, method: str = "GET", **headers: str) -> http.client.HTTPResponse:
    return fetch(url, target, method, **headers)[0]


def body(url: str, target: str, **headers: str) -> bytes:
    reply, data = fetch(url, target, **headers)
    assert reply.status == 200, reply.status
    return data


def test_the_embedded_view_is_opt_in_and_read_only(graph: SegmentGraph) -> None:
    off = TrackerService.start(graph)
    try:
        assert off.web_url is None and off.server.web_port == 0
    finally:
        off.stop()
    svc = TrackerService.start(graph, web_port=0)
    try:
        url = svc.web_url
        assert url is not None and url.startswith("http://127.0.0.1:") and "token" not in url
        assert b'<svg id="graph"' in body(url, "/")
        assert b"function drawGraph" in body(url, "/app.js")
        view = json.loads(body(url, "/api/view"))
        assert [s["name"] for s in view["segments"]] == ["src", "mid", "sink"]
        assert view["url"] == svc.url
        for method in ("POST", "PUT", "DELETE"):
            assert request(url, "/api/view", method).status == 405
        assert request(url, "/missing").status == 404
        assert request(url, "/api/view", Host="rebound.example:80").status == 403
    finally:
        svc.stop()


def test_the_view_follows_the_tracker(graph: SegmentGraph) -> None:
    svc = TrackerService.start(graph, web_port=0, metrics_every_ms=0)
    try:
        url = svc.web_url
        assert url is not None
        assert json.loads(body(url, "/api/view"))["fronts"] == []
        with svc.agent() as agent:
            agent.register_front(7, "src", 42)
            deadline = time.monotonic() + 30
            while not (view := json.loads(body(url, "/api/view")))["fronts"]:
                assert time.monotonic() < deadline, "the view never showed the front"
                time.sleep(0.05)
        assert view["fronts"][0]["front"] == 7 and view["fronts"][0]["heartbeat"] == 42
    finally:
        svc.stop()


def test_garbage_gets_a_400_and_the_server_goes_on(graph: SegmentGraph) -> None:
    svc = TrackerService.start(graph, web_port=0)
    try:
        with socket.create_connection(("127.0.0.1", svc.server.web_port), timeout=10) as s:
            s.sendall(b"\x16\x03\x01 not http\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400 ")
        assert svc.web_url is not None
        assert json.loads(body(svc.web_url, "/api/view"))["graph_known"]
    finally:
        svc.stop()


def test_with_a_secret_the_login_link_sets_a_cookie(graph: SegmentGraph) -> None:
    svc = TrackerService.start(graph, secret=SECRET, web_port=0)
    try:
        url = svc.web_url
        token = web_token(SECRET)
        assert url is not None and url.endswith(f"/?token={token}")
        assert request(url, "/api/view").status == 401
        assert request(url, "/?token=" + "1" * 64).status == 401
        login = request(url, f"/?token={token}")
        assert login.status == 303 and login.getheader("Location") == "/"
        cookie = (login.getheader("Set-Cookie") or "").split(";")[0]
        assert cookie == f"{COOKIE}={token}"
        assert json.loads(body(url, "/api/view", Cookie=cookie))["segments"]
        assert body(url, "/api/view", Authorization=f"Bearer {token}")
    finally:
        svc.stop()


def test_serve_refuses_a_non_loopback_view_without_a_secret(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LOWTIDE_SECRET"}
    cmd = [sys.executable, "-m", "lowtide.cli", "serve", "--port", "0",
           "--web-port", "0", "--web-host", "0.0.0.0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "requires a shared secret" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_prints_the_login_link(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    secret_file.chmod(0o600)
    graph = write_graph(tmp_path)
    args = ("--graph", str(graph), "--secret-file", str(secret_file), "--web-port", "0")
    with serve(tmp_path, *args) as server:
        assert server.proc.stdout is not None  # printed with the first line: maybe buffered
        line = server.proc.stdout.readline().strip()
        assert line.startswith("lowtide web http://127.0.0.1:")
        url = line.split()[-1]
        assert url.endswith(f"/?token={web_token(SECRET)}")
        assert request(url, "/api/view").status == 401
        view = json.loads(body(url, "/api/view", Authorization=f"Bearer {web_token(SECRET)}"))
        assert [s["name"] for s in view["segments"]] == ["src", "sink"]
