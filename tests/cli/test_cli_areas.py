"""The CLI without an area's optional dependencies: a hint, not a traceback."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter (re-importing lowtide's packages in this one would leave
# other tests holding stale modules): rich made unimportable, as without the extras.
WITHOUT_RICH = """
import sys
sys.modules["rich"] = None
from lowtide import cli
parser = cli.build_parser()
print(parser.epilog)
sys.exit(cli.main(["bench", "core", "--batches", "20"]))
"""


def test_an_area_missing_its_dependency_is_named_with_its_extra() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_RICH], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr  # the core still runs
    epilog = out.stdout.splitlines()[0]
    assert "lowtide[service]" in epilog and "'rich'" in epilog
    assert "Traceback" not in out.stderr


def test_every_command_has_a_handler() -> None:
    """Each command and benchmark the CLI lists runs something (none only prints help)."""
    from lowtide.cli import build_parser

    parser = build_parser()
    top = next(a for a in parser._actions if a.dest == "command")
    commands = [[name] for name in top.choices if name not in ("bench", "spark")]
    bench = top.choices["bench"]._actions[-1].choices
    commands += [["bench", name] for name in bench]
    commands += [["spark", name] for name in top.choices["spark"]._actions[-1].choices]
    assert ["bench", "spark"] in commands and ["serve"] in commands
    for argv in commands:
        assert callable(getattr(parser.parse_args(argv), "handler", None)), argv
