"""Experiment 17: does it travel? Experiment 2's verdicts on the GPT-2 block trained by AdamW, again
on other stacks.

The core table (Pre-LN RMSNorm, Pre-LN LayerNorm, Post-LN LayerNorm, Peri-LN, no norm, QK-norm and
nGPT) is made by experiment 2 once per stack, each configuration's LR tuned on that stack, with
sequential seeds: the reference (the GPT-2 block, AdamW), the same block trained by Muon (--set
optimizer=muon; nGPT refuses Muon) and the modern block, rotary positions and a SwiGLU MLP (--set
pos=rope --set mlp=swiglu), trained by AdamW. docs/campaign.md gives the three commands. This script
trains nothing. For each stack against the reference, over the configurations both tables hold, it
gives Kendall's tau-b of their order by mean loss with its exact permutation p-value, and for every
configuration its verdict on each stack and how that verdict moved from the reference's
(babygpt.rankings.transfer): holds (the same decided verdict), undecided on both, reversed (better
on one, worse on the other), appears (inconclusive on the reference, decided here), lost (decided
there, inconclusive here), changed (equivalent against better or worse), or not run.

    python experiments/exp17_transfer.py [--stacks LABEL=DIR,LABEL=DIR,...] [--out DIR]

The first stack is the reference. Writes results.csv (one row per configuration and stack) and
report.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import _common

from babygpt.errors import BabyGPTError
from babygpt.files import write_csv
from babygpt.options import option
from babygpt.rankings import TAU_HEADER, baseline, missing_reports, read_table, shared_configurations, tau_cells, \
    transfer

NAME = "exp17_transfer"
STACKS = ("gpt2_adamw=results/transfer/gpt2_adamw,gpt2_muon=results/transfer/gpt2_muon,"
          "modern_adamw=results/transfer/modern_adamw")


@dataclass
class Exp17Options(_common.Options):
    stacks: str = option(STACKS, "comma-separated LABEL=DIR, one per stack, each DIR experiment 2's output for that "
                                 "stack; the first is the reference", metavar="LABEL=DIR,...")

    def stack_dirs(self) -> dict:
        """{label: directory} in the order given."""
        return dict(spec.partition("=")[::2] for spec in self.stacks.split(","))

    def problems(self) -> list[str]:
        specs = self.stacks.split(",")
        problems = [f"--stacks entry {s!r} is not LABEL=DIR; write e.g. gpt2_muon=results/transfer/gpt2_muon"
                    for s in specs if not all(s.partition("=")[::2]) or "=" not in s]
        labels = [s.partition("=")[0] for s in specs]
        if len(set(labels)) < len(labels):
            problems.append(f"--stacks names a label twice ({', '.join(labels)}); give each stack its own")
        if len(specs) < 2:
            problems.append(f"--stacks needs a reference and at least one other stack, got {self.stacks!r}")
        return problems


def main(argv):
    exp = _common.begin(Exp17Options, argv, NAME, __doc__)
    stacks = exp.args.stack_dirs()
    missing = missing_reports(list(stacks.values()), "--stacks")
    if missing:
        raise BabyGPTError(*missing)
    tables = {label: read_table(d) for label, d in stacks.items()}
    reference, *others = stacks
    baselines = {label: baseline(t) for label, t in tables.items()}
    if len(set(baselines.values())) > 1:
        raise BabyGPTError(f"the stacks' verdicts were drawn against different baselines ("
                           f"{', '.join(f'{label}: {b}' for label, b in baselines.items())}); make every table "
                           f"with the same --baseline")
    configs = list(dict.fromkeys(c for t in tables.values() for c in t))
    pairs = {label: shared_configurations([tables[reference], tables[label]]) for label in others}
    too_few = [f"{label} shares {len(shared)} configuration(s) with {reference}; a ranking needs at least two"
               for label, shared in pairs.items() if len(shared) < 2]
    if too_few:
        raise BabyGPTError(*too_few)
    out = exp.claim()
    rows = [{"configuration": c, "stack": label, "mean_loss": t[c][0], "verdict": t[c][1]}
            for c in configs for label, t in tables.items() if c in t]
    write_csv(os.path.join(out, "results.csv"), list(rows[0]), rows)
    taus = [[label, *tau_cells(tables[reference], tables[label], shared)] for label, shared in pairs.items()]
    body = (f"Stacks: {', '.join(f'{label} (`{d}`)' for label, d in stacks.items())}; the reference is "
            f"{reference}. Each table is experiment 2's, at its own budget, each configuration at the LR tuned "
            f"for it on that stack. Kendall's tau-b compares a stack's order of the configurations by mean loss "
            f"with the reference's, over the configurations both hold (1: the same order, -1: reversed); the "
            f"p-value is the exact two-sided permutation test of no association, and the last column the "
            f"smallest |tau| that could reach p ≤ 0.05 with that many configurations: a tau short of it is no "
            f"evidence either way. Each verdict was drawn over its own table's comparisons (Holm; "
            f"group-sequential over the looks where the table had them), against each table's own baseline.\n\n"
            + _common.table_section("Kendall's tau", "Each stack against the reference.", "tau",
                                    _common.markdown_table(["stack", *TAU_HEADER], taus))
            + _common.table_section("Verdicts by stack", "Each configuration's verdict against the baseline on "
                                    "each stack (its mean loss), and how it moved from the reference's: *holds* (the "
                                    "same decided verdict), *undecided on both*, *reversed* (better ↔ worse), "
                                    "*appears* (inconclusive on the reference, decided here), *lost* (decided on "
                                    "the reference, inconclusive here), *changed* (another decided verdict), "
                                    "*not run*.", "verdicts",
                                    _common.markdown_table(["configuration", *stacks, *(f"{label} vs {reference}"
                                                                                       for label in others)],
                                                           [verdict_row(c, tables, pairs, reference)
                                                            for c in configs])))
    exp.write_report("Does it travel? The core table on other stacks", body)
    return 0


def verdict_row(config: str, tables: dict, pairs: dict, reference: str) -> list[str]:
    """One configuration's cells: its verdict on each stack, then how each other stack's moved."""
    def cell(label):
        table = tables[label]
        if config not in table:
            return "not run"
        loss, verdict = table[config]
        return f"{verdict} ({'no finished run' if loss is None else f'{loss:.3f}'})"
    moves = [transfer(tables[reference].get(config, (None, None))[1], tables[label].get(config, (None, None))[1])
             for label in pairs]
    return [config, *map(cell, tables), *moves]


if __name__ == "__main__":
    _common.main(main)
