"""Overlay the metrics of training runs: ``python -m babygpt.plot RUN_DIR... [--out FILE]``.

Draws the training loss (thin) and the eval val loss (markers) of each run against the
iteration; a run that diverged gets an ``x`` at its ``diverged_at`` iteration.

``python -m babygpt.plot RUN_DIR --diag [--at 100,500]`` draws the per-layer diagnostics of one
run trained with ``diag_interval`` > 0 (see babygpt/diagnostics.py): a layer-by-iteration heatmap
of each quantity, and its per-layer profile at chosen iterations.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Optional

from .errors import BabyGPTError
from .files import output_file_problems, write_atomic
from .ngram import kn_order, label, strongest
from .runstore import expand_runs, load_run
from .options import option, parse_into


def drawable_problem(run: dict, keys: tuple[str, ...]) -> str | None:
    """Why ``run`` gives nothing to draw (no row with a finite value of any of ``keys``), or None."""
    if any(isinstance(r.get(k), (int, float)) and math.isfinite(r[k]) for r in run["metrics"] for k in keys):
        return None
    if not run["metrics"]:
        metrics = os.path.join(run["dir"], "metrics.jsonl")
        if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:  # one unterminated line, dropped as cut short
            return (f"nothing to plot for '{run['dir']}': its metrics.jsonl holds no complete metrics row (its one "
                    f"line is not one: damaged, or cut short by a kill); repair or delete that line")
        return f"nothing to plot for '{run['dir']}': its metrics.jsonl has no rows; train it past its first log"
    return (f"nothing to plot for '{run['dir']}': its metrics.jsonl has no finite {' or '.join(keys)} (all "
            f"missing or NaN: the run diverged before its first finite value); leave it out")


def series(run: dict, key: str) -> tuple[list[int], list[float]]:
    """(iterations, values) of the rows that have a finite ``key``."""
    pts = [(r["iter"], r[key]) for r in run["metrics"] if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def diverged_at(run: dict) -> int | None:
    if run["summary"].get("status") == "diverged":
        return run["summary"].get("diverged_at")
    return next((r["diverged_at"] for r in run["metrics"] if r.get("diverged_at")), None)


# Line styles of the reference losses: the unigram (add-one), the Kneser-Ney 5-gram, the strongest
# Kneser-Ney order (STRONGEST_STYLE), and the add-one bigram and trigram of summaries written before
# the Kneser-Ney floors.
REFERENCE_STYLES = {"unigram": ":", "kn5": "--", "bigram": "--", "trigram": "-."}
STRONGEST_STYLE = "-."


def drawn_references(refs: dict) -> list[str]:
    """The keys of ``refs`` to draw: every key that is not a Kneser-Ney order (the unigram; the
    bigram and trigram of an old summary), and of the Kneser-Ney orders only the 5-gram and the
    strongest, so that the plot keeps three grey lines rather than nine."""
    best = strongest(refs)
    keep = {"kn5", best[0]} if best else set()
    return [key for key in refs if kn_order(key) is None or key in keep]


def reference_style(key: str) -> str:
    """The line style of a drawn reference loss (the one Kneser-Ney order drawn besides the 5-gram
    is the strongest)."""
    if key in REFERENCE_STYLES:
        return REFERENCE_STYLES[key]
    return STRONGEST_STYLE if kn_order(key) is not None else ":"


def reference_lines(ax, refs: dict | None, initial: float | None = None) -> None:
    """Grey horizontal lines at the data's n-gram reference losses (babygpt.ngram; see
    drawn_references) and, if given, the loss at initialisation; call before ``ax.legend()``."""
    refs = refs or {}
    for key in drawn_references(refs):
        ax.axhline(refs[key], color="grey", linestyle=reference_style(key), linewidth=1,
                   label=f"{label(key)} {refs[key]:.3f}")
    if initial is not None:
        ax.axhline(initial, color="black", linestyle=":", linewidth=1, label=f"initial {initial:.3f}")


def run_references(runs: list[dict]) -> dict | None:
    """The reference losses recorded in the runs' summary.json (the first run that has them)."""
    return next((r["summary"]["references"] for r in runs if isinstance(r["summary"].get("references"), dict)), None)


