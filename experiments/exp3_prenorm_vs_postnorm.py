"""Experiment 3: stability maps of Pre-LN, Post-LN and DeepNorm over learning rate, warmup, depth and init.

Xiong et al. 2020 (arXiv:2002.04745) and Liu et al. 2020 (arXiv:2004.08249) report that Post-LN
needs learning-rate warmup, more so as depth grows, while Pre-LN trains without it; DeepNet (Wang
et al. 2022, arXiv:2203.00555) that DeepNorm makes Post-LN stable. Each cell of the map is one
configuration (placement, init, depth, warmup, learning rate) run with every seed; each run ends
finished, collapsed (no better than the unigram loss) or diverged. The learning rate is constant
after the linear warmup (min_lr = learning_rate), so warmup is the only schedule at work.

Tiers (the grid and budget of each; any of --lrs, --depths, --warmups, --inits, --seeds replaces
its part of the grid):
  quick    1 LR, depth 2, warmup 0 and 5, Xavier init, 1 seed, the tiny model: checks the pipeline.
  default  the slice that answers the warmup question in about 15 minutes: Xavier init (the
           papers' setting), LR 1e-3 ... 3e-2, warmup 0, 15 and 75 of 150 iterations, depth 6
           and 12, 2 seeds; width 64, context 32, batch 16.
  full     the rest: both inits, LR 3e-4 ... 3e-2, warmup 0, 50 and 250 of 500 iterations, depth 6
           and 12, 2 seeds; width 128, context 64, batch 16 (experiment 2's default-tier model).

    python experiments/exp3_prenorm_vs_postnorm.py [--quick | --full] [--jobs N] [--lrs 1e-3,3e-3]
        [--depths 6,12] [--warmups 0,15,75] [--inits gpt2,xavier] [--seeds 2]
        [--placements pre,post,deepnorm] [--norm_type layernorm] [--out DIR]

A row of the map (init, placement, depth, warmup) whose largest stable LR sits at an edge of the
grid has not been measured, only bounded: the grid of that row is extended a half-decade at a time
(at most MAX_EXTENSIONS a side) above a top LR that is still stable, and below when no LR is, until
the answer lies inside what was tried; a row still at an edge then says so.

Writes results.csv (one row per run), stability_map.png and report.md (the largest stable LR per
init, placement, depth and warmup, and the whole map).
"""

import os
from dataclasses import dataclass
from typing import Optional

import _common

from babygpt.verdicts import run_loss
from babygpt.model import INITS
from babygpt.options import option
from babygpt.plot import new_figure, save
from babygpt.sweep import Run
from babygpt.tuning import HALF_DECADE, MAX_EXTENSIONS, snap_half_decade

GRIDS = {
    "quick": {"lrs": "1e-2", "depths": "2", "warmups": "0,5", "inits": "xavier", "seeds": 1},
    "default": {"lrs": "1e-3,3e-3,1e-2,3e-2", "depths": "6,12", "warmups": "0,15,75", "inits": "xavier",
                "seeds": 2},
    "full": {"lrs": "3e-4,1e-3,3e-3,1e-2,3e-2", "depths": "6,12", "warmups": "0,50,250", "inits": "gpt2,xavier",
             "seeds": 2},
}
# Per-run budgets on top of the tier's (_common.TIERS); n_layer, warmup_iters and the LR come from the grid.
BUDGETS = {
    "quick": {},
    "default": {"n_embd": 64, "n_head": 4, "block_size": 32, "batch_size": 16, "max_iters": 150,
                "eval_interval": 50, "eval_iters": 5, "log_interval": 10, "dropout": 0.0},
    "full": dict(_common.DEFAULT_BUDGET),
}
OUTCOME_CODE = {"finished": None, "collapsed": "C", "skipped_out": "S", "diverged": "D"}  # a finished run shows its loss
EXTENSIONS = {"quick": 0, "default": MAX_EXTENSIONS, "full": MAX_EXTENSIONS}


