"""The README's and docs' result tables are generated from the reports, and cannot drift from them;
every other result figure in them has a committed source (docfigures.py)."""

import glob
import os
import shutil

import pytest

from babygpt import docfigures, doctables
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


# ---- Every figure has a source --------------------------------------------------------------

SOURCE_REPORT = """# exp

| configuration | val loss | share |
|---|---|---|
| a | 2.2171 | 0.849 |

12 runs, 2171 s of training; eval 38.4% of rows.
"""


@pytest.fixture
def results(tmp_path):
    """A repository root (not a git work tree: every file counts as committed) with one experiment."""
    (tmp_path / "results" / "exp").mkdir(parents=True)
    (tmp_path / "results" / "exp" / "report.md").write_text(SOURCE_REPORT)
    (tmp_path / "results" / "exp" / "results.csv").write_text("name,wall_time_s,tokens_per_s\na,392.4,27123.5\n")
    return tmp_path


def findings(root, body: str) -> list[str]:
    """The unsourced findings of a page whose one section names results/exp and holds ``body``."""
    text = f"# Page\n\nFrom [the report](results/exp/report.md).\n\n{body}\n"
    return docfigures.unsourced(text, docfigures.Sources(str(root)), "page.md")


def figures(text: str) -> list[str]:
    return [f.text for f in docfigures.find_figures(docfigures.checked_text(text))]


def test_what_counts_as_a_result_figure():
    assert figures("losses 1.6214 and 0.064 ± 0.040, a slope of −0.72, 1.95e-05 per element") == \
        ["1.6214", "0.064", "0.040", "−0.72", "1.95e-05"]
    assert figures("38.4% of rows, 66–99% saturated, took 392 s, 3 min 18 s, 2.9–4.9 s, ≈ 27k tokens/s") == \
        ["38.4%", "66", "99%", "392 s", "3 min 18 s", "2.9", "4.9 s", "27k tokens/s"]
    not_figures = ("lr 3e-3 and 1e-2, 4 layers, 2,400 iterations, weight decay 0.1, alpha 0.5, torch 2.13.0, "
                   "Zhu et al. 2025 (arXiv:2503.10622), N(0, 0.02) weights, a 95% CI, [a link](../x/1.25.md)")
    assert figures(not_figures) == []
    assert figures("| config | train tokens/s | ms/iter | loss |\n|---|---|---|---|\n| a | 23,716 | 86.4 | 2.5 |\n") \
        == ["23,716", "86.4"]  # a column whose header names a rate or a time


def test_a_figure_is_found_in_the_results_its_section_names_and_rounded_to_its_precision(results):
    assert findings(results, "It ends at 2.2171 after 392 s, 6 min 32 s in all, at 27k tokens/s.") == []
    assert findings(results, "Rounded: 2.217, 2.22, 85% saturated, 38.4% of rows.") == []
    assert findings(results, "It ends at 2.2181.") == \
        ["page.md:5: 2.2181: not in the results its section names (results/exp)"]
    source_too_coarse = findings(results, "Within 0.8490 of it.")  # the source shows 0.849, not 0.8490
    assert source_too_coarse == ["page.md:5: 0.8490: not in the results its section names (results/exp)"]
    nowhere = docfigures.unsourced("# Page\n\nIt ends at 2.2171.\n", docfigures.Sources(str(results)), "p.md")
    assert nowhere == ["p.md:3: 2.2171: no source: its section names no results/ directory "
                       "(add a <!-- source: ... --> marker)"]


@pytest.mark.parametrize("stored", [False, True], ids=["run directory", "runs.jsonl"])
def test_the_records_of_single_runs_source_a_figure_only_where_named(results, stored):
    """A sweep's committed run records (results/exp/runs/<run>/, or their lines of the sweep's
    runs.jsonl) hold thousands of numbers: a section naming the experiment does not search them, a
    marker naming the run's file does."""
    from babygpt.runstore import RunStore, pack

    run = results / "results" / "exp" / "runs" / "a__seed=0"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"config": {"seed": 0}}')
    (run / "summary.json").write_text('{"status": "finished", "iter": 5, "val_loss_full": 2.4567, '
                                      '"final_val_loss": 2.5, "best_val_loss": 2.5}')
    if stored:
        RunStore(str(results / "results" / "exp")).add(pack(str(run)))
        shutil.rmtree(run)
    assert findings(results, "It ends at 2.4567.") == \
        ["page.md:5: 2.4567: not in the results its section names (results/exp)"]
    assert findings(results, "It ends at 2.4567. <!-- source: results/exp/runs/a__seed=0/summary.json -->") == []


def test_code_blocks_and_generated_tables_are_not_checked(results):
    body = ("```\nstep 400 | val 9.8765\n```\n\n    indented 9.8765\n\n"
            "<!-- generated: results/exp/report.md#t -->\n| 9.8765 |\n<!-- end generated -->\n")
    assert findings(results, body) == []
    assert findings(results, "The log line `val 9.8765` is prose.") == \
        ["page.md:5: 9.8765: not in the results its section names (results/exp)"]


def test_a_marker_excuses_or_names_the_source_of_the_sentence_or_block_it_follows(results):
    assert findings(results, "Kim et al. report 1.2345. <!-- source: paper --> Ours is 2.2171.") == []
    assert findings(results, "We get 1.2345. <!-- source: paper --> Ours is 9.9999.") == \
        ["page.md:5: 9.9999: not in the results its section names (results/exp)"]  # only the sentence before
    assert findings(results, "A 0.935 factor and 0.996, <!-- source: math: sqrt(7/8) --> all told.") == []
    table = "| a | b |\n|---|---|\n| 1.2345 | 5.4321 |\n<!-- source: paper: Table 2 -->\n"
    assert findings(results, table) == []  # a marker on its own line covers the block above it
    # A path narrows the search to that file: 2.2171 is in report.md, 392 s is not.
    assert findings(results, "It took 392 s. <!-- source: results/exp/results.csv -->") == []
    assert findings(results, "It ends at 2.2171. <!-- source: results/exp/results.csv -->") == \
        ["page.md:5: 2.2171: not in results/exp/results.csv"]


