"""Experiment 2: the norm configurations head to head, each at its own tuned learning rate, over seeds.

The protocol of GUIDE §6, the same for every configuration:
  1. Tune: seed 0 at every LR of a half-decade grid (3e-4 ... 3e-2). The tuned LR is the one with
     the lowest final loss; the LR sensitivity (Wortsman et al. 2023, arXiv:2309.14322) is the mean
     over the grid of min(loss(lr), initial loss) minus that lowest loss.
  2. Seed: seeds 1..N at the tuned LR. The tuning seed is left out because its loss was picked as
     the lowest of the grid and is biased low. A seed fixes the init and the data order, so seed s
     of two configurations is a pair: each configuration gets the mean paired difference to the
     baseline with its 95% t-interval, and is called better or worse only if that excludes zero.
"Loss" is the final evaluation over the whole validation split (val_loss_full); min_lr is always
lr / 10, so the schedule keeps its shape across the grid.

Tiers: --quick checks the pipeline (tiny model, 2 LRs); the default uses _common.DEFAULT_BUDGET with
400 iterations; --full trains the core configurations with train.py's own budget (2,400 iterations)
at the tuned LRs of the default tier's results (--tuned_from), 2 seeds, no grid.

    python experiments/exp2_norm_comparison.py [--quick | --full] [--configs A.py,B.py] [--baseline NAME]
        [--jobs N] [--out DIR]

Writes results.csv (one row per run), tuned_lrs.json, norm_comparison.png, lr_sensitivity.png
(not in --full) and report.md.
"""

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

import _common

from babygpt.compare import MIN_PAIRS_FOR_VERDICT, best_lr, mean_interval, outcome_counts, paired_against, run_loss
from babygpt.errors import BabyGPTError
from babygpt.options import option
from babygpt.plot import load_run, new_figure, reference_lines, save
from babygpt.rundir import read_json, write_json
from babygpt.stats import lr_sensitivity
from babygpt.sweep import Run, Sweep

NAME = "exp2_norm_comparison"
# 8 runs per configuration (5 LRs, then 3 seeds) x 4 configurations in 15 minutes on a 2-core CPU:
# 400 iterations (not 500), evals every 100.
EXP2_BUDGET = {"max_iters": 400, "eval_interval": 100}
CORE = ("prenorm_rms", "prenorm_ln", "postnorm_ln", "prenorm_none")
GRID = {"quick": "3e-3,3e-2", "default": "3e-4,1e-3,3e-3,1e-2,3e-2"}
SEEDS = {"quick": 2, "default": 3, "full": 2}
TUNED_FILE = "tuned_lrs.json"


def config_path(name: str) -> str:
    return os.path.join(_common.ROOT, "config", name + ".py")


def config_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def lr_overrides(lr: float) -> dict:
    return {"learning_rate": lr, "min_lr": lr / 10}


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


@dataclass
class Exp2Options(_common.TrainingOptions):
    configs: Optional[str] = option(None, "comma-separated config files to compare (none: " + ", ".join(CORE) + ")")
    baseline: Optional[str] = option(None, "the configuration the others are paired with (none: the first)")
    seeds: Optional[int] = option(None, "seeds at the tuned LR, numbered from 1 (none: 3; quick and full 2)")
    lrs: Optional[str] = option(None, "LR grid, tuned on seed 0 (none: 3e-4,1e-3,3e-3,1e-2,3e-2; quick 3e-3,3e-2)")
    tuned_from: Optional[str] = option(None, "--full: the default tier's output, whose tuned LRs it uses "
                                             f"(none: results/{NAME})")

    def config_files(self) -> list[str]:
        return self.configs.split(",") if self.configs else [config_path(n) for n in CORE]

    def problems(self) -> list[str]:
        problems = super().problems()
        try:
            if any(lr <= 0 or not math.isfinite(lr) for lr in floats(self.lrs or "1")):
                problems.append(f"--lrs takes positive learning rates, got {self.lrs!r}")
        except ValueError:
            problems.append(f"--lrs takes comma-separated numbers, got {self.lrs!r}")
        names = [config_name(c) for c in self.config_files()]
        problems += [f"config file '{c}' not found; --configs takes existing files, e.g. config/prenorm_ln.py"
                     for c in self.config_files() if not os.path.isfile(c)]
        if len(set(names)) < len(names):
            problems.append(f"--configs names a configuration twice ({', '.join(names)}); each needs its own file name")
        if self.baseline is not None and self.baseline not in names:
            problems.append(f"--baseline {self.baseline!r} is not among the configurations ({', '.join(names)}); "
                            f"add its config file to --configs")
        if self.seeds is not None and self.seeds < 2:
            problems.append(f"--seeds must be at least 2 (a confidence interval needs two runs), got {self.seeds}")
        if self.full and self.lrs:
            problems.append("--full has no LR grid (it uses the default tier's tuned LRs); drop --lrs")
        return problems


