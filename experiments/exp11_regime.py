"""Experiment 11: the regime's frontier. How much compute does a character transformer need to beat
a count-based model of the same text?

Every verdict of experiment 2 comes from runs that an interpolated Kneser-Ney n-gram model beats.
This experiment maps where the Pre-LN RMSNorm baseline (config/prenorm_rms.py, GPT-2 init) ends up
as the run grows along the four axes a CPU user can turn: model size (width), context, dropout and
steps. Each point is one configuration trained on seed 0 at a coarsely tuned LR: the half-decade
grid of the point, extended a half-decade while the best LR sits at an edge (babygpt.tuning, no
quarter-decade refinement). Everything a point does not set is train.py's default (batch 32, warmup
100, cosine decay to lr/10, float32).

For each point the report gives the loss over the whole validation split at the best LR, the train
loss and the train/val gap of the last evaluation, the parameters, the tokens seen and the training
minutes; the plot puts the val loss against the minutes with the n-gram floors drawn. The answer:
the cheapest point below its floor, the strongest n-gram model scored on the point's own targets
with the context its run had (a point of context 128 against 128-character windows), or, if none
is, how far the closest point is and where a straight line through the cheapest-so-far points (loss
against log minutes) would cross that floor.

Minutes are wall-clock seconds of training (evaluations included) over 60, on the CPU and thread
count each run's summary.json records ("machine"); a campaign fixes the thread count (--jobs 2 on a
2-core machine: one thread per run).

Tiers: --quick checks the pipeline (two tiny points); the default runs the two cheapest points of
the frontier (about 15 minutes with --jobs 2 on a 2-core CPU); --full the whole frontier, a campaign
of several CPU hours (shard it with --shard K/N, continue it with the same command).

    python experiments/exp11_regime.py [--quick | --full] [--jobs N] [--out DIR]

Writes results.csv, frontier.png and report.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import _common

from babygpt.verdicts import run_loss
from babygpt.config import FIELDS
from babygpt.ngram import label, strongest
from babygpt.plot import new_figure, save_log_x
from babygpt.sweep import Run
from babygpt.tuning import ranked, search_all
from _common import config_path, lr_overrides

NAME = "exp11_regime"
BASELINE = "prenorm_rms"
SEED = 0
MAX_EXTENSIONS = 2  # half-decade steps past an edge of a point's grid: a coarse search
SMALL_LRS = (3e-3, 1e-2)  # the grid of the 128-wide points (experiment 2's tuned LRs lie between)
WIDE_LRS = (1e-3, 3e-3)  # wider models train at lower LRs
MAX_LOG10_MINUTES = 9  # a trend that meets the floor later than 10^9 minutes per run is reported as never


@dataclass(frozen=True)
class Point:
    """One configuration of the frontier: what it changes from train.py's defaults, and its LR grid."""

    label: str
    overrides: tuple  # ((key, value), ...)
    lrs: tuple

    def runs(self, lrs) -> dict:
        return {lr: Run({**dict(self.overrides), **lr_overrides(lr)}, SEED, config_path(BASELINE), self.label)
                for lr in lrs}


def point(label: str, lrs=SMALL_LRS, **overrides) -> Point:
    return Point(label, tuple(overrides.items()), tuple(lrs))


