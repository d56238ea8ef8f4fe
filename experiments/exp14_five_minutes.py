"""Experiment 14: below the n-gram floor in five CPU minutes? The modern config (config/modern_rms.py:
RoPE, SwiGLU, QK-norm, zero-initialised projections, Muon), its AdamW twin and the default
(config/prenorm_rms.py), each trained for the iterations its training steps take in 5 minutes at
2 threads, its LR tuned on seeds 0 and 1 at that budget, and each run's test loss (the sliding-window
loss of the validation split's second half, trainer.final_evaluation) read against the strongest
count-based model scored on exactly those targets with the same context (references_test).

The runs are sweeps of experiments/sweep.py, one directory per arm and LR under --out (default
results/modern_5min), made by the commands in its README.md: the tuning seeds 0 and 1 in ``<arm>``
or ``<arm>_lrLR``, the evaluation seed(s) at the tuned LR in ``<arm>_eval``; the budgets come from the training
ms/iter of experiments/exp13_stack_speed.py at 2 threads on the same machine (--timings). This script
trains nothing: it reads the finished runs and writes settings.json, results.csv and report.md into --out.

    python experiments/exp14_five_minutes.py [--out DIR] [--timings DIR/stack_speed.csv]
"""

import csv
import glob
import json
import os
import statistics
import time
from dataclasses import dataclass

import _common

from babygpt import files
from babygpt.errors import BabyGPTError
from babygpt.ngram import label, strongest
from babygpt.options import option
from babygpt.rundir import write_json
from babygpt.runstore import run_info, run_summary, runs_under

BUDGET_S = 300  # five minutes of training steps
# arm -> (the sweep directories' name prefix, the LR key its sweeps vary, its row in exp13's table)
ARMS = {"modern_rms (Muon)": ("modern_rms", "muon_lr", "modern_rms.py"),
        "modern_rms_adamw": ("modern_rms_adamw", "learning_rate", "modern_rms_adamw.py"),
        "prenorm_rms (the default)": ("prenorm_rms", "learning_rate", "default")}


@dataclass
class Exp14Options(_common.Options):
    timings: str = option(os.path.join(_common.ROOT, "results", "modern_5min", "budget_timings", "stack_speed.csv"),
                          "exp13's stack_speed.csv the budgets were set from")

    @property
    def root(self) -> str:
        """The sweeps' parent directory, where results.csv and report.md go: --out, or results/modern_5min."""
        return self.out if self.out is not None else os.path.join(_common.ROOT, "results", "modern_5min")

    def problems(self) -> list[str]:
        problems = [f"--{name}: experiment 14 trains nothing (it reads the finished sweeps under --out); leave it out"
                    for name in ("quick", "overwrite") if getattr(self, name)]
        if self.publish:  # (root: --out, else the committed directory already)
            problems.append("--publish: experiment 14 writes into results/modern_5min already (or --out); "
                            "leave it out")
        return problems + [f"{path!r} not found; check the path" for path in (self.root, self.timings)
                           if not os.path.exists(path)]


def sweep_dirs(root: str, prefix: str) -> dict[str, list[str]]:
    """The arm's sweep directories by role: tuning (``prefix``, ``prefix``_lrLR) and evaluation
    (``prefix``_eval, seeds after the tuning seeds at the tuned LR)."""
    dirs = {"tuning": [], "evaluation": []}
    for d in sorted(glob.glob(os.path.join(root, prefix + "*"))):
        name = os.path.basename(d)
        if name == prefix + "_eval":
            dirs["evaluation"].append(d)
        elif name.split("_lr")[0] == prefix:  # modern_rms_adamw_lr* is not modern_rms's
            dirs["tuning"].append(d)
    return dirs


def finished_runs(sweeps: list[str], lr_key: str, role: str) -> list[dict]:
    """Every finished run of ``sweeps``: its LR, seed, losses and the floors of its test targets."""
    runs = []
    for path in (p for d in sweeps for p in sorted(runs_under(d))):
        summary, config = run_summary(path), run_info(path)
        if summary is None or config is None:
            continue  # not started, or killed before its end
        config = config["config"]  # the run's TrainConfig, flat
        if summary.get("status") != "finished":
            continue
        floors = summary["references_test"]
        floor, floor_loss = strongest(floors)
        runs.append({"role": role, "lr": config[lr_key], "seed": config["seed"], "iters": summary["iter"],
                     "tune_loss": summary["tune_loss"], "test_loss": summary["test_loss"],
                     "floor": floor, "floor_loss": floor_loss,
                     "kn8": floors["kn8"], "machine": summary.get("machine")})
    return runs


def ms_per_iter(timings: str) -> dict:
    with open(timings) as f:
        return {row["piece"]: float(row["ms_per_iter"]) for row in csv.DictReader(f)}