def plot_runs(ax, runs: list[dict], labels: list[str] | None = None, train_loss: bool = True) -> None:
    """Draw each run's loss curves on ``ax``, with an x where a run diverged, over the data's
    reference losses when the runs' summaries have them."""
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
    reference_lines(ax, run_references(runs))
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss (faint: train, each logged step; dots: val, each eval)" if train_loss else "val loss (dots: each eval)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def diag_series(run: dict) -> tuple[list[int], dict[str, list[list[float]]]]:
    """Iterations with diagnostics, and for each quantity one list of per-layer values per iteration."""
    from .diagnostics import KEYS

    rows = [r for r in run["metrics"] if r.get("resid_rms") is not None]
    if not rows:
        raise BabyGPTError(f"no diagnostics in '{run['dir']}'; train with --diag_interval=N (e.g. 10)")
    n_layer = len(rows[0]["resid_rms"])
    as_floats = lambda vs: [math.nan if v is None else v for v in (vs or [None] * n_layer)]  # noqa: E731
    # output_logz holds one value, not one per block; log Z may be negative, so it is drawn linear.
    return [r["iter"] for r in rows], {k: [as_floats(r.get(k)) for r in rows] for k in KEYS}


DIAG_COLUMNS = 3  # quantities side by side in the diagnostics figure


