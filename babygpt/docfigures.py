"""Every result figure in the README and docs has a committed source.

A number typed into prose goes stale silently when an experiment is rerun, and a number that was
never in any output cannot be checked at all. So every *result figure* outside the generated
tables (see doctables.py) and outside code blocks must be found in a committed file under
``results/`` (report.md, *.csv, *.json, *.jsonl).

What counts as a result figure (the rule is in ``result_kind`` and ``column_figures``):

- a decimal with two or more digits after the point: 1.6214, 0.064 ± 0.040, −0.078, 1.95e-05;
- a percentage: 38.4%, 66–99% (but not a confidence level: "95% CI", "95% interval");
- a number tied to a unit of measured time or throughput: 392 s, 3 min 18 s, 2.9–4.9 s, 27k tokens/s,
  and every number of a table column whose header names one ("train tokens/s", "ms/iter").

Not figures: versions (torch 2.13.0), arXiv ids, years, integers and one-decimal values without a
unit (layers, iterations, LRs such as 3e-3 or 0.5), the parameters of a distribution written
N(0, 0.02), link targets and URLs.

Where a figure is looked for: a figure matches a source when a number there rounds to it at the
precision it is written with, or finer (so 2.2171 and 2.21706 both source 2.217, 0.66 sources 66%,
392.4 sources "6 min 32 s", but 2.2 does not source 2.20), in:

- the files a ``source:`` marker names, when the figure is in the marker's scope; or else
- the committed result files of every ``results/...`` directory its section (the text between
  two headings) mentions in its text: a generated table's report, a report link, a command's
  ``--out`` (a marker's own paths are not mentions: they cover only the marker's scope).
  A section that names none has no sources. (Searching all of results/ instead would accept about
  nine in ten random two-decimal numbers: its CSVs hold some 20,000 of them.)

The marker, an HTML comment that renders as nothing:

    ... took 392 s. <!-- source: results/default_run/summary.json -->
    ... inside the 7–64% saving Zhang & Sennrich 2019 report. <!-- source: paper -->
    ... the factor is √(127/128) ≈ 0.996. <!-- source: math -->

Written inside a line it covers the sentence it follows (back to the previous sentence end, list
item, table row or paragraph start); on a line of its own it covers the paragraph, list or table
directly above it. Its body is either committed file paths (the figures must be in one of them;
a path that is not committed is itself an error, so a pending source cannot be forgotten), or a
reason why the figures are not this project's results, followed by an optional note:
``paper`` (quoted from a paper or another project), ``math`` (arithmetic: a formula's value, or a
difference of sourced figures) or ``config`` (a setting or a budget target). A marker that covers
no figure is an error too, so markers cannot outlive the figures they were written for.
"""

from __future__ import annotations

import bisect
import glob
import json
import os
import re
import subprocess
from dataclasses import dataclass, field

from .errors import BabyGPTError
from .runstore import STORE, stored_file, stored_files
from .state import summary_problems

REASONS = {
    "paper": "quoted from a paper or another project",
    "math": "arithmetic: a formula's value or a difference of sourced figures",
    "config": "a setting or a budget target, not a measurement",
}
SOURCE_SUFFIXES = (".md", ".csv", ".json", ".jsonl")
RUNS_DIR = "runs"  # a sweep's run directories (babygpt.sweepdir)
RESULTS = "results"

# ---- The rule: what a result figure is ----------------------------------------------------------

# A number as prose writes it: thousands separators, a decimal part, an exponent, a k/M multiplier.
# Not inside a word, a path or a version, and not an arXiv id.
NUMBER = re.compile(r"(?<![\w.,/#])(?<!arXiv:)[+\-−]?(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.(?P<frac>\d+))?"
                    r"(?:e(?P<exp>[+\-−]?\d+))?(?P<mult>k|\s?M(?![\w]))?(?![\w.]?\d)(?![a-zA-Z_]\w)")
