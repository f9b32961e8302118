"""What the commands print in normal runs and on a user's mistakes: what the README
says, one line per error with what to do, never a traceback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

LOWTIDE = [sys.executable, "-m", "lowtide.cli"]


def lowtide(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOWTIDE, *argv], capture_output=True, text=True, timeout=120)


def one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def free_port() -> int:
    """A port nobody listens on (bound, then released): connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_walkthrough_reports_the_lost_item_the_readme_names() -> None:
    done = lowtide("walkthrough")
    assert done.returncode == 0 and "Traceback" not in done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    missing = "segment 'parse', slots [100, 110): 1 item(s) missing"
    assert figures["stuck"] == [missing]
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert missing in readme


def test_status_live_says_it_is_connecting_while_the_server_is_down() -> None:
    url = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [*LOWTIDE, "status", "--url", url, "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # piped: each rendering printed as it comes
    finally:
        proc.kill()
        proc.wait(10)
    assert line.strip() == f"connecting to {url} (refused), retrying"


def test_status_once_against_a_down_server_is_one_line() -> None:
    url = f"tcp://127.0.0.1:{free_port()}"
    one_line_error(lowtide("status", "--url", url, "--once"), "(refused)", "lowtide serve")
    one_line_error(lowtide("spark", "status", "--url", url, "--once"), "(refused)", "lowtide serve")


def test_a_bad_url_is_one_line() -> None:
    one_line_error(lowtide("status", "--url", "nonsense", "--once"), "tcp://HOST:PORT")


def test_serve_with_a_bad_graph_is_one_line(tmp_path: Path) -> None:
    one_line_error(lowtide("serve", "--graph", str(tmp_path / "none.json")), "cannot read")
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    one_line_error(lowtide("serve", "--graph", str(bad)), "not a graph", "write JSON")


def test_serve_on_a_taken_port_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = lowtide("serve", "--port", port, "--log-level", "warning")
    one_line_error(done, "cannot listen", "--port 0")


def test_serve_labels_its_metrics_and_stops_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen(
        [*LOWTIDE, "serve", "--port", "0", "--metrics-port", "0", "--pipeline", "orders"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("lowtide serving tcp://127.0.0.1:")
        metrics_url = proc.stdout.readline().split()[-1]
        body = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(10)
    assert 'lowtide_connections{pipeline="orders"} 0.0' in body
    assert proc.returncode == 0 and "Traceback" not in err


def test_usage_errors_are_one_line_pointing_at_help() -> None:
    one_line_error(lowtide("serve", "--port", "99999"), "0-65535", "lowtide serve --help")
    one_line_error(lowtide("nosuch"), "invalid choice", "lowtide --help")
    one_line_error(lowtide("status", "--url", "tcp://127.0.0.1:99999", "--once"), "0-65535")


def test_serve_on_a_state_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    done = lowtide("serve", "--port", "0", "--state-dir", str(a_file), "--log-level", "warning")
    one_line_error(done, str(a_file), "--state-dir")
