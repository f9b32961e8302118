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
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import Agent, TrackerService, wall_ms
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


def live_dom(url: str, tmp_path: Path) -> str:
    """The page's DOM once its script ran and fetched the view."""
    dom = chromium(tmp_path / "profile", "--dump-dom", url)
    assert re.search(r'id="state" class="state">live', dom), "the script did not fetch the view"
    return dom


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
    dom = live_dom(stuck_tracker, tmp_path)
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


# ------------------------------------------- what an operator looks at (issue 34 point 8)
HOSTILE = "<b>sink</b>"  # a segment name with markup: the page must show it as text
OPS_GRAPH = SegmentGraph.of(("src", ()), (HOSTILE, ("src",)))
SECOND_SERIES = (255, 127, 14)  # page.py's COLOURS[1]


def wait_for_view(url: str, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(url.split("?")[0] + "api/view", timeout=10) as reply:
            doc: dict[str, Any] = json.loads(reply.read())
        if doc and ready(doc):
            return doc
        assert time.monotonic() < deadline, f"the view never got there: {doc}"
        time.sleep(0.2)


def two_points_each(charts: dict[str, Any]) -> bool:
    """Every segment's lines have two points (a bucket may hold no figure of a
    segment yet: one point draws no line)."""
    return bool(charts["series"]) and all(
        sum(v is not None for v in series[key]) >= 2
        for series in charts["series"] for key in ("min_time_ms", "lag_ms"))


@pytest.fixture
def operated_tracker() -> Iterator[str]:
    """An embedded tracker that retires dead fronts: front 1 heartbeats with the clock
    (ok), front 2 five seconds behind it (lagging), front 3 fell silent (retired),
    front 4 was declared and never registered (it holds the segment where it was
    declared, so the sink's windows since then stay open). Yields the page's URL once
    the charts have two points."""
    svc = TrackerService.start(OPS_GRAPH, web_port=0, front_timeout_ms=3_000,
                               dead_fronts="retire", grid=TimeGrid(DELTA_MS))
    stop = threading.Event()
    try:
        with svc.agent() as agent:
            start = wall_ms() // DELTA_MS
            for front, at in ((2, start - 500), (1, start), (3, start)):
                agent.register_front(front, "src", at)
            agent.declare_front(4, "src", start + 100)

            def beat() -> None:
                while not stop.wait(0.1):
                    now = wall_ms() // DELTA_MS
                    agent.heartbeat(1, now)
                    agent.heartbeat(2, now - 500)

            beater = threading.Thread(target=beat, daemon=True)
            beater.start()
            url = svc.server.web_url
            assert url is not None
            wait_for_view(url, lambda d: two_points_each(d["charts"])
                          and {f["state"] for f in d["fronts"]} >= {"retired", "lagging"})
            yield url
            stop.set()
            beater.join(5)
    finally:
        stop.set()
        svc.stop()


@needs_chromium
def test_the_page_shows_utc_times_charts_open_windows_and_front_states(
    operated_tracker: str, tmp_path: Path
) -> None:
    dom = live_dom(operated_tracker, tmp_path)
    utc = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}"

    def rows(body: str) -> list[list[str]]:
        found = re.search(rf'<tbody id="{body}">(.*?)</tbody>', dom, re.S)
        assert found is not None, body
        return [re.findall(r"<td[^>]*>([^<]*)</td>", tr)
                for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", found.group(1), re.S)]

    fronts = {int(r[0]): r for r in rows("fronts")}
    assert {f: r[4] for f, r in fronts.items()} == {
        1: "ok", 2: "lagging", 3: "retired", 4: "declared"}
    assert re.fullmatch(utc, fronts[1][2]) and re.fullmatch(utc, fronts[4][2])
    assert "retired at" in fronts[3][5] and "slot" not in fronts[3][5]  # a UTC time there
    # the declared front holds the sink: its windows since then are open, with an ETA
    open_windows = rows("open-windows")
    assert open_windows and all(r[0] == "&lt;b&gt;sink&lt;/b&gt;" for r in open_windows)
    assert all(re.fullmatch(rf"\[{utc}, \d\d:\d\d:\d\d\.\d{{3}}\)", r[1]) for r in open_windows)
    assert all(re.fullmatch(utc, r[2]) or r[2].startswith("never") for r in open_windows)
    # a line per segment in each chart, named as text (the hostile name never as markup)
    for chart in ("chart-lag", "chart-min"):
        svg = re.search(rf'<svg id="{chart}".*?</svg>', dom, re.S)
        assert svg is not None
        assert re.findall(r'data-segment="([^"]*)"', svg.group(0)) == [
            "src", "&lt;b&gt;sink&lt;/b&gt;"]
        assert re.search(r'<path class="series" d="M[\d.]+,[\d.]+ L', svg.group(0))
    assert "<b>sink</b>" not in dom and "&lt;b&gt;sink&lt;/b&gt;" in dom

    # and the charts' lines are drawn: the second segment's colour (page.py's COLOURS)
    shot = tmp_path / "view.png"
    chromium(tmp_path / "profile", f"--screenshot={shot}", operated_tracker)
    image = png.decode(shot.read_bytes())[:, :, :3]
    assert int((image == SECOND_SERIES).all(axis=2).sum()) > 100
