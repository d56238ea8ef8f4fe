"""Experiment 3: Pre-LN vs Post-LN as depth grows, with and without learning-rate warmup.

Xiong et al. 2020 (arXiv:2002.04745) report that Post-LN needs warmup and that the need grows
with depth, while Pre-LN trains without it. Here: LayerNorm, Pre-LN and Post-LN, at 4, 8 and 12
layers, each with warmup (100 iterations) and without (0), all at the same learning rate and budget
(_common.DEFAULT_BUDGET otherwise), seed 0.

    python experiments/exp3_prenorm_vs_postnorm.py [--quick | --full] [--lr LR] [--depths 4,8,12]
        [--placements pre,post,sandwich,deepnorm] [--norm_type layernorm] [--out DIR]

Writes results.csv (one row per run), prenorm_vs_postnorm.png and report.md.
"""

import os
import time
from dataclasses import dataclass
from typing import Optional

import _common

from babygpt.options import option
from babygpt.plot import load_run, new_figure, plot_runs, save
from babygpt.sweep import Run, Sweep


@dataclass
class Exp3Options(_common.TrainingOptions):
    lr: float = option(3e-3, "learning rate of every run")
    depths: Optional[str] = option(None, "comma-separated n_layer values (none: 4,8,12; quick 2)")
    warmup: Optional[int] = option(None, "warmup iterations of the warmup runs (none: 100; quick 5)")
    placements: str = _common.placements_option()
    norm_type: str = option("layernorm", "the norm of every run")

    def problems(self) -> list[str]:
        problems = super().problems() + _common.placement_problems(self.placements)
        if self.depths and not all(d.strip().isdigit() for d in self.depths.split(",")):
            problems.append(f"--depths takes comma-separated integers, got {self.depths!r}")
        return problems


def main(argv):
    args = _common.parse(Exp3Options, argv, "exp3_prenorm_vs_postnorm", __doc__)
    placements = args.placements.split(",")
    started = time.time()
    out = _common.output_path(args, "exp3_prenorm_vs_postnorm")
    depths = [int(d) for d in (args.depths or ("2" if args.quick else "4,8,12")).split(",")]
    warmups = [0, args.warmup or (5 if args.quick else 100)]

    runs = {}
    for depth in depths:
        for placement in placements:
            for warmup in warmups:
                runs[depth, placement, warmup] = Run(
                    {"n_layer": depth, "norm_placement": placement, "norm_type": args.norm_type,
                     "warmup_iters": warmup, "learning_rate": args.lr, "min_lr": args.lr / 10}, 0,
                    label=f"{placement}, warmup {warmup}")
    sweep = Sweep(out, list(runs.values()), _common.budget_args(args, runs=runs.values()), args.jobs)
    _common.claim(out, args, "exp3_prenorm_vs_postnorm", sweep)
    rows = _common.finished_rows(sweep)

    table = []
    for (depth, placement, warmup), run in runs.items():
        r = rows[run.name]
        table.append([depth, placement, warmup, r["status"], r["diverged_at"] or "—",
                      f"{r['val_loss_full']:.3f}" if r["val_loss_full"] is not None else "—",
                      f"{r['best_val_loss']:.3f}" if r["best_val_loss"] is not None else "—",
                      f"{r['wall_time_s']:.1f}" if r["wall_time_s"] is not None else "—"])

    fig, axes = new_figure(1, len(depths), figsize=(5.5 * len(depths), 4.5), squeeze=False)
    for ax, depth in zip(axes[0], depths):
        keys = [(depth, pl, w) for pl in placements for w in warmups]
        plot_runs(ax, [load_run(sweep.out_dir(runs[k])) for k in keys],
                  [runs[k].label for k in keys], train_loss=False)
        ax.set_title(f"{depth} layers, lr {args.lr:g}")
    save(fig, os.path.join(out, "prenorm_vs_postnorm.png"))

    budget = _common.TIERS[_common.tier(args)] or "train.py defaults"
    header = ["n_layer", "placement", "warmup", "status", "diverged at", "final val (whole split)",
              "best val (eval windows)", "train time (s)"]
    body = (f"Tier `{_common.tier(args)}`. Budget per run: {budget} (n_layer and warmup_iters as listed); "
            f"lr {args.lr:g}, min_lr {args.lr / 10:g}, norm_type {args.norm_type}, seed 0.\n\n"
            + _common.table_marker("runs")
            + _common.markdown_table(header, table) + "\n\n" + _common.references_section(
                _common.reference_losses(args.data_dir)) + "\n\n![](prenorm_vs_postnorm.png)")
    _common.write_report(os.path.join(out, "report.md"), "Pre-LN vs Post-LN, depth and warmup",
                         _common.command_line(), body, started)
    return 0


if __name__ == "__main__":
    _common.main(main)
