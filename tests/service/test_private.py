"""Private by default (issue 21, point 10): secret files only their owner can read,
metrics on loopback unless asked, and one-line errors from `lowtide status`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lowtide.cli import main as cli_main
from lowtide.service import TrackerService
from lowtide.service.auth import load_secret
from lowtide.service.deploy.standalone import add_arguments, server_config
from lowtide.service.deploy.standalone import main as serve_main
from tests.service.conftest import SECRET


def secret_file(tmp_path: Path, secret: bytes, mode: int) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(secret)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_secret_file_others_can_read_is_refused(
    tmp_path: Path, mode: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = secret_file(tmp_path, SECRET, mode)
    with pytest.raises(ValueError, match=f"chmod 600 {path}"):
        load_secret(path)
    assert serve_main(["--port", "0", "--secret-file", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"chmod 600 {path}" in err
    path.chmod(0o600)
    assert load_secret(path) == SECRET


def test_metrics_listen_on_loopback_unless_asked(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    secret = str(secret_file(tmp_path, SECRET, 0o600))
    base = ["--host", "0.0.0.0", "--metrics-port", "0", "--secret-file", secret]
    assert server_config(parser.parse_args(base)).metrics_host == "127.0.0.1"
    asked = parser.parse_args([*base, "--metrics-host", "0.0.0.0"])
    assert server_config(asked).metrics_host == "0.0.0.0"


@pytest.mark.socket
@pytest.mark.parametrize("given", ["none", "wrong", "open"])
def test_status_says_in_one_line_why_it_cannot_connect(
    secured: TrackerService,
    tmp_path: Path,
    given: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOWTIDE_SECRET", raising=False)
    args = ["status", "--url", secured.url, "--once"]
    if given == "wrong":
        args += ["--secret-file", str(secret_file(tmp_path, b"another secret, long enough", 0o600))]
    elif given == "open":
        args += ["--secret-file", str(secret_file(tmp_path, SECRET, 0o644))]
    assert cli_main(args) in (1, 2)
    err = capsys.readouterr().err.strip()
    assert err.startswith("lowtide status: ") and "\n" not in err
    assert ("chmod 600" if given == "open" else "secret") in err
    args = ["status", "--url", secured.url, "--once", "--secret-file"]
    assert cli_main([*args, str(secret_file(tmp_path, SECRET, 0o600))]) == 0
