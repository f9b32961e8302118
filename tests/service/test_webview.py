"""The web view without sockets: its document from a tracker's status, and which
request gets which answer (routes, read-only, the secret's token, loopback hosts)."""

from __future__ import annotations

import json
import re
import time

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import ServerConfig, TrackerService
from lowtide.service.auth import web_token
from lowtide.service.net import HttpReply, HttpRequest, parse_http_head
from lowtide.service.web.app import COOKIE, WebApp
from lowtide.service.web.charts import ChartRing
from lowtide.service.web.page import APP_JS, PAGE_HTML
from lowtide.service.web.view import WebView, view_document
from tests.service import lost
from tests.service.conftest import SECRET

SLOT = 1_000


def stuck_status(svc: TrackerService, timeout_s: float = 30) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = svc.status()
        if status.get("stuck_detail"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"no stuck window in {svc.status()}")


def lost_items_status(**options: object) -> dict[str, object]:
    """The status of a tracker where ``lost`` lost its items, once they are stuck."""
    svc = TrackerService.start(lost.graph(), listen=False, stuck_after_ms=100, **options)
    try:
        with svc.agent() as agent:
            lost.lose_items(agent, SLOT)
            return stuck_status(svc)
    finally:
        svc.stop()


def test_the_document_shows_the_graph_fronts_and_the_stuck_window() -> None:
    status = lost_items_status()
    doc = view_document(status, lost.graph(), pipeline="orders")
    assert doc["pipeline"] == "orders" and doc["graph_known"]
    segments = {s["name"]: s for s in doc["segments"]}
    assert {n: s["depth"] for n, s in segments.items()} == {
        "src": 0, "parse": 1, "enrich": 1, "sink": 2
    }
    assert segments["sink"]["inbound"] == ["parse", "enrich"]
    assert segments["src"]["min_time"] == SLOT + 10  # the heartbeat passed, nothing left
    assert segments["parse"]["min_time"] == SLOT  # held by the lost items
    assert segments["parse"]["stuck_windows"] == 1 and segments["parse"]["open_windows"] == 1
    assert segments["parse"]["in_flight"] == lost.LOST
    now = doc["now_ms"]
    assert segments["parse"]["lag_ms"] == now - SLOT * 10
    assert segments["parse"]["received"] == lost.ITEMS - lost.LOST
    [stuck] = doc["stuck"]
    where = (stuck["segment"], stuck["window_start"], stuck["window_end"])
    assert where == ("parse", SLOT, SLOT + 1)
    assert (stuck["missing"], stuck["extra"]) == (lost.LOST, 0)
    # times in UTC, never slots (issue 34 point 8)
    assert (stuck["start_ms"], stuck["end_ms"]) == (SLOT * 10, (SLOT + 1) * 10)
    assert stuck["text"] == ("segment 'parse', [1970-01-01T00:00:10.000+00:00, "
                             "1970-01-01T00:00:10.010+00:00): 2 item(s) missing")
    [front] = doc["fronts"]
    assert front == {"front": lost.FRONT, "segment": "src", "heartbeat_ms": (SLOT + 10) * 10,
                     "heartbeat_lag_ms": now - (SLOT + 10) * 10, "state": "lagging",
                     "detail": ""}
    # the stuck window holds the sink: its windows are open, each with an ETA
    assert doc["open_windows"] and all(w["sink"] == "sink" and w["eta_ms"] >= now
                                       and w["late_ms"] is None for w in doc["open_windows"])
    assert doc["open_windows"][0]["start_ms"] == SLOT * 10
    assert doc["open_windows"][0]["held_by"].startswith("front 1 on 'src'")


