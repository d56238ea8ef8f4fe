"""Finished runs side by side: ``python compare.py RUN_DIR RUN_DIR... [--plot FILE]``.

One row per run: its status, the config keys that differ between the runs (and only those), its
size, its losses beside the data's n-gram floors, and its cost. One run per configuration is an
anecdote, not a result: the table says so, and names the experiment that draws a verdict (several
seeds, each configuration at its own tuned LR, corrected intervals: experiments/exp2_norm_comparison.py).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from typing import Optional

from .errors import BabyGPTError
from .config import TrainConfig, to_dict
from .files import output_file_problems
from .ngram import label, strongest
from .options import option, parse_into
from .rundir import RunDir, latest_config, read_record, read_summary
from .runstore import config_problem, expand_runs, metrics_problem, stored, summary_fields_problem

# Keys that say where or how a run ran, not what it is: never shown as a difference.
DEFAULTS = to_dict(TrainConfig())  # what a key a record lacks ran at
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
    sweep stored); a path that is not a run, or a damaged record (a field of the wrong type
    included: records are input like any other), is refused by name. A run with no summary yet is
    shown as such."""
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
    problem = record_problem(info, summary, rows)
    if problem:
        raise BabyGPTError(f"{os.path.join(path, problem[0])} is damaged ({problem[1]}); restore it, or leave that "
                           f"run out")
    speeds = [r["tokens_per_s"] for r in rows if _is_number(r.get("tokens_per_s"))]
    return RunRecord(path, latest_config(info), info.get("num_params"), summary,
                     statistics.median(speeds) if speeds else None)


def _is_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def record_problem(info: dict, summary: dict | None, rows: list[dict]) -> tuple[str, str] | None:
    """(file, what is wrong) for the first field of a run's records that is not of a kind a run
    writes (the checks a sweep's store makes of each of its lines), or None."""
    found = (("config.json", config_problem(info)),
             ("summary.json", summary_fields_problem(summary) if summary is not None else None),
             ("metrics.jsonl", metrics_problem(rows)))
    return next(((name, problem) for name, problem in found if problem), None)


def setting(run: RunRecord, key: str):
    """The run's value of ``key``; a key its record lacks was added since it ran: it ran at its default."""
    return run.config.get(key, DEFAULTS.get(key, "—"))


def differing_keys(runs: list[RunRecord]) -> list[str]:
    """The config keys whose values are not the same in every run, in config order."""
    keys = list(dict.fromkeys(k for r in runs for k in r.config))
    return [k for k in keys if k not in NOT_COMPARED and len({repr(setting(r, k)) for r in runs}) > 1]


def cell(value) -> str:
    """A table cell: a | or a line break in a path or a value would split the row."""
    return str(value).replace("|", "\\|").replace("\r", "\\r").replace("\n", "\\n")


def _loss(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "—"


def table(runs: list[RunRecord]) -> str:
    """The markdown table of ``runs``: status, differing keys, parameters, losses, cost."""
    keys = differing_keys(runs)
    header = ["run", "status", *keys, "params", "best val", "final val", "whole-split val", "train s", "tok/s"]
    rows = []
    for r in runs:
        s = r.summary or {}
        rows.append([cell(r.path), r.status, *(cell(setting(r, k)) for k in keys),
                     f"{r.num_params / 1e6:.2f}M" if r.num_params else "—",
                     _loss(s.get("best_val_loss")), _loss(s.get("final_val_loss")), _loss(s.get("val_loss_full")),
                     f"{s['wall_time_s']:.0f}" if isinstance(s.get("wall_time_s"), (int, float)) else "—",
                     f"{r.tokens_per_s / 1e3:.1f}k" if r.tokens_per_s else "—"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def floors_lines(runs: list[RunRecord]) -> list[str]:
    """The data's floors the runs recorded: the unigram (the collapse line) and the strongest n-gram;
    one line for each corpus (data_dir) the runs trained on, when they trained on more than one."""
    by_data: dict[str, dict] = {}
    for r in runs:
        refs = (r.summary or {}).get("references")
        if refs:
            by_data.setdefault(str(setting(r, "data_dir")), refs)
    lines = []
    for data_dir, refs in by_data.items():
        best = strongest(refs)
        shown = [("unigram", refs["unigram"])] if "unigram" in refs else []
        where = f" {cell(data_dir)}" if len(by_data) > 1 else ""
        lines.append(f"floors of the data{where} (val loss of n-gram models): " + ", ".join(
            f"{label(k)} {v:.4f}" for k, v in shown + ([best] if best else [])))
    return lines


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
        # (an empty --plot= is refused there, not read as no --plot)
        plot = output_file_problems(self.plot, "--plot", image_formats()) if self.plot is not None else []
        return problems + repeated_runs(self.runs) + plot


def repeated_runs(paths: list[str]) -> list[str]:
    """A problem for each run ``paths`` name more than once: one path twice (however spelled), or a
    run and its sweep's directory. Its row would be shown twice, as if it were two runs."""
    named: dict[str, str] = {}  # the run's real path -> the argument that named it first
    problems = []
    for given in paths:
        for run in expand_runs([given]):
            key = os.path.realpath(run)
            if key in named:
                problems.append(f"the run {run!r} is named twice ({named[key]!r}, then {given!r}); pass each "
                                f"run once")
            named.setdefault(key, given)
    return problems


def main(argv: list[str]) -> int:
    args = parse_into(CompareOptions, argv, "python compare.py RUN_DIR RUN_DIR... [--plot FILE]",
                      "Put finished runs side by side: what differs between them, their losses, their cost.")
    runs = [read_run(path) for path in expand_runs(args.runs)]
    if args.plot:  # refused before anything is printed or written, as babygpt.plot refuses it
        from .plot import drawable_problem, load_run

        empty = [drawable_problem(load_run(r.path), ("loss", "val_loss")) for r in runs]
        if any(empty):
            raise BabyGPTError(*[p for p in empty if p])
    print(table(runs))
    for line in floors_lines(runs):
        print(line)
    if not differing_keys(runs):
        print("the runs have the same settings (only where they ran differs)")
    print(NO_VERDICT)
    if args.plot:
        from .plot import load_run, new_figure, plot_runs, save

        fig, ax = new_figure(figsize=(8, 5))
        plot_runs(ax, [load_run(r.path) for r in runs])
        print(f"wrote {save(fig, args.plot)}")
    return 0