def tuned_lr(runs: list[dict]) -> float | None:
    """The LR with the lowest mean tune loss over the tuning seeds (an LR with one finished seed is not
    a candidate)."""
    by_lr = {}
    for r in runs:
        by_lr.setdefault(r["lr"], []).append(r["tune_loss"])
    complete = {lr: v for lr, v in by_lr.items() if len(v) >= 2}
    return min(complete, key=lambda lr: statistics.mean(complete[lr])) if complete else None


def arm_rows(arm: str, runs: list[dict], ms: float) -> list[dict]:
    """One row per run, the arm's tuned LR (``tuned_lr`` of its tuning runs) marked; an arm that tried
    one LR has none (the default runs at the LR tuned at 2,400 iterations)."""
    tuning = [r for r in runs if r["role"] == "tuning"]
    tuned = tuned_lr(tuning) if len({r["lr"] for r in tuning}) > 1 else None
    return [{"arm": arm, "role": r["role"], "lr": r["lr"], "seed": r["seed"], "iters": r["iters"],
             "train_minutes_2_threads": r["iters"] * ms / 60e3, "tuned": r["lr"] == tuned,
             "tune_loss": r["tune_loss"], "test_loss": r["test_loss"], "floor": label(r["floor"]),
             "floor_loss": r["floor_loss"], "below_floor": r["test_loss"] < r["floor_loss"],
             "kn8_loss": r["kn8"], "below_kn8": r["test_loss"] < r["kn8"], "machine": r["machine"]}
            for r in sorted(runs, key=lambda r: (r["role"] != "tuning", r["lr"], r["seed"]))]


def table(rows: list[dict]) -> str:
    header = ["arm", "seed's role", "LR", "seed", "iterations", "training min (2 threads)", "tune loss", "test loss",
              "strongest floor", "below it", "KN 8-gram", "below it"]
    return _common.markdown_table(header, [
        [r["arm"], r["role"], f"{r['lr']:g}{' (tuned)' if r['tuned'] else ''}", r["seed"], f"{r['iters']:,}",
         f"{r['train_minutes_2_threads']:.1f}", f"{r['tune_loss']:.4f}", f"{r['test_loss']:.4f}",
         f"{r['floor']} {r['floor_loss']:.4f}", "yes" if r["below_floor"] else "no", f"{r['kn8_loss']:.4f}",
         "yes" if r["below_kn8"] else "no"] for r in rows])


def main(argv):
    started = time.time()
    args = _common.parse(Exp14Options, argv, "exp14_five_minutes", __doc__)
    ms = ms_per_iter(args.timings)
    rows = []
    for arm, (prefix, lr_key, piece) in ARMS.items():
        dirs = sweep_dirs(args.root, prefix)
        runs = [r for role, sweeps in dirs.items() for r in finished_runs(sweeps, lr_key, role)]
        rows += arm_rows(arm, runs, ms[piece])
    if not rows:
        raise BabyGPTError(f"no finished run under {args.root}; run the sweeps its README.md lists first")
    write_json(os.path.join(args.root, "settings.json"), _common.settings(args, "exp14_five_minutes"))
    files.write_csv(os.path.join(args.root, "results.csv"), list(rows[0]), rows)
    tuned = [r for r in rows if r["tuned"] and r["role"] == "tuning"]
    evaluation = [r for r in rows if r["role"] == "evaluation"]
    answer = (f"{sum(r['below_floor'] for r in rows)} of {len(rows)} runs end below the strongest count-based "
              f"floor of their test targets; of the tuning seeds at the tuned LRs, {sum(r['below_floor'] for r in tuned)} "
              f"of {len(tuned)}; of the evaluation seeds, {sum(r['below_floor'] for r in evaluation)} of "
              f"{len(evaluation)}.")
    edges = []
    for arm in ARMS:
        tried = sorted({r["lr"] for r in rows if r["arm"] == arm and r["role"] == "tuning"})
        best = [r["lr"] for r in rows if r["arm"] == arm and r["tuned"]]
        if len(tried) > 1 and best and best[0] in (tried[0], tried[-1]):
            side = "lowest" if best[0] == tried[0] else "highest"
            edges.append(f"{arm}'s tuned LR {best[0]:g} is the {side} it tried: one beyond it may do better.")
    answer += "".join(" " + e for e in edges)
    budgets = "\n".join(f"- {arm}: {ms[piece]:.1f} ms per training step at 2 threads, so "
                        f"{int(BUDGET_S * 1e3 / ms[piece]):,} steps in {BUDGET_S} s" for arm, (_, _, piece) in ARMS.items())
    body = (f"Budgets (from {os.path.relpath(args.timings, args.root)}; evaluation time not counted):\n\n{budgets}\n\n"
            f"{_common.table_marker('runs')}{table(rows)}\n\n{answer}\n")
    _common.write_report(os.path.join(args.root, "report.md"), "Below the n-gram floor in five CPU minutes?",
                         _common.command_line(), body, started)
    return 0


if __name__ == "__main__":
    _common.main(main)
