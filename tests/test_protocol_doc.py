"""docs/PROTOCOL.md stays the protocol the code cites: every "rule N" cited in src/,
tests/ and docs/ is a numbered rule there, and every rule links a test file that
exists or says it is not built yet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = REPO / "docs" / "PROTOCOL.md"
#: "rule 6", "Rule 8", "rule-2 order", "rules 2 and 3", "rules 1, 2, 5, 6", "rule 3 and 6"
CITATION = re.compile(r"\b[Rr]ules?[ -](\d+(?:(?:, | and |, and )\d+)*)")
HEADING = re.compile(r"^### Rule (\d+): ", re.M)
TEST_LINK = re.compile(r"\]\(\.\./(tests/[\w/]+\.py)\)")


def cited(text: str) -> set[int]:
    return {int(n) for m in CITATION.finditer(text) for n in re.findall(r"\d+", m.group(1))}


def rules(doc: str) -> dict[int, str]:
    """Rule number -> its section (up to the next rule)."""
    starts = list(HEADING.finditer(doc))
    ends = [m.start() for m in starts[1:]] + [len(doc)]
    return {int(m.group(1)): doc[m.start():end] for m, end in zip(starts, ends, strict=True)}


def citing_files() -> list[Path]:
    files = [*(REPO / "src").rglob("*.py"), *(REPO / "tests").rglob("*.py"),
             *(REPO / "docs").glob("*.md"), REPO / "README.md"]
    return sorted(f for f in files if f != PROTOCOL)


def test_the_rules_are_numbered_one_by_one() -> None:
    numbers = [int(m.group(1)) for m in HEADING.finditer(PROTOCOL.read_text())]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 14


@pytest.mark.parametrize("path", citing_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_rule_is_in_the_protocol(path: Path) -> None:
    assert cited(path.read_text()) <= set(rules(PROTOCOL.read_text()))


def test_every_rule_links_a_test_or_says_it_is_not_built_yet() -> None:
    for number, section in rules(PROTOCOL.read_text()).items():
        links = TEST_LINK.findall(section)
        missing = [link for link in links if not (REPO / link).is_file()]
        assert not missing, f"rule {number} links tests that do not exist: {missing}"
        assert links or "not built yet" in section, f"rule {number} names no test"


def test_the_checks_catch_what_they_should() -> None:
    text = "see rule 6; Rules 2 and 3; rules 1, 2, 5, 6; rule 3 and 6; rule-7; the paper's rule"
    assert cited(text) == {1, 2, 3, 5, 6, 7}
    doc = ("### Rule 1: a\n[x](../tests/test_layers.py)\n### Rule 2: b\nnot built yet\n"
           "### Rule 3: c\nnothing\n")
    assert set(rules(doc)) == {1, 2, 3}
    assert TEST_LINK.findall(rules(doc)[1]) == ["tests/test_layers.py"]
    assert not TEST_LINK.findall(rules(doc)[3]) and "not built yet" not in rules(doc)[3]