# Ordered by cost, cheapest first: a campaign cut short has the cheap end of the frontier complete.
FRONTIER = (
    point("4x128, ctx 64, 1,200 it", max_iters=1200),
    point("4x128, ctx 64, 2,400 it (train.py's default shape)"),
    point("4x128, ctx 64, 4,800 it", max_iters=4800),
    point("4x128, ctx 64, 4,800 it, dropout 0.1", max_iters=4800, dropout=0.1),
    point("4x128, ctx 128, 2,400 it", block_size=128),
    point("4x256, ctx 64, 2,400 it", WIDE_LRS, n_embd=256),
    point("4x256, ctx 64, 4,800 it, dropout 0.2", WIDE_LRS, n_embd=256, max_iters=4800, dropout=0.2),
    # The plan's last point was 4x256, ctx 128, 4,800 it, dropout 0.2 (about 2 CPU hours a run). Dropped
    # once the two points before it showed that dropout does not pay at these budgets and that
    # context 128 and 4,800 iterations are each the best use of a doubling: this point combines the two.
    point("4x128, ctx 128, 4,800 it", block_size=128, max_iters=4800),
)
QUICK = (point("2x32, 10 it", (3e-3, 3e-2), max_iters=10, eval_interval=5),
         point("2x32, 20 it", (3e-3, 3e-2), max_iters=20, eval_interval=10))
POINTS = {"quick": QUICK, "default": FRONTIER[:2], "full": FRONTIER}
EXTENSIONS = {"quick": 0, "default": MAX_EXTENSIONS, "full": MAX_EXTENSIONS}


@dataclass
class Exp11Options(_common.TrainingOptions):
    """The frontier's options: those of every training experiment (its points are fixed per tier)."""


def tokens(p: Point, budget: dict) -> int:
    """Training tokens a run of ``p`` sees: iterations x batch x context."""
    get = lambda k: dict(p.overrides).get(k, budget.get(k, FIELDS[k].default))  # noqa: E731
    return get("max_iters") * get("batch_size") * get("block_size") * get("gradient_accumulation_steps")


def base_budget(tier: str) -> dict:
    """What every run of the tier trains with beyond its point's keys: the quick tier's tiny model,
    otherwise train.py's own defaults (not the experiments' shorter default-tier budget)."""
    return {} if tier == "quick" else {k: FIELDS[k].default for k in _common.DEFAULT_BUDGET}


def search(exp, points) -> tuple[dict, dict]:
    """Every point's coarse LR search: ({label: {lr: loss}}, {run name: results row})."""
    by_label = {p.label: p for p in points}
    extra = base_budget(exp.tier)
    trained = [r for p in points for r in p.runs(p.lrs).values()]
    exp.claim(exp.sweep(trained, extra))  # checked and claimed once, before anything trains

    def train_round(wanted: dict) -> dict:
        trained.extend(r for name, lrs in wanted.items() for r in by_label[name].runs(lrs).values()
                       if r not in trained)
        rows = _common.finished_rows(exp.sweep(trained, extra), last=False)
        return {name: {lr: [run_loss(rows[run.name])] for lr, run in p.runs(list(p.lrs) + extra_lrs(trained, p)).items()
                       if run.name in rows} for name, p in by_label.items()}

    searched = search_all({p.label: list(p.lrs) for p in points}, train_round, EXTENSIONS[exp.tier], refine=False)
    rows = _common.finished_rows(exp.sweep(trained, extra))  # the last sweep: a shard stops here until --collect
    return {name: m for name, (_, m) in searched.items()}, rows


def extra_lrs(trained: list, p: Point) -> list:
    """The LRs the search added to point ``p`` beyond its grid (its runs carry its label)."""
    return sorted({r.overrides["learning_rate"] for r in trained if r.label == p.label} - set(p.lrs))


def frontier_rows(points, means: dict, rows: dict, budget: dict) -> list[dict]:
    """One row per point, at its best LR (None where every LR diverged)."""
    out = []
    for p in points:
        order = ranked(means[p.label])
        best = order[0] if order else None
        row = rows[p.runs([best])[best].name] if best is not None else None
        out.append({"point": p, "lr": best, "row": row, "tokens": tokens(p, budget),
                    "censored": best is not None and best in (min(means[p.label]), max(means[p.label]))})
    return out


def minutes(row: dict) -> float:
    return (row["wall_time_s"] or 0.0) / 60