def test_every_front_state() -> None:
    """ok, lagging (trails the pack), dead (waited for), ended, declared and not
    registered, retired (gone from the fronts, named by the tracker's events)."""
    now, delta = 100_000, 10
    status = {
        "now_ms": now, "delta_ms": delta,
        "fronts": {"1": ["src", 9_990], "2": ["src", 9_000], "3": ["src", 9_980],
                   "4": ["src", TimeGrid(delta).end_slot]},
        "fronts_dead": {"3": {"text": "front 3 dead, waited for: silent since "
                                      "1970-01-01T00:01:30+00:00 on 'src', its heartbeat at "
                                      "slot 9980"}},
        "fronts_declared": {"5": ["src", 9_000, -1]},
        "front_events": {"recent": [
            "front 6 retired at 1970-01-01T00:01:00+00:00: silent since "
            "1970-01-01T00:00:50+00:00 on 'src', its heartbeat at slot 5000",
            "retired: front 7 was declared on 'src' and did not register by its deadline"]},
    }
    fronts = {f["front"]: f for f in view_document(status, SegmentGraph.of(("src", ())))["fronts"]}
    assert {f: r["state"] for f, r in fronts.items()} == {
        1: "ok", 2: "lagging", 3: "dead", 4: "ended", 5: "declared", 6: "retired", 7: "retired"}
    assert fronts[3]["detail"].endswith("its heartbeat at 1970-01-01T00:01:39.800+00:00")
    assert fronts[6]["segment"] == "src" and "at 1970-01-01T00:00:50.000+00:00" in \
        fronts[6]["detail"]
    assert fronts[4]["heartbeat_ms"] is None and fronts[5]["heartbeat_ms"] == 90_000


def test_open_windows_come_from_the_sla_watch_when_there_is_one() -> None:
    status = lost_items_status(sla_ms=1)
    doc = view_document(status, lost.graph())
    assert doc["open_windows"] == status["freshness"]["open"]  # type: ignore[index]
    assert doc["open_windows"][0]["late_ms"] > 0