@dataclass
class Plan:
    """What an invocation trains: configurations by name, the LR grid (empty in --full), the seeds."""

    tier: str
    out: str
    configs: dict  # name -> config file
    baseline: str
    lrs: list
    seeds: list
    args: object = None  # the command line, for how the sweeps are spread (jobs, shards, GPUs)
    base_args: list = field(default_factory=list)

    def grid(self) -> dict:
        """{name: {lr: the seed-0 tuning run}}; empty without an LR grid (--full)."""
        return {name: {lr: Run(lr_overrides(lr), 0, path) for lr in self.lrs}
                for name, path in self.configs.items() if self.lrs}

    def seed_runs(self, tuned: dict) -> dict:
        """{name: the runs of seeds 1..N at its tuned LR} (none for a configuration that diverged at every LR)."""
        return {name: [Run(lr_overrides(tuned[name]), s, path) for s in self.seeds] if tuned[name] else []
                for name, path in self.configs.items()}

    def sweep(self, runs: list) -> Sweep:
        return _common.sweep(self.out, runs, self.base_args, self.args)


def main(argv):
    args = _common.parse(Exp2Options, argv, NAME, __doc__)
    started = time.time()
    tier = _common.tier(args)
    configs = {config_name(c): c for c in args.config_files()}
    plan = Plan(tier, _common.output_path(args, NAME), configs, args.baseline or next(iter(configs)),
                sorted(floats(args.lrs or GRID[tier])) if tier != "full" else [],
                list(range(1, (args.seeds or SEEDS[tier]) + 1)), args)
    tuned_from = args.tuned_from or os.path.join("results", NAME)
    grid, tuned, seed_runs, rows = train(args, plan, tuned_from)
    write_results(args, plan, grid, tuned, seed_runs, rows, tuned_from, started)
    return 0


def train(args, plan: Plan, tuned_from: str):
    """Tune on seed 0 (unless --full, which reads the tuned LRs), then train the seeds there.
    Returns the grid, the tuned LRs, the seed runs and every run's results row by name."""
    grid = plan.grid()
    grid_runs = [r for by_lr in grid.values() for r in by_lr.values()]
    tuned = read_tuned(tuned_from, plan.configs) if not grid_runs else None
    known = grid_runs or [r for rs in plan.seed_runs(tuned).values() for r in rs]  # the runs known before training
    plan.base_args = _common.budget_args(args, EXP2_BUDGET if plan.tier == "default" else {}, known)
    _common.claim(plan.out, args, NAME, plan.sweep(known))
    if grid_runs:  # 1. tune on seed 0
        rows = _common.finished_rows(plan.sweep(grid_runs), last=False)
        tuned = {name: best_lr({lr: rows[r.name] for lr, r in by_lr.items()}) for name, by_lr in grid.items()}
    seed_runs = plan.seed_runs(tuned)
    # 2. seeds at the tuned LRs (the tuning runs are done, so the sweep skips them)
    rows = _common.finished_rows(plan.sweep(grid_runs + [r for rs in seed_runs.values() for r in rs]))
    write_json(os.path.join(plan.out, TUNED_FILE), {"lrs": plan.lrs, "tuned": tuned})
    return grid, tuned, seed_runs, rows