def pareto(points: list[dict]) -> list[dict]:
    """The points no cheaper point beats: the frontier proper, cheapest first."""
    done = sorted((p for p in points if p["row"] is not None and math.isfinite(run_loss(p["row"]))),
                  key=lambda p: minutes(p["row"]))
    front, low = [], math.inf
    for p in done:
        if run_loss(p["row"]) < low:
            front.append(p)
            low = run_loss(p["row"])
    return front


def trend(front: list[dict], floor: float) -> tuple[float, float, float | None] | None:
    """Least squares of loss = a + b log10(minutes) over the frontier, and the minutes where that line
    meets ``floor`` (None if it does not fall); None with fewer than two points."""
    if len(front) < 2:
        return None
    xs = [math.log10(max(minutes(p["row"]), 1e-6)) for p in front]
    ys = [run_loss(p["row"]) for p in front]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    if b >= 0:
        return a, b, None
    exponent = (floor - a) / b
    return a, b, 10 ** exponent if exponent <= MAX_LOG10_MINUTES else math.inf


def point_floors(points: list[dict], data_dir: str) -> None:
    """Give each finished point its "floor": (key, nats) of the strongest n-gram model scored on the
    targets the point's loss was scored on, with the context its run had (_common.matched_floors:
    a point with context 128 is read against the floor of 128-character windows, one with 64
    against 64's). One number for every point would credit the longer contexts with the n-gram's
    advantage over a window's first targets."""
    for p in points:
        matched = _common.matched_floors(data_dir, [p["row"]]) if p["row"] is not None else None
        p["floor"] = strongest(matched.refs) if matched else None


def below_floor(p: dict) -> bool:
    return p.get("floor") is not None and run_loss(p["row"]) < p["floor"][1]


def crossing(points: list[dict]) -> dict | None:
    """The cheapest frontier point whose loss is below its own floor (None if none is)."""
    return next((p for p in pareto(points) if below_floor(p)), None)


def answer(points: list[dict]) -> str:
    """Where the frontier first passes its floor, or how far it stays above it. One seed a point, its
    LR the best of a few on the same split the loss is read on: an observation, not an estimate."""
    caveat = (" One seed, its LR the best on the same validation split: the number is biased low and "
              "carries a seed's spread (a few thousandths at this budget).")
    p = crossing(points)
    if p is not None:
        key, floor = p["floor"]
        return (f"The cheapest point below its floor ({label(key)} scored as the run, {floor:.4f}) is "
                f"**{p['point'].label}** at lr {p['lr']:g}: {run_loss(p['row']):.4f} after "
                f"{minutes(p['row']):.1f} training minutes, {run_loss(p['row']) - floor:+.4f} from it." + caveat)
    front = [p for p in pareto(points) if p.get("floor")]
    if not front:
        return "No point has finished yet."
    best = min(front, key=lambda p: run_loss(p["row"]) - p["floor"][1])
    key, floor = best["floor"]
    text = (f"No point finished so far is below its floor. The closest, **{best['point'].label}** at lr "
            f"{best['lr']:g}, ends at {run_loss(best['row']):.4f}, {run_loss(best['row']) - floor:+.4f} nats from "
            f"its floor ({label(key)} scored as the run, {floor:.4f}), after {minutes(best['row']):.1f} minutes.")
    fit = trend(front, floor)
    if fit is None:
        return text + caveat
    a, b, cross = fit
    where = ("does not fall, so it predicts no crossing" if cross is None else
             f"falls too slowly to meet that floor within 10^{MAX_LOG10_MINUTES} minutes per run"
             if math.isinf(cross) else f"would meet that floor at about {cross:.0f} minutes per run")
    return (text + f" A straight line through the {len(front)} cheapest-so-far points, loss = {a:.3f} "
            f"{b:+.3f} log10(minutes), {where}; loss curves flatten, so read this as a lower bound on the "
            f"cost." + caveat)


