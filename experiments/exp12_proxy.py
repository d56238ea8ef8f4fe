"""Experiment 12: is the short budget a proxy for the long one? Kendall's tau between the tiers'
rankings of the configurations they share, and the verdicts that flip.

Wortsman et al. 2023 (arXiv:2309.14322) ask whether small-scale runs predict what happens at scale;
here the question is asked of normalization across training budgets. Each tier is a committed
report of experiment 2 (e.g. results/exp2_norm_comparison at 400 iterations, results/full/exp2_gpt2
at 2,400): its "tuned" table gives every configuration's mean loss over the evaluation seeds at its
own tuned LR, and its verdict against the baseline. This script trains nothing. For the
configurations every tier holds, it ranks them by mean loss in each tier, gives Kendall's tau-b for
each pair of tiers with its exact permutation p-value (few configurations make a wide one), and
lists each configuration's verdict in every tier, marking those that reverse (better in one tier,
worse in another) apart from those that are only gained or lost (inconclusive in one tier).

    python experiments/exp12_proxy.py --tiers results/exp2_norm_comparison,results/full/exp2_gpt2 [--out DIR]

A tier may join several reports of one budget with "+" (results/exp2_norm_comparison+results/
exp2_norm_variants): a configuration is read from the first report that holds it. Their losses
compare (the same protocol and baseline runs); their verdicts were drawn over different tables.

Writes results.csv (one row per configuration and tier) and report.md.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass

import _common

from babygpt.doctables import report_table
from babygpt.errors import BabyGPTError
from babygpt.files import write_csv
from babygpt.options import option
from babygpt.stats import kendall_ceiling, kendall_p, kendall_tau

NAME = "exp12_proxy"
CONFIG, LOSS, VERDICT = "configuration", "val loss, mean ± 95% CI", "verdict"


@dataclass
class Exp12Options(_common.Options):
    tiers: str = option("results/exp2_norm_comparison,results/full/exp2_gpt2",
                        "comma-separated directories of experiment 2's reports, shortest budget first",
                        metavar="DIR,...")

    def tier_dirs(self) -> list[str]:
        return [t for t in self.tiers.split(",") if t]

    def problems(self) -> list[str]:
        dirs = self.tier_dirs()
        return [] if len(dirs) >= 2 else [f"--tiers needs at least two report directories, got {self.tiers!r}"]

    def missing_reports(self) -> list[str]:
        """The reports --tiers names that are not there (checked before anything is written)."""
        return [f"--tiers: {d}/report.md not found; run experiment 2 into {d} first"
                for tier in self.tier_dirs() for d in tier.split("+") if not os.path.exists(os.path.join(d, "report.md"))]


def read_tier(spec: str) -> dict:
    """{configuration: (mean loss, verdict)} over the reports ``spec`` joins with "+", the first that
    holds a configuration winning."""
    merged: dict = {}
    for directory in spec.split("+"):
        merged = {**read_report(directory), **merged}
    return merged


def read_report(directory: str) -> dict:
    """{configuration: (mean loss, verdict)} from the "tuned" table of ``directory``'s report; the
    baseline's verdict is "baseline", and a configuration with no finished evaluation run is left out."""
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
        if value is not None:
            out[cells[CONFIG]] = (value, "baseline" if cells[VERDICT] == "—" else cells[VERDICT])
    return out


def verdict_word(verdict: str) -> str:
    """The verdict without its detail: "inconclusive (2 pairs)" -> "inconclusive"."""
    return verdict.split(" (")[0].split(" within")[0]


def verdict_change(verdicts: list[str]) -> str:
    """How one configuration's verdict moves over the tiers, shortest first: "no" where every tier
    says the same; "reversed (better → worse)" where one tier finds it better and another worse;
    otherwise "changed (inconclusive → worse)" -- a verdict gained or lost is not a reversal."""
    words = [verdict_word(v) for v in verdicts]
    if len(set(words)) == 1:
        return "no"
    kind = "reversed" if {"better", "worse"} <= set(words) else "changed"
    return f"{kind} ({' → '.join(words)})"


def main(argv):
    exp = _common.begin(Exp12Options, argv, NAME, __doc__)
    dirs = exp.args.tier_dirs()
    if exp.args.missing_reports():
        raise BabyGPTError(*exp.args.missing_reports())
    tiers = {d: read_tier(d) for d in dirs}
    shared = [c for c in tiers[dirs[0]] if all(c in t for t in tiers.values())]
    if len(shared) < 2:
        raise BabyGPTError(f"the tiers share {len(shared)} configuration(s) ({', '.join(shared) or 'none'}); "
                           f"a ranking needs at least two")
    out = exp.claim()
    rows = [{"configuration": c, "tier": d, "mean_loss": tiers[d][c][0], "verdict": tiers[d][c][1],
             "rank": sorted(tiers[d][x][0] for x in shared).index(tiers[d][c][0]) + 1}
            for c in shared for d in dirs]
    write_csv(os.path.join(out, "results.csv"), list(rows[0]), rows)

    taus = []
    for a, b in itertools.combinations(dirs, 2):
        xs, ys = [tiers[a][c][0] for c in shared], [tiers[b][c][0] for c in shared]
        ceiling = kendall_ceiling(len(shared))
        tau = kendall_tau(xs, ys)
        tied = math.isnan(tau)  # every configuration ties in one tier: no order to compare
        taus.append([a, b, len(shared), "undefined (one tier ties them all)" if tied else f"{tau:+.3f}",
                     "—" if tied else f"{kendall_p(xs, ys):.3f}", "none can" if ceiling is None else f"{ceiling:.3f}"])
    by_config = {(r["configuration"], r["tier"]): r for r in rows}
    ranking = [[c, *[f"{by_config[c, d]['rank']} ({by_config[c, d]['mean_loss']:.3f}) {by_config[c, d]['verdict']}"
                     for d in dirs],
                verdict_change([tiers[d][c][1] for d in dirs])] for c in shared]
    body = (f"Tiers, shortest budget first: {', '.join(f'`{d}`' for d in dirs)}. {len(shared)} configurations "
            f"in every tier; each ranked by its mean loss over the evaluation seeds at its own tuned LR "
            f"(1 = lowest). Kendall's tau-b compares two tiers' orders (1: the same, -1: reversed); the "
            f"p-value is the exact two-sided permutation test of no association, which with this few "
            f"configurations needs a large tau to be small: the last column is the smallest |tau| that could "
            f"reach p ≤ 0.05 with this many configurations, and a tau short of significance is no evidence "
            f"either way, not evidence of no relation. A verdict is drawn over its own table's comparisons "
            f"(Holm), so verdicts compare across tiers only where the tiers' tables hold the same configurations.\n\n"
            + _common.table_section("Kendall's tau", "Each pair of tiers.", "tau", _common.markdown_table(
                ["shorter tier", "longer tier", "configurations", "Kendall's tau-b", "p (exact)",
                 "smallest tau that can reach p ≤ 0.05"], taus))
            + _common.table_section("Rankings and verdicts", "Rank (mean loss) and verdict against the baseline "
                                    "in each tier; *flips*: \"reversed\" where one tier finds a configuration better "
                                    "and another worse, \"changed\" where a verdict is gained or lost (e.g. "
                                    "inconclusive → worse), \"no\" where every tier says the same.", "ranking",
                                    _common.markdown_table(["configuration", *dirs, "flips"], ranking)))
    exp.write_report("Is the short budget a proxy?", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
