"""Experiment 2: the norm configurations head to head on TinyShakespeare, with seeds and an LR sweep.

Every configuration trains the same model on the same data order for the same budget
(_common.DEFAULT_BUDGET: 4 layers, 128 wide, context 64, batch 16; here 400 iterations, evals every 100).
For each:
  - 3 seeds at the base learning rate: final and best val loss (mean ± std), divergence, wall time;
  - a learning-rate sweep (seed 0) over a log grid: final val loss vs LR, and the LR tolerance,
    the largest LR whose final val loss is within --margin of the configuration's best.
min_lr is always learning_rate / 10, so the schedule keeps its shape across the sweep.

    python experiments/exp2_norm_comparison.py [--quick] [--configs A.py,B.py] [--jobs N] [--out DIR]

Writes results.csv (one row per run), norm_comparison.png, lr_tolerance.png and report.md.
"""

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Optional

import _common

from babygpt.options import option
from babygpt.plot import load_run, new_figure, save
from babygpt.state import COMPLETED
from babygpt.sweep import Run, Sweep

# 30 runs must fit in 15 minutes on a 2-core CPU: 400 iterations (not 500), evals every 100.
EXP2_BUDGET = {"max_iters": 400, "eval_interval": 100}
CONFIGS = [os.path.join(_common.ROOT, "config", name + ".py")
           for name in ("prenorm_none", "postnorm_ln", "prenorm_ln", "prenorm_rms", "postnorm_rms")]


def lr_overrides(lr: float) -> dict:
    return {"learning_rate": lr, "min_lr": lr / 10}


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


@dataclass
class Exp2Options(_common.TrainingOptions):
    configs: Optional[str] = option(None, "comma-separated config files to compare (none: the five in config/)")
    seeds: Optional[int] = option(None, "seeds per configuration (none: 3; quick 1)")
    base_lr: float = option(3e-3, "learning rate of the seed runs")
    lrs: Optional[str] = option(None, "LR grid (none: 1e-3,3e-3,1e-2,3e-2; quick 3e-3,3e-2)")
    margin: float = option(0.05, "LR tolerance margin in nats")

    def problems(self) -> list[str]:
        try:
            floats(self.lrs or "0")  # the default grid is fine
        except ValueError:
            return [f"--lrs takes comma-separated numbers, got {self.lrs!r}"]
        return []


