"""Every verdict the README and docs state is the verdict of the table it comes from.

A verdict typed into prose ("Peri-LN is better", "RMSNorm = LayerNorm") goes stale silently when
its table is redrawn under a better protocol, and the figure check (docfigures.py) cannot see it:
a word is not a number. So every sentence that states a verdict carries a marker naming the table
and the verdict of each configuration it speaks of, and ``python -m babygpt.doctables --check``
reads each of them against the table:

    **Peri-LN is better** than the baseline ... <!-- verdict: results/full/exp2_gpt2/report.md#tuned periln_rms=better -->
    Earlier versions called it level with Pre-LN. <!-- verdict: none: what an earlier protocol said -->

The body is one or more tables (``REPORT#KEY``, as a generated block names them), each followed by
``configuration=verdict`` pairs (better, worse, equivalent, inconclusive, or baseline for the row
the table compares with) and, where the sentence names an LR, ``configuration:tuned=LR`` or
``configuration:runner_up=LR``, and for a verdict drawn again over the runs that trained,
``configuration:trained=verdict``; or ``none:`` and why the sentence is no verdict of this project's
tables (a quoted paper, an earlier protocol's reading). A marker covers the sentence it follows, or
on a line of its own the block above it, as a source marker does.

What counts as a verdict claim (``CLAIMS``), outside code: a verdict word in bold (``**... worse**``), a verdict word
after a linking verb ("is worse", "are both inconclusive", "stays better", "is level with"), or
"A = B" between two capitalised names. Each such sentence needs a marker; each marker must cover a
claim, and each of its pairs must match its table.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

from .docfigures import COMMENT, blank, line_of, marker_scopes, without_code
from .errors import BabyGPTError

# (report path relative to the repository, table key) -> the table's markdown (doctables.report_table)
TableReader = Callable[[str, str], str]

VERDICTS = ("better", "worse", "equivalent", "inconclusive", "baseline")
# the columns a marker may name beside a verdict: an LR, or the verdict drawn again over the runs that
# trained (a verdict word, read as the cell's first word: "inconclusive (4 pairs)")
LR_COLUMNS = {"tuned": "tuned LR", "runner_up": "runner-up LR"}
VERDICT_COLUMNS = {"trained": "verdict on the runs that trained"}
COLUMNS = {**LR_COLUMNS, **VERDICT_COLUMNS}
MARKER = re.compile(r"<!--\s*verdict:\s*(?P<body>.*?)\s*-->", re.DOTALL)
WORD = r"(?:better|worse|equivalent|inconclusive)"
LINKING = r"(?:is|are|was|were|stays?|remains?|ends?|comes? out|becomes?)"
QUALIFIER = r"(?:still|now|also|not|then|both|each|all|clearly|robustly|shown)"
CLAIMS = (re.compile(r"\*\*[^*\n]*\b" + WORD + r"\b[^*\n]*\*\*"
                     rf"|\b{LINKING}\s+(?:{QUALIFIER}\s+)*(?:{WORD}|level with|as good as|on a par with)\b",
                     re.IGNORECASE),
          re.compile(r"\b[A-Z][\w-]*[A-Z][\w-]* = [A-Z][\w-]*[A-Z][\w-]*\b"))  # "RMSNorm = LayerNorm"
PAIR = re.compile(r"^(?P<name>[\w.-]+)(?::(?P<column>\w+))?=(?P<value>\S+)$")


@dataclass
class Claim:
    """One configuration's verdict (or tuned LR) as a marker states it, and the table it names."""

    report: str
    key: str
    name: str
    column: str | None
    value: str


def parse_marker(body: str) -> tuple[list[Claim], str | None]:
    """(claims, problem) of a marker's body; no claims for ``none: why``."""
    words = body.split()
    if words and words[0].rstrip(":") == "none":
        return [], None if len(words) > 1 else "a verdict marker 'none' needs its reason: 'none: why'"
    claims, table = [], None
    for word in words:
        if "#" in word and "=" not in word:
            table = tuple(word.split("#", 1))
            continue
        pair = PAIR.match(word)
        if not pair or table is None:
            return [], (f"cannot read '{word}' in a verdict marker: write REPORT#TABLE then name=verdict, "
                        f"name:tuned=LR or name:trained=verdict pairs, or 'none: why'")
        column, value = pair.group("column"), pair.group("value")
        if column is not None and column not in COLUMNS:
            return [], f"'{column}' is no column a verdict marker checks; use one of {', '.join(COLUMNS)}"
        if column not in LR_COLUMNS and value not in VERDICTS:
            return [], f"'{value}' is no verdict; use one of {', '.join(VERDICTS)}"
        claims.append(Claim(*table, pair.group("name"), column, value))
    return (claims, None) if claims else ([], "an empty verdict marker; name a table and its verdicts")


