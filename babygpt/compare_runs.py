"""Finished runs side by side: ``python compare.py RUN_DIR RUN_DIR... [--plot FILE]``.

One row per run: its status, the config keys that differ between the runs (and only those), its
size, its losses beside the data's n-gram floors, and its cost. One run per configuration is an
anecdote, not a result: the table says so, and names the experiment that draws a verdict (several
seeds, each configuration at its own tuned LR, corrected intervals: experiments/exp2_norm_comparison.py).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from typing import Optional

from .errors import BabyGPTError
from .files import output_file_problems
from .ngram import label, strongest
from .options import option, parse_into
from .rundir import RunDir, latest_config, read_record, read_summary
from .runstore import expand_runs, stored

# Keys that say where or how a run ran, not what it is: never shown as a difference.
NOT_COMPARED = ("out_dir", "init_from", "device", "compile", "log_interval", "eval_interval", "eval_iters")


@dataclass
class RunRecord:
    """What a run directory says about its run."""

    path: str
    config: dict
    num_params: int | None
    summary: dict | None  # None while it has none (running, or killed before its end)
    tokens_per_s: float | None  # the median over its logged rows

    @property
    def status(self) -> str:
        if self.summary is None:
            return "no summary (still running, or killed)"
        return self.summary["status"]


def read_run(path: str) -> RunRecord:
    """The records of the run in ``path`` (a run directory, or ``<sweep>/runs/<name>`` of a run its
    sweep stored); a path that is not a run, or a damaged record, is refused by name (a run with no
    summary yet is shown as such)."""
    record = stored(path)
    if record is not None:
        info, summary, rows = record["config"], record["summary"], record["metrics"]
    else:
        rundir = RunDir(path)
        if not os.path.isdir(path) or not os.path.exists(rundir.config):
            raise BabyGPTError(f"'{path}' is not a run directory (no config.json); pass the out_dir of a training "
                               f"run")
        info, summary, rows = read_record(rundir.config, ("config",)), read_summary(rundir.summary), \
            rundir.metrics_rows()
    config = latest_config(info)
    if config is None:
        raise BabyGPTError(f"{os.path.join(path, 'config.json')} is damaged (no settings in its last start); "
                           f"restore it")
    speeds = [r["tokens_per_s"] for r in rows if isinstance(r.get("tokens_per_s"), (int, float))]
    return RunRecord(path, config, info.get("num_params"), summary, statistics.median(speeds) if speeds else None)


def differing_keys(runs: list[RunRecord]) -> list[str]:
    """The config keys whose values are not the same in every run, in config order."""
    keys = list(dict.fromkeys(k for r in runs for k in r.config))
    return [k for k in keys if k not in NOT_COMPARED and len({repr(r.config.get(k)) for r in runs}) > 1]


def _loss(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "—"


def table(runs: list[RunRecord]) -> str:
    """The markdown table of ``runs``: status, differing keys, parameters, losses, cost."""
    keys = differing_keys(runs)
    header = ["run", "status", *keys, "params", "best val", "final val", "whole-split val", "train s", "tok/s"]
    rows = []
    for r in runs:
        s = r.summary or {}
        rows.append([r.path, r.status, *(str(r.config.get(k, "—")) for k in keys),
                     f"{r.num_params / 1e6:.2f}M" if r.num_params else "—",
                     _loss(s.get("best_val_loss")), _loss(s.get("final_val_loss")), _loss(s.get("val_loss_full")),
                     f"{s['wall_time_s']:.0f}" if isinstance(s.get("wall_time_s"), (int, float)) else "—",
                     f"{r.tokens_per_s / 1e3:.1f}k" if r.tokens_per_s else "—"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def floors_line(runs: list[RunRecord]) -> str | None:
    """The data's floors the runs recorded: the unigram (the collapse line) and the strongest n-gram."""
    refs = next((r.summary["references"] for r in runs if r.summary and isinstance(r.summary.get("references"), dict)),
                None)
    if not refs:
        return None
    best = strongest(refs)
    shown = [("unigram", refs["unigram"])] if "unigram" in refs else []
    return "floors of the data (val loss of n-gram models): " + ", ".join(
        f"{label(k)} {v:.4f}" for k, v in shown + ([best] if best else []))


NO_VERDICT = ("one run per configuration supports no verdict: seeds alone move the loss by a few hundredths. "
              "For a verdict (each configuration at its own tuned LR, 5 evaluation seeds, Holm-corrected "
              "intervals): python experiments/exp2_norm_comparison.py --configs A.py,B.py --out out/mine")


@dataclass
class CompareOptions:
    """python compare.py's command line."""

    runs: list[str] = option(help="run directories (each an out_dir of train.py), runs <sweep>/runs/<name>, or "
                                  "sweep directories (all of their runs)", positional=True, metavar="RUN_DIR...")
    plot: Optional[str] = option(None, "also overlay the runs' loss curves in this image file (e.g. runs.png)")

    def problems(self) -> list[str]:
        from .plot import image_formats

        problems = [] if len(expand_runs(self.runs)) >= 2 else ["pass at least two run directories to compare"]
        return problems + (output_file_problems(self.plot, "--plot", image_formats()) if self.plot else [])


def main(argv: list[str]) -> int:
    args = parse_into(CompareOptions, argv, "python compare.py RUN_DIR RUN_DIR... [--plot FILE]",
                      "Put finished runs side by side: what differs between them, their losses, their cost.")
    runs = [read_run(path) for path in expand_runs(args.runs)]
    print(table(runs))
    floors = floors_line(runs)
    if floors:
        print(floors)
    if not differing_keys(runs):
        print("the runs have the same settings (only where they ran differs)")
    print(NO_VERDICT)
    if args.plot:
        from .plot import load_run, new_figure, plot_runs, save

        fig, ax = new_figure(figsize=(8, 5))
        plot_runs(ax, [load_run(r.path) for r in runs])
        print(f"wrote {save(fig, args.plot)}")
    return 0
