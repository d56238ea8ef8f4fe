"""Experiment 16: where a verdict's noise comes from, and what removes it.

A comparison of two configurations (docs/experiments.md, "How configurations are compared") is
noisy for two reasons besides the seed itself. The tuned LR is the best grid point of two tuning
seeds, so it moves with those seeds; and a run's last weights carry the noise of its last steps.
This experiment trains each configuration at every LR of a grid on the same seeds, with an
exponential moving average of the weights kept beside them (ema_decay, babygpt/averaging.py), and
measures on those same runs:

* **End-of-run noise.** At each configuration's LR (the best grid point on the mean over all seeds'
  tune loss), the seed-to-seed SD of the test loss of the last weights and of their average, and
  the SD of the last periodic validation estimate against the mean of the last --last_evals of
  them; and the paired SD (a configuration minus the baseline, seed by seed), with and without the
  average. The interval of a ratio of SDs is a bootstrap over seeds (fixed generator seed).
* **LR choice.** For every set of --tuning_seeds seeds (2 and 3 by default), each rule picks an LR
  from those seeds' tune losses: the best grid point, or the minimum of a parabola in log10(LR)
  fitted to the best point and up to two neighbours a side, moved to the nearest grid point. The
  other seeds (never used to pick) score the choice: its regret, their mean test loss at the chosen
  LR minus their mean at their own best LR, and the spread of that mean over the tuning sets.

    python experiments/exp16_noise.py [--quick] [--jobs N] [--configs A.py,B.py] [--lrs ...]
        [--seeds 8] [--ema_decay 0.98] [--out DIR]

Writes results.csv, noise.csv, lr_choice.csv and report.md. Every figure comes from the seeds
named in the report; with a handful of seeds an SD is itself uncertain (the intervals say how much).
"""

import itertools
import math
import os
import random
import statistics
from dataclasses import dataclass
from typing import Optional

import _common

from babygpt.files import write_csv
from babygpt.options import Range, option, range_problems
from babygpt.plot import load_run
from babygpt.sweep import Run
from babygpt.verdicts import reported_loss, tuning_loss
from _common import EXP2_BUDGET, config_path, floats, lr_list_problems, lr_overrides

NAME = "exp16_noise"
CONFIGS = "prenorm_rms,prenorm_ln"  # the baseline first; the pair the full tier's sequential stage decides
GRID = {"quick": "3e-3,1e-2", "default": "0.001,0.0017,0.003,0.0055,0.01,0.017"}
SEEDS = {"quick": 3, "default": 8}
SIZES = {"quick": "1,2", "default": "2,3"}  # tuning-set sizes: the protocol's 2, and 3
# Periodic evaluations every 25 iterations (16 in a default run), so that the last few span the
# last fifth of the run.
BUDGET = {"quick": {}, "default": {**EXP2_BUDGET, "eval_interval": 25}}
BOOTSTRAP = 2000  # resamples of the seeds for an SD ratio's interval
NEIGHBOURS = 2  # grid points a side of the best one that the parabola is fitted to


