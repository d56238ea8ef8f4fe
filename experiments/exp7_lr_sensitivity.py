"""Experiment 7: Wortsman et al.'s small-scale instabilities, and what QK-norm and the z-loss do about them.

Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities",
arXiv:2309.14322) reproduce two instabilities of large models in small ones by raising the LR:
attention logits that keep growing until the softmax is one-hot (fixed by normalizing queries and
keys, qk_norm), and output logits that drift away from log Z = 0 (fixed by the z-loss,
z_loss * (log Z)^2 with 1e-4). This experiment draws their loss-vs-LR curves for Pre-LN RMSNorm with
each fix off and on, at two widths, and records the per-layer max attention logit and the output
log Z along the way (diagnostics every --diag_interval iterations).

Arms: plain, qk_norm, z_loss (1e-4), qk_norm + z_loss, all with this project's AdamW weight decay 0.1
(PyTorch's coupled form: each step scales a weight by 1 - lr_t * 0.1). Wortsman et al. observe the
output-logit drift *without* weight decay and train with an "independent" decay of 1e-4 (a step
scales a weight by 1 - s_t * 1e-4, s_t the schedule's factor, lr_t / lr); whether weight decay is
why the z-loss changes nothing here is measured by four more arms: plain and z_loss with weight
decay 0, and with the independent 1e-4 (weight_decay = 1e-4 / lr, which makes the coupled form
exactly the independent one). The LR sensitivity (docs/experiments.md) of an arm at a width is computed on the
seed-mean loss of each LR. Two seeds: no difference between arms is claimed (inconclusive); the
table shows the curves, not verdicts.

    python experiments/exp7_lr_sensitivity.py [--quick | --full] [--jobs N] [--widths 64,128] [--lrs ...]
        [--seeds 2] [--out DIR]

Writes results.csv, lr_sensitivity.png and report.md.
"""

import math
import os
import statistics
from dataclasses import dataclass
from typing import Optional

import _common

from babygpt.verdicts import outcome_counts, run_loss
from babygpt.options import option
from babygpt.plot import load_run, new_figure, reference_lines, save
from babygpt.stats import lr_sensitivity
from babygpt.sweep import Run
from _common import floats, initial_loss, lr_overrides

NAME = "exp7_lr_sensitivity"
Z_LOSS = 1e-4  # Wortsman et al.'s (and PaLM's) coefficient
INDEPENDENT_WD = 1e-4  # Wortsman et al.'s independent weight decay
# arm -> (flags, weight decay: a number, or "independent" for INDEPENDENT_WD / lr; None = the default 0.1)
ARMS = {
    "plain": ({"qk_norm": False, "z_loss": 0.0}, None),
    "qk_norm": ({"qk_norm": True, "z_loss": 0.0}, None),
    "z_loss": ({"qk_norm": False, "z_loss": Z_LOSS}, None),
    "qk_norm + z_loss": ({"qk_norm": True, "z_loss": Z_LOSS}, None),
    "plain, wd 0": ({"qk_norm": False, "z_loss": 0.0}, 0.0),
    "z_loss, wd 0": ({"qk_norm": False, "z_loss": Z_LOSS}, 0.0),
    "plain, independent wd 1e-4": ({"qk_norm": False, "z_loss": 0.0}, "independent"),
    "z_loss, independent wd 1e-4": ({"qk_norm": False, "z_loss": Z_LOSS}, "independent"),
}


def weight_decay(rule, lr: float) -> dict:
    """The run's weight_decay override for an arm's rule at peak LR ``lr`` (none for the default)."""
    if rule is None:
        return {}
    return {"weight_decay": INDEPENDENT_WD / lr if rule == "independent" else rule}


SETUP = {"norm_placement": "pre", "norm_type": "rmsnorm", "n_layer": 4, "n_head": 4}
# Per tier: LR grid (half-decades up to 1e-1), widths, and the budget on top of _common.TIERS.
GRID = {"quick": "1e-2,1e-1", "default": "1e-3,3e-3,1e-2,3e-2,1e-1", "full": "3e-4,1e-3,3e-3,1e-2,3e-2,1e-1"}
WIDTHS = {"quick": "32", "default": "64,128", "full": "64,128,256"}
BUDGET = {"quick": {}, "default": {"max_iters": 250, "eval_interval": 125, "warmup_iters": 25},
          "full": {"max_iters": 2400, "eval_interval": 400}}


