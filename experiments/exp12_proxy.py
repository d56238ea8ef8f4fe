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
import os
from dataclasses import dataclass

import _common

from babygpt.errors import BabyGPTError
from babygpt.files import write_csv
from babygpt.options import option
from babygpt.rankings import (TAU_HEADER, missing_reports, rank, read_table, shared_configurations, tau_cells,
                              verdict_change)

NAME = "exp12_proxy"


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
        return missing_reports(self.tier_dirs(), "--tiers")


def main(argv):
    exp = _common.begin(Exp12Options, argv, NAME, __doc__)
    dirs = exp.args.tier_dirs()
    if exp.args.missing_reports():
        raise BabyGPTError(*exp.args.missing_reports())
    tiers = {d: read_table(d) for d in dirs}
    shared = shared_configurations(list(tiers.values()))
    if len(shared) < 2:
        raise BabyGPTError(f"the tiers share {len(shared)} configuration(s) ({', '.join(shared) or 'none'}); "
                           f"a ranking needs at least two")
    out = exp.claim()
    rows = [{"configuration": c, "tier": d, "mean_loss": tiers[d][c][0], "verdict": tiers[d][c][1],
             "rank": rank(tiers[d], shared, c)} for c in shared for d in dirs]
    write_csv(os.path.join(out, "results.csv"), list(rows[0]), rows)
    taus = [[a, b, *tau_cells(tiers[a], tiers[b], shared)] for a, b in itertools.combinations(dirs, 2)]
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
                ["shorter tier", "longer tier", *TAU_HEADER], taus))
            + _common.table_section("Rankings and verdicts", "Rank (mean loss) and verdict against the baseline "
                                    "in each tier; *flips*: \"reversed\" where one tier finds a configuration better "
                                    "and another worse, \"changed\" where a verdict is gained or lost (e.g. "
                                    "inconclusive → worse), \"no\" where every tier says the same.", "ranking",
                                    _common.markdown_table(["configuration", *dirs, "flips"], ranking)))
    exp.write_report("Is the short budget a proxy?", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