@dataclass
class Exp3Options(_common.TrainingOptions):
    lrs: Optional[str] = option(None, "comma-separated learning rates (none: the tier's grid)", metavar="LR,...")
    depths: Optional[str] = option(None, "comma-separated n_layer values (none: the tier's)", metavar="N,...")
    warmups: Optional[str] = option(None, "comma-separated warmup_iters values (none: the tier's)",
                                     metavar="N,...")
    inits: Optional[str] = option(None, "comma-separated inits among " + ",".join(INITS) + " (none: the tier's)",
                                   metavar="INIT,...")
    seeds: Optional[int] = option(None, "seeds per cell, 0..N-1 (none: the tier's)")
    placements: str = _common.placements_option("pre,post,deepnorm")
    norm_type: str = option("layernorm", "the norm of every run")

    def problems(self) -> list[str]:
        problems = super().problems() + _common.placement_problems(self.placements)
        for name, kind, least, what in (("lrs", float, 0.0, "positive numbers"), ("depths", int, 1, "positive integers"),
                                        ("warmups", int, 0, "integers >= 0")):
            text = getattr(self, name)
            if text is not None and not _parses(text, kind, least):
                problems.append(f"--{name} takes comma-separated {what}, got {text!r}")
        bad = [i for i in (self.inits or "").split(",") if self.inits and i not in INITS]
        if bad:
            problems.append(_common.unknown_choice("init", bad[0], INITS))
        if self.seeds is not None and self.seeds < 1:
            problems.append(f"--seeds must be at least 1, got {self.seeds}")
        return problems


def _parses(text: str, kind, least) -> bool:
    """Every comma-separated value of ``text`` reads as ``kind`` and is at least ``least`` (above it for floats)."""
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        return False
    return all(v > least if kind is float else v >= least for v in values)


@dataclass
class Grid:
    """The map's axes, read from the options over the tier's defaults."""

    inits: list[str]
    placements: list[str]
    depths: list[int]
    warmups: list[int]
    lrs: list[float]
    seeds: list[int]

    @classmethod
    def of(cls, args) -> "Grid":
        default = GRIDS[_common.tier(args)]
        pick = lambda name: getattr(args, name) if getattr(args, name) is not None else default[name]  # noqa: E731
        return cls(pick("inits").split(","), args.placements.split(","),
                   [int(d) for d in pick("depths").split(",")], [int(w) for w in pick("warmups").split(",")],
                   sorted(float(lr) for lr in pick("lrs").split(",")), list(range(pick("seeds"))))

    def rows(self):
        """(init, placement, depth, warmup): the map's rows, in the order of the tables."""
        for init in self.inits:
            for placement in self.placements:
                for depth in self.depths:
                    for warmup in self.warmups:
                        yield init, placement, depth, warmup

    def cells(self):
        """(init, placement, depth, warmup, lr) for every cell of the grid before any extension."""
        for row in self.rows():
            for lr in self.lrs:
                yield (*row, lr)


def cell_runs(grid: Grid, norm_type: str, cells=None) -> dict[tuple, list[Run]]:
    """One Run per seed for every cell (the grid's, unless ``cells``); constant LR after warmup
    (min_lr = learning_rate)."""
    return {cell: [Run({"init": cell[0], "norm_placement": cell[1], "n_layer": cell[2], "warmup_iters": cell[3],
                        "learning_rate": cell[4], "min_lr": cell[4], "norm_type": norm_type}, seed,
                       label=f"{cell[1]}, {cell[0]}, {cell[2]} layers, warmup {cell[3]}, lr {cell[4]:g}")
                   for seed in grid.seeds]
            for cell in (grid.cells() if cells is None else cells)}


def trained(row: dict) -> bool:
    return row["status"] == "finished"


