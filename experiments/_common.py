"""What the experiment scripts share: the command line, the run budgets, tables."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from babygpt.cli import OneLineParser, run  # noqa: E402

# Training budgets (model shape, context, batch, iterations) of the experiments. Default mode
# is sized so that each experiment stays within about 15 minutes on a 2-core CPU; quick mode
# only checks that everything runs.
DEFAULT_BUDGET = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 16,
                  "max_iters": 500, "eval_interval": 50, "eval_iters": 10, "log_interval": 10,
                  "warmup_iters": 50, "dropout": 0.0}
QUICK_BUDGET = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 8,
                "max_iters": 10, "eval_interval": 5, "eval_iters": 2, "log_interval": 5,
                "warmup_iters": 5, "dropout": 0.0}


def parser(name: str, description: str) -> argparse.ArgumentParser:
    p = OneLineParser(prog=f"experiments/{name}.py", description=description)
    p.add_argument("--quick", action="store_true", help="a tiny version that only checks the pipeline")
    p.add_argument("--out", default=None, help=f"output directory (default: results/{name})")
    p.add_argument("--debug", action="store_true", help="show a traceback on errors")
    return p


def training_parser(name: str, description: str) -> argparse.ArgumentParser:
    p = parser(name, description)
    p.add_argument("--data_dir", default="data/shakespeare_char", help="prepared data (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=1, help="training runs in parallel (default: 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a training key for every run, e.g. --set max_iters=1000")
    return p


def add_placements(p: argparse.ArgumentParser) -> None:
    p.add_argument("--placements", default="pre,post", help="norm placements to compare (default pre,post)")


def placements(args) -> list[str]:
    """The --placements list, checked against the model's before anything is written."""
    from babygpt.errors import BabyGPTError, unknown_choice
    from babygpt.model import PLACEMENTS

    chosen = args.placements.split(",")
    bad = [pl for pl in chosen if pl not in PLACEMENTS]
    if bad:
        raise BabyGPTError(unknown_choice("placement", bad[0], PLACEMENTS))
    return chosen


def out_dir(args, name: str) -> str:
    path = args.out or os.path.join("results", name)
    os.makedirs(path, exist_ok=True)
    return path


def budget_args(args, extra: dict | None = None) -> list[str]:
    budget = dict(QUICK_BUDGET if args.quick else DEFAULT_BUDGET)
    budget.update(extra or {})
    return [f"--{k}={v}" for k, v in budget.items()] + [f"--data_dir={args.data_dir}"] + \
        [f"--{s}" for s in args.set]


def finished_rows(sweep) -> dict:
    """Run the sweep; its rows by run name. Runs that crashed or were refused (not finished, not
    diverged) stop the experiment with a pointer to their logs."""
    from babygpt.errors import BabyGPTError
    from babygpt.sweep import DONE

    rows = sweep.run()
    failed = [r["name"] for r in rows if r["status"] not in DONE]
    if failed:
        raise BabyGPTError(f"{len(failed)} of {len(rows)} runs failed (first: {failed[0]}); "
                           f"see {os.path.join(sweep.root, 'logs', failed[0] + '.log')}")
    return {r["name"]: r for r in rows}


def mean_std(values: list[float]) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(path: str, title: str, command: str, body: str, started: float) -> None:
    import platform

    import torch

    text = (f"# {title}\n\nCommand: `{command}`\n\n"
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
            f"wall time {time.time() - started:.0f} s\n\n{body}\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


def command_line() -> str:
    return " ".join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def main(fn) -> None:
    sys.exit(run(fn, sys.argv[1:]))