@dataclass
class Exp7Options(_common.TrainingOptions):
    lrs: Optional[str] = option(None, f"LR grid (none: {GRID['default']}; quick {GRID['quick']})", metavar="LR,...")
    widths: Optional[str] = option(None, f"model widths n_embd, 4 heads each (none: {WIDTHS['default']}; "
                                         f"quick {WIDTHS['quick']}; full {WIDTHS['full']})", metavar="WIDTH,...")
    seeds: Optional[int] = option(None, "seeds per cell, 0..N-1 (none: 2; quick 1)")
    diag_interval: Optional[int] = option(None, "iterations between diagnostics (max attention logit, output "
                                                "log Z; none: 25, quick 5)")

    def problems(self) -> list[str]:
        problems = super().problems()
        try:
            if any(not (0 < v < math.inf) for v in floats(self.lrs or "1")):
                problems.append(f"--lrs takes positive learning rates, got {self.lrs!r}")
        except ValueError:
            problems.append(f"--lrs takes comma-separated numbers, got {self.lrs!r}")
        try:
            if any(w <= 0 or w % 4 for w in map(int, (self.widths or "4").split(","))):
                problems.append(f"--widths takes positive multiples of 4 (4 heads), got {self.widths!r}")
        except ValueError:
            problems.append(f"--widths takes comma-separated integers, got {self.widths!r}")
        if self.seeds is not None and self.seeds < 1:
            problems.append(f"--seeds must be at least 1, got {self.seeds}")
        if self.diag_interval is not None and self.diag_interval < 1:
            problems.append(f"--diag_interval must be at least 1, got {self.diag_interval}")
        return problems


def cell_runs(lrs: list[float], widths: list[int], seeds: int, diag_interval: int) -> dict:
    """{(arm, width, lr): [Run per seed]}."""
    return {(arm, width, lr): [Run({**SETUP, **flags, "n_embd": width, **lr_overrides(lr), **weight_decay(rule, lr),
                                    "diag_interval": diag_interval}, seed, label=f"{arm}, w{width}")
                               for seed in range(seeds)]
            for arm, (flags, rule) in ARMS.items() for width in widths for lr in lrs}


def last_diag(run: dict, key: str) -> float | None:
    """The largest value over layers of ``key`` in the run's last finite diagnostics row, or, for a
    run that diverged, the last one before it."""
    for row in reversed(run["metrics"]):
        values = [v for v in (row.get(key) or []) if v is not None]
        if values:
            return max(values)
    return None


def peak_diag(run: dict, key: str) -> float | None:
    """The largest value of ``key`` over layers and every measured iteration."""
    values = [v for row in run["metrics"] for v in (row.get(key) or []) if v is not None]
    return max(values) if values else None


def mean_or_none(values) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(values) if values else None


def fmt(v, spec=".3f") -> str:
    return "—" if v is None else format(v, spec)


def summarise(cells: dict, rows: dict, loaded: dict) -> dict:
    """Per cell: the seeds' outcomes, mean final loss, mean peak attention logit, mean final |log Z|."""
    out = {}
    for key, runs in cells.items():
        losses = [run_loss(rows[r.name]) for r in runs]
        out[key] = {"outcomes": outcome_counts([rows[r.name] for r in runs]),
                    "loss": statistics.fmean(losses) if all(math.isfinite(v) for v in losses) else math.inf,
                    "losses": losses,
                    "logit": mean_or_none(peak_diag(loaded[r.name], "attn_logit_max") for r in runs),
                    "logz": mean_or_none(abs(v) if v is not None else None
                                         for v in (last_diag(loaded[r.name], "output_logz") for r in runs))}
    return out


def outcomes_line(summary: dict, seeds: int) -> str:
    """The cells where not every seed finished (collapsed or diverged), or that every run finished."""
    odd = [f"{arm} w{w} lr {lr:g}: {cell['outcomes']}" for (arm, w, lr), cell in summary.items()
           if cell["outcomes"] != f"{seeds} finished"]
    return ("Cells where not every seed finished: " + "; ".join(odd) + ".") if odd else "Every run finished."


