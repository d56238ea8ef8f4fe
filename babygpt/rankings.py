"""Experiment 2's tables read back and compared with each other: each configuration's mean loss and
verdict from a table's report, Kendall's tau-b between two tables' orders, and how a configuration's
verdict moves from one table to another. Experiment 12 compares tables of one stack at several
budgets; experiment 17 tables of one budget on several stacks."""

from __future__ import annotations

import math
import os

from babygpt.doctables import report_table
from babygpt.errors import BabyGPTError
from babygpt.stats import kendall_ceiling, kendall_p, kendall_tau

CONFIG, LOSS, VERDICT = "configuration", "val loss, mean ± 95% CI", "verdict"
TAU_HEADER = ["configurations", "Kendall's tau-b", "p (exact)", "smallest tau that can reach p ≤ 0.05"]


def missing_reports(specs: list[str], option: str) -> list[str]:
    """The reports the table ``specs`` (directories, joined with "+") name that are not there."""
    return [f"{option}: {d}/report.md not found; run experiment 2 into {d} first (docs/campaign.md gives the "
            f"commands that make the committed tables)"
            for spec in specs for d in spec.split("+") if not os.path.exists(os.path.join(d, "report.md"))]


def read_table(spec: str) -> dict:
    """{configuration: (mean loss, verdict)} over the reports ``spec`` joins with "+", the first that
    holds a configuration with a mean loss winning (else the first that lists it)."""
    merged: dict = {}
    for directory in spec.split("+"):
        for config, entry in read_report(directory).items():
            if config not in merged or merged[config][0] is None and entry[0] is not None:
                merged[config] = entry
    return merged


def read_report(directory: str) -> dict:
    """{configuration: (mean loss, verdict)} from the "tuned" table of ``directory``'s report; the
    baseline's verdict is "baseline", and a configuration with no finished evaluation run has mean
    loss None (it takes part in no ranking)."""
    lines = report_table(os.path.join(directory, "report.md"), "tuned").splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    if not {CONFIG, LOSS, VERDICT} <= set(header):
        raise BabyGPTError(f"{directory}/report.md: its tuned table lacks {CONFIG!r}, {LOSS!r} or {VERDICT!r}; "
                           f"is it experiment 2's report?")
    out = {}
    for number, line in enumerate(lines[2:], 3):
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        loss = (cells.get(LOSS) or "").split()[:1]
        try:
            value = float(loss[0]) if loss and loss[0] not in ("—", "nan") else None
        except ValueError:
            value = math.nan
        if len(cells) < len(header) or value is not None and not math.isfinite(value):
            raise BabyGPTError(f"{directory}/report.md: row {number} of its tuned table is damaged ({line.strip()[:60]!r}"
                               f"); make the report again with experiment 2's command (its first lines name it)")
        out[cells[CONFIG]] = (value, "baseline" if cells[VERDICT] == "—" else cells[VERDICT])
    return out


def baseline(table: dict) -> str | None:
    """The configuration ``table``'s verdicts were drawn against."""
    return next((c for c, (_, verdict) in table.items() if verdict == "baseline"), None)


def shared_configurations(tables: list[dict]) -> list[str]:
    """The configurations every table holds with a mean loss, in the first table's order."""
    return [c for c in tables[0] if all(c in t and t[c][0] is not None for t in tables)]


def rank(table: dict, configs: list[str], config: str) -> int:
    """``config``'s rank by mean loss among ``configs`` in ``table`` (1 = lowest)."""
    return sorted(table[c][0] for c in configs).index(table[config][0]) + 1


def tau_cells(a: dict, b: dict, configs: list[str]) -> list[str]:
    """TAU_HEADER's cells for tables ``a`` and ``b`` over ``configs``: their count, Kendall's tau-b of
    the two orders by mean loss, its exact two-sided permutation p-value, and the smallest |tau| that
    could reach p ≤ 0.05 with that many."""
    xs, ys = [a[c][0] for c in configs], [b[c][0] for c in configs]
    ceiling = kendall_ceiling(len(configs))
    tau = kendall_tau(xs, ys)
    tied = math.isnan(tau)  # every configuration ties in one table: no order to compare
    return [str(len(configs)), "undefined (one table ties them all)" if tied else f"{tau:+.3f}",
            "—" if tied else p_text(kendall_p(xs, ys)), "none can" if ceiling is None else f"{ceiling:.3f}"]


def p_text(p: float) -> str:
    """A p-value at three decimals, or at one significant digit below 0.001, where three decimals
    would print an exact p (seven configurations in the same order: 2/7! ≈ 0.0004) as 0.000."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1g}"


def verdict_word(verdict: str) -> str:
    """The verdict without its detail: "inconclusive (2 pairs)" -> "inconclusive"."""
    return verdict.split(" (")[0].split(" within")[0]


def verdict_change(verdicts: list[str]) -> str:
    """How one configuration's verdict moves over tables in order: "no" where every table says the
    same; "reversed (better → worse)" where one finds it better and another worse; otherwise
    "changed (inconclusive → worse)" -- a verdict gained or lost is not a reversal."""
    words = [verdict_word(v) for v in verdicts]
    if len(set(words)) == 1:
        return "no"
    kind = "reversed" if {"better", "worse"} <= set(words) else "changed"
    return f"{kind} ({' → '.join(words)})"


def transfer(reference: str | None, other: str | None) -> str:
    """How a verdict on the reference table moves to another table: "holds" (the same decided
    verdict), "undecided on both" (inconclusive on both: nothing that could hold), "baseline" (the
    tables' baseline), "reversed" (better on one, worse on the other), "appears" (inconclusive on the
    reference, decided on the other), "lost" (decided on the reference, inconclusive on the other), "changed" (another
    decided verdict: equivalent against better or worse), or "not run" where either table lacks it."""
    if reference is None or other is None:
        return "not run"
    was, now = verdict_word(reference), verdict_word(other)
    if was == now:
        return {"inconclusive": "undecided on both", "baseline": "baseline"}.get(was, "holds")
    if {was, now} == {"better", "worse"}:
        return "reversed"
    if was == "inconclusive":
        return "appears"
    return "lost" if now == "inconclusive" else "changed"