def frontier_table(points: list[dict], means: dict) -> str:
    body = []
    for p in points:
        tried = ", ".join(f"{lr:g}: {m:.3f}" if math.isfinite(m) else f"{lr:g}: diverged"
                          for lr, m in sorted(means[p["point"].label].items()))
        row = p["row"]
        if row is None:
            body.append([p["point"].label, "—", f"{p['tokens'] / 1e6:.1f}M", tried, "none", "—", "—", "—", "—", "—",
                         "—"])
            continue
        gap = (row["final_val_loss"] - row["final_train_loss"]
               if row["final_val_loss"] is not None and row["final_train_loss"] is not None else None)
        body.append([p["point"].label, f"{row['num_params'] / 1e6:.2f}M" if row["num_params"] else "—",
                     f"{p['tokens'] / 1e6:.1f}M", tried,
                     f"{p['lr']:g}" + (" (edge)" if p["censored"] else ""),
                     f"{run_loss(row):.4f}",
                     f"{run_loss(row) - p['floor'][1]:+.4f} ({p['floor'][1]:.4f})" if p.get("floor") else "—",
                     f"{row['final_train_loss']:.4f}" if row["final_train_loss"] else "—",
                     f"{gap:+.3f}" if gap is not None else "—", f"{minutes(row):.1f}", row["status"]])
    return _common.markdown_table(["point", "parameters", "tokens", "val loss by LR (whole split)", "best LR",
                                   "val loss, whole split", "− its floor, scored as the run (the floor)", "train loss (last eval)", "val − train (last eval)",
                                   "training minutes", "status"], body)


def plot(points: list[dict], refs: dict, path: str) -> None:
    fig, ax = new_figure(figsize=(9, 6))
    done = [p for p in points if p["row"] is not None]
    for i, p in enumerate(done):
        x, val = minutes(p["row"]), run_loss(p["row"])
        ax.plot([x], [val], "o", color=f"C{i % 10}", label=p["point"].label)
        if p["row"]["final_train_loss"] is not None:  # the gap: a line down to the train loss
            ax.plot([x, x], [val, p["row"]["final_train_loss"]], "-", color=f"C{i % 10}", alpha=0.5)
            ax.plot([x], [p["row"]["final_train_loss"]], "_", color=f"C{i % 10}", markersize=12)
    front = pareto(points)
    ax.plot([minutes(p["row"]) for p in front], [run_loss(p["row"]) for p in front], "k--", linewidth=1,
            label="frontier (no cheaper point is better)")
    # Every run ends far below the unigram loss: its line would squash the frontier into a sliver.
    near = {k: v for k, v in refs.items() if k != "unigram"}
    save_log_x(fig, ax, near, path, dict(
        xlabel="training minutes per run (1 thread)", ylabel="val loss, whole split (o); train loss (—)",
        title="Pre-LN RMSNorm over size, context, dropout and steps, each at its best LR"), legend_size=7)


def main(argv):
    exp = _common.begin(Exp11Options, argv, NAME, __doc__)
    points = POINTS[exp.tier]
    means, rows = search(exp, points)
    budget = exp.budget(base_budget(exp.tier))
    table = frontier_rows(points, means, rows, budget)
    refs = _common.reference_losses(exp.args.data_dir)
    point_floors(table, exp.args.data_dir)
    plot(table, refs, os.path.join(exp.out, "frontier.png"))
    body = (f"{exp.budget_line(base_budget(exp.tier), leave_out=('max_iters', 'learning_rate', 'min_lr'))}, each point's own keys "
            f"as its label says; seed {SEED}; LR searched coarsely from each point's half-decade grid (at most "
            f"{EXTENSIONS[exp.tier]} half-decade steps past an edge; *edge*: the best LR is still at one). "
            f"Losses in nats; one run per LR, so a difference of a few hundredths between points is within "
            f"seed noise. {_common.training_time(rows.values())}.\n\n"
            + _common.table_section("Frontier", answer(table), "frontier", frontier_table(table, means))
            + _common.references_section(refs) + "\n\n![](frontier.png)")
    exp.write_report("The regime's frontier: what a character transformer needs to beat the n-gram floors", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
