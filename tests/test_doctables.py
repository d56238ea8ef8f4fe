"""The README's and docs' result tables are generated from the reports, and cannot drift from them."""

import os
import re

import pytest

from babygpt import doctables
from babygpt.errors import BabyGPTError
from conftest import ROOT

REPORT = """# A report

<!-- table: tuned -->
| configuration | loss |
|---|---|
| a | 2.100 |

Some text.

<!-- table: other -->
| x |
|---|
| 1 |
"""


def document(body: str, key: str = "tuned") -> str:
    return f"# Doc\n\n<!-- generated: res/report.md#{key} -->\n{body}<!-- end generated -->\n\nAfter.\n"


@pytest.fixture
def root(tmp_path):
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "report.md").write_text(REPORT)
    return tmp_path


def test_a_block_is_replaced_by_its_reports_table(root):
    table = "| configuration | loss |\n|---|---|\n| a | 2.100 |\n"
    assert doctables.report_table(str(root / "res" / "report.md"), "tuned") == table
    assert doctables.render(document("old\n"), str(root)) == document(table)
    assert doctables.render(document("", "other"), str(root)) == document("| x |\n|---|\n| 1 |\n", "other")


def test_check_names_each_stale_block_and_main_rewrites_it(root, monkeypatch):
    path = root / "doc.md"
    path.write_text(document("| configuration | loss |\n|---|---|\n| a | 2.000 |\n"))
    assert doctables.stale_blocks(str(path), str(root)) == [f"{path}: res/report.md#tuned"]
    monkeypatch.setattr(doctables, "ROOT", str(root))
    assert doctables.main(["--check", str(path)]) == 1
    assert doctables.main([str(path)]) == 0
    assert doctables.main(["--check", str(path)]) == 0 and "| a | 2.100 |" in path.read_text()


def test_missing_reports_and_tables_are_named(root):
    with pytest.raises(BabyGPTError, match="run its experiment first"):
        doctables.render(document("", "tuned").replace("res/report.md", "res/none.md"), str(root))
    with pytest.raises(BabyGPTError, match="has no table 'nope'"):
        doctables.render(document("", "nope"), str(root))
    with pytest.raises(BabyGPTError, match="no markdown file"):
        doctables.main(["--check", str(root / "none.md")])


@pytest.mark.parametrize("name", doctables.DOCUMENTS)
def test_committed_documents_match_the_committed_reports(name):
    path = os.path.join(ROOT, name)
    with open(path, encoding="utf-8") as f:
        assert doctables.blocks(f.read()), f"{name} has no generated tables"
    assert doctables.stale_blocks(path) == [], "run python -m babygpt.doctables"


def test_every_figure_in_the_readme_results_comes_from_a_generated_table():
    """The prose of the README's results section may only repeat figures (numbers with a decimal
    point) that its generated tables show, so a rerun that changes a figure fails here."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Headline results"):]
    section = section[:section.index("\n## ", 1)]
    tables = "".join(m.group("body") for m in doctables.blocks(section))
    prose = doctables.BLOCK.sub("", section)
    figures = set(re.findall(r"(?<![\w.])\d+\.\d+", prose))
    shown = set(re.findall(r"(?<![\w.])\d+\.\d+", tables))
    assert tables and figures <= shown, f"figures in the prose but in no generated table: {sorted(figures - shown)}"
