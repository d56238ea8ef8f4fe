"""Experiment 8: where DyT's tanh saturates, layer by layer over training, plain and as the paper trains it.

DyT (Zhu et al. 2025, arXiv:2503.10622) replaces each norm by gamma * tanh(alpha * x) (+ beta). Unlike a
norm it does not rescale its input: an input too small stays in the linear part, where DyT is just
alpha * x and nothing is normalized; an input too large lands on the flat part, where the output no
longer depends on it and no gradient passes. This experiment trains plain DyT (config/prenorm_dyt.py)
and the paper's language-model recipe (config/prenorm_dyt_paper.py) under both inits, each at the LR
experiment 2 tuned for it (results/exp2_norm_variants and results/exp2_norm_variants_xavier), and
records per block the share of DyT inputs with |alpha x| >= 2 (diagnostics' tanh_saturation), the
RMS of alpha x (tanh_input_rms: far below 1, DyT is linear and rescales nothing), and the alphas
the run learned.

    python experiments/exp8_dyt_saturation.py [--quick | --full] [--jobs N] [--seed 1] [--out DIR]

Writes results.csv, dyt_saturation.png and report.md.
"""

import os
from dataclasses import dataclass
from typing import Optional

import _common

from babygpt.checkpoint import load_checkpoint
from babygpt.verdicts import run_loss
from babygpt.errors import BabyGPTError
from babygpt.options import option
from babygpt.plot import load_run, new_figure, save
from babygpt.sweep import DONE, Run
from _common import EXP2_BUDGET, config_path, lr_overrides, read_tuned

NAME = "exp8_dyt_saturation"
CONFIGS = ("prenorm_dyt", "prenorm_dyt_paper")
# init -> the experiment-2 output whose tuned LRs the runs use
TUNED_FROM = {"gpt2": "results/exp2_norm_variants", "xavier": "results/exp2_norm_variants_xavier"}
QUICK_LR = 3e-3


@dataclass
class Exp8Options(_common.TrainingOptions):
    seed: int = option(1, "the seed of every run (1: experiment 2's first evaluation seed)")
    diag_interval: Optional[int] = option(None, "iterations between diagnostics (none: 25; quick 5)")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.diag_interval is not None and self.diag_interval < 1:
            problems.append(f"--diag_interval must be at least 1, got {self.diag_interval}")
        return problems


def arm_runs(tier: str, seed: int, diag_interval: int) -> dict:
    """{(config, init): Run} at experiment 2's tuned LR (quick: one fixed LR, nothing read)."""
    runs = {}
    for init, source in TUNED_FROM.items():
        tuned = {c: QUICK_LR for c in CONFIGS} if tier == "quick" else read_tuned(source, CONFIGS)
        for config in CONFIGS:
            runs[(config, init)] = Run({"init": init, **lr_overrides(tuned[config]),
                                        "diag_interval": diag_interval}, seed, config_path(config))
    return runs


def diag_rows(run: dict) -> list[dict]:
    return [r for r in run["metrics"] if r.get("tanh_saturation") is not None]


def final_weights(run_dir: str) -> str:
    """The run's checkpoint, which holds its learned alphas. The committed records do not (so a
    fresh clone cannot --collect this experiment): refused with what to do instead."""
    path = os.path.join(run_dir, "ckpt.pt")
    if not os.path.exists(path):
        raise BabyGPTError(f"'{path}' not found: experiment 8 reads each run's learned alphas from its final "
                           f"weights, which are not committed; run the experiment into a new --out to train them")
    return path


def learned_alphas(run_dir: str) -> tuple[list[float], list[float]]:
    """(ln1 alphas, ln2 alphas) per block at the end of a run, from its checkpoint."""
    state = load_checkpoint(final_weights(run_dir))["model"]
    pick = lambda norm: [v.item() for k, v in sorted(state.items()) if k.endswith(f"{norm}.alpha")]  # noqa: E731
    return pick("ln1"), pick("ln2")


def fmt_list(values, spec=".2f") -> str:
    return " / ".join("—" if v is None else format(v, spec) for v in values)


def saturation_table(runs: dict, loaded: dict, rows: dict, sweep, at: list[int]) -> str:
    body = []
    for (config, init), run in runs.items():
        data = loaded[(config, init)]
        ln1, ln2 = learned_alphas(sweep.out_dir(run))
        lr = run.overrides["learning_rate"]
        for it in at:
            d = next((r for r in reversed(diag_rows(data)) if r["iter"] <= it), None)
            if d is None:
                continue
            body.append([config, init, f"{lr:g}", f"{run_loss(rows[run.name]):.3f} {rows[run.name]['status']}",
                         d["iter"], fmt_list(d["tanh_saturation"], ".3f"), fmt_list(d["tanh_input_rms"], ".3g"),
                         fmt_list(ln1) + " ; " + fmt_list(ln2) if it == at[-1] else ""])
    return _common.markdown_table(["config", "init", "LR", "final loss", "iter", "saturated share per block",
                                   "RMS of alpha x per block", "learned alpha per block (ln1 ; ln2), at the end"], body)


def plot(runs: dict, loaded: dict, path: str) -> None:
    fig, axes = new_figure(1, len(runs), figsize=(4.5 * len(runs), 3.8), squeeze=False)
    for ax, key in zip(axes[0], runs):
        rows = diag_rows(loaded[key])
        if rows:
            for layer in range(len(rows[0]["tanh_saturation"])):
                ax.plot([r["iter"] for r in rows], [r["tanh_saturation"][layer] for r in rows], label=f"block {layer}")
        ax.set(title=f"{key[0]}, {key[1]} init", xlabel="iteration", ylabel="share of DyT inputs |αx| ≥ 2",
               ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, path)


def main(argv):
    exp = _common.begin(Exp8Options, argv, NAME, __doc__)
    args, tier = exp.args, exp.tier
    diag_interval = args.diag_interval or (5 if tier == "quick" else 25)
    runs = arm_runs(tier, args.seed, diag_interval)
    budget = EXP2_BUDGET if tier == "default" else {}
    # A run that ended before (committed, or trained by another shard) is not trained again, so its
    # final weights, needed at the end, are checked now, before anything is written.
    planned = exp.sweep(list(runs.values()), budget)
    for run in runs.values():
        if planned.status(run) in DONE:
            final_weights(planned.out_dir(run))
    sweep, rows = exp.train(list(runs.values()), budget)
    loaded = {key: load_run(sweep.out_dir(run)) for key, run in runs.items()}
    plot(runs, loaded, os.path.join(exp.out, "dyt_saturation.png"))
    last = max(r["iter"] for rs in loaded.values() for r in diag_rows(rs)) if any(map(diag_rows, loaded.values())) else 0
    at = sorted({diag_interval, max(diag_interval, last // 4), last})
    body = (f"{exp.budget_line(budget)}; seed {args.seed}; each "
            f"configuration at its experiment-2 tuned LR for that init; diagnostics every {diag_interval} "
            f"iterations. {_common.training_time(rows.values())}.\n\n"
            + _common.table_section("Saturation by block", "Saturated: |alpha x| >= 2, where tanh's slope is under "
                                    "0.07 (its slope at 0 is 1). Blocks listed from 0; each block's value counts "
                                    "the inputs of its ln1 and ln2.", "saturation",
                                    saturation_table(runs, loaded, rows, sweep, at))
            + "![](dyt_saturation.png)")
    exp.write_report("Where DyT saturates", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