def test_the_charts_keep_the_last_hour_of_each_segment() -> None:
    graph = SegmentGraph.of(("src", ()), ("sink", ("src",)))
    view = WebView(charts=ChartRing(span_ms=60_000, bucket_ms=5_000))
    for i in range(30):  # 2 minutes, one refresh every 4 s; the sink lags 3 s more
        now = 1_000_000 + 4_000 * i
        view.observe({"now_ms": now, "delta_ms": 10, "segments": [
            {"segment": "src", "min_time": (now - 1_000) // 10},
            {"segment": "sink", "min_time": (now - 4_000) // 10}]}, graph)
    charts = json.loads(view.body)["charts"]
    last = 1_000_000 + 4_000 * 29
    assert len(charts["t_ms"]) == 12 and charts["t_ms"][-1] == last // 5_000 * 5_000
    src, sink = charts["series"]
    assert (src["segment"], sink["segment"]) == ("src", "sink")
    assert set(src["lag_ms"]) == {1_000} and set(sink["lag_ms"]) == {4_000}
    assert sink["min_time_ms"][-1] == last - 4_000


def test_rows_per_second_come_from_successive_refreshes() -> None:
    graph = SegmentGraph.of(("src", ()))
    view = WebView()

    def status(now_ms: int, received: int) -> dict[str, object]:
        seg = {"segment": "src", "min_time": 5, "received": received, "sent": received}
        return {"now_ms": now_ms, "delta_ms": 10, "global_min": 5, "segments": [seg]}

    view.observe(status(10_000, 100), graph)
    assert json.loads(view.body)["segments"][0]["rows_per_s"] is None  # one sample
    view.observe(status(11_000, 600), graph)
    assert json.loads(view.body)["segments"][0]["rows_per_s"] == 500.0


def test_before_a_graph_or_a_min_time_there_is_nothing_to_lag() -> None:
    doc = view_document({"now_ms": 5, "global_min": 0}, None)
    assert (doc["graph_known"], doc["segments"], doc["global_lag_ms"]) == (False, [], None)
    graph = SegmentGraph.of(("src", ()))
    seg = view_document({"segments": [{"segment": "src", "min_time": 0}]}, graph)["segments"][0]
    assert seg["lag_ms"] is None


# ------------------------------------------------------------------ HTTP side
def get(app: WebApp, target: str, **headers: str) -> HttpReply:
    return app.respond(HttpRequest("GET", target, {"host": "127.0.0.1:1", **headers}))


def header(reply: HttpReply, name: str) -> str | None:
    return dict(reply.headers).get(name)


@pytest.fixture
def open_app() -> WebApp:
    view = WebView()
    view.observe({"now_ms": 1, "segments": []}, SegmentGraph.of(("src", ())))
    return WebApp(view, secret=None)


def test_the_page_its_assets_and_its_data(open_app: WebApp) -> None:
    page = get(open_app, "/")
    assert page.status == 200 and page.content_type.startswith("text/html")
    assert b'<svg id="graph"' in page.body
    assert get(open_app, "/app.js").content_type.startswith("text/javascript")
    assert get(open_app, "/app.css").content_type.startswith("text/css")
    data = get(open_app, "/api/view")
    assert data.content_type == "application/json"
    assert json.loads(data.body)["segments"][0]["name"] == "src"
    assert get(open_app, "/nothing").status == 404
    csp = header(page, "Content-Security-Policy") or ""
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert header(page, "Referrer-Policy") == "no-referrer"


def test_the_page_loads_nothing_from_elsewhere() -> None:
    """It must work offline: every script and style it references is served here."""
    refs = re.findall(r'(?:src|href)="([^"]*)"', PAGE_HTML)
    assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_read_only(open_app: WebApp, method: str) -> None:
    reply = open_app.respond(HttpRequest(method, "/api/view", {"host": "localhost"}))
    assert reply.status == 405 and header(reply, "Allow") == "GET"


@pytest.mark.parametrize(
    ("host", "status"),
    [("127.0.0.1:8080", 200), ("localhost:8080", 200), ("[::1]:8080", 200),
     ("evil.example", 403), ("evil.example:8080", 403), ("10.0.0.1:8080", 403)],
)
def test_without_a_secret_only_loopback_names_are_answered(
    open_app: WebApp, host: str, status: int
) -> None:
    """A page elsewhere whose name rebinds to 127.0.0.1 still sends its own name."""
    assert get(open_app, "/api/view", host=host).status == status


def test_with_a_secret_the_token_logs_in_once_then_a_cookie_or_header_carries_it() -> None:
    app = WebApp(WebView(), SECRET)
    token = web_token(SECRET)
    refused = get(app, "/api/view")
    assert refused.status == 401 and b"login link" in refused.body
    assert header(refused, "WWW-Authenticate") == 'Bearer realm="lowtide"'
    assert get(app, "/?token=" + "0" * 64).status == 401
    login = get(app, "/?token=" + token)
    assert login.status == 303 and header(login, "Location") == "/"  # token off the URL
    cookie = header(login, "Set-Cookie") or ""
    assert cookie.startswith(f"{COOKIE}={token};") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert get(app, "/api/view", cookie=f"other=1; {COOKIE}={token}").status == 200
    assert get(app, "/api/view", cookie=f"{COOKIE}=wrong").status == 401
    assert get(app, "/api/view", authorization=f"Bearer {token}").status == 200
    assert get(app, "/api/view", authorization="Bearer wrong").status == 401
    # the token opens the view from any host name: the secret, not the name, decides
    assert get(app, "/", host="tracker.example", authorization=f"Bearer {token}").status == 200


def test_a_non_loopback_view_without_a_secret_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError) as refused:
        ServerConfig(web_port=0, web_host="0.0.0.0")
    assert "\n" not in str(refused.value) and "secret" in str(refused.value)
    ServerConfig(web_port=0, web_host="0.0.0.0", host="0.0.0.0", secret=SECRET)  # fine
    ServerConfig(web_host="0.0.0.0")  # the view is off: nothing is bound there


def test_http_heads_are_parsed_or_refused() -> None:
    head = b"GET /api/view?x=1 HTTP/1.1\r\nHost: localhost:1\r\nCookie: a=b\r\n\r\n"
    assert parse_http_head(head) == HttpRequest(
        "GET", "/api/view?x=1", {"host": "localhost:1", "cookie": "a=b"}
    )
    assert parse_http_head(b"\x16\x03\x01 hello\r\n\r\n") is None  # TLS, or garbage


def test_a_group_tracker_shows_its_role_and_epoch() -> None:
    """Rule 18: the status's ``ha`` reaches the page's summary line."""
    ha = {"role": "leader", "epoch": 3, "log": "kafka://127.0.0.1:9092/orders"}
    assert view_document({"ha": ha}, None)["ha"] == ha
    assert view_document({}, None)["ha"] is None
    assert "view.ha.role" in APP_JS