def table_rows(table: str) -> dict[str, dict[str, str]]:
    """{configuration: {column header: cell}} of a markdown table."""
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def table_verdict(row: dict[str, str]) -> str | None:
    """The first word of a row's verdict cell ("baseline" for the row compared with), or None if
    the table has no verdict column."""
    cell = next((v for k, v in row.items() if k == "verdict"), None)
    if cell is None:
        return None
    if cell in ("—", "-", "") and any(v == "(baseline)" for v in row.values()):
        return "baseline"
    return cell.split()[0] if cell.split() else cell


def same_lr(cell: str, value: str) -> bool:
    try:
        return abs(float(cell) - float(value)) <= 1e-12 * max(1.0, abs(float(value)))
    except ValueError:
        return False


def claim_problem(claim: Claim, read: TableReader, tables: dict) -> str | None:
    """Why ``claim`` does not hold in its table, or None."""
    where = f"{claim.report}#{claim.key}"
    try:
        if where not in tables:
            tables[where] = table_rows(read(claim.report, claim.key))
        rows = tables[where]
    except BabyGPTError as e:
        return str(e)
    row = rows.get(claim.name)
    if row is None:
        return f"{where} has no row '{claim.name}' (its rows: {', '.join(rows)})"
    if claim.column in LR_COLUMNS:
        cell = row.get(LR_COLUMNS[claim.column], "")
        return None if same_lr(cell, claim.value) else \
            f"{claim.name}'s {LR_COLUMNS[claim.column]} is {cell} in {where}, not {claim.value}"
    if claim.column in VERDICT_COLUMNS:
        header = VERDICT_COLUMNS[claim.column]
        if header not in row:
            return f"{where} has no column '{header}'"
        found = (row[header].split() or [""])[0]
        return None if found == claim.value else \
            f"{claim.name}'s {header} is '{row[header]}' in {where}, not {claim.value}"
    found = table_verdict(row)
    if found is None:
        return f"{where} has no verdict column"
    return None if found == claim.value else f"{claim.name} is '{found}' in {where}, not '{claim.value}'"


def claims_in(text: str) -> list[int]:
    """Offsets of the verdict claims of ``text``, outside code, generated tables and comments."""
    visible = without_code(text)
    visible = blank(visible, [m.span() for m in COMMENT.finditer(visible)])
    return sorted(m.start() for pattern in CLAIMS for m in pattern.finditer(visible))


def verdict_problems(text: str, read: TableReader, name: str = "") -> list[str]:
    """'name:line: ...' for each verdict claim without a marker, each marker that covers no claim
    or cannot be read, and each stated verdict its table contradicts."""
    findings, tables = [], {}
    scopes = []
    for m, line, scope in marker_scopes(text, MARKER):
        claims, problem = parse_marker(m.group("body"))
        if problem:
            findings.append((line, problem))
        findings += [(line, p) for p in (claim_problem(c, read, tables) for c in claims) if p]
        scopes.append((line, scope))
    claims = claims_in(text)
    for offset in claims:
        if not any(start <= offset < end for _, (start, end) in scopes):
            findings.append((line_of(text, offset), "a verdict stated without a <!-- verdict: REPORT#TABLE "
                                                   "name=verdict --> marker (see babygpt/docverdicts.py)"))
    for line, (start, end) in scopes:
        if not any(start <= offset < end for offset in claims):
            findings.append((line, "verdict marker covers no verdict claim: move it after the sentence that "
                                   "states the verdict, or remove it"))
    return [f"{name}:{line}: {message}" for line, message in sorted(findings)]


def verdict_problems_in_file(path: str, root: str, read: TableReader) -> list[str]:
    """verdict_problems() of the markdown file at ``path``, named relative to ``root``."""
    with open(path, encoding="utf-8") as f:
        return verdict_problems(f.read(), read, os.path.relpath(path, root))
