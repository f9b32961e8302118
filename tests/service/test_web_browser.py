"""The web view in a real headless browser (Debian's chromium): `lowtide serve` with a
secret tracks a small graph where two items get lost; the browser opens the login
link, runs the page's script, and the test reads both the DOM it built and its
screenshot (the graph's nodes drawn, the stuck segment in red)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lowtide.service import Agent
from lowtide.service.auth import web_token
from tests.service import lost, png
from tests.service.conftest import SECRET
from tests.service.procs import serve

pytestmark = pytest.mark.socket

CHROMIUM = Path("/usr/bin/chromium")
WIDTH, HEIGHT = 1200, 900
NODE_AREA = 240 * 70  # webpage.py's NODE_W x NODE_H
STUCK_RED, OK_GREEN = (211, 58, 44), (46, 158, 91)  # webpage.py's APP_CSS
DELTA_MS = 10

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"no browser at {CHROMIUM}: run `make browser` (Debian's chromium) for this test",
)


def chromium(profile: Path, *args: str) -> str:
    """Run headless chromium to the end (its virtual clock lets the page poll a few
    times first); stdout. Chromium starts helper processes: they share its new
    session, and all of them are killed by its pid if it overruns."""
    cmd = [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
           "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
           f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=4000", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, err[-2000:]
    return out


def view(url: str) -> dict[str, object]:
    req = urllib.request.Request(
        url.split("?")[0] + "api/view", headers={"Authorization": f"Bearer {web_token(SECRET)}"}
    )
    with urllib.request.urlopen(req, timeout=10) as reply:
        doc: dict[str, object] = json.loads(reply.read())
        return doc


@pytest.fixture
def stuck_tracker(tmp_path: Path) -> Iterator[str]:
    """`lowtide serve` with a stuck window in ``parse``; yields the login link."""
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    secret_file.chmod(0o600)
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(json.dumps(lost.SPEC))
    args = ("--graph", str(graph_file), "--secret-file", str(secret_file), "--web-port", "0",
            "--stuck-after-ms", "300", "--delta-ms", str(DELTA_MS))
    with serve(tmp_path, *args) as server:
        assert server.proc.stdout is not None
        login = server.proc.stdout.readline().split()[-1]
        with Agent.connect(server.url, lost.graph(), secret=SECRET) as agent:
            lost.lose_items(agent, int(time.time() * 1000) // DELTA_MS)
        deadline = time.monotonic() + 30
        while not view(login)["stuck"]:  # the page shows what the server saw: wait for it
            assert time.monotonic() < deadline, "the tracker found no stuck window"
            time.sleep(0.1)
        yield login


@needs_chromium
def test_the_page_draws_the_graph_and_the_stuck_window(
    stuck_tracker: str, tmp_path: Path
) -> None:
    dom = chromium(tmp_path / "profile", "--dump-dom", stuck_tracker)
    assert re.search(r'id="state" class="state">live', dom), "the script did not fetch the view"
    for name in ("src", "enrich", "sink"):
        assert f'<g class="node ok" id="node-{name}"' in dom
    assert '<g class="node stuck" id="node-parse"' in dom
    assert f"1 stuck: {lost.LOST} missing" in dom  # on the node
    row = re.search(r'<tbody id="stuck">(.*?)</tbody>', dom, re.S)
    assert row is not None
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))
    assert cells[0] == "parse" and cells[2:4] == [str(lost.LOST), "0"]  # missing, extra
    assert f"{lost.LOST} item(s) missing" in cells[-1]
    fronts = re.search(r'<tbody id="fronts">(.*?)</tbody>', dom, re.S)
    assert fronts is not None and f"<td>{lost.FRONT}</td><td>src</td>" in fronts.group(1)

    shot = tmp_path / "view.png"
    chromium(tmp_path / "profile", f"--screenshot={shot}", stuck_tracker)
    image = png.decode(shot.read_bytes())
    assert image.shape[:2] == (HEIGHT, WIDTH)
    assert len(np.unique(image.reshape(-1, image.shape[2])[:, :3], axis=0)) > 50  # not blank

    def pixels(colour: tuple[int, int, int]) -> int:
        return int((image[:, :, :3] == colour).all(axis=2).sum())

    # node fills, text drawn over them aside (the legend's keys are 144 pixels each)
    assert pixels(STUCK_RED) > NODE_AREA // 2  # parse
    assert pixels(OK_GREEN) > 3 * NODE_AREA // 2  # src, enrich, sink