def plot_diagnostics(run: dict, at: list[int] | None = None):
    """Top: log10 heatmaps (layer x iteration); bottom: per-layer profiles at the ``at`` iterations
    (default: the first, middle and last measured). Returns the figure."""
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    from .diagnostics import KEYS, SHARES, SIGNED, SINGLE_VALUE

    iters, values = diag_series(run)
    if at:
        missing = [i for i in at if i not in iters]
        if missing:
            raise BabyGPTError(f"no diagnostics at iteration(s) {missing}; measured every "
                               f"{iters[1] - iters[0] if len(iters) > 1 else iters[0]} iterations, "
                               f"from {iters[0]} to {iters[-1]}")
    else:  # the first, middle and last iterations where every value is finite (a diverged run ends in NaN)
        present = [k for k in KEYS if any(math.isfinite(v) for vs in values[k] for v in vs)]
        ok = [i for n, i in enumerate(iters) if all(math.isfinite(v) for k in present for v in values[k][n])]
        at = sorted({ok[0], ok[len(ok) // 2], ok[-1]}) if ok else [iters[0]]
    titles = {"resid_rms": "residual stream RMS after block", "resid_max": "residual stream max |x| after block",
              "grad_norm": "gradient norm of block",
              "update_ratio": "update / weight ratio of block", "attn_logit_max": "max attention logit in block",
              "token_independence": "share of stream same at every position",
              "tanh_saturation": "share of DyT inputs saturated in block",
              "tanh_input_rms": "RMS of DyT's tanh input in block",
              "output_logz": "output log Z, mean over positions",
              "angular_distance": "angular distance, block input to output",
              "removal_loss_delta": "loss increase when the block is skipped"}
    # Only what this run has: no DyT, no tanh_saturation; runs from before a quantity existed lack it.
    keys = [k for k in KEYS if any(math.isfinite(v) for vs in values[k] for v in vs)]
    # A grid, DIAG_COLUMNS quantities wide: each quantity is a heatmap above its per-layer profile.
    cols = min(DIAG_COLUMNS, len(keys))
    rows = -(-len(keys) // cols)
    fig, axes = new_figure(2 * rows, cols, figsize=(5 * cols, 3.75 * 2 * rows), squeeze=False)
    for empty in range(len(keys), rows * cols):
        axes[2 * (empty // cols), empty % cols].axis("off")
        axes[2 * (empty // cols) + 1, empty % cols].axis("off")
    for n, key in enumerate(keys):
        top, col = 2 * (n // cols), n % cols
        data = np.array(values[key], dtype=float).T  # (L, n_iters), or (1, n_iters) for output_logz
        ax = axes[top, col]
        at_ = diverged_at(run)
        if at_ is not None:
            ax.axvline(at_, color="red", linestyle="--", linewidth=1)
        if key in SINGLE_VALUE:  # a curve over iterations, and no per-layer profile
            ax.plot(iters, data[0])
            ax.set(title=titles[key], xlabel="iteration", ylabel=key)
            ax.grid(alpha=0.3)
            axes[top + 1, col].axis("off")
            continue
        log = key not in SHARES + SIGNED  # shares (0 to 1, zero included) and signed values: linear scale
        finite = data[np.isfinite(data) & (data > 0 if log else True)]
        norm = (LogNorm if log else Normalize)(finite.min(), finite.max()) if finite.size else None
        mesh = ax.pcolormesh(iters, np.arange(data.shape[0]), np.where(data > 0, data, np.nan) if log else data,
                             norm=norm, shading="nearest", cmap="viridis")
        fig.colorbar(mesh, ax=ax)
        ax.set(title=titles[key], xlabel="iteration", ylabel="layer", yticks=range(data.shape[0]))
        ax = axes[top + 1, col]
        for i in at:
            ax.plot(np.arange(data.shape[0]), data[:, iters.index(i)], "o-", label=f"iter {i}")
        ax.set_yscale("log" if log else "linear")
        ax.set(xlabel="layer", ylabel=key, xticks=range(data.shape[0]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(os.path.basename(os.path.normpath(run["dir"])))
    return fig


def new_figure(*args, **kwargs):
    """A matplotlib figure on the non-interactive backend (works without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_log_x(fig, ax, refs: dict | None, path: str, labels: dict, initial: float | None = None,
               legend_size: int = 8) -> str:
    """Finish a loss plot whose x axis is logarithmic (an LR, minutes): the data's reference lines
    (and the initial loss), ``labels`` (xlabel, ylabel, title), a grid and the legend; then ``save``."""
    reference_lines(ax, refs, initial=initial)
    ax.set_xscale("log")
    ax.set(**labels)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    return save(fig, path)


def save(fig, path: str) -> str:
    """Write ``fig`` to ``path`` (its format from the extension) atomically: a failed write (a full
    disk) is an error naming ``path`` and leaves the earlier image whole."""
    import io

    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    image = io.BytesIO()
    extension = os.path.splitext(path)[1].lstrip(".").lower()
    fig.savefig(image, dpi=110, format=extension or None)
    plt.close(fig)
    write_atomic(path, image.getvalue())
    return path


@dataclass
class PlotOptions:
    """python -m babygpt.plot's command line."""

    runs: list[str] = option(help="run directories (each with metrics.jsonl), runs <sweep>/runs/<name>, or sweep "
                                  "directories (all of their runs)", positional=True, metavar="RUN_DIR...")
    out: str = option("runs.png", "image to write")
    no_train: bool = option(False, "only the eval val loss")
    diag: bool = option(False, "per-layer diagnostics of one run (diag_interval > 0)")
    at: Optional[str] = option(None, "with --diag: iterations for the per-layer profiles, e.g. 100,500")

    def problems(self) -> list[str]:
        return output_file_problems(self.out, "--out", image_formats())


def image_formats() -> tuple[str, ...]:
    """The file extensions matplotlib can write (png, pdf, svg, ...)."""
    from matplotlib.figure import Figure

    # pgf needs a LaTeX installation; the other formats need nothing beyond matplotlib.
    return tuple(sorted(set(Figure().canvas.get_supported_filetypes()) - {"pgf"}))


def main(argv: list[str]) -> int:
    args = parse_into(PlotOptions, argv, "python -m babygpt.plot RUN_DIR... [--out FILE] [--diag [--at 100,500]]",
                      "Overlay the loss curves of runs, or draw one run's per-layer diagnostics.")
    runs = [load_run(d) for d in expand_runs(args.runs)]
    if args.diag:
        if len(runs) != 1:
            raise BabyGPTError("--diag draws one run; pass a single run directory")
        try:
            at = [int(v) for v in args.at.split(",")] if args.at else None
        except ValueError:
            raise BabyGPTError(f"--at takes comma-separated iterations, got '{args.at}'") from None
        try:
            figure = plot_diagnostics(runs[0], at)
        except BabyGPTError:
            raise
        except (TypeError, ValueError, KeyError, IndexError) as e:
            raise BabyGPTError(f"the diagnostics rows in {args.runs[0]}/metrics.jsonl are damaged "
                               f"({type(e).__name__}); re-run with diag_interval > 0") from None
        print(f"wrote {save(figure, args.out)}")
        return 0
    if args.at:
        raise BabyGPTError("--at needs --diag")
    empty = [drawable_problem(run, ("val_loss",) if args.no_train else ("loss", "val_loss")) for run in runs]
    if any(empty):
        raise BabyGPTError(*[p for p in empty if p])
    fig, ax = new_figure(figsize=(8, 5))
    plot_runs(ax, runs, train_loss=not args.no_train)
    print(f"wrote {save(fig, args.out)}")
    return 0


if __name__ == "__main__":
    from .cli import run as run_cli

    sys.exit(run_cli(main, sys.argv[1:]))