def write_results(args, plan: Plan, grid, tuned, seed_runs, rows, tuned_from, started) -> None:
    """report.md and the two plots."""
    sweep = plan.sweep([])
    refs = _common.reference_losses(args.data_dir)
    losses = {name: [run_loss(rows[r.name]) for r in rs] for name, rs in seed_runs.items()}
    initial = {name: initial_loss(sweep.out_dir(next(iter(by_lr.values())))) for name, by_lr in grid.items()}
    seeds = f"seeds {', '.join(map(str, plan.seeds))}"
    plot_curves({n: [load_run(sweep.out_dir(r)) for r in rs] for n, rs in seed_runs.items()}, refs,
                os.path.join(plan.out, "norm_comparison.png"), f"val loss, mean and range over {seeds}, "
                                                               f"each configuration at its tuned LR")
    budget = {**_common.TIERS[plan.tier], **(EXP2_BUDGET if plan.tier == "default" else {})}
    how = (f"LR grid {', '.join(f'{lr:g}' for lr in plan.lrs)} on seed 0, then " if plan.lrs else
           f"tuned LRs from the default tier ({tuned_from}/{TUNED_FILE}), ")
    sensitivities = {n: sensitivity(grid[n], rows, initial[n]) for n in grid}
    sections = [f"Tier `{plan.tier}`. Budget per run: {budget or 'train.py defaults'}; min_lr = lr/10; {how}"
                f"{seeds} at each configuration's tuned LR, paired with {plan.baseline}. "
                "Losses are the final evaluation over the whole validation split; a verdict (better/worse) "
                f"needs a paired interval that excludes zero over at least {MIN_PAIRS_FOR_VERDICT} seeds. "
                f"{_common.training_time(rows.values())}.",
                _common.table_marker("tuned") + tuned_table(plan.configs, seed_runs, rows, losses, tuned,
                                                            plan.baseline, sensitivities),
                _common.references_section(refs), "![](norm_comparison.png)"]
    if grid:
        plot_lr_curves(grid, rows, refs, initial, os.path.join(plan.out, "lr_sensitivity.png"))
        sections.insert(2, "Final loss by learning rate (seed 0; **bold**: the tuned LR):\n\n"
                        + _common.table_marker("lr_grid") + lr_grid_table(grid, rows, tuned, initial))
        sections.append("![](lr_sensitivity.png)")
    _common.write_report(os.path.join(plan.out, "report.md"), "Normalization configurations compared",
                         _common.command_line(), "\n\n".join(sections), started)


# ---------------------------------------------------------------- reading the runs

def initial_loss(run_dir: str) -> float:
    """The val loss a run measured at iteration 0, before any update."""
    rows = load_run(run_dir)["metrics"]
    first = next((r for r in rows if r.get("iter") == 0 and r.get("val_loss") is not None), None)
    if first is None:
        raise BabyGPTError(f"{run_dir} has no evaluation at iteration 0; delete it and run the experiment again")
    return first["val_loss"]


def sensitivity(by_lr: dict, rows: dict, initial: float) -> float | None:
    """Wortsman et al.'s LR sensitivity over the grid; None if no LR trained (every run collapsed
    or diverged), where the measure says nothing: it would be near 0, as if perfectly robust."""
    if not any(rows[r.name]["status"] == "finished" for r in by_lr.values()):
        return None
    return lr_sensitivity({lr: run_loss(rows[r.name]) for lr, r in by_lr.items()}, initial)


def read_tuned(path: str, configs: dict) -> dict:
    """The tuned LR of each configuration from a default-tier output directory."""
    record = read_json(os.path.join(path, TUNED_FILE))
    if record is None:
        raise BabyGPTError(f"no {TUNED_FILE} in '{path}'; run the default tier first "
                           f"(python experiments/{NAME}.py with the same --configs) or pass --tuned_from DIR")
    tuned = record.get("tuned") if isinstance(record.get("tuned"), dict) else {}
    missing = [name for name in configs if not isinstance(tuned.get(name, ""), (int, float, type(None)))]
    if missing:
        raise BabyGPTError(f"{path}/{TUNED_FILE} has no tuned LR for {', '.join(missing)}; run the default tier "
                           f"with these configurations first")
    return {name: tuned[name] for name in configs}