def test_a_markers_paths_serve_its_own_scope_only(results):
    (results / "results" / "other").mkdir()
    (results / "results" / "other" / "report.md").write_text("7.7777\n")
    body = "Elsewhere 7.7777. <!-- source: results/other/report.md --> Here 7.7777 again."
    assert findings(results, body) == ["page.md:5: 7.7777: not in the results its section names (results/exp)"]


def test_bad_markers_are_errors(results):
    missing = findings(results, "It ends at 1.6214. <!-- source: results/default_run/summary.json -->")
    assert missing == ["page.md:5: source results/default_run/summary.json is not a committed file "
                       "(commit it, or point the marker at the file that holds the figures)"]
    assert "unknown source 'papers'" in findings(results, "It is 1.2345. <!-- source: papers -->")[0]
    assert findings(results, "No figure here. <!-- source: paper -->") == \
        ["page.md:5: source marker covers no result figure: move it after the sentence or block that "
         "holds the figures, or remove it"]
    assert findings(results, "The syntax is `<!-- source: nowhere -->`, quoted as code.") == []


def test_check_names_each_unsourced_figure_with_its_line(results, monkeypatch, capsys):
    page = results / "page.md"
    page.write_text("# Page\n\n[report](results/exp/report.md)\n\nIt ends at 2.2171,\nthen at 3.1416.\n")
    monkeypatch.setattr(doctables, "ROOT", str(results))
    assert doctables.main(["--check", str(page)]) == 1
    assert "unsourced: page.md:6: 3.1416: not in the results its section names (results/exp)" in capsys.readouterr().err
    page.write_text("# Page\n\n[report](results/exp/report.md)\n\nIt ends at 2.2171.\n")
    assert doctables.main(["--check", str(page)]) == 0


@pytest.mark.slow
def test_committed_files_are_what_git_tracks():
    committed = docfigures.committed_files(ROOT)
    assert "results/exp2_norm_comparison/report.md" in committed
    assert not any(p.startswith(("results/quick/", "out/")) for p in committed)


@pytest.fixture(scope="module")
def sources():
    """The repository's committed results (tens of MB of stored runs), read once for every document,
    and only where these tests run: not at collection, which every worker and the fast loop pay."""
    return docfigures.Sources(ROOT)


@pytest.mark.xdist_group("doc-sources")  # one worker reads the results
@pytest.mark.parametrize("name", doctables.FIGURE_DOCUMENTS)
@pytest.mark.slow
def test_every_result_figure_of_the_committed_documents_has_a_committed_source(name, sources):
    """Run python -m babygpt.doctables --check to see these with the rule's hint."""
    assert docfigures.unsourced_in_file(os.path.join(ROOT, name), ROOT, sources) == []


def test_each_generated_table_has_one_home():
    """Among the reference pages (docs/*.md) a table is generated into one (docs/results.md holds every
    experiment's); the others link to it. The README's headline table and the lessons, which each
    stand alone, may quote one."""
    homes = {}
    for name in doctables.DOCUMENTS:
        if name == "README.md" or name.startswith(os.path.join("docs", "learn")):
            continue
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            for match in doctables.BLOCK.finditer(f.read()):
                homes.setdefault(f"{match.group('source')}#{match.group('key')}", []).append(name)
    assert {table: pages for table, pages in homes.items() if len(pages) > 1} == {}


def test_the_results_index_lists_every_report_with_its_command_and_is_current():
    from babygpt.resultsindex import INDEX, index_text, stale_index

    assert stale_index(ROOT) == [], "run python -m babygpt.doctables"
    text = index_text(ROOT)
    reports = glob.glob(os.path.join(ROOT, "results", "**", "report.md"), recursive=True)
    assert len([line for line in text.splitlines() if line.startswith("| [")]) == len(reports) > 0
    assert "| [full/exp2_gpt2](full/exp2_gpt2/report.md) | Normalization configurations compared | `tuned`, " in text
    assert os.path.isfile(os.path.join(ROOT, INDEX))


def test_a_stale_results_index_fails_the_check(tmp_path, monkeypatch):
    from babygpt import resultsindex

    (tmp_path / "results" / "x").mkdir(parents=True)
    (tmp_path / "results" / "x" / "report.md").write_text("# A question\n\nCommand: `python a.py | tee b`\n\n"
                                                           "<!-- table: t -->\n| a |\n|---|\n| 1 |\n")
    assert resultsindex.stale_index(str(tmp_path)) == [resultsindex.INDEX]
    (tmp_path / resultsindex.INDEX).write_text(resultsindex.index_text(str(tmp_path)))
    assert resultsindex.stale_index(str(tmp_path)) == []
    # the command that makes the report again: with --out where it wrote to the default (out/ now)
    assert "| `python a.py \\| tee b --out results/x` |" in resultsindex.index_text(str(tmp_path))
    (tmp_path / "results" / "x" / "report.md").write_text("# A question\n\nCommand: `python a.py --out=elsewhere`\n")
    assert "| `python a.py --out=elsewhere` |" in resultsindex.index_text(str(tmp_path))