def row_lrs(runs: dict, row: tuple) -> list[float]:
    """The LRs tried in one row of the map, ascending."""
    return sorted(cell[4] for cell in runs if cell[:4] == row)


def stable_lrs(runs: dict, rows: dict, row: tuple) -> list[float]:
    """The LRs of ``row`` at which every seed trained (finished, neither collapsed nor diverged)."""
    return [lr for lr in row_lrs(runs, row) if all(trained(rows[r.name]) for r in runs[(*row, lr)])]


def largest_stable_lr(runs: dict, rows: dict, row: tuple) -> Optional[float]:
    """The largest LR tried in ``row`` at which every seed trained; None if there is none."""
    stable = stable_lrs(runs, rows, row)
    return max(stable) if stable else None


def edge(runs: dict, rows: dict, row: tuple) -> Optional[str]:
    """Where the row's answer is censored: "low" if no LR tried is stable, "high" if the largest LR
    tried is; None when the largest stable LR lies inside the row's LRs."""
    stable, lrs = stable_lrs(runs, rows, row), row_lrs(runs, row)
    if not stable:
        return "low"
    return "high" if max(stable) == lrs[-1] else None


def extensions(grid: Grid, runs: dict, rows: dict, steps: dict, limit: int) -> list[tuple]:
    """The next cells of the rows whose answer sits at an edge: a half-decade beyond it (``steps``
    counts each row's extensions per side and is updated)."""
    cells = []
    for row in grid.rows():
        side = edge(runs, rows, row)
        if side is None or steps.setdefault((row, side), 0) >= limit:
            continue
        steps[(row, side)] += 1
        lrs = row_lrs(runs, row)
        lr = snap_half_decade(lrs[-1] * HALF_DECADE) if side == "high" else snap_half_decade(lrs[0] / HALF_DECADE)
        cells.append((*row, lr))
    return cells


def stable_cell(runs: dict, rows: dict, row: tuple) -> str:
    """The stable-LR table's cell: the largest stable LR, or the bound a censored row gives."""
    lrs, top, side = row_lrs(runs, row), largest_stable_lr(runs, rows, row), edge(runs, rows, row)
    if side == "low":
        return f"none (< {lrs[0]:g}, grid edge)"
    if side == "high":
        return f">= {top:g} (grid edge)"
    return f"{top:g}"


def cell_text(cell_rows: list[dict]) -> str:
    """Each seed's outcome: its whole-split loss if it trained, C if it collapsed, S if it was
    skipped_out (no finite result), D if it diverged."""
    return " / ".join(OUTCOME_CODE[r["status"]] or f"{run_loss(r):.2f}" for r in cell_rows)


def stable_lr_table(grid: Grid, runs: dict, rows: dict) -> str:
    body = []
    for init in grid.inits:
        for placement in grid.placements:
            for depth in grid.depths:
                body.append([init, placement, depth, *(stable_cell(runs, rows, (init, placement, depth, w))
                                                       for w in grid.warmups)])
    return _common.markdown_table(["init", "placement", "n_layer", *(f"warmup {w}" for w in grid.warmups)], body)


def all_lrs(runs: dict) -> list[float]:
    return sorted({cell[4] for cell in runs})


def map_table(grid: Grid, runs: dict, rows: dict) -> str:
    lrs = all_lrs(runs)
    body = [[*row, *(cell_text([rows[r.name] for r in runs[(*row, lr)]]) if (*row, lr) in runs else ""
                     for lr in lrs)] for row in grid.rows()]
    return _common.markdown_table(["init", "placement", "n_layer", "warmup", *(f"lr {lr:g}" for lr in lrs)], body)