# ---------------------------------------------------------------- tables

def tuned_table(configs, seed_runs, rows, losses, tuned, baseline, sensitivities) -> str:
    header = ["configuration", "parameters", "tuned LR", "LR sensitivity", "runs", "val loss, mean ± 95% CI",
              f"paired Δ vs {baseline}, 95% CI", "verdict", "train time / run (s)"]
    table = []
    for name in configs:
        rs = [rows[r.name] for r in seed_runs[name]]
        delta, call = ("(baseline)", "—") if name == baseline else paired_against(losses[name], losses[baseline])
        sens = sensitivities.get(name)  # absent: no grid (--full); None: no LR trained
        table.append([name, f"{rs[0]['num_params']:,}" if rs and rs[0]["num_params"] else "—",
                      f"{tuned[name]:g}" if tuned[name] else "none (all diverged)",
                      f"{sens:.3f}" if sens is not None else "— (no LR trains)" if name in sensitivities else "—",
                      outcome_counts(rs),
                      mean_interval(losses[name]), delta, call,
                      f"{statistics.fmean(r['wall_time_s'] or 0 for r in rs):.1f}" if rs else "—"])
    return _common.markdown_table(header, table)


def lr_cell(row: dict, is_best: bool) -> str:
    if row["status"] == "diverged":
        return f"diverged @ {row['diverged_at']}"
    text = f"{run_loss(row):.3f}" + (" collapsed" if row["status"] == "collapsed" else "")
    return f"**{text}**" if is_best else text


def lr_grid_table(grid, rows, tuned, initial) -> str:
    lrs = sorted({lr for by_lr in grid.values() for lr in by_lr})
    table = [[name, f"{initial[name]:.3f}"] + [lr_cell(rows[by_lr[lr].name], lr == tuned[name]) for lr in lrs]
             for name, by_lr in grid.items()]
    return _common.markdown_table(["configuration", "initial"] + [f"{lr:g}" for lr in lrs], table)


# ---------------------------------------------------------------- plots

def plot_curves(curves: dict, refs: dict, path: str, title: str) -> None:
    """Mean val loss of each configuration's seeds at the eval iterations all of them reached; band = min..max."""
    fig, ax = new_figure(figsize=(8, 5))
    for i, (name, runs) in enumerate(curves.items()):
        series = [{r["iter"]: r["val_loss"] for r in run["metrics"] if r.get("val_loss") is not None} for run in runs]
        common = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not common:
            continue
        ax.plot(common, [statistics.fmean(s[it] for s in series) for it in common], "o-", color=f"C{i}",
                markersize=3, label=name)
        ax.fill_between(common, [min(s[it] for s in series) for it in common],
                        [max(s[it] for s in series) for it in common], color=f"C{i}", alpha=0.2)
    reference_lines(ax, refs)
    ax.set(xlabel="iteration", ylabel="val loss (eval windows)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def plot_lr_curves(grid, rows, refs, initial, path) -> None:
    """Final loss against LR (seed 0); an x on the initial-loss line where a run diverged."""
    fig, ax = new_figure(figsize=(8, 5))
    top = max(initial.values())
    for i, (name, by_lr) in enumerate(grid.items()):
        points = {lr: run_loss(rows[r.name]) for lr, r in by_lr.items()}
        xs = [lr for lr in sorted(points) if math.isfinite(points[lr])]
        ax.plot(xs, [points[lr] for lr in xs], "o-", color=f"C{i}", label=name)
        bad = [lr for lr in points if not math.isfinite(points[lr])]
        ax.plot(bad, [top] * len(bad), "x", color=f"C{i}", markersize=10, markeredgewidth=2)
    reference_lines(ax, refs, initial=top)
    ax.set_xscale("log")
    ax.set(xlabel="learning rate", ylabel="final val loss, whole split (x: diverged)",
           title="loss vs learning rate (seed 0)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


if __name__ == "__main__":
    _common.main(main)