@dataclass
class Exp16Options(_common.TrainingOptions):
    configs: Optional[str] = option(None, f"config files, the baseline first (none: config/ "
                                          f"{CONFIGS.replace(',', '.py, config/')}.py)", metavar="CONFIG,...")
    lrs: Optional[str] = option(None, f"LR grid (none: {GRID['default']}; quick {GRID['quick']})", metavar="LR,...")
    seeds: Optional[int] = option(None, f"seeds 0..N-1 of every configuration at every LR (none: "
                                        f"{SEEDS['default']}; quick {SEEDS['quick']})")
    ema_decay: float = option(0.98, "the average's decay (about 1 / (1 - decay) steps remembered)",
                              valid=Range(0, 1, low_open=True, high_open=True))
    last_evals: int = option(4, "periodic evaluations averaged at the end of a run")
    tuning_seeds: Optional[str] = option(None, f"sizes of the tuning sets the LR rules are tried with (none: "
                                               f"{SIZES['default']}; quick {SIZES['quick']})", metavar="N,...")

    def problems(self) -> list[str]:
        problems = super().problems() + range_problems(self)
        if self.full:
            problems.append("--full is not a tier of this experiment (its grid of LRs x seeds is sized for the "
                            "default tier); drop --full")
        if self.lrs is not None:
            problems += lr_list_problems(self.lrs)
        configs = (self.configs or "x,y").split(",")
        if len(configs) < 2:
            problems.append(f"--configs needs a baseline and at least one configuration, got {self.configs!r}")
        problems += _common.repeated_entries("--configs", configs)
        paths = self.configs.split(",") if self.configs else [config_path(n) for n in CONFIGS.split(",")]
        problems += _common.muon_tie_problems([c for c in paths if os.path.isfile(c)], self.set)
        tier = "quick" if self.quick else "default"
        seeds, sizes = self.seeds or SEEDS[tier], self.tuning_seeds or SIZES[tier]
        if self.seeds is not None and self.seeds < 3:
            problems.append(f"--seeds must be at least 3 (tuning seeds and others to score them), got {self.seeds}")
        if self.last_evals < 1:
            problems.append(f"--last_evals must be at least 1, got {self.last_evals}")
        try:
            if any(not 1 <= int(n) < seeds for n in sizes.split(",")):
                problems.append(f"--tuning_seeds takes sizes from 1 to one less than the number of seeds ({seeds}), "
                                f"got {sizes!r}")
        except ValueError:
            problems.append(f"--tuning_seeds takes comma-separated integers, got {sizes!r}")
        return problems


def parabola_lr(by_lr: dict[float, float]) -> float:
    """The grid LR nearest (in log10) the minimum of a parabola in log10(LR) through the best grid
    point of ``by_lr`` (LR -> mean loss) and up to NEIGHBOURS finite points a side; the best point
    itself where fewer than three points are finite or the parabola opens downwards."""
    lrs = sorted(by_lr)
    best = min(lrs, key=lambda lr: by_lr[lr])
    i = lrs.index(best)
    near = [lr for lr in lrs[max(0, i - NEIGHBOURS):i + NEIGHBOURS + 1] if math.isfinite(by_lr[lr])]
    if len(near) < 3:
        return best
    a, b, _ = quadratic_fit([math.log10(lr) for lr in near], [by_lr[lr] for lr in near])
    if a <= 0:
        return best
    x = min(max(-b / (2 * a), math.log10(lrs[0])), math.log10(lrs[-1]))
    return min(lrs, key=lambda lr: abs(math.log10(lr) - x))


def quadratic_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(a, b, c) of the least-squares y = a x^2 + b x + c, from the normal equations (3 x 3)."""
    s = [sum(x ** k for x in xs) for k in range(5)]
    t = [sum(y * x ** k for x, y in zip(xs, ys)) for k in range(3)]
    m = [[s[4], s[3], s[2], t[2]], [s[3], s[2], s[1], t[1]], [s[2], s[1], s[0], t[0]]]
    for col in range(3):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [u - f * v for u, v in zip(m[r], m[col])]
    return tuple(m[r][3] / m[r][r] for r in range(3))


RULES = {"best grid point": lambda by_lr: min(by_lr, key=by_lr.get), "parabola in log LR": parabola_lr}


def mean_at(table: dict, lr: float, seeds) -> float:
    return statistics.fmean(table[(lr, s)] for s in seeds)


def lr_choice(tune: dict, test: dict, lrs: list[float], seeds: list[int], size: int) -> dict:
    """For each rule: over every set of ``size`` tuning seeds, the LR it picks from their tune losses,
    scored on the other seeds' test losses. ``tune``/``test``: (lr, seed) -> loss."""
    out = {}
    overall = min(lrs, key=lambda lr: mean_at(tune, lr, seeds))
    for rule, pick in RULES.items():
        regrets, means, hits = [], [], 0
        for chosen_seeds in itertools.combinations(seeds, size):
            others = [s for s in seeds if s not in chosen_seeds]
            lr = pick({lr: mean_at(tune, lr, chosen_seeds) for lr in lrs})
            held = {x: mean_at(test, x, others) for x in lrs}
            regrets.append(held[lr] - min(held.values()))
            means.append(held[lr])
            hits += lr == overall
        out[rule] = {"sets": len(regrets), "mean_regret": statistics.fmean(regrets), "max_regret": max(regrets),
                     "sd_of_mean": statistics.stdev(means) if len(means) > 1 else 0.0,
                     "share_overall_best": hits / len(regrets)}
    return out