def plot_map(grid: Grid, runs: dict, rows: dict, path: str) -> None:
    """One panel per (init, placement) and depth: warmup (rows) x LR (columns), coloured by the share
    of seeds that trained (green all, red none), each cell labelled with its outcomes."""
    import numpy as np

    lrs = all_lrs(runs)
    panels = [(i, p) for i in grid.inits for p in grid.placements]
    fig, axes = new_figure(len(panels), len(grid.depths), squeeze=False,
                           figsize=(1.1 * len(lrs) * len(grid.depths) + 1.5, 0.5 * len(grid.warmups) * len(panels) + 1.2 * len(panels)))
    for row_axes, (init, placement) in zip(axes, panels):
        for ax, depth in zip(row_axes, grid.depths):
            cells = [[[rows[r.name] for r in runs.get((init, placement, depth, w, lr), [])] for lr in lrs]
                     for w in grid.warmups]
            share = np.array([[sum(map(trained, c)) / len(c) if c else np.nan for c in line] for line in cells])
            ax.imshow(share, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")  # an untried cell (nan) stays blank
            for y, line in enumerate(cells):
                for x, c in enumerate(line):
                    ax.text(x, y, cell_text(c) if c else "", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
            ax.set_yticks(range(len(grid.warmups)), [str(w) for w in grid.warmups])
            ax.set(xlabel="learning rate", ylabel="warmup iterations", title=f"{placement}, {init} init, {depth} layers")
    save(fig, path)


def train_extending(grid: Grid, runs: dict, sweep_of, args) -> tuple[dict, dict]:
    """Train the grid, then extension rounds until no row's answer is at an edge it may still move
    past (a shard waits for every round); returns every cell's runs and every run's results row."""
    steps: dict = {}
    every = lambda: [r for seeds in runs.values() for r in seeds]  # noqa: E731
    rows = _common.finished_rows(sweep_of(every()), last=False)
    while True:
        new = extensions(grid, runs, rows, steps, EXTENSIONS[_common.tier(args)])
        if not new:
            return runs, _common.finished_rows(sweep_of(every()))
        runs = {**runs, **cell_runs(grid, args.norm_type, new)}
        rows = _common.finished_rows(sweep_of(every()), last=False)


def main(argv):
    exp = _common.begin(Exp3Options, argv, "exp3_prenorm_vs_postnorm", __doc__)
    args, tier = exp.args, exp.tier

    def sweep_of(rs):  # an extension round's runs set the keys the first round's set: the same base args
        return exp.sweep(rs, BUDGETS[tier])

    grid = Grid.of(args)
    runs = cell_runs(grid, args.norm_type)
    exp.claim(sweep_of([r for seeds in runs.values() for r in seeds]))
    runs, rows = train_extending(grid, runs, sweep_of, args)
    plot_map(grid, runs, rows, os.path.join(exp.out, "stability_map.png"))

    body = (f"{exp.budget_line(BUDGETS[tier], leave_out=('n_layer', 'warmup_iters'))}; n_layer, warmup_iters, "
            f"init and learning_rate as listed, constant after warmup (min_lr = learning_rate); norm_type "
            f"{args.norm_type}; seeds {', '.join(map(str, grid.seeds))}. "
            f"{_common.training_time(rows.values())}.\n\n"
            + _common.table_section("Largest stable learning rate", "The largest LR tried at which every seed "
                                    "finished without collapsing or diverging. A row whose answer was at an edge of "
                                    f"the grid {', '.join(f'{lr:g}' for lr in grid.lrs)} was extended a half-decade at "
                                    f"a time (at most {EXTENSIONS[tier]} a side); *grid edge* marks one "
                                    "still there.", "stable_lr",
                                    stable_lr_table(grid, runs, rows))
            + _common.table_section("The map", "Each seed's final loss over the whole validation split, or C "
                                    "(collapsed), S (skipped_out) or D (diverged); blank: not tried in that row.", "map",
                                    map_table(grid, runs, rows))
            + _common.references_section(_common.reference_losses(args.data_dir))
            + "\n\n![](stability_map.png)")
    exp.write_report("Stability maps: placement x LR x warmup x depth x init", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
