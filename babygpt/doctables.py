"""Result tables in the README and docs, copied from the experiments' reports so they cannot go stale.

An experiment's report.md puts a marker line before each table it wants to be quotable:

    <!-- table: tuned -->
    | configuration | ... |

A markdown file quotes it with a block that names the report (relative to the repository root)
and the table; everything between the two marker lines is generated:

    <!-- generated: results/exp2_norm_comparison/report.md#tuned -->
    | configuration | ... |
    <!-- end generated -->

    python -m babygpt.doctables            rewrite the blocks of README.md, docs/results.md and the lessons,
                                           and results/README.md, the index of every report
    python -m babygpt.doctables --check    exit 1, naming each block that differs from its report,
                                           each result figure of README.md, docs/*.md and
                                           docs/learn/*.md that no committed result file holds
                                           (file:line and the figure; the rule is in docfigures.py),
                                           and each verdict stated in them that its table does not
                                           draw or that names no table (docverdicts.py)
"""

from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass

from .docfigures import Sources, unsourced_in_file
from .docverdicts import verdict_problems_in_file
from .errors import BabyGPTError
from .files import write_atomic
from .options import option, parse_into
from .resultsindex import INDEX, index_text, stale_index

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The README, the results and the lessons of the learning path (docs/learn/NN-*.md).
def _has_blocks(path: str) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        return any(line.startswith("<!-- generated: ") and line.rstrip().endswith("-->") for line in f)


# The pages whose tables are copied from the reports: the README, every docs/ page holding a
# generated block, and the lessons.
DOCUMENTS = ("README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
                                  if _has_blocks(p)),
             *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "learn", "[0-9][0-9]-*.md"))))
# Every markdown page whose figures must have a source (docfigures.py): the above, and the other docs.
FIGURE_DOCUMENTS = ("README.md",
                    *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))),
                    *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "learn", "*.md"))))
BLOCK = re.compile(r"(<!-- generated: (?P<source>[^#\s]+)#(?P<key>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.DOTALL)


def read_markdown(path: str, what: str = "markdown file") -> str:
    """The text of ``path``; a BabyGPTError naming it if it is not UTF-8 or cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise BabyGPTError(f"{what} '{path}' is not UTF-8 text (bad byte at offset {e.start}); "
                           f"save it as UTF-8") from None
    except FileNotFoundError:
        raise
    except OSError as e:
        raise BabyGPTError(f"cannot read {what} '{path}': {e.strerror}; check the path and its permissions") from None


def report_table(report_path: str, key: str) -> str:
    """The markdown table that follows ``<!-- table: key -->`` in a report (its lines up to the
    first line that is not a table row), with a trailing newline."""
    try:
        lines = read_markdown(report_path, "report").splitlines()
    except FileNotFoundError:
        raise BabyGPTError(f"{report_path} not found; run its experiment first") from None
    marker = f"<!-- table: {key} -->"
    if marker not in lines:
        raise BabyGPTError(f"{report_path} has no table '{key}' (no line '{marker}'); "
                           f"run its experiment again or fix the name")
    start = lines.index(marker) + 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    if end == start:
        raise BabyGPTError(f"{report_path}: no table follows '{marker}'")
    return "\n".join(lines[start:end]) + "\n"


def render(text: str, root: str | None = None) -> str:
    """``text`` with every generated block replaced by its report's table (paths under ``root``,
    default the repository)."""
    root = root or ROOT

    def fill(m: re.Match) -> str:
        return m.group(1) + report_table(os.path.join(root, m.group("source")), m.group("key")) + m.group(5)
    return BLOCK.sub(fill, text)


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def stale_blocks(path: str, root: str | None = None) -> list[str]:
    """'path: source#key' for each block of ``path`` whose body differs from its report."""
    root = root or ROOT
    text = read_markdown(path)
    return [f"{path}: {m.group('source')}#{m.group('key')}" for m in blocks(text)
            if m.group("body") != report_table(os.path.join(root, m.group("source")), m.group("key"))]


@dataclass
class DocTablesOptions:
    """python -m babygpt.doctables's command line."""

    files: list[str] = option([], "markdown files (none: README.md, docs/results.md and docs/learn/NN-*.md for the "
                                 "tables; README.md, docs/*.md and docs/learn/*.md for the figures)", positional=True,
                              metavar="FILE...")
    check: bool = option(False, "change nothing; exit 1 if a block differs from its report or a figure "
                                "has no committed source")


def check(table_paths: list[str], figure_paths: list[str], index: bool = False) -> int:
    """--check: print each stale block (and, with ``index``, a stale results/README.md), unsourced
    figure and unmarked or stale verdict to stderr; 1 if there is any."""
    sources = Sources(ROOT)
    found = [report("stale", [s for p in table_paths for s in stale_blocks(p)] + (stale_index(ROOT) if index else []),
                    "run python -m babygpt.doctables to regenerate them"),
             report("unsourced", [f for p in figure_paths for f in unsourced_in_file(p, ROOT, sources)],
                    "give each figure its committed source (a generated table, or a <!-- source: results/... --> "
                    "marker after its sentence), or reword or drop it; see babygpt/docfigures.py"),
             report("verdict", [v for p in figure_paths
                                for v in verdict_problems_in_file(p, ROOT, table_in_repository)],
                    "state each verdict as its table draws it, with a <!-- verdict: REPORT#TABLE name=verdict --> "
                    "marker after its sentence; see babygpt/docverdicts.py")]
    return 1 if any(found) else 0


def report(kind: str, findings: list[str], hint: str) -> bool:
    """Print each finding as 'kind: finding' to stderr, then the hint once; whether there was any."""
    for finding in findings:
        print(f"{kind}: {finding}", file=sys.stderr)
    if findings:
        print(hint, file=sys.stderr)
    return bool(findings)


def table_in_repository(report: str, key: str) -> str:
    """report_table() of a report named relative to the repository."""
    return report_table(os.path.join(ROOT, report), key)


def main(argv: list[str]) -> int:
    args = parse_into(DocTablesOptions, argv, "python -m babygpt.doctables [FILE ...] [--check]",
                      "Copy the experiments' report tables into the README and docs.")
    paths = args.files or [os.path.join(ROOT, d) for d in DOCUMENTS]
    figure_paths = args.files or [os.path.join(ROOT, d) for d in FIGURE_DOCUMENTS]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise BabyGPTError(*[f"'{p}' is a directory; pass markdown files" if os.path.isdir(p) else
                             f"no markdown file '{p}'; pass the files to update (default: README.md, "
                             f"docs/results.md and the lessons in docs/learn/ of the repository)" for p in missing])
    texts = {path: read_markdown(path) for path in dict.fromkeys(paths + (figure_paths if args.check else []))}
    if args.check:  # every file read above: a bad one is refused before any finding is printed
        return check(paths, figure_paths, index=not args.files)
    for path in paths:
        text = texts[path]
        new = render(text)  # every block, or an error before anything is written
        if new != text:
            write_atomic(path, new.encode("utf-8"))
            print(f"updated {path} ({len(blocks(text))} generated tables)")
    if not args.files and stale_index(ROOT):
        write_atomic(os.path.join(ROOT, INDEX), index_text(ROOT).encode("utf-8"))
        print(f"updated {INDEX}")
    return 0


if __name__ == "__main__":
    from .cli import run

    sys.exit(run(main, sys.argv[1:]))
