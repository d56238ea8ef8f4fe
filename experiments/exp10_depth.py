"""Experiment 10: what each placement leaves its deep blocks doing, at 12 and 24 layers.

Pre-LN adds every block's output to a stream that grows with depth, so a deep block's update is
small beside it: Gromov et al. 2024 (arXiv:2403.17887) find deep blocks of Pre-LN models nearly the
identity and prunable; Sun et al. 2025 ("The Curse of Depth", arXiv:2502.05795) trace it to Pre-LN
and propose LayerNorm Scaling; Mix-LN (Li et al. 2024, arXiv:2412.13795) makes the first quarter of
the blocks Post-LN for the same reason. This experiment trains narrow models (width 64) at 12 and 24
layers under Pre-LN, Post-LN, Mix-LN, LayerNorm Scaling, Peri-LN and DeepNorm, all at one learning
rate (1e-3, where Post-LN trains in experiment 2; not tuned per placement), and measures per block,
at the end of training, on the same batch (babygpt/diagnostics.py):

  angular_distance    arccos of the cosine between the block's input and output, over pi
  removal_loss_delta  how much the loss rises when the block is skipped

    python experiments/exp10_depth.py [--quick] [--jobs N] [--seed 1] [--configs A,B] [--out DIR]

--configs with --set runs a paper's own setup for some of them, e.g. LayerNorm Scaling without the
depth-scaled init: --configs prenorm_rms,prenorm_rms_lns --set init_depth_factor=false.

Writes results.csv, depth.png and report.md.
"""

import os
import statistics
from dataclasses import dataclass

import _common

from babygpt.verdicts import run_loss
from babygpt.options import option
from babygpt.plot import load_run, new_figure, save
from babygpt.sweep import Run
from _common import config_path, lr_overrides

NAME = "exp10_depth"
CONFIGS = ("prenorm_rms", "postnorm_rms", "mixln_rms", "prenorm_rms_lns", "periln_rms", "deepnorm_ln")
DEPTHS = {"quick": (4,), "default": (12, 24), "full": (12, 24)}
LR = 1e-3
# Narrow, so that 24 blocks fit the CPU budget; max_iters is experiment 2's default-tier budget.
SHAPE = {"quick": {}, "default": {"n_embd": 64, "n_head": 4, "max_iters": 400, "eval_interval": 100},
         "full": {"n_embd": 64, "n_head": 4}}
NEAR_IDENTITY = 0.01  # nats: a block whose removal costs less than this is one the model barely needs


@dataclass
class Exp10Options(_common.TrainingOptions):
    seed: int = option(1, "the seed of every run")
    configs: str = option(",".join(CONFIGS), "comma-separated configurations to measure (names of config/*.py)",
                         metavar="NAME,...")

    def config_names(self) -> list[str]:
        return self.configs.split(",")

    def problems(self) -> list[str]:
        missing = [c for c in self.config_names() if c and not os.path.exists(config_path(c))]  # "": parse's
        return super().problems() + [f"--configs: no config/{c}.py; name files in config/, e.g. prenorm_rms"
                                     for c in missing]


def depth_runs(configs: list, tier: str, seed: int, max_iters: int) -> dict:
    """{(config, n_layer): Run}, each measured once, at its last iteration."""
    return {(config, depth): Run({"n_layer": depth, **lr_overrides(LR), "diag_interval": max_iters}, seed,
                                 config_path(config))
            for config in configs for depth in DEPTHS[tier]}


def last_diagnostics(run: dict) -> dict:
    """The run's last diagnostics row ({} if it has none: a run that diverged before it)."""
    rows = [r for r in run["metrics"] if r.get("angular_distance") is not None]
    return rows[-1] if rows else {}


def fmt_list(values, spec: str) -> str:
    return " / ".join("—" if v is None else format(v, spec) for v in values)


def depth_table(runs: dict, loaded: dict, rows: dict) -> str:
    body = []
    for (config, depth), run in runs.items():
        d = last_diagnostics(loaded[(config, depth)])
        turn, cost = d.get("angular_distance") or [], d.get("removal_loss_delta") or []
        deep = turn[len(turn) // 2:]  # the deeper half of the blocks
        body.append([config, depth, f"{run_loss(rows[run.name]):.3f} {rows[run.name]['status']}",
                     f"{statistics.mean(deep):.3f}" if deep else "—",
                     f"{sum(c is not None and c < NEAR_IDENTITY for c in cost)} of {len(cost)}",
                     fmt_list(turn, ".2f"), fmt_list(cost, ".3f")])
    return _common.markdown_table(["config", "n_layer", "final loss", "mean angular distance, deeper half",
                                   f"blocks whose removal costs < {NEAR_IDENTITY} nats",
                                   "angular distance per block", "loss increase when the block is skipped"], body)


def plot(configs: list, loaded: dict, depths: tuple, path: str) -> None:
    fig, axes = new_figure(2, len(depths), figsize=(6 * len(depths), 7), squeeze=False)
    for col, depth in enumerate(depths):
        for config in configs:
            d = last_diagnostics(loaded[(config, depth)])
            for row, key in enumerate(("angular_distance", "removal_loss_delta")):
                values = d.get(key) or []
                axes[row, col].plot(range(len(values)), values, "o-", markersize=3, label=config)
        for row, label in enumerate(("angular distance, input to output", "loss increase when skipped (nats)")):
            axes[row, col].set(title=f"{depth} layers", xlabel="block", ylabel=label)
            axes[row, col].grid(alpha=0.3)
        axes[0, col].legend(fontsize=8)
    save(fig, path)


def main(argv):
    exp = _common.begin(Exp10Options, argv, NAME, __doc__)
    args, tier = exp.args, exp.tier
    budget = exp.budget(SHAPE[tier])
    runs = depth_runs(args.config_names(), tier, args.seed, budget["max_iters"])
    sweep, rows = exp.train(list(runs.values()), SHAPE[tier])
    loaded = {key: load_run(sweep.out_dir(run)) for key, run in runs.items()}
    plot(args.config_names(), loaded, DEPTHS[tier], os.path.join(exp.out, "depth.png"))
    body = (f"{exp.budget_line(SHAPE[tier], leave_out=('n_layer',))}; lr {LR:g} for every run (not tuned per placement), min_lr lr/10; "
            f"seed {args.seed}; the diagnostics measured once, at the last iteration, on that step's batch. "
            f"{_common.training_time(rows.values())}.\n\n"
            + _common.table_section("Depth", "Blocks listed from 0. A block near the identity turns the stream "
                                    "little (angular distance near 0) and costs little when skipped.", "depth",
                                    depth_table(runs, loaded, rows))
            + "![](depth.png)")
    exp.write_report("What each placement leaves its deep blocks doing", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