# What may follow a number to tie it to a time or a throughput; a range's upper end ("2.9–4.9 s",
# "3 min 18 s" is handled whole) lends its unit to the lower one.
RANGE_TAIL = re.compile(r"\s?(?:–|-|to)\s?[+\-−]?\d[\d,]*(?:\.\d+)?(?:k|\s?M(?!\w))?")
SECONDS = {"µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
           "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0}
TIME_UNIT = re.compile(r"[ \u00a0](?P<unit>µs|us|ms|sec|seconds?|s|min|minutes?|h|hours?)(?![\w/])")
RATE_UNIT = re.compile(r"\s?(?:tokens/s|tok/s|[GT]FLOP/s|ms/iter|it/s|µs per call)")
MIN_SEC = re.compile(r"[ \u00a0]min[ \u00a0](?P<sec>\d+)[ \u00a0]s(?!\w)")
PERCENT = re.compile(r"\s?%")
CONFIDENCE = re.compile(r"\s?%\s*(?:t-)?(?:CI|interval|confidence)")


@dataclass(frozen=True)
class Figure:
    """One result figure of a document: where it is, how it is written, and the (value, precision)
    readings a source number may round to."""

    start: int
    text: str
    readings: tuple[tuple[float, float], ...]


def precision_of(frac: str | None, exp: str | None) -> float:
    """The unit of the last written digit: 0.01 for 2.06, 1e-7 for 1.95e-05, 1 for 392."""
    return float(f"1e{-len(frac or '') + int((exp or '0').replace('−', '-'))}")  # 1e999 is inf, not an error


def number_value(m: re.Match) -> tuple[float, float]:
    """(absolute value, precision) of a NUMBER match, its k/M multiplier applied."""
    mult = {"k": 1e3, "M": 1e6}.get((m.group("mult") or "").strip(), 1.0)
    digits = m.group("int").replace(",", "") + ("." + m.group("frac") if m.group("frac") else "")
    exp = (m.group("exp") or "0").replace("−", "-")
    return float(f"{digits}e{exp}") * mult, precision_of(m.group("frac"), m.group("exp")) * mult


def after_range(text: str, pos: int) -> int:
    """Where the unit of the number ending at ``pos`` would start: past a range's upper end."""
    tail = RANGE_TAIL.match(text, pos)
    return tail.end() if tail else pos


def result_kind(text: str, m: re.Match) -> tuple[tuple[tuple[float, float], ...], int] | None:
    """(readings, end) if the NUMBER match ``m`` of ``text`` is a result figure (a time, a rate, a
    percentage, a decimal with two or more digits after the point), else None. The readings are
    the values a source may hold for it: a time also in seconds, a percentage also as a fraction."""
    value, prec = number_value(m)
    unit_at = after_range(text, m.end())
    min_sec = MIN_SEC.match(text, m.end())
    if min_sec and not m.group("frac"):
        return ((value * 60 + int(min_sec.group("sec")), 1.0),), min_sec.end()
    time = TIME_UNIT.match(text, unit_at)
    if time:
        scale = SECONDS[time.group("unit")]
        readings = ((value, prec),) if scale == 1.0 else ((value, prec), (value * scale, prec * scale))
        return readings, (time.end() if unit_at == m.end() else m.end())
    rate = RATE_UNIT.match(text, unit_at)
    if rate:
        return ((value, prec),), (rate.end() if unit_at == m.end() else m.end())
    percent = PERCENT.match(text, unit_at)
    if percent and not CONFIDENCE.match(text, unit_at):
        return ((value, prec), (value / 100, prec / 100)), (percent.end() if unit_at == m.end() else m.end())
    if m.group("frac") and len(m.group("frac")) >= 2:
        return ((value, prec),), m.end()
    return None


def find_figures(masked: str) -> list[Figure]:
    """Every result figure of ``masked`` (a document with its unchecked parts blanked out): the
    figures of its text, and the numbers of table columns whose header names a time or a rate."""
    found, taken = [], 0
    for m in NUMBER.finditer(masked):
        kind = None if m.start() < taken else result_kind(masked, m)  # "18 s" of "3 min 18 s" is taken
        if kind:
            readings, end = kind
            found.append(Figure(m.start(), masked[m.start():end].strip(), readings))
            taken = end
    starts = {f.start for f in found}
    found += [f for f in column_figures(masked) if f.start not in starts]
    return sorted(found, key=lambda f: f.start)


TABLE_ROW = re.compile(r"^[ \t]*\|.*$", re.MULTILINE)
HEADER_UNIT = re.compile(r"tokens/s|tok/s|[GT]FLOP/s|ms/iter|µs|\((?:s|ms|min)\)|\bms\b")


def cells(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """(start, end) offsets of the cells of the table row text[start:end] (split at unescaped |)."""
    bars = [i for i in range(start, end) if text[i] == "|" and text[i - 1] != "\\"]
    return list(zip(bars, bars[1:]))


def column_figures(masked: str) -> list[Figure]:
    """Every number in a table column whose header names a unit of time or throughput
    ("train tokens/s", "ms/iter"): a typed table's cell is a figure even with its unit above it."""
    found, rows = [], list(TABLE_ROW.finditer(masked))
    tables, current = [], []
    for row in rows:  # contiguous rows form one table
        if current and masked.count("\n", current[-1].end(), row.start()) > 1:
            tables.append(current)
            current = []
        current.append(row)
    tables += [current] if current else []
    for table in tables:
        header = cells(masked, *table[0].span())
        timed = {i for i, (a, b) in enumerate(header) if HEADER_UNIT.search(masked[a:b])}
        for row in table[2:]:
            for i, (a, b) in enumerate(cells(masked, *row.span())):
                if i not in timed:
                    continue
                for m in NUMBER.finditer(masked, a + 1, b):
                    value, prec = number_value(m)
                    found.append(Figure(m.start(), m.group().strip(), ((value, prec),)))
    return found


# ---- What is not checked: code, generated tables, comments, links --------------------------------

FENCE = re.compile(r"^\s*(```+|~~~+)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
GENERATED = re.compile(r"^<!-- generated: \S+ -->\n.*?^<!-- end generated -->", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"(`+)(?!`)(?:(?!\n\s*\n).)*?(?<!`)\1(?!`)", re.DOTALL)  # within a paragraph
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
LINK_TARGET = re.compile(r"\]\([^)\s]*\)|<https?://[^>]*>|https?://\S+")
DISTRIBUTION = re.compile(r"\bN\([^()]*\)")  # N(0, 0.02): an init's parameters, a setting


def blank(text: str, spans) -> str:
    """``text`` with each (start, end) span replaced by spaces, newlines kept: offsets and line
    numbers stay those of the file."""
    chars = list(text)
    for start, end in spans:
        for i in range(start, end):
            if chars[i] != "\n":
                chars[i] = " "
    return "".join(chars)


def code_block_spans(text: str) -> list[tuple[int, int]]:
    """Fenced code blocks, and indented (4-space) blocks that start after a blank line outside a
    list: what a reader sees as code."""
    spans, offset, fence, in_list, prev_blank, in_indented = [], 0, None, False, True, False
    for line in text.splitlines(keepends=True):
        start, offset = offset, offset + len(line)
        stripped = line.strip()
        if fence:
            spans.append((start, offset))
            if stripped.startswith(fence):
                fence = None
            continue
        opening = FENCE.match(line)
        if opening:
            fence = opening.group(1)
            spans.append((start, offset))
            continue
        indented = line.startswith(("    ", "\t")) and stripped
        if indented and (in_indented or (prev_blank and not in_list)):
            spans.append((start, offset))
            in_indented = True
        elif stripped:
            in_indented = False
            if LIST_ITEM.match(line):
                in_list = True
            elif not line.startswith((" ", "\t")):
                in_list = False
        prev_blank = not stripped
    return spans


def without_blocks(text: str) -> str:
    """``text`` with its code blocks and generated tables blanked."""
    text = blank(text, code_block_spans(text))
    return blank(text, [m.span() for m in GENERATED.finditer(text)])


def without_code(text: str) -> str:
    """``text`` with code blocks, generated tables and inline code blanked: where markers live
    (a marker quoted in inline code is an example, not a marker)."""
    text = without_blocks(text)
    return blank(text, [m.span() for m in INLINE_CODE.finditer(text)])


def checked_text(text: str) -> str:
    """``text`` with everything a figure is not looked for in blanked: code blocks, generated
    tables, comments (markers included), link targets, URLs and N(…) settings. Inline code stays:
    a run's output quoted there (`val 2.0951`) is a figure like any other."""
    text = without_blocks(text)
    for pattern in (COMMENT, LINK_TARGET, DISTRIBUTION):
        text = blank(text, [m.span() for m in pattern.finditer(text)])
    return text


# ---- Markers ------------------------------------------------------------------------------------

MARKER = re.compile(r"<!--\s*source:\s*(?P<body>.*?)\s*-->", re.DOTALL)
ABBREVIATION = re.compile(r"\b(?:e\.g|i\.e|al|vs|cf|Fig|Eq|Tab|approx)$")
SENTENCE_END = re.compile(r"[.!?][*_)]*\s+(?=[A-Z*_(\[`])")
HEADING = re.compile(r"^#{1,6}\s", re.MULTILINE)
BLANK_LINE = re.compile(r"\n[ \t]*\n")
BLOCK_START = re.compile(r"\n(?=[ \t]*(?:[-*+]|\d+\.)\s|[ \t]*\||#)")  # a list item, table row or heading


@dataclass
class Marker:
    """A ``<!-- source: ... -->`` comment: the span of text it covers, and either the committed
    files its figures come from or the reason they are not this project's results."""

    line: int
    scope: tuple[int, int]
    paths: list[str] = field(default_factory=list)
    reason: str | None = None


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def sentence_start(text: str, end: int) -> int:
    """Where the sentence that ends at ``end`` begins: after the previous sentence end, comment or
    blank line, or at the start of its list item, table row or heading line."""
    body = text[:end].rstrip().rstrip(".!?:;*_) ")  # its own full stop is not its start
    floor = 0
    for pattern in (BLANK_LINE, BLOCK_START, COMMENT):
        for m in pattern.finditer(body):
            floor = max(floor, m.end() if pattern is not BLOCK_START else m.start() + 1)
    start = floor
    for m in SENTENCE_END.finditer(body, floor):
        if not ABBREVIATION.search(body[:m.start()]):
            start = m.end()
    return start


def block_above(text: str, line_start: int) -> tuple[int, int]:
    """The span of the paragraph, list or table that ends on the line before ``line_start``
    (empty if that line is blank)."""
    end = line_start
    start = end
    while start > 0:
        prev = text.rfind("\n", 0, start - 1) + 1
        if not text[prev:start].strip():
            break
        start = prev
    return start, end


def parse_body(body: str, committed: set[str]) -> tuple[list[str], str | None, str | None]:
    """(paths, reason, problem) of a marker's body."""
    words = body.split()
    if not words:
        return [], None, "empty source marker; name a committed file or one of: " + ", ".join(REASONS)
    if words[0].rstrip(":") in REASONS:  # "math", or "math: 0.02·√2" with a note
        return [], words[0].rstrip(":"), None
    paths = [w.strip(",;") for w in words]
    missing = [p for p in paths if p not in committed]
    if missing:
        looks_like_path = [p for p in missing if "/" in p or p.endswith(SOURCE_SUFFIXES)]
        if looks_like_path:  # reported once here; its figures wait for the file
            return [], None, (f"source {', '.join(looks_like_path)} is not a committed file "
                                 f"(commit it, or point the marker at the file that holds the figures)")
        return [], None, (f"unknown source '{missing[0]}'; name a committed file or one of: "
                             + ", ".join(f"{k} ({v})" for k, v in REASONS.items()))
    return paths, None, None


def marker_scopes(text: str, pattern: re.Pattern) -> list[tuple[re.Match, int, tuple[int, int]]]:
    """(match, line, scope) of each comment of ``pattern`` in ``text`` (code excluded): written inside
    a line it covers the sentence it follows, on a line of its own the block directly above it."""
    visible = without_code(text)
    found = []
    for m in pattern.finditer(visible):
        line_start = visible.rfind("\n", 0, m.start()) + 1
        line_end = visible.find("\n", m.end())
        line_end = len(visible) if line_end < 0 else line_end
        alone = not visible[line_start:m.start()].strip() and not visible[m.end():line_end].strip()
        scope = block_above(visible, line_start) if alone else (sentence_start(visible, m.start()), m.start())
        found.append((m, line_of(text, m.start()), scope))
    return found


def find_markers(text: str, committed: set[str]) -> tuple[list[Marker], list[tuple[int, str]]]:
    """The markers of ``text`` (code excluded) with their scopes, and (line, problem) for each
    marker that names no committed file or no known reason."""
    markers, problems = [], []
    for m, line, scope in marker_scopes(text, MARKER):
        paths, reason, problem = parse_body(m.group("body"), committed)
        if problem:
            problems.append((line, problem))
        markers.append(Marker(line, scope, paths, reason))
    return markers, problems


# ---- Sources ------------------------------------------------------------------------------------

SOURCE_NUMBER = {  # a CSV's commas separate fields; a report's may group thousands
    "md": re.compile(r"(?<![\w.])(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.(?P<frac>\d+))?"
                     r"(?:[eE](?P<exp>[+-]?\d+))?"),
    "data": re.compile(r"(?<![\w.])(?P<int>\d+)(?:\.(?P<frac>\d+))?(?:[eE](?P<exp>[+-]?\d+))?"),
}
REFERENCE = re.compile(r"results/[\w.\-/]*[\w]")


def committed_files(root: str) -> set[str]:
    """Repository-relative paths of the files git tracks under ``root`` (every file, outside a
    git work tree: a test's temporary directory), and of the files of the runs its sweeps' stores
    hold whole (babygpt.runstore). A figure's source must be committed, or a fresh clone could not
    check it."""
    files = tracked_files(root)
    return files | stored_files(root, [p for p in files if os.path.basename(p) == STORE])


def tracked_files(root: str) -> set[str]:
    """The files git tracks under ``root`` (every file, outside a git work tree), without reading the
    stores: what committed_files adds to them costs seconds."""
    files = set()
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True)
        files = {p for p in out.stdout.decode("utf-8").split("\0")
                 if p and os.path.isfile(os.path.join(root, p))}  # tracked, and not deleted since
    except (OSError, subprocess.CalledProcessError):
        pass
    if not files:
        files = {os.path.relpath(p, root).replace(os.sep, "/")
                 for p in glob.glob(os.path.join(root, "**", "*"), recursive=True) if os.path.isfile(p)}
    return files


def check_summary(path: str, text: str) -> None:
    """Refuse, by name, a run's summary.json that no run could have written (state.summary_problems)."""
    try:
        summary = json.loads(text)
    except ValueError:
        summary = None
    problems = summary_problems(summary) if isinstance(summary, dict) else ["it is not a JSON object"]
    if problems:
        raise BabyGPTError(f"{path} is damaged ({problems[0]}); restore it from git before checking the docs")


class Sources:
    """The numbers of the committed source files under a root, each file's sorted once."""

    def __init__(self, root: str):
        self.root = root
        self.committed = committed_files(root)
        self._numbers: dict[str, tuple[list[float], list[float]]] = {}

    def results_files(self, under: str = RESULTS) -> list[str]:
        """Committed source files (report.md, *.csv, *.json, *.jsonl) at or below ``under``. The
        records of single runs (``.../runs/<run>/``, kept whole in their sweep's runs.jsonl so that a
        report can be made again without training) hold thousands of numbers that would source almost any figure: they
        count only where ``under`` itself names a run."""
        inside = f"/{RUNS_DIR}/" in f"/{under}/"
        return sorted(p for p in self.committed
                      if (p == under or p.startswith(under.rstrip("/") + "/")) and p.startswith(RESULTS + "/")
                      and p.endswith(SOURCE_SUFFIXES) and (inside or f"/{RUNS_DIR}/" not in p)
                      and os.path.basename(p) != STORE)  # (a store's runs count as their own files)

    def numbers(self, path: str) -> tuple[list[float], list[float]]:
        """(sorted values, their precisions) of every number written in ``path``."""
        if path not in self._numbers:
            text = stored_file(os.path.join(self.root, path))
            if text is None:
                with open(os.path.join(self.root, path), encoding="utf-8", errors="replace") as f:
                    text = f.read()
            if os.path.basename(path) == "summary.json":  # a run's record: only a whole one is a source
                check_summary(path, text)
            pattern = SOURCE_NUMBER["md" if path.endswith(".md") else "data"]
            pairs = sorted((float(f"{m.group('int').replace(',', '')}.{m.group('frac') or 0}e{m.group('exp') or 0}"),
                            precision_of(m.group("frac"), m.group("exp"))) for m in pattern.finditer(text))
            self._numbers[path] = ([v for v, _ in pairs], [p for _, p in pairs])
        return self._numbers[path]

    def holds(self, figure: Figure, paths: list[str]) -> bool:
        """Whether one of ``paths`` writes a number that rounds to one of ``figure``'s readings,
        with at least the figure's precision."""
        for path in paths:
            values, precisions = self.numbers(path)
            for value, prec in figure.readings:
                half = prec / 2 * (1 + 1e-6)  # 0.985 rounds to 0.99 despite binary floats
                i = bisect.bisect_left(values, value - half)
                while i < len(values) and values[i] <= value + half:
                    if precisions[i] <= prec * (1 + 1e-9):
                        return True
                    i += 1
        return False

    def referenced(self, section: str) -> list[str]:
        """The committed source files of every results/... directory or file ``section`` names
        (outside its source markers, whose paths are for their own scope only)."""
        files: set[str] = set()
        for ref in REFERENCE.findall(MARKER.sub("", section)):
            ref = ref.rstrip("/.")
            if ref in self.committed:
                ref = os.path.dirname(ref)
            if ref != RESULTS:
                files.update(self.results_files(ref))
        return sorted(files)


# ---- The check ----------------------------------------------------------------------------------

def section_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each section: from a heading (or the file's start) to the next heading,
    headings inside code blocks not counted."""
    visible = blank(text, code_block_spans(text))
    starts = [0] + [m.start() for m in HEADING.finditer(visible) if m.start() > 0]
    return list(zip(starts, starts[1:] + [len(text)]))


def covering(markers: list[Marker], offset: int) -> Marker | None:
    """The marker whose scope holds ``offset`` (the innermost: the one whose scope starts last)."""
    inside = [m for m in markers if m.scope[0] <= offset < m.scope[1]]
    return max(inside, key=lambda m: m.scope[0]) if inside else None


def figure_problem(fig: Figure, marker: Marker | None, section_sources: list[str], sources: Sources) -> str | None:
    """Why ``fig`` is unsourced, or None when its marker excuses it or its sources hold it."""
    if marker:
        if marker.reason or not marker.paths or sources.holds(fig, marker.paths):
            return None
        return f"not in {', '.join(marker.paths)}"
    if not section_sources:
        return "no source: its section names no results/ directory (add a <!-- source: ... --> marker)"
    if sources.holds(fig, section_sources):
        return None
    dirs = sorted({os.path.dirname(p) for p in section_sources})
    return f"not in the results its section names ({', '.join(dirs)})"


def unsourced(text: str, sources: Sources, name: str = "") -> list[str]:
    """'name:line: ...' for every result figure of ``text`` that no source holds, every marker
    whose body names no committed file or known reason, and every marker that covers no figure."""
    markers, problems = find_markers(text, sources.committed)
    findings = list(problems)  # (line, message)
    figures = find_figures(checked_text(text))
    used: set[int] = set()
    for start, end in section_spans(text):
        section_sources = sources.referenced(text[start:end])
        for fig in (f for f in figures if start <= f.start < end):
            marker = covering(markers, fig.start)
            if marker:
                used.add(id(marker))
            problem = figure_problem(fig, marker, section_sources, sources)
            if problem:
                findings.append((line_of(text, fig.start), f"{fig.text}: {problem}"))
    findings += [(m.line, "source marker covers no result figure: move it after the sentence or "
                          "block that holds the figures, or remove it") for m in markers if id(m) not in used]
    return [f"{name}:{line}: {message}" for line, message in sorted(findings, key=lambda f: f[0])]


def unsourced_in_file(path: str, root: str, sources: Sources | None = None) -> list[str]:
    """unsourced() of the markdown file at ``path``, named relative to ``root`` in the findings."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return unsourced(text, sources or Sources(root), os.path.relpath(path, root))