def sd_ratio_interval(a: list[float], b: list[float], rng: random.Random) -> tuple[float, float]:
    """The 2.5% and 97.5% points of SD(b) / SD(a) over bootstrap resamples of the seeds (paired:
    both lists are indexed by seed), resamples with no spread in ``a`` left out."""
    n, ratios = len(a), []
    for _ in range(BOOTSTRAP):
        idx = [rng.randrange(n) for _ in range(n)]
        sa = statistics.pstdev([a[i] for i in idx])
        if sa > 0:
            ratios.append(statistics.pstdev([b[i] for i in idx]) / sa)
    ratios.sort()
    return ratios[int(0.025 * len(ratios))], ratios[min(len(ratios) - 1, int(0.975 * len(ratios)))]


def estimators(run: dict, last_evals: int) -> dict:
    """One run's four estimates of its final loss."""
    vals = [r["val_loss"] for r in run["metrics"] if r.get("val_loss") is not None]
    return {"test, weights": reported_loss(run["summary"]),
            "test, average": run["summary"].get("test_loss_ema", math.nan),
            "last periodic val": vals[-1] if vals else math.nan,
            f"mean of last {last_evals} periodic vals": statistics.fmean(vals[-last_evals:]) if vals else math.nan}


def fmt(v, spec=".4f") -> str:
    return "—" if v is None or not math.isfinite(v) else format(v, spec)


def noise_tables(est: dict, names: list[str], best: dict, seeds: list[int], label: dict) -> tuple[list, list]:
    """(noise.csv's rows, the report's rows) of the end-of-run noise at each configuration's ``best``
    LR; ``est``: (config, lr, seed) -> the run's estimators."""
    kinds = list(est[next(iter(est))])
    rng = random.Random(0)
    rows, body = [], []
    for c in names:
        series = {k: [est[(c, best[c], s)][k] for s in seeds] for k in kinds}
        sds = {k: statistics.stdev(v) for k, v in series.items()}
        low, high = sd_ratio_interval(series[kinds[0]], series[kinds[1]], rng)
        paired = {}
        if c != names[0]:
            for k in kinds[:2]:
                paired[k] = statistics.stdev([est[(c, best[c], s)][k] - est[(names[0], best[names[0]], s)][k]
                                              for s in seeds])
        rows += [{"config": label[c], "lr": best[c], "estimate": k, "seeds": len(seeds),
                  "mean": statistics.fmean(series[k]), "sd": sds[k], "paired_sd": paired.get(k)} for k in kinds]
        body.append([label[c], f"{best[c]:g}", fmt(sds[kinds[0]]), fmt(sds[kinds[1]]),
                     f"{sds[kinds[1]] / sds[kinds[0]]:.2f} ({low:.2f}–{high:.2f})" if sds[kinds[0]] else "—",
                     fmt(statistics.fmean(series[kinds[1]]) - statistics.fmean(series[kinds[0]]), "+.4f"),
                     fmt(sds[kinds[2]]), fmt(sds[kinds[3]]),
                     " / ".join(fmt(paired[k]) for k in kinds[:2]) if paired else "(baseline)"])
    return rows, body


def choice_tables(tune: dict, test: dict, names: list[str], lrs: list[float], seeds: list[int], sizes: list[int],
                  label: dict) -> tuple[list, list]:
    """(lr_choice.csv's rows, the report's rows): each rule at each tuning-set size, per configuration."""
    rows, body = [], []
    for c in names:
        tune_c = {(lr, s): tune[(c, lr, s)] for lr in lrs for s in seeds}
        test_c = {(lr, s): test[(c, lr, s)] for lr in lrs for s in seeds}
        for size in sizes:
            for rule, r in lr_choice(tune_c, test_c, lrs, seeds, size).items():
                rows.append({"config": label[c], "tuning_seeds": size, "rule": rule, **r})
                body.append([label[c], size, rule, r["sets"], fmt(r["mean_regret"]), fmt(r["max_regret"]),
                             fmt(r["sd_of_mean"]), f"{r['share_overall_best']:.0%}"])
    return rows, body


