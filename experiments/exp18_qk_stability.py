"""Experiment 18: under Muon, how large do attention logits grow with the learning rate, and does
QK-norm or QK-Clip keep them (and the run) in check?

Kimi K2 (Kimi Team 2025, arXiv:2507.20534, section 2.1) trained with Muon and saw attention logits
grow until training became unstable; its QK-Clip rescales a head's W_q and W_k after a step whose
largest logit passed tau (the paper's tau: 100). QK-norm (Henry et al. 2020; Dehghani et al. 2023)
fixes the size of queries and keys before their learned gains, so the logits can grow only through
those gains. This experiment maps the three over Muon's LR on the GPT-2 block
(Pre-LN RMSNorm, config/prenorm_rms.py, optimizer muon): no QK-norm, QK-norm (qk_norm true,
config/prenorm_rms_qknorm.py) and QK-Clip (qk_clip_tau). The grid moves muon_lr, the LR of the
blocks' matrices, where the logits' growth comes from; AdamW's learning_rate (embeddings, head,
gains) stays train.py's default. Each run records its largest attention logit every --diag_interval
iterations (diagnostics' attn_logit_max); the table gives, per arm and LR, the largest over the run
and the seeds, how many runs collapsed or diverged, their mean final loss, and under QK-Clip how
many logged steps clipped a head. A map, two seeds a point: no verdicts.

    python experiments/exp18_qk_stability.py [--quick] [--lrs A,B,...] [--seeds N] [--qk_clip_tau T] [--jobs N] [--out DIR]

Writes results.csv (one row per run), qk_stability.png and report.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import _common
from _common import EXP2_BUDGET, config_path, floats, lr_list_problems

from babygpt.files import write_csv
from babygpt.options import option
from babygpt.plot import load_run, new_figure, save
from babygpt.sweep import Run
from babygpt.verdicts import run_loss

NAME = "exp18_qk_stability"
KIMI_TAU = 100.0  # Kimi K2's tau (arXiv:2507.20534, section 2.1)
LRS = {"quick": "0.01,0.3", "default": "0.003,0.01,0.03,0.1,0.3,1"}
ARMS = ("no QK-norm", "QK-norm", "QK-Clip")
FAILED = ("collapsed", "diverged", "skipped_out")


@dataclass
class Exp18Options(_common.TrainingOptions):
    lrs: Optional[str] = option(None, f"muon_lr grid (none: {LRS['default']}; quick {LRS['quick']})", metavar="LR,...")
    seeds: int = option(2, "seeds per point, 0..N-1")
    qk_clip_tau: float = option(KIMI_TAU, "QK-Clip's threshold for the QK-Clip arm (Kimi K2's: 100)")
    diag_interval: Optional[int] = option(None, "iterations between the logit measurements (none: 25; quick 5)")

    def problems(self) -> list[str]:
        problems = super().problems() + (lr_list_problems(self.lrs) if self.lrs is not None else [])
        if self.seeds < 1:
            problems.append(f"--seeds must be at least 1, got {self.seeds}")
        if not (self.qk_clip_tau > 0 and math.isfinite(self.qk_clip_tau)):
            problems.append(f"--qk_clip_tau must be a positive number, got {self.qk_clip_tau}")
        if self.diag_interval is not None and self.diag_interval < 1:
            problems.append(f"--diag_interval must be at least 1, got {self.diag_interval}")
        return problems


def arm_runs(lrs: list[float], seeds: int, tau: float, diag_interval: int) -> dict:
    """{(arm, lr, seed): Run}: each arm at every muon_lr of the grid on seeds 0..seeds-1."""
    arms = {"no QK-norm": (config_path("prenorm_rms"), {}),
            "QK-norm": (config_path("prenorm_rms_qknorm"), {}),
            "QK-Clip": (config_path("prenorm_rms"), {"qk_clip_tau": tau})}
    return {(arm, lr, s): Run({"optimizer": "muon", "muon_lr": lr, "diag_interval": diag_interval, **extra}, s, path,
                              arm.lower().replace(" ", "_").replace("-", ""))
            for arm, (path, extra) in arms.items() for lr in lrs for s in range(seeds)}


def largest_logit(metrics: list[dict]) -> float | None:
    """The largest attention logit any block reached at the run's measurements (one value per block
    a row); inf where one was not finite (the logits overflowed: max() alone would depend on where
    the NaN lies); None where no measurement was made."""
    values = [v for r in metrics for v in r.get("attn_logit_max") or []]
    if not values:
        return None
    return max(values) if all(math.isfinite(v) for v in values) else math.inf


def clipped_steps(metrics: list[dict]) -> tuple[int, int]:
    """(how many logged steps clipped at least one head, how many steps were logged): QK-Clip's rows,
    one every log_interval iterations, carry qk_clipped_heads, the count of the step that wrote
    the row; the steps between rows go uncounted."""
    logged = [r["qk_clipped_heads"] for r in metrics if "qk_clipped_heads" in r]
    return sum(1 for n in logged if n > 0), len(logged)


def run_rows(runs: dict, rows: dict, sweep) -> list[dict]:
    out = []
    for (arm, lr, seed), run in runs.items():
        metrics = load_run(sweep.out_dir(run))["metrics"]
        row = rows[run.name]
        clipped, logged = clipped_steps(metrics)
        out.append({"arm": arm, "muon_lr": lr, "seed": seed, "status": row["status"], "final_loss": run_loss(row),
                    "max_attn_logit": largest_logit(metrics), "clipped_steps": clipped, "logged_steps": logged})
    return out


def map_table(results: list[dict], lrs: list[float]) -> str:
    body = []
    for arm in ARMS:
        for lr in lrs:
            point = [r for r in results if r["arm"] == arm and r["muon_lr"] == lr]
            logits = [r["max_attn_logit"] for r in point if r["max_attn_logit"] is not None]
            trained = [r["final_loss"] for r in point if r["status"] not in FAILED and math.isfinite(r["final_loss"])]
            body.append([arm, f"{lr:g}", f"{max(logits):.1f}" if logits else "—",
                         f"{sum(r['status'] in FAILED for r in point)} of {len(point)}",
                         f"{sum(trained) / len(trained):.4f}" if trained else "—",
                         f"{sum(r['clipped_steps'] for r in point)} of {sum(r['logged_steps'] for r in point)}"
                         if arm == "QK-Clip" else ""])
    return _common.markdown_table(["arm", "muon_lr", "largest attention logit", "collapsed or failed",
                                   "mean final loss of the others", "logged steps that clipped (of logged)"], body)


def plot(results: list[dict], lrs: list[float], tau: float, path: str) -> None:
    fig, ax = new_figure(figsize=(6, 4))
    ax.axhline(tau, color="gray", linestyle="--", linewidth=1, label=f"QK-Clip's tau ({tau:g})")
    for arm in ARMS:
        peaks = [max([r["max_attn_logit"] for r in results if r["arm"] == arm and r["muon_lr"] == lr
                      and r["max_attn_logit"] is not None], default=math.nan) for lr in lrs]
        ax.plot(lrs, [p if math.isfinite(p) else math.nan for p in peaks], marker="o", label=arm)  # (inf: off the axis)
    ax.set(xscale="log", yscale="log", xlabel="muon_lr", ylabel="largest attention logit over the run")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, path)


def main(argv):
    exp = _common.begin(Exp18Options, argv, NAME, __doc__)
    args, tier = exp.args, exp.tier
    lrs = sorted(floats(args.lrs or LRS["quick" if tier == "quick" else "default"]))
    diag_interval = args.diag_interval or (5 if tier == "quick" else 25)
    runs = arm_runs(lrs, args.seeds, args.qk_clip_tau, diag_interval)
    budget = EXP2_BUDGET if tier == "default" else {}
    sweep, rows = exp.train(list(runs.values()), budget)
    results = run_rows(runs, rows, sweep)
    write_csv(os.path.join(exp.out, "results.csv"), list(results[0]), results)
    plot(results, lrs, args.qk_clip_tau, os.path.join(exp.out, "qk_stability.png"))
    fixed = _common.resolved_keys(config_path("prenorm_rms"), args.set,
                                  ("muon_adjust_lr", "muon_ns_dtype", "learning_rate"))
    body = (f"{exp.budget_line(budget)}; optimizer muon (muon_adjust_lr {fixed['muon_adjust_lr']}, Newton-Schulz in "
            f"{fixed['muon_ns_dtype']}), muon_lr over "
            f"the grid, AdamW's learning_rate {fixed['learning_rate']:g}; seeds {', '.join(map(str, range(args.seeds)))}; QK-Clip "
            f"at tau {args.qk_clip_tau:g}; the largest attention logit measured every {diag_interval} iterations, in the "
            f"step's forward, before QK-Clip rescales W_q and W_k after that step (so it can pass tau); QK-Clip's "
            f"count of clipping steps looks only at the steps that wrote a log row (one in log_interval). "
            f"Collapsed: the run ended within 0.1 nats of the unigram loss or above it (train.py's test). "
            f"{_common.training_time(rows.values())}.\n\n"
            + _common.table_section("The map", "Per arm and muon_lr, over the seeds.", "map", map_table(results, lrs))
            + "![](qk_stability.png)")
    exp.write_report("Attention logits and collapse under Muon: no QK-norm, QK-norm, QK-Clip", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
