"""Overlay the metrics of training runs: ``python -m babygpt.plot RUN_DIR... [--out FILE]``.

Draws the training loss (thin) and the eval val loss (markers) of each run against the
iteration; a run that diverged gets an ``x`` at its ``diverged_at`` iteration.
"""

from __future__ import annotations

import json
import os
import sys

from .errors import BabyGPTError


def load_run(run_dir: str) -> dict:
    """metrics rows, summary (or {}) and the config.json of a run directory."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise BabyGPTError(f"no metrics.jsonl in '{run_dir}'; pass the out_dir of a training run")
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a row cut short by a kill
    run = {"dir": run_dir, "metrics": rows, "summary": {}, "info": {}}
    for key, name in (("summary", "summary.json"), ("info", "config.json")):
        try:
            with open(os.path.join(run_dir, name), encoding="utf-8") as f:
                run[key] = json.load(f)
        except (OSError, ValueError):
            pass
    return run


def series(run: dict, key: str) -> tuple[list[int], list[float]]:
    """(iterations, values) of the rows that have a finite ``key``."""
    pts = [(r["iter"], r[key]) for r in run["metrics"] if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def diverged_at(run: dict) -> int | None:
    if run["summary"].get("status") == "diverged":
        return run["summary"].get("diverged_at")
    return next((r["diverged_at"] for r in run["metrics"] if r.get("diverged_at")), None)


def plot_runs(ax, runs: list[dict], labels: list[str] | None = None, train_loss: bool = True) -> None:
    """Draw each run's loss curves on ``ax``, with an x where a run diverged."""
    for i, run in enumerate(runs):
        label = labels[i] if labels else os.path.basename(os.path.normpath(run["dir"]))
        color = f"C{i % 10}"
        if train_loss:
            x, y = series(run, "loss")
            ax.plot(x, y, color=color, alpha=0.3, linewidth=0.8)
        x, y = series(run, "val_loss")
        ax.plot(x, y, "o-", color=color, markersize=3, label=label)
        at = diverged_at(run)
        if at is not None:
            last = y[-1] if y else (series(run, "loss")[1] or [0])[-1]
            ax.plot([at], [last], "x", color=color, markersize=12, markeredgewidth=2.5)
            ax.annotate(f"diverged @ {at}", (at, last), textcoords="offset points", xytext=(4, 6),
                        color=color, fontsize=8)
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss (line: train, dots: val)" if train_loss else "val loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def new_figure(*args, **kwargs):
    """A matplotlib figure on the non-interactive backend (works without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    from .cli import OneLineParser

    p = OneLineParser(prog="python -m babygpt.plot", description="Overlay the loss curves of runs.")
    p.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", default="runs.png", help="image to write (default: runs.png)")
    p.add_argument("--no_train", action="store_true", help="only the eval val loss")
    p.add_argument("--debug", action="store_true", help="show a traceback on errors")
    args = p.parse_args(argv)
    runs = [load_run(d) for d in args.runs]
    fig, ax = new_figure(figsize=(8, 5))
    plot_runs(ax, runs, train_loss=not args.no_train)
    print(f"wrote {save(fig, args.out)}")
    return 0


if __name__ == "__main__":
    from .cli import run

    sys.exit(run(main, sys.argv[1:]))
