"""Every number the documents quote has one source: a file the code writes (or the paper's, with
its source), between markers that `slora-vtc docs` refreshes; and those files are what the code
writes today."""

import json
import os
import re

import pytest

from slora_vtc.docs import DOCS, INCLUDE, NUMBER, Numbers, refresh_docs, refresh_text
from slora_vtc.errors import UserError
from slora_vtc.figures import render_figures
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.files import REPO

# numbers written in prose that are settings, definitions or arithmetic on them, not measurements
NOT_MEASURED = {
    ("paper_repro.md", "2401.00588"),  # the paper's arXiv id
    ("paper_repro.md", "10 %"),  # a threshold we count against
    ("paper_repro.md", "0.25"),
    ("paper_repro.md", "0.5"),  # shares of capacity, worked out
    ("paper_repro.md", "50 %"),  # the paper's prediction error setting
    ("paper_repro.md", "28.5"),  # the fairness table's window step: (600 - 30) / 20
    ("benchmarks/README.md", "15 %"),  # how noisy this shared machine is
    ("docs/design.md", "80 %"),  # the steady-state window's end
    ("docs/beyond.md", "2501.14312"),  # the DLPM paper's arXiv id
    ("docs/beyond.md", "4.1"),  # a theorem's number
}
FENCE, CODE, OTHER = (
    re.compile(r"```.*?```", re.S),
    re.compile(r"`[^`\n]*`"),
    re.compile(r"\]\([^)]*\)|<!--.*?-->", re.S),
)
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?!\.\d)|\d+(?:\.\d+)? ?%")


def test_committed_docs_quote_the_committed_numbers():
    assert refresh_docs([REPO / d for d in DOCS], write=False) == []


def test_no_measured_number_is_typed_by_hand():
    """A decimal or a percentage outside markers, code and links is a number nothing keeps true."""
    typed = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for pattern in (FENCE, INCLUDE, NUMBER, CODE, OTHER):
            text = pattern.sub(" ", text)
        typed += [(doc, m.group()) for m in MEASURED.finditer(text) if (doc, m.group()) not in NOT_MEASURED]
    assert typed == []


def test_a_stale_number_is_found_and_refreshed(tmp_path):
    numbers = Numbers(REPO)
    value = json.loads((REPO / "figures" / "numbers.json").read_text())["overload"]["vtc"]["throughput_tok_s"]
    stale = "VTC serves <!--n:fig:overload/vtc/throughput_tok_s-->1.0<!--/n--> tokens/s"
    assert (
        refresh_text(stale, numbers)
        == f"VTC serves <!--n:fig:overload/vtc/throughput_tok_s-->{value}<!--/n--> tokens/s"
    )
    doc = tmp_path / "doc.md"
    doc.write_text(stale)
    assert refresh_docs([doc], write=False, root=REPO) == [doc] and doc.read_text() == stale
    refresh_docs([doc], root=REPO)
    assert refresh_docs([doc], write=False, root=REPO) == []


def test_a_key_may_hold_an_arrow():
    """vllm_steps.json names its cross-checks "a->b": such a marker is read, not left as it was."""
    key = "vsteps:cross/median/poisson-burst->poisson-closed/wall"
    wall = json.loads((REPO / "benchmarks/results/vllm_steps.json").read_text())["cross"]["median"]
    expected = format(wall["poisson-burst->poisson-closed"]["wall"], "+.0%")
    assert refresh_text(f"<!--n:{key}|+.0%-->?<!--/n-->", Numbers(REPO)) == f"<!--n:{key}|+.0%-->{expected}<!--/n-->"


@pytest.mark.parametrize(
    "text, message",
    [
        ("<!--n:nowhere:x-->1<!--/n-->", "doc.md:1: number 'nowhere:x' names no source"),
        ("a\nb <!--n:fig:overload/vtc/testbed 1<!--/n-->", "doc.md:2: a number's marker is not KEY[|FORMAT]-->"),
        (
            "line\n<!--n:fig:overload/nope-->1<!--/n-->",
            "doc.md:2: figures/numbers.json has no 'overload/nope' (stopped at 'nope')",
        ),
        ("<!--n:fig:overload/vtc/testbed|.1f-->1<!--/n-->", "cannot format 'a10g-2024' with '.1f'"),
        (
            "<!--include:figures/tables/none.md-->\n<!--/include-->",
            "doc.md:1: included file figures/tables/none.md does not exist",
        ),
    ],
)
def test_a_broken_marker_names_file_and_line(text, message):
    with pytest.raises(UserError, match=re.escape(message)):
        refresh_text(text, Numbers(REPO), "doc.md")


@pytest.mark.slow
def test_committed_numbers_are_what_the_code_writes(tmp_path):
    """Regenerate every figure: numbers.json and the table fragments must equal the committed ones."""
    render_figures(None, tmp_path, jobs=os.cpu_count() or 1)
    committed = json.loads((REPO / "figures" / "numbers.json").read_text())
    assert json.loads((tmp_path / "numbers.json").read_text()) == committed
    for table in (REPO / "figures" / "tables").glob("*.md"):
        assert (tmp_path / "tables" / table.name).read_text() == table.read_text(), table.name
    assert (tmp_path / "fairness_tables.md").read_text() == (REPO / "figures" / "fairness_tables.md").read_text()


def test_a_document_named_on_the_command_line_is_read_where_the_user_stands(capsys, tmp_path, monkeypatch):
    """`docs FILE` reads FILE from the current folder, as every command does: README.md here is not the
    repository's (which it must not rewrite); a file that is missing or not text is one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text("no numbers quoted here\n")
    assert run_cli(capsys, "docs", "--check", "notes.md")[0] == 0
    code, _, err = run_cli(capsys, "docs", "--write", "README.md")
    assert_one_line_error(code, err, str(tmp_path / "README.md"), "no such markdown file")
    (tmp_path / "binary.md").write_bytes(b"\xff\xfe")
    code, _, err = run_cli(capsys, "docs", "--check", "binary.md")
    assert_one_line_error(code, err, "binary.md", "cannot read it as text")