def main(argv):
    exp = _common.begin(Exp16Options, argv, NAME, __doc__)
    args, tier = exp.args, exp.tier
    names = (args.configs or ",".join(config_path(n) for n in CONFIGS.split(","))).split(",")
    lrs = floats(args.lrs or GRID[tier])
    seeds = list(range(args.seeds or SEEDS[tier]))
    sizes = [int(v) for v in (args.tuning_seeds or SIZES[tier]).split(",")]
    muon = {c: _common.trains_with_muon(c, args.set) for c in names}  # as experiment 2 tunes them
    runs = {(c, lr, s): Run({**lr_overrides(lr, muon[c]), "ema_decay": args.ema_decay}, s, c)
            for c in names for lr in lrs for s in seeds}
    sweep, rows = exp.train(list(runs.values()), BUDGET[tier])
    est = {key: estimators(load_run(sweep.out_dir(run)), args.last_evals) for key, run in runs.items()}
    tune = {key: tuning_loss(rows[run.name]) for key, run in runs.items()}
    test = {key: reported_loss(rows[run.name]) for key, run in runs.items()}
    label = {c: os.path.splitext(os.path.basename(c))[0] for c in names}
    best = {c: min(lrs, key=lambda lr: statistics.fmean(tune[(c, lr, s)] for s in seeds)) for c in names}
    noise_rows, noise_body = noise_tables(est, names, best, seeds, label)
    write_csv(os.path.join(exp.out, "noise.csv"), list(noise_rows[0]), noise_rows)
    choice_rows, choice_body = choice_tables(tune, test, names, lrs, seeds, sizes, label)
    write_csv(os.path.join(exp.out, "lr_choice.csv"), list(choice_rows[0]), choice_rows)

    refs = _common.reference_losses(args.data_dir)
    seed_text = f"seeds {seeds[0]}–{seeds[-1]}"
    body = (f"{exp.budget_line(BUDGET[tier])}; configurations {', '.join(label.values())} (the first is the "
            f"baseline), each at every LR of {', '.join(f'{lr:g}' for lr in lrs)} (min_lr = lr/10) on {seed_text}; "
            f"weights averaged with ema_decay {args.ema_decay:g}. {_common.training_time(rows.values())}.\n\n"
            + _common.table_section(
                "End-of-run noise",
                f"At each configuration's LR (the best grid point on the mean tune loss over {seed_text}): the SD "
                f"over seeds of the test loss of the last weights and of their average, their ratio (95% bootstrap "
                f"interval over seeds), the average's mean minus the weights'; the SD of the last periodic "
                f"validation estimate ({exp.budget(BUDGET[tier])['eval_iters']} batches) and of the mean of "
                f"the last {args.last_evals}; and the paired SD against the baseline, weights / average.", "noise",
                _common.markdown_table(["configuration", "LR", "SD test, weights", "SD test, average",
                                        "ratio (95% interval)", "average − weights", "SD last periodic val",
                                        f"SD mean of last {args.last_evals}", "paired SD vs baseline"], noise_body))
            + _common.table_section(
                "LR choice",
                "For every set of tuning seeds of the size shown, the LR each rule picks from their tune losses, "
                "scored on the other seeds' test losses: the regret (their mean at the chosen LR minus their mean "
                "at their best LR; mean and largest over the sets), the SD over the sets of their mean at the "
                f"chosen LR (the noise the choice adds), and how often the choice is the LR best on all of {seed_text}.",
                "lr_choice",
                _common.markdown_table(["configuration", "tuning seeds", "rule", "sets", "mean regret",
                                        "largest regret", "SD of the scored mean", "picks the all-seed best"],
                                       choice_body))
            + _common.references_section(refs))
    exp.write_report("Where a verdict's noise comes from", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