def sensitivity_table(summary: dict, lrs, widths, initial: dict) -> str:
    body = []
    for width in widths:
        for arm in ARMS:
            by_lr = {lr: summary[(arm, width, lr)]["loss"] for lr in lrs}
            best = min(by_lr, key=by_lr.get)
            trains = any(math.isfinite(v) for v in by_lr.values())
            body.append([width, arm, f"{best:g}" if trains else "—", fmt(by_lr[best] if trains else None),
                         fmt(lr_sensitivity(by_lr, initial[width]) if trains else None),
                         " / ".join(fmt(by_lr[lr]) if math.isfinite(by_lr[lr]) else "diverged" for lr in lrs)])
    return _common.markdown_table(["width", "arm", "best LR", "best loss (seed mean)", "LR sensitivity",
                                   "loss at LR " + ", ".join(f"{lr:g}" for lr in lrs)], body)


def instability_table(summary: dict, lrs, widths) -> str:
    body = [[width, arm] + [f"{fmt(summary[(arm, width, lr)]['logit'], '.1f')} / "
                            f"{fmt(summary[(arm, width, lr)]['logz'], '.2f')}" for lr in lrs]
            for width in widths for arm in ARMS]
    return _common.markdown_table(["width", "arm"] + [f"lr {lr:g}" for lr in lrs], body)


def plot(summary: dict, lrs, widths, refs: dict, initial: dict, path: str) -> None:
    panels = [("loss", "final val loss (seed mean)"), ("logit", "peak max attention logit"),
              ("logz", "final |output log Z|")]
    fig, axes = new_figure(len(widths), len(panels), figsize=(5 * len(panels), 3.8 * len(widths)), squeeze=False)
    for row, width in enumerate(widths):
        for col, (key, title) in enumerate(panels):
            ax = axes[row, col]
            for i, arm in enumerate(ARMS):
                colour, style = f"C{i % 4}", "o-" if i < 4 else ("s--" if i < 6 else "^:")
                ys = [summary[(arm, width, lr)][key] for lr in lrs]
                ys = [math.nan if y is None or not math.isfinite(y) else y for y in ys]
                ax.plot(lrs, ys, style, color=colour, label=arm)
            if key == "loss":
                reference_lines(ax, refs, initial[width])
            positive = any((summary[(arm, width, lr)][key] or 0) > 0 for arm in ARMS for lr in lrs)
            ax.set(title=f"width {width}: {title}", xlabel="learning rate", xscale="log",
                   yscale="log" if key == "logit" and positive else "linear")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    save(fig, path)


def main(argv):
    exp = _common.begin(Exp7Options, argv, NAME, __doc__)
    args, tier = exp.args, exp.tier
    lrs = floats(args.lrs or GRID[tier])
    widths = [int(w) for w in (args.widths or WIDTHS[tier]).split(",")]
    seeds = args.seeds or (1 if tier == "quick" else 2)
    diag_interval = args.diag_interval or (5 if tier == "quick" else 25)
    cells = cell_runs(lrs, widths, seeds, diag_interval)
    every_run = [r for runs in cells.values() for r in runs]
    sweep, rows = exp.train(every_run, BUDGET[tier])
    loaded = {r.name: load_run(sweep.out_dir(r)) for r in every_run}
    initial = {w: initial_loss(sweep.out_dir(cells[("plain", w, lrs[0])][0])) for w in widths}
    summary = summarise(cells, rows, loaded)
    refs = _common.reference_losses(args.data_dir)
    plot(summary, lrs, widths, refs, initial, os.path.join(exp.out, "lr_sensitivity.png"))

    body = (f"{exp.budget_line(BUDGET[tier], leave_out=(*SETUP, 'n_embd'))}; Pre-LN RMSNorm, 4 layers, "
            f"4 heads, width {', '.join(map(str, widths))}; min_lr = lr/10; seeds {', '.join(map(str, range(seeds)))}; diagnostics every "
            f"{diag_interval} iterations. {_common.training_time(rows.values())}.\n\n"
            + _common.table_section(
                "Loss against learning rate", "Final loss over the whole validation split, the mean of the "
                "seeds (diverged if any seed diverged). LR sensitivity: Wortsman et al.'s mean over the grid of "
                "min(loss, initial loss) minus the best loss. With 2 seeds no difference between arms is "
                "claimed: inconclusive.", "sensitivity",
                sensitivity_table(summary, lrs, widths, initial))
            + _common.table_section(
                "The two instabilities", "Each cell: the largest attention logit q.k/sqrt(D) over layers and "
                "measured iterations / |log Z| of the output at the last measurement (seed means).",
                "instabilities", instability_table(summary, lrs, widths))
            + outcomes_line(summary, seeds) + "\n\n"
            + _common.references_section(refs) + "\n\n![](lr_sensitivity.png)")
    exp.write_report("LR sensitivity with and without QK-norm and z-loss", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