def main(argv):
    args = _common.parse(Exp2Options, argv, "exp2_norm_comparison", __doc__)
    started = time.time()
    out = _common.output_path(args, "exp2_norm_comparison")
    configs = args.configs.split(",") if args.configs else CONFIGS
    seeds = args.seeds or (1 if args.quick else 3)
    lrs = sorted(set(floats(args.lrs or ("3e-3,3e-2" if args.quick else "1e-3,3e-3,1e-2,3e-2")) + [args.base_lr]))

    runs, seed_runs, lr_runs = [], {}, {}
    for config in configs:
        name = os.path.splitext(os.path.basename(config))[0]
        seed_runs[name] = [Run(lr_overrides(args.base_lr), s, config) for s in range(seeds)]
        lr_runs[name] = {lr: (seed_runs[name][0] if lr == args.base_lr else Run(lr_overrides(lr), 0, config))
                         for lr in lrs}
        runs += seed_runs[name] + [r for lr, r in lr_runs[name].items() if lr != args.base_lr]
    sweep = Sweep(out, runs, _common.budget_args(args, EXP2_BUDGET if not args.quick else {}, runs), args.jobs)
    _common.claim(out, args, "exp2_norm_comparison", sweep)
    rows = _common.finished_rows(sweep)

    def final(run):
        r = rows[run.name]
        return r["final_val_loss"] if r["status"] in COMPLETED else math.inf

    table, tolerance = [], {}
    for name in seed_runs:
        rs = [rows[r.name] for r in seed_runs[name]]
        finals = {lr: final(run) for lr, run in lr_runs[name].items()}
        best = min(finals.values())
        ok = [lr for lr, v in finals.items() if math.isfinite(v) and v <= best + args.margin]
        tolerance[name] = max(ok) if ok else None
        nonfinite = [r["first_nonfinite_at"] for r in rs if r["first_nonfinite_at"] is not None]
        table.append([
            name, f"{rs[0]['num_params']:,}" if rs[0]["num_params"] else "—",
            f"{sum(r['status'] == 'finished' for r in rs)}/{len(rs)} finished, "
            f"{sum(r['status'] == 'collapsed' for r in rs)} collapsed, "
            f"{sum(r['status'] == 'diverged' for r in rs)} diverged",
            min(nonfinite) if nonfinite else "—",
            _common.mean_std([r["final_val_loss"] for r in rs]),
            _common.mean_std([r["best_val_loss"] for r in rs]),
            f"{statistics.mean(r['wall_time_s'] or 0 for r in rs):.1f}",
            f"{tolerance[name]:g}" if tolerance[name] else "—",
        ])
    lr_table = [[name] + [("diverged" if not math.isfinite(final(lr_runs[name][lr])) else
                           f"{final(lr_runs[name][lr]):.3f}") for lr in lrs] for name in lr_runs]

    fig, ax = new_figure(figsize=(8, 5))
    for i, (name, rs) in enumerate(seed_runs.items()):
        curves = [load_run(sweep.out_dir(r)) for r in rs]
        _plot_mean_curve(ax, curves, name, f"C{i}")
    ax.set(xlabel="iteration", ylabel="val loss", title=f"val loss, mean and range over {seeds} seeds (lr {args.base_lr:g})")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, os.path.join(out, "norm_comparison.png"))

    fig, ax = new_figure(figsize=(8, 5))
    finite = [final(r) for runs_ in lr_runs.values() for r in runs_.values() if math.isfinite(final(r))]
    top = max(finite) + 0.1 if finite else 1.0
    for i, (name, by_lr) in enumerate(lr_runs.items()):
        xs = [lr for lr in lrs if math.isfinite(final(by_lr[lr]))]
        ax.plot(xs, [final(by_lr[lr]) for lr in xs], "o-", color=f"C{i}", label=name)
        bad = [lr for lr in lrs if not math.isfinite(final(by_lr[lr]))]
        ax.plot(bad, [top] * len(bad), "x", color=f"C{i}", markersize=10, markeredgewidth=2)
    ax.set_xscale("log")
    ax.set(xlabel="learning rate", ylabel="final val loss (x: diverged)", title="learning-rate tolerance (seed 0)")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, os.path.join(out, "lr_tolerance.png"))

    header = ["configuration", "parameters", "runs (finished = no NaN/inf)", "first non-finite iter", "final val loss",
              "best val loss", "train time / run (s)", f"LR tolerance (±{args.margin:g})"]
    budget = _common.QUICK_BUDGET if args.quick else _common.DEFAULT_BUDGET
    budget = {**budget, **({} if args.quick else EXP2_BUDGET)}
    body = (f"Budget per run: {budget}; base lr {args.base_lr:g}, min_lr = lr/10, {seeds} seeds.\n\n"
            + _common.markdown_table(header, table)
            + "\n\nFinal val loss by learning rate (seed 0):\n\n"
            + _common.markdown_table(["configuration"] + [f"{lr:g}" for lr in lrs], lr_table)
            + "\n\n![](norm_comparison.png)\n\n![](lr_tolerance.png)")
    _common.write_report(os.path.join(out, "report.md"), "Normalization configurations compared",
                         _common.command_line(), body, started)
    return 0


def _plot_mean_curve(ax, runs, label, color):
    """Mean val loss over runs at the eval iterations all of them reached; band = min..max."""
    series = []
    for run in runs:
        series.append({r["iter"]: r["val_loss"] for r in run["metrics"] if r.get("val_loss") is not None})
    common = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if common:
        mean = [statistics.mean(s[i] for s in series) for i in common]
        ax.plot(common, mean, "o-", color=color, markersize=3, label=label)
        ax.fill_between(common, [min(s[i] for s in series) for i in common],
                        [max(s[i] for s in series) for i in common], color=color, alpha=0.2)
    for run in runs:
        at = run["summary"].get("diverged_at")
        if at is not None:
            ax.plot([at], [max(mean) if common else 0], "x", color=color, markersize=10, markeredgewidth=2)


if __name__ == "__main__":
    _common.main(main)
