"""Experiment 2: the norm configurations head to head, each at its own tuned learning rate, over seeds.

The protocol of docs/experiments.md, the same for every configuration:
  1. Tune on seeds 0..T-1 (T >= 2 tuning seeds): the half-decade LR grid (3e-4 ... 3e-2), extended
     by half-decade steps while the best LR is at an edge, then refined to the quarter-decade
     points beside the best (babygpt.tuning). The tuned LR has the lowest *mean* final loss over
     the tuning seeds; the runner-up is kept too. The LR sensitivity (Wortsman et al. 2023,
     arXiv:2309.14322) is the mean over the half-decade grid of min(mean loss(lr), initial loss)
     minus the best mean on it.
  2. Evaluate on seeds T..T+E-1, disjoint from the tuning seeds (whose losses were picked as the
     lowest and are biased low), at each configuration's tuned LR. A seed fixes the init and the
     data order, so seed s of two configurations is a pair. Each configuration gets its paired
     difference to the baseline, and the table's verdicts are drawn together (babygpt.verdicts):
     better / worse after Holm-Bonferroni, equivalent within ±m by two one-sided tests (m: 0.01
     nats, stated before the runs, unless --margin), otherwise inconclusive with the number of
     pairs that would decide it. A run that diverged counts at the data's unigram loss.
  3. Robustness: the baseline also runs the evaluation seeds at its second-best LR (with
     --runner_up all, every configuration does), and every verdict is drawn again against that,
     and with the configuration at its own; "robust" says whether it stays the same ("not run"
     where those runs were not trained). Each better/worse verdict is drawn again with each
     evaluation seed left out in turn ("leave-one-seed-out").
With --looks (e.g. 5,10,15,20,25,30) step 2 is group-sequential (babygpt.sequential): the evaluation
seeds come in rounds, each comparison is looked at after every round and stops once it is better,
worse or equivalent within ±m; the next round trains the next seeds of the comparisons still open
(and the baseline's), up to the last look. O'Brien-Fleming alpha spending keeps the table's error
rate over the looks, Holm over the comparisons; the report gives each comparison's look-by-look
path and the pairs it used. The robustness runs (step 3) are the first look's seeds. After each look,
progress.md gives where the stage stands (the verdicts so far and the pairs each would still need),
long before report.md exists.
"Loss" is the final evaluation of the validation split's test part (test_loss), and LRs are tuned on
its other part (tune_loss); runs from before that split was recorded are tuned and reported on the
whole split (val_loss_full), as the report says (babygpt.verdicts.loss_split). min_lr is always lr / 10,
so the schedule keeps its shape across the grid. A configuration trained by Muon (optimizer muon in its
file or --set) tunes one LR for both of its groups, muon_lr = learning_rate, as Liu et al. 2025
(arXiv:2502.16982, section 2.2) and their code do (_common.muon_tie_problems); that needs
muon_adjust_lr match_rms_adamw (the default). --set optimizer=muon trains every configuration's block
by Muon; nGPT refuses it.

Tiers: --quick checks the pipeline (tiny model, 2 LRs, no extension); the default uses
_common.DEFAULT_BUDGET with 400 iterations; --full uses train.py's own budget (2,400 iterations)
and tunes there too, as docs/experiments.md asks (a verdict at a budget needs LRs tuned at that budget): each
configuration's search starts from the three half-decade points around the LR the default tier
tuned for it (--tuned_from, one or more default-tier outputs), and is extended and refined as in
the default tier; then the same five evaluation seeds. --beyond is the beyond-n-gram tier: the
same protocol as --full at the regime frontier's point below the strongest n-gram floor
(_common.BEYOND_BUDGET: context 128, 4,800 iterations), its search starting around the LRs of
--tuned_from (a default- or full-tier output). It is sized for a GPU: on a machine with one,
--jobs 8 runs eight at once on it; on CPU a run takes over half an hour at one thread.

    python experiments/exp2_norm_comparison.py [--quick | --full | --beyond] [--configs A.py,B.py] [--baseline NAME]
        [--tune_seeds T] [--seeds E] [--margin M] [--runner_up baseline|all] [--jobs N] [--out DIR]

Writes results.csv (one row per run), tuned_lrs.json, norm_comparison.png, lr_sensitivity.png
(not in --full) and report.md.
"""

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Literal, Optional

import _common
from _common import (EXP2_BUDGET, TUNED_FILE, config_path, floats, initial_loss, lr_list_problems,  # noqa: F401
                     lr_overrides, read_record, read_tuned)

from babygpt.verdicts import ALPHA, EQUIVALENCE_MARGIN, MIN_PAIRS_FOR_VERDICT, compare_table, count_cell, \
    floor_interval, leave_one_seed_out, loss_split, mean_interval, outcome_counts, pairs_of, reported_loss, \
    SPLIT_PARTS, difference_interval, part_differences, split_sentence, tuning_loss, verdict_loss
from babygpt.errors import BabyGPTError
from babygpt.files import write_atomic
from babygpt.ngram import label, strongest
from babygpt.options import option
from babygpt.plot import load_run, new_figure, reference_lines, save, save_log_x
from babygpt.rundir import write_json
from babygpt.sequential import nominal_levels, sequential_verdicts
from babygpt.stats import PairedTest, clopper_pearson, lr_sensitivity, pairs_for_difference, pairs_for_equivalence
from babygpt.sweep import Run, Sweep
from babygpt.tuning import HALF_DECADE, MAX_EXTENSIONS, ranked, search_all, snap_half_decade

NAME = "exp2_norm_comparison"
CORE = ("prenorm_rms", "prenorm_ln", "postnorm_ln", "prenorm_none")
GRID = {"quick": "3e-3,3e-2", "default": "3e-4,1e-3,3e-3,1e-2,3e-2"}
TUNE_SEEDS = {"quick": 2, "default": 2, "full": 2, "beyond": 2}
SEEDS = {"quick": 2, "default": 5, "full": 5, "beyond": 5}
EXTENSIONS = {"quick": 0, "default": MAX_EXTENSIONS, "full": MAX_EXTENSIONS, "beyond": MAX_EXTENSIONS}
CENTRED = ("full", "beyond")  # the tiers whose search starts around another tier's tuned LRs


def config_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def centered_grid(lr: float) -> list[float]:
    """The three half-decade points (..., 1e-3, 3e-3, 1e-2, ...) around ``lr``: where the full and
    beyond tiers' searches start for a configuration an earlier tier tuned to ``lr``."""
    centre = snap_half_decade(lr)
    return sorted({snap_half_decade(centre / HALF_DECADE), centre, snap_half_decade(centre * HALF_DECADE)})


@dataclass
class Exp2Options(_common.TrainingOptions):
    configs: Optional[str] = option(None, "comma-separated config files to compare (none: " + ", ".join(CORE) + ")",
                                    metavar="FILE.py,...")
    baseline: Optional[str] = option(None, "the configuration the others are paired with (none: the first)")
    tune_seeds: Optional[int] = option(None, "seeds the LR is tuned on, 0..T-1 (none: 2)")
    seeds: Optional[int] = option(None, "evaluation seeds at the tuned LR, numbered after the tuning seeds "
                                        "(none: 5; quick 2)")
    lrs: Optional[str] = option(None, "the LR grid the search starts from (none: 3e-4,1e-3,3e-3,1e-2,3e-2; "
                                      "quick 3e-3,3e-2)", metavar="LR,...")
    margin: Optional[float] = option(None, "the equivalence margin m in nats, stated before the runs (none: "
                                           f"{EQUIVALENCE_MARGIN:g}, a difference that would matter at this scale)")
    runner_up: Literal["baseline", "all"] = option("baseline", "whose evaluation seeds also run at their runner-up "
                                                               "LR: the baseline's, or every configuration's")
    beyond: bool = option(False, "the beyond-n-gram tier: --full's protocol at the regime frontier's point "
                                 "below the n-gram floors (context 128, 4,800 iterations; writes to "
                                 "results/beyond/)")
    tuned_from: Optional[str] = option(None, "--full, --beyond: earlier tiers' outputs (comma-separated; the first "
                                             "that tuned a configuration counts), around whose tuned LRs the "
                                             f"search starts (none: results/{NAME})", metavar="DIR,...")
    looks: Optional[str] = option(None, "group-sequential evaluation: comma-separated, increasing numbers of seed "
                                        "pairs at which the verdicts are looked at, e.g. 5,10,15,20,25,30; each "
                                        "comparison gets seeds a round at a time until it is decided or the last "
                                        "look (none: one look at --seeds)", metavar="N,...")

    def look_list(self) -> list[int]:
        return [int(n) for n in self.looks.split(",")] if self.looks else []

    def config_files(self) -> list[str]:
        return self.configs.split(",") if self.configs else [config_path(n) for n in CORE]

    def problems(self) -> list[str]:
        problems = super().problems() + (lr_list_problems(self.lrs) if self.lrs is not None else [])
        if self.beyond and (self.quick or self.full):
            problems.append("--beyond is a tier of its own; pass one of --quick, --full and --beyond")
        names = [config_name(c) for c in self.config_files()]
        problems += [f"config file '{c}' not found; --configs takes existing files, e.g. config/prenorm_ln.py"
                     for c in self.config_files() if not os.path.isfile(c)]
        if len(set(names)) < len(names):
            problems.append(f"--configs names a configuration twice ({', '.join(names)}); each needs its own file name")
        if self.baseline is not None and self.baseline not in names:
            problems.append(f"--baseline {self.baseline!r} is not among the configurations ({', '.join(names)}); "
                            f"add its config file to --configs")
        if self.seeds is not None and self.seeds < 2:
            problems.append(f"--seeds must be at least 2 (a confidence interval needs two runs), got {self.seeds}")
        if self.tune_seeds is not None and self.tune_seeds < 2:
            problems.append(f"--tune_seeds must be at least 2 (one seed's LR can be overturned by the next), "
                            f"got {self.tune_seeds}")
        if self.runner_up == "all" and len(names) < 2:  # (Plan.runner_up_runs: every side is the baseline)
            problems.append("--runner_up all also trains the configurations besides the baseline at their runner-up "
                            f"LR, but --configs names only {names[0]}, the baseline; drop --runner_up, or add "
                            f"configurations to --configs")
        if self.margin is not None and not (self.margin > 0 and math.isfinite(self.margin)):
            problems.append(f"--margin takes a positive number of nats, got {self.margin}")
        existing = [c for c in self.config_files() if os.path.isfile(c)]
        return problems + self.looks_problems(names) + self.tuned_from_problems() + \
            _common.muon_tie_problems(existing, self.set)

    def tuned_from_problems(self) -> list[str]:
        """--tuned_from is read where a search starts around earlier LRs: --full or --beyond without --lrs."""
        if self.tuned_from is None:
            return []
        if not (self.full or self.beyond):
            return ["--tuned_from is read by --full and --beyond only (this tier searches its own grid); drop it"]
        if self.lrs is not None:
            return ["--tuned_from and --lrs both say where the LR search starts; pass one"]
        return [f"--tuned_from names '{p}', which is not a directory; give the output directory of an earlier tier"
                for p in self.tuned_from.split(",") if not os.path.isdir(p)]

    def looks_problems(self, names: list[str]) -> list[str]:
        if self.looks is None:
            return []
        try:
            looks = self.look_list()
        except ValueError:
            return [f"--looks takes comma-separated whole numbers of seed pairs, e.g. 5,10,15, got {self.looks!r}"]
        problems = []
        if not looks or looks[0] < MIN_PAIRS_FOR_VERDICT or any(b <= a for a, b in zip(looks, looks[1:])):
            problems.append(f"--looks must increase and start at {MIN_PAIRS_FOR_VERDICT} pairs or more (a verdict "
                            f"needs that many), got {self.looks}")
        if self.seeds is not None:
            problems.append("--seeds and --looks both set how many evaluation seeds run; pass one (with --looks, "
                            "the last look is the most)")
        if len(names) < 2:
            problems.append("--looks needs at least two configurations: it decides comparisons with the baseline")
        return problems


@dataclass
class Plan:
    """What an invocation trains: configurations by name, the LR grid each one's search starts
    from, the seeds."""

    tier: str
    out: str
    configs: dict  # name -> config file
    baseline: str
    grids: dict  # name -> the LRs its search starts from
    tune_seeds: list
    seeds: list
    args: object = None  # the command line, for how the sweeps are spread (jobs, shards, GPUs)
    base_args: list = field(default_factory=list)
    tuning_runs: list = field(default_factory=list)  # every tuning run asked for so far, in order
    looks: list = field(default_factory=list)  # --looks: the pairs at each look ([]: one look at every seed)
    muon: frozenset = frozenset()  # the configurations trained by optimizer muon: their LR moves muon_lr too

    def run(self, name: str, lr: float, seed: int) -> Run:
        """Configuration ``name``'s run at grid point ``lr`` (_common.lr_overrides) and ``seed``."""
        return Run(lr_overrides(lr, name in self.muon), seed, self.configs[name])

    def tuning(self, wanted: dict) -> dict:
        """{name: {lr: [the runs of each tuning seed]}} for the LRs ``wanted`` ({name: [lrs]})."""
        return {name: {lr: [self.run(name, lr, s) for s in self.tune_seeds] for lr in lrs}
                for name, lrs in wanted.items()}

    def seed_runs(self, lrs: dict, counts: dict | None = None) -> dict:
        """{name: the runs of the evaluation seeds at lrs[name]} (none where there is no LR): the first
        counts[name] seeds where ``counts`` is given, else all of them."""
        seeds = {name: self.seeds[:counts[name]] if counts else self.seeds for name in self.configs}
        return {name: [self.run(name, lrs[name], s) for s in seeds[name]] if lrs.get(name) else []
                for name in self.configs}

    def runner_up_runs(self, second: dict) -> dict:
        """{name: the evaluation seeds' runs at its runner-up LR second[name]} for the sides
        --runner_up asks for: the baseline alone (the default, as sweeps made before the option
        were), or every configuration ([] where it has no runner-up LR)."""
        sides = list(self.configs) if getattr(self.args, "runner_up", "baseline") == "all" else [self.baseline]
        first = dict.fromkeys(self.configs, self.looks[0]) if self.looks else None  # --looks: the first look's
        runs = self.seed_runs({name: second.get(name) for name in sides}, first)
        return {name: runs[name] for name in sides}

    def sweep(self, runs: list) -> Sweep:
        return _common.sweep(self.out, runs, self.base_args, self.args)


@dataclass
class Outcome:
    """What the training left: the search's mean losses, the tuned and runner-up LRs, the evaluation
    runs (at the tuned LRs, and at the runner-up LRs of the sides --runner_up names: {name: runs})
    and every run's results row."""

    means: dict  # name -> {lr: mean loss over the tuning seeds}
    tuned: dict  # name -> LR or None
    second: dict  # name -> LR or None
    censored: dict  # name -> True where the best LR stayed at an edge of the search
    seed_runs: dict
    robustness_runs: dict
    rows: dict
    paths: dict | None = None  # --looks: {name: [sequential.Look per look]}; None: one look


def main(argv):
    args = _common.parse(Exp2Options, argv, NAME, __doc__)
    started = time.time()
    tier = _common.tier(args)
    configs = {config_name(c): c for c in args.config_files()}
    n_tune = args.tune_seeds or TUNE_SEEDS[tier]
    tuned_from = args.tuned_from or os.path.join("results", NAME)
    looks = args.look_list()
    plan = Plan(tier, _common.output_path(args, NAME), configs, args.baseline or next(iter(configs)),
                start_grids(args, tier, configs, tuned_from), list(range(n_tune)),
                list(range(n_tune, n_tune + (looks[-1] if looks else args.seeds or SEEDS[tier]))), args, looks=looks,
                muon=_common.muon_configurations(configs, args.set))
    outcome = train(args, plan)
    write_results(args, plan, outcome, tuned_from, started)
    return 0


def start_grids(args, tier: str, configs: dict, tuned_from: str) -> dict:
    """{name: the LRs its search starts from}: --lrs or the tier's grid; in --full and --beyond
    without --lrs, the three half-decade points around the LR --tuned_from tuned for it (all of them
    diverged there: the default grid)."""
    if args.lrs or tier not in CENTRED:
        return {name: sorted(floats(args.lrs or GRID[tier])) for name in configs}
    tuned = read_record(tuned_from.split(","), configs)["tuned"]
    return {name: centered_grid(tuned[name]) if tuned[name] else sorted(floats(GRID["default"])) for name in configs}


def train(args, plan: Plan) -> Outcome:
    """The LR search on the tuning seeds, then the evaluation seeds at each configuration's tuned LR
    and at the runner-up LRs --runner_up asks for (Plan.runner_up_runs)."""
    known = [r for by_lr in plan.tuning(plan.grids).values() for rs in by_lr.values() for r in rs]
    plan.base_args = _common.budget_args(args, EXP2_BUDGET if plan.tier == "default" else {}, known)
    _common.claim(plan.out, args, NAME, plan.sweep(known))
    searched = search_all(plan.grids, lambda wanted: train_round(plan, wanted), EXTENSIONS[plan.tier])
    means = {name: means for name, (_, means) in searched.items()}
    record = {"tuned": {n: (ranked(m) + [None])[0] for n, m in means.items()},
              "second": {n: (ranked(m) + [None, None])[1] for n, m in means.items()},
              "censored": {n: search.censored(means[n]) for n, (search, _) in searched.items()}}
    paths = None
    if plan.looks:
        seed_runs, paths = sequential_rounds(plan, record["tuned"], args.margin or EQUIVALENCE_MARGIN,
                                             _common.reference_losses(args.data_dir).get("unigram"),
                                             lambda rows: strongest_floor(args.data_dir, rows))
    else:
        seed_runs = plan.seed_runs(record["tuned"])
    robustness = plan.runner_up_runs(record["second"])
    rows = _common.finished_rows(plan.sweep(plan.tuning_runs + [r for rs in seed_runs.values() for r in rs]
                                            + [r for rs in robustness.values() for r in rs]))
    write_json(os.path.join(plan.out, TUNED_FILE),
               {"lrs": sorted({lr for grid in plan.grids.values() for lr in grid}), "grids": plan.grids,
                "tune_seeds": plan.tune_seeds, **record,
                "means": {n: {f"{lr:g}": m for lr, m in sorted(ms.items())} for n, ms in means.items()}})
    return Outcome(means, record["tuned"], record["second"], record.get("censored") or {}, seed_runs,
                   robustness, rows, paths)


def sequential_rounds(plan: Plan, tuned: dict, margin: float, unigram: float | None,
                      floor_of=lambda rows: None) -> tuple[dict, dict]:
    """--looks: the evaluation seeds a round at a time. Every configuration runs the first look's
    seeds; after each round the table is looked at (sequential.sequential_verdicts) and the next
    look's seeds run for the comparisons still open and the baseline. Returns ({name: its evaluation
    runs}, {name: its path of looks}). A shard waits for the others at each round, whose verdicts
    decide what the next one trains. Under --collect, which refuses a stage whose next look has runs
    missing, progress.md is written only once every look it needs is there: nothing on disk changes
    before that refusal."""
    base = plan.baseline
    counts = dict.fromkeys(plan.configs, plan.looks[0])
    collect = getattr(plan.args, "collect", False)
    while True:
        runs = plan.seed_runs(tuned, counts)
        rows = _common.finished_rows(plan.sweep(plan.tuning_runs + [r for rs in runs.values() for r in rs]),
                                     last=False)
        losses = verdict_losses(runs, rows, unigram)
        paths = sequential_verdicts({name: pairs_of(losses[name], losses[base]) for name in plan.configs
                                     if name != base}, plan.looks, margin)
        done = min((len(path) for path in paths.values()), default=len(plan.looks))
        still_open = [name for name, path in paths.items() if path and path[-1].verdict is None]
        progress = (plan, runs, rows, losses, paths, margin, bool(still_open) and done < len(plan.looks),
                    floor_of([rows[r.name] for rs in runs.values() for r in rs]))
        if not collect:
            write_progress(*progress)
        wanted = {**counts, **({name: plan.looks[done] for name in [*still_open, base]}
                               if still_open and done < len(plan.looks) else {})}
        if wanted == counts:  # decided, at the last look, or (pairs lost to a run without a loss) stuck
            if collect:
                write_progress(*progress)
            return runs, paths
        counts = wanted


PROGRESS_FILE = "progress.md"  # --looks: where the stage stands after its latest look


def strongest_floor(data_dir: str, rows) -> tuple[str, float, bool] | None:
    """The data's strongest n-gram floor (key, nats, whether scored as the runs): scored on the
    targets the runs of ``rows`` were scored on, with their context, or (before any run finished)
    the full-context floor, which the column's header then names (floor_column)."""
    matched = _common.matched_floors(data_dir, rows)
    return floor_from(matched, None if matched else _common.reference_losses(data_dir))


def floor_from(matched, refs: dict | None) -> tuple[str, float, bool] | None:
    """strongest_floor's answer from the matched floors (None: no run finished) or else ``refs``."""
    found = strongest(matched.refs if matched else refs)
    return (*found, matched is not None) if found else None


def floor_column(floor: tuple[str, float, bool] | None) -> list[str]:
    """The header of the column of each mean against ``floor`` (strongest_floor's), if there is one."""
    if not floor:
        return []
    key, nats, matched = floor
    return [f"mean − {label(key)} floor, {'scored as the runs' if matched else 'full context'} ({nats:.4f})"]


def write_progress(plan: Plan, runs: dict, rows: dict, losses: dict, paths: dict, margin: float,
                   continues: bool, floor: tuple[str, float, bool] | None = None) -> None:
    """progress.md after each look of a --looks stage: a campaign of many CPU hours is read, cited
    and stopped between looks, long before report.md exists (written once every comparison is
    decided or the last look is reached). ``runs``: {name: its evaluation runs}; ``rows``: {run
    name: its result row}; ``floor``: strongest_floor's, for where each mean lies against it."""
    # the last look that tested a comparison (a decided one's path repeats its deciding look after it)
    looked = max((next(i for i, look in enumerate(path) if look is path[-1]) + 1 for path in paths.values() if path),
                 default=0)
    state = (f"It continues: the comparisons still open and {plan.baseline} train the next look's seeds; "
             f"report.md follows when every comparison is decided or the last look is reached."
             if continues else "It has ended: report.md holds the results.")
    seeds = sorted({r.seed for rs in runs.values() for r in rs})
    evaluated = {name: [rows[r.name] for r in rs] for name, rs in runs.items()}
    flat = [row for rs in evaluated.values() for row in rs]
    parts = parts_section(plan, evaluated)
    body = (f"Experiment 2's group-sequential stage after look {looked} of {len(plan.looks)} (looks at "
            f"{', '.join(map(str, plan.looks))} pairs), evaluation seeds {', '.join(map(str, seeds))} so far. "
            f"{state} The verdict so far is the sequential verdict at its latest look: *inconclusive so far* while "
            f"a comparison is open; *pairs to decide* is what a fixed design at the last look's level would need at "
            f"the paired SD seen so far: to show equivalence within ±{margin:g} were the true difference 0 (TOST), "
            f"or to show the difference seen so far. "
            f"{split_sentence(loss_split(rows[r.name] for r in plan.tuning_runs), loss_split(flat))}\n\n"
            + _common.table_marker("progress")
            + progress_table(plan, evaluated, losses, paths, margin, continues, floor)
            + "\n\n" + looks_section(plan.looks, paths) + (f"\n\n{parts}" if parts else ""))
    text = (f"# Normalization configurations compared: the sequential stage so far\n\n"
            f"{_common.made_by(_common.command_line())}\n\n{body}\n")
    write_atomic(os.path.join(plan.out, PROGRESS_FILE), text.encode("utf-8"))


def progress_table(plan: Plan, rows: dict, losses: dict, paths: dict, margin: float, continues: bool,
                   floor: tuple[str, float, bool] | None = None) -> str:
    """One row per configuration: its runs so far, their mean, and against the baseline the interval,
    verdict and pairs to decide at its latest look (sequential_cells; *inconclusive so far* while the
    stage ``continues``)."""
    base = plan.baseline
    on_trained = trained_verdicts(plan, rows, margin)
    table = []
    for name in plan.configs:
        rs = rows[name]
        if name == base:
            cells = ["(baseline)", "—", "—"]
        else:
            diffs = pairs_of(losses[name], losses[base])
            ci, verdict, to_decide, _ = sequential_cells(paths[name], diffs, plan.looks, margin)
            if continues:  # an open comparison's verdict is not final while the stage goes on
                verdict = verdict.replace("inconclusive (", "inconclusive so far (", 1)
            cells = [ci, verdict, to_decide]
        table.append([name, outcome_counts(rs), mean_interval(losses[name]),
                      *([floor_interval(losses[name], floor[1])] if floor else []), *cells, failure_rate(rs),
                      on_trained.get(name, "—")])
    return _common.markdown_table(["configuration", "runs", "val loss, mean ± 95% CI",
                                   *floor_column(floor),
                                   f"paired Δ vs {base}, CI at the latest look", "verdict", "pairs to decide",
                                   "collapsed or failed, 95% CI", "verdict on the runs that trained"], table)


def parts_section(plan: Plan, rows: dict) -> str:
    """Each comparison's paired differences on every part of the validation split (part_differences:
    the pairs where both runs trained): whether a difference on the test part, which the verdicts
    are drawn on, is there on the other text too. A description, with no verdict of its own; empty
    for runs from before the test split. ``rows``: {name: its evaluation runs' rows, by seed}."""
    if loss_split(row for rs in rows.values() for row in rs) != "test":
        return ""
    table = []
    for name in plan.configs:
        if name != plan.baseline:
            parts = part_differences(rows[name], rows[plan.baseline])
            table.append([name, len(parts["test_loss"]), *map(difference_interval, parts.values())])
    return ("The same pairs on each part of the validation split (the pairs where both runs trained; paired Δ "
            f"against {plan.baseline}, mean ± 95% t-interval, not adjusted for the looks or the table: a description "
            "beside the verdicts, not one; LRs were chosen on the tuning part, with the tuning seeds):\n\n"
            + _common.table_marker("parts")
            + _common.markdown_table(["comparison", "pairs", *(f"Δ on the {part}" for part in SPLIT_PARTS.values())],
                                     table))


def train_round(plan: Plan, wanted: dict) -> dict:
    """Train one round of the LR search (every tuning seed of the ``wanted`` LRs) after the runs of
    the rounds before; {name: {lr: [loss by tuning seed]}} over every LR tried so far."""
    plan.tuning_runs += [r for by_lr in plan.tuning(wanted).values() for rs in by_lr.values() for r in rs]
    rows = _common.finished_rows(plan.sweep(plan.tuning_runs), last=False)
    loss_split(rows.values())  # refuses runs from before the test split beside runs from after it
    losses: dict = {name: {} for name in plan.configs}
    for run in plan.tuning_runs:
        name = config_name(run.config)
        losses[name].setdefault(run.overrides["learning_rate"], []).append(tuning_loss(rows[run.name]))
    return losses


def write_results(args, plan: Plan, outcome: Outcome, tuned_from: str, started) -> None:
    """report.md and the two plots."""
    sweep = plan.sweep([])
    rows = outcome.rows
    refs = _common.reference_losses(args.data_dir)
    # the floors scored on the targets the runs were scored on, with the same context (or none yet)
    matched = _common.matched_floors(args.data_dir, rows.values())
    losses = verdict_losses(outcome.seed_runs, rows, refs.get("unigram"))
    runner_up = verdict_losses(outcome.robustness_runs, rows, refs.get("unigram"))
    margin = args.margin or EQUIVALENCE_MARGIN
    used = sorted({r.seed for rs in outcome.seed_runs.values() for r in rs})
    seeds = f"seeds {', '.join(map(str, used))}"
    plot_curves({n: [load_run(sweep.out_dir(r)) for r in rs] for n, rs in outcome.seed_runs.items()}, refs,
                os.path.join(plan.out, "norm_comparison.png"), f"val loss, mean and range over {seeds}, "
                                                               f"each configuration at its tuned LR")
    budget = {**_common.TIERS[plan.tier], **(EXP2_BUDGET if plan.tier == "default" else {})}
    tune = f"seeds {', '.join(map(str, plan.tune_seeds))}"
    how = (f"LR searched from {search_start(plan, tuned_from)} on tuning {tune} (half-decade steps beyond an "
           f"edge while the best mean loss is there, at most {EXTENSIONS[plan.tier]} a side, then the "
           f"quarter-decade points beside the best), then evaluation ")
    initial = {name: initial_loss(sweep.out_dir(plan.run(name, plan.grids[name][0], plan.tune_seeds[0])))
               for name in plan.configs}
    trained = {config_name(r.config) for r in plan.tuning_runs if rows[r.name]["status"] == "finished"}
    sensitivities = sensitivities_over_one_grid(plan.grids, outcome.means, initial, trained)
    sections = [f"Tier `{plan.tier}`. Budget per run: {budget or 'train.py defaults'}; min_lr = lr/10{muon_tie(plan)}; {how}"
                f"{seeds} at each configuration's tuned LR, paired with {plan.baseline}. {splits(plan, outcome)} "
                f"{verdict_rule(len(plan.configs) - 1, margin, args.margin, refs.get('unigram'), plan.looks)} "
                f"{_common.training_time(rows.values())}."
                + ("" if sensitivities else " Each configuration searched its own grid, so the LR sensitivity "
                   "(which compares configurations over one grid) is left out: see the default tier's."),
                _common.table_marker("tuned") + tuned_table(plan, outcome, losses, runner_up, margin, sensitivities,
                                                            floor_from(matched, refs)),
                _common.references_section(refs, matched), "![](norm_comparison.png)"]
    parts = parts_section(plan, {name: [rows[r.name] for r in rs] for name, rs in outcome.seed_runs.items()})
    if parts:
        sections.insert(2, parts)
    if outcome.paths is not None:
        sections.insert(2, looks_section(plan.looks, outcome.paths))
    plot_lr_curves(outcome.means, refs, initial, os.path.join(plan.out, "lr_sensitivity.png"))
    sections.insert(2, f"Final loss by learning rate, the mean over tuning {tune} (**bold**: the tuned LR, "
                    "*italic*: the runner-up; diverged: a tuning seed diverged; blank: not tried):\n\n"
                    + _common.table_marker("lr_grid") + lr_grid_table(outcome, initial))
    sections.append("![](lr_sensitivity.png)")
    _common.write_report(os.path.join(plan.out, "report.md"), "Normalization configurations compared",
                         _common.command_line(), "\n\n".join(sections), started)


def muon_tie(plan: Plan) -> str:
    """The report's words on the LR that Muon's configurations tune (_common.muon_tie_problems)."""
    if not plan.muon:
        return ""
    names = ", ".join(n for n in plan.configs if n in plan.muon)
    return (f"; under optimizer muon ({names}) muon_lr = lr as well, one LR for both groups as Liu et al. 2025 "
            f"(arXiv:2502.16982) tune it with muon_adjust_lr match_rms_adamw")


def splits(plan: Plan, outcome: Outcome) -> str:
    """The report's sentence on the parts of the validation split the LRs were tuned on and the
    losses are reported on (verdicts.loss_split of the tuning runs, then of the evaluation runs)."""
    evaluated = [r for runs in (*outcome.seed_runs.values(), *outcome.robustness_runs.values()) for r in runs]
    return split_sentence(loss_split(outcome.rows[r.name] for r in plan.tuning_runs),
                          loss_split(outcome.rows[r.name] for r in evaluated))


def search_start(plan: Plan, tuned_from: str) -> str:
    """Where the report says the LR search started: the tier's (or --lrs's) grid, or in --full and
    --beyond the points around each configuration's earlier-tier LR (so said even where those
    points happen to coincide)."""
    if plan.tier in CENTRED and not plan.args.lrs:
        return (f"the three half-decade points around the LR {tuned_from} tuned for each configuration, at "
                f"this tier's budget,")
    return f"the grid {', '.join(f'{lr:g}' for lr in next(iter(plan.grids.values())))}"


def sensitivities_over_one_grid(grids: dict, means: dict, initial: dict, trained: set) -> dict:
    """{name: LR sensitivity} where every configuration searched the same grid; {} otherwise.
    Wortsman's sensitivity compares configurations only over one grid: --full and --beyond centre
    each one's grid on its own earlier-tier LR, so there the column is left out unless the grids
    coincide (the default tier's table has it)."""
    if len({tuple(g) for g in grids.values()}) != 1:
        return {}
    return {n: sensitivity(grids[n], means[n], initial[n], n in trained) for n in means}


# How the report treats runs that collapse or fail, and what the LR search does about them.
FAILURES_RULE = ("*Collapsed or failed*: how many evaluation runs at the tuned LR collapsed, diverged or were skipped "
                 "out, with the exact 95% interval of that rate (Clopper & Pearson 1934); *verdict on the runs that "
                 "trained*: the verdict drawn again, the same way, over the pairs where both runs finished: how the "
                 "configuration compares when it trains, beside how often it does. The LR search does not prefer a "
                 "lower LR that never collapses: a collapsed tuning run counts at its own (near-unigram) loss in its "
                 "LR's mean, a diverged one makes that mean infinite, and the LR of the lowest mean is tuned, so an LR "
                 "where one tuning seed of two collapsed is tuned only if its mean is still the lowest.")


def verdict_rule(k: int, margin: float, stated: float | None, unigram: float | None, looks: list | None = None) -> str:
    """The report's sentences on how the table's verdicts are drawn: what babygpt.verdicts does (or
    with --looks, babygpt.sequential)."""
    if looks:
        return sequential_rule(k, margin, stated, looks) + " " + FAILURES_RULE
    over = "for the table's one comparison" if k == 1 else f"over the table's {k} comparisons together"
    given = " with --margin" if stated else ""
    failed = (f"A run that diverged or was skipped out counts at the data's unigram loss ({unigram:.4f} nats), as a "
              f"collapsed run in effect does" if unigram is not None else
              "A run that diverged or was skipped out has no pair (the data's reference losses have no unigram "
              "loss to count it at)")
    return (f"Verdicts are drawn {over}: *better*/*worse* where the paired t-test rejects no difference after "
            f"Holm-Bonferroni (family-wise 5%; the interval shown is the one at the comparison's Holm step, and for "
            f"the comparisons at and after the step where Holm stopped, that step's, so an interval excludes zero "
            f"only beside better/worse), *equivalent within ±{margin:.3f}* where two one-sided tests (Holm as well) "
            f"reject a difference of {margin:g} nats or more (m = {margin:g} nats, stated before the "
            f"runs{given} (not estimated from them)), otherwise *inconclusive*; a verdict needs at least "
            f"{MIN_PAIRS_FOR_VERDICT} seed pairs. For an inconclusive comparison, *pairs to decide* is how many "
            f"seed pairs its observed paired SD would need for an 80% chance to decide at its Holm level: TOST "
            f"within ±m were the true difference 0, the t-test were it the observed one (Chow, Shao & Wang 2008). "
            f"{failed}. *Leave-one-seed-out*: in how many of the tables drawn again with one evaluation seed "
            f"deleted (from every configuration) a better/worse verdict stays. *Robust*: whether the verdict stays "
            f"the same against the baseline at its runner-up LR, and with the configuration at its own, the table's "
            f"verdicts drawn again (Holm) with that side's runs; where it changes, the new verdict and its paired "
            f"difference with a plain 95% interval, not the Holm step's (*not run*: those runs were not trained; "
            f"--runner_up all trains them). {FAILURES_RULE}")


def sequential_rule(k: int, margin: float, stated: float | None, looks: list) -> str:
    """verdict_rule's sentences for --looks."""
    levels = ", ".join(f"{n} pairs: {p:.3g}" for n, p in zip(looks, nominal_levels(looks, ALPHA)))
    return (f"Verdicts are group-sequential over the table's {k} comparison{'s' if k > 1 else ''}: evaluation seed "
            f"pairs come in rounds and each comparison is looked at after {', '.join(map(str, looks))} pairs, until "
            f"it is decided. At a look, *better*/*worse* where the paired t-test rejects no difference at that look's "
            f"level under O'Brien-Fleming alpha spending (Lan & DeMets 1983; family-wise 5% over the looks, two-sided "
            f"levels {levels}), made sequential over the table by Holm (the i-th smallest p of the r comparisons not "
            f"yet found different tested at the level for 5%/(r - i); Maurer & Bretz 2013); *equivalent within "
            f"±{margin:.3f}* where two one-sided tests reject a difference of {margin:g} nats or more at that look's "
            f"level (m stated before the runs{' with --margin' if stated else ''}, not estimated from them); a decided "
            f"comparison trains no more seeds; one still open after the last look is *inconclusive*. The interval "
            f"shown beside a verdict is at its deciding look's level (the last look's for an open one); *pairs to "
            f"decide* is what a fixed design at the last look's level would need at the observed paired SD (80% "
            f"power; Chow, Shao & Wang 2008). A run that diverged or was skipped out counts at the data's unigram "
            f"loss. Leave-one-seed-out is not drawn for sequential verdicts (a look's data are its first pairs). "
            f"*Robust*: on the first look's seeds, which the runner-up runs hold, the verdict drawn (fixed design, "
            f"Holm) at the tuned LRs and again against the baseline at its runner-up LR, and with the configuration "
            f"at its own: whether the two agree, with both paired differences (95%); the sequential verdict rests "
            f"on more pairs, so it is not the one compared.")


def looks_section(looks: list, paths: dict) -> str:
    """The look-by-look paths: one row per comparison, one column per look (the paired difference,
    the two p-values, the verdict so far; blank after it stopped)."""
    rows = []
    for name, path in paths.items():
        cells = [look.cell() if i == 0 or path[i - 1].verdict is None else "" for i, look in enumerate(path)]
        rows.append([name, *cells, *[""] * (len(looks) - len(path)),
                     path[-1].pairs if path else 0])
    return ("Each comparison's path over the looks (paired Δ against the baseline over the pairs so far, the t-test's "
            "p, TOST's p, and the verdict; blank once it stopped or where the looks were not reached):\n\n"
            + _common.table_marker("looks")
            + _common.markdown_table(["comparison", *[f"look {i + 1}: {n} pairs" for i, n in enumerate(looks)],
                                      "pairs used"], rows))


def sequential_cells(path: list, diffs: list, looks: list, margin: float) -> list[str]:
    """The tuned table's Holm-step CI, verdict, pairs-to-decide and leave-one-seed-out cells for a
    comparison decided (or left open) by the sequential looks: the interval at the level of the look
    it ended at, over the pairs it used."""
    if not path:
        return ["—", f"inconclusive ({len(diffs)} pairs)", "—", "—"]
    last = path[-1]
    decided = next(i for i, look in enumerate(path) if look is last)
    level = nominal_levels(looks, ALPHA)[decided]
    test = PairedTest.of(diffs[:last.pairs], margin)
    ci = f"{test.mean:+.3f} ± {test.half_width(1 - level):.3f} ({confidence(level)})"
    if last.verdict is not None:
        verdict = f"equivalent within ±{margin:.3f}" if last.verdict == "equivalent" else last.verdict
        return [ci, f"{verdict} (look {decided + 1}, {last.pairs} pairs)", "—", "—"]
    sd = test.se * math.sqrt(test.df + 1)
    final = nominal_levels(looks, ALPHA)[-1]
    to_decide = (f"{count_cell(pairs_for_equivalence(sd, margin, final))} (TOST ±{margin:g}); "
                 f"{count_cell(pairs_for_difference(sd, test.mean, final))} (difference)")
    return [ci, f"inconclusive (look {len(path)}, {last.pairs} pairs)", to_decide, "—"]


def confidence(alpha: float) -> str:
    """An interval's confidence for a two-sided level ``alpha``, with the digits that keep it below
    100%: 0.0125 -> "98.75%", 2.4e-07 -> "99.999976%" (an early look's O'Brien-Fleming level)."""
    digits = max(2, math.ceil(-math.log10(100 * alpha)) + 1) if alpha > 0 else 2
    return f"{100 * (1 - alpha):.{digits}f}".rstrip("0").rstrip(".") + "%"


def verdict_losses(runs: dict, rows: dict, unigram: float | None) -> dict:
    """{name: [the loss each run counts at in a verdict]} for {name: runs} (compare.verdict_loss: a
    run that diverged at the data's ``unigram`` loss)."""
    return {name: [verdict_loss(rows[r.name], unigram) for r in rs] for name, rs in runs.items()}


# ---------------------------------------------------------------- reading the runs

def sensitivity(grid: list, means: dict, initial: float, trained: bool) -> float | None:
    """Wortsman et al.'s LR sensitivity over the half-decade grid, from the mean loss over the tuning
    seeds; None if no LR ``trained`` (every run collapsed or diverged), where the measure says
    nothing: it would be near 0, as if perfectly robust."""
    if not trained:
        return None
    return lr_sensitivity({lr: means[lr] for lr in grid if lr in means}, initial)


# ---------------------------------------------------------------- tables

def tuned_table(plan: Plan, outcome: Outcome, losses: dict, runner_up: dict, margin: float,
                sensitivities: dict, floor: tuple[str, float, bool] | None) -> str:
    """One row per configuration: its tuned LR, its evaluation seeds, where their mean lies against
    the data's strongest n-gram ``floor`` (key, nats: the regime its verdict is about), and its
    verdict against the baseline, drawn over the table; for an inconclusive one the pairs that would
    decide it, for a better/worse one how often it survives leaving a seed out, and for each whether
    it survives either side at its runner-up LR (``runner_up``: {name: losses there}, absent where
    not run)."""
    base = plan.baseline
    verdicts = compare_table(losses, base, margin)
    stable = leave_one_seed_out(losses, base, margin)
    if outcome.paths is None:
        again = {name: robust_cell(verdicts.get(name), sides)
                 for name, sides in runner_up_verdicts(losses, base, runner_up, margin).items()}
    else:  # the runner-up runs hold the first look's seeds: compare like with like, on those pairs
        first = {name: ls[:plan.looks[0]] for name, ls in losses.items()}
        at_tuned = compare_table(first, base, margin)
        again = {name: robust_on_first_look(at_tuned.get(name), sides)
                 for name, sides in runner_up_verdicts(first, base, runner_up, margin).items()}
    header = ["configuration", "parameters", "tuned LR", "runner-up LR", "LR sensitivity", "runs",
              "val loss, mean ± 95% CI", *floor_column(floor),
              f"paired Δ vs {base}, 95% CI", "Holm-step CI" if outcome.paths is None else "CI at the deciding look", "verdict", "pairs to decide", "leave-one-seed-out",
              f"robust at runner-up LR ({base}'s / own)", "collapsed or failed, 95% CI",
              "verdict on the runs that trained", "train time / run (s)"]
    on_trained = trained_verdicts(plan, {name: [outcome.rows[r.name] for r in runs]
                                         for name, runs in outcome.seed_runs.items()}, margin)
    table = []
    for name in plan.configs:
        rs = [outcome.rows[r.name] for r in outcome.seed_runs[name]]
        c = verdicts.get(name)
        sens = sensitivities.get(name)  # absent: grids differ (--full); None: no LR trained
        tuned = outcome.tuned[name]
        table.append([name, f"{rs[0]['num_params']:,}" if rs and rs[0]["num_params"] else "—",
                      (f"{tuned:g}" + (" (edge)" if outcome.censored.get(name) else "")) if tuned
                      else "none (all diverged)",
                      f"{outcome.second[name]:g}" if outcome.second.get(name) else "—",
                      f"{sens:.3f}" if sens is not None else "— (no LR trains)" if name in sensitivities else "—",
                      outcome_counts(rs), mean_interval(losses[name]),
                      *([floor_interval(losses[name], floor[1])] if floor else []),
                      "(baseline)" if c is None else c.delta(),
                      *(["—"] * 4 if c is None else
                        sequential_cells(outcome.paths[name], pairs_of(losses[name], losses[base]), plan.looks, margin)
                        if outcome.paths is not None else
                        [c.adjusted(), c.call(), c.to_decide(),
                         "stable in {} of {} deletions".format(*stable[name]) if name in stable else "—"]),
                      again.get(name, "—"), failure_rate(rs), on_trained.get(name, "—"),
                      f"{statistics.fmean(r['wall_time_s'] or 0 for r in rs):.1f}" if rs else "—"])
    return _common.markdown_table(header, table)


def failure_rate(rows: list) -> str:
    """How many evaluation runs at the tuned LR collapsed, diverged or were skipped out, with the exact
    95% interval of that rate: "1 of 7 (0.4%–58%)"."""
    if not rows:
        return "—"
    k = sum(r["status"] != "finished" for r in rows)
    lo, hi = clopper_pearson(k, len(rows))
    return f"{k} of {len(rows)} ({percent(lo)}–{percent(hi)})"


def percent(rate: float) -> str:
    """0.0036 -> "0.4%", 0.5787 -> "58%", 1.0 -> "100%"."""
    return f"{100 * rate:.1f}%" if 0 < 100 * rate < 9.95 else f"{100 * rate:.0f}%"


def pairs_text(n: int) -> str:
    """1 -> "1 pair", 4 -> "4 pairs"."""
    return f"{n} pair{'s' if n != 1 else ''}"


def trained_verdicts(plan: Plan, rows: dict, margin: float) -> dict:
    """{name: its verdict against the baseline over the pairs where both runs finished}, drawn as the
    table's own (Holm over the table, sequential over the looks with --looks); "— (every run
    trained)" for a configuration whose runs and the baseline's all finished: its verdict column is
    already over runs that trained. ``rows``: {name: its evaluation runs' rows}."""
    base = plan.baseline
    failed = {name for name, rs in rows.items() if any(r["status"] != "finished" for r in rs)}
    same = "— (every run trained)"
    if not failed:
        return {name: same for name in rows if name != base}
    losses = {name: [reported_loss(r) if r["status"] == "finished" else math.inf for r in rs]
              for name, rs in rows.items()}
    if not plan.looks:
        # call() already names the pairs of a comparison with too few: the word alone, then the count once
        drawn = {name: f"{c.call().split(' (')[0]} ({pairs_text(c.pairs)})"
                 for name, c in compare_table(losses, base, margin).items()}
    else:
        base_losses = losses[base]
        paths = sequential_verdicts({name: pairs_of(losses[name], base_losses) for name in losses if name != base},
                                    plan.looks, margin)
        drawn = {name: (f"{'equivalent within ±%.3f' % margin if path[-1].verdict == 'equivalent' else path[-1].verdict}"
                        f" ({pairs_text(path[-1].pairs)})" if path and path[-1].verdict else
                        f"inconclusive ({pairs_text(path[-1].pairs if path else len(pairs_of(losses[name], base_losses)))})")
                 for name, path in paths.items()}
    return {name: drawn[name] if name in failed or base in failed else same for name in drawn}


def runner_up_verdicts(losses: dict, base: str, runner_up: dict, margin: float) -> dict:
    """{name: (its comparison against the baseline at the baseline's runner-up LR, and at its own
    runner-up LR against the baseline at its tuned one)}, each drawn over the whole table again
    with that side's losses replaced; in place of a comparison, "not run" where those runs were not
    trained, "no runner-up LR" where the search found one LR only."""
    def redrawn(side: str):
        if side not in runner_up:
            return None
        return compare_table({**losses, side: runner_up[side]}, base, margin) if runner_up[side] else {}

    against_base = redrawn(base)
    sides = {}
    for name in losses:
        if name == base:
            continue
        own = redrawn(name)
        sides[name] = tuple("not run" if table is None else table.get(name, "no runner-up LR")
                            for table in (against_base, own))
    return sides


def robust_cell(comparison, sides) -> str:
    """"<against the baseline at its runner-up LR> / <at its own runner-up LR>", each yes / no (and
    the verdict it becomes) / not run / no runner-up LR."""
    if comparison is None or sides is None:
        return "—"
    return " / ".join(side if isinstance(side, str) else "yes" if side.call() == comparison.call()
                      else f"no: {side.call()} ({side.delta()})" for side in sides)


def robust_on_first_look(comparison, sides) -> str:
    """For a sequential table, whose runner-up runs hold the first look's seeds only: the verdict on
    those pairs at the tuned LRs against the same pairs with one side at its runner-up LR, each with
    its paired difference, e.g. "yes: inconclusive, -0.010 ± 0.011 → -0.006 ± 0.014 / not run". The
    sequential verdict itself rests on more pairs, so it is not the one compared."""
    if comparison is None or sides is None:
        return "—"
    return " / ".join(side if isinstance(side, str) else
                      f"{'yes' if side.call() == comparison.call() else 'no'}: {comparison.call()}"
                      + ("" if side.call() == comparison.call() else f" → {side.call()}")
                      + f", {comparison.delta()} → {side.delta()}" for side in sides)


def lr_cell(mean: float | None, tuned: bool, second: bool) -> str:
    if mean is None:
        return ""
    text = f"{mean:.3f}" if math.isfinite(mean) else "diverged"
    return f"**{text}**" if tuned else f"*{text}*" if second else text


def lr_grid_table(outcome: Outcome, initial: dict) -> str:
    """Mean loss over the tuning seeds at every LR the search tried, per configuration."""
    lrs = sorted({lr for means in outcome.means.values() for lr in means})
    table = [[name, f"{initial[name]:.3f}"] + [lr_cell(means.get(lr), lr == outcome.tuned[name],
                                                       lr == outcome.second.get(name)) for lr in lrs]
             for name, means in outcome.means.items()]
    return _common.markdown_table(["configuration", "initial"] + [f"{lr:g}" for lr in lrs], table)


# ---------------------------------------------------------------- plots

def plot_curves(curves: dict, refs: dict, path: str, title: str) -> None:
    """Mean val loss of each configuration's seeds at the eval iterations all of them reached; band = min..max."""
    fig, ax = new_figure(figsize=(8, 5))
    for i, (name, runs) in enumerate(curves.items()):
        series = [{r["iter"]: r["val_loss"] for r in run["metrics"] if r.get("val_loss") is not None} for run in runs]
        common = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not common:
            continue
        ax.plot(common, [statistics.fmean(s[it] for s in series) for it in common], "o-", color=f"C{i}",
                markersize=3, label=name)
        ax.fill_between(common, [min(s[it] for s in series) for it in common],
                        [max(s[it] for s in series) for it in common], color=f"C{i}", alpha=0.2)
    reference_lines(ax, refs)
    ax.set(xlabel="iteration", ylabel="val loss (eval windows)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def plot_lr_curves(means: dict, refs, initial: dict, path) -> None:
    """Mean final loss over the tuning seeds against LR; an x on the initial-loss line where a
    tuning seed diverged."""
    fig, ax = new_figure(figsize=(8, 5))
    top = max(initial.values())
    for i, (name, points) in enumerate(means.items()):
        xs = [lr for lr in sorted(points) if math.isfinite(points[lr])]
        ax.plot(xs, [points[lr] for lr in xs], "o-", color=f"C{i}", label=name)
        bad = [lr for lr in points if not math.isfinite(points[lr])]
        ax.plot(bad, [top] * len(bad), "x", color=f"C{i}", markersize=10, markeredgewidth=2)
    save_log_x(fig, ax, refs, path, dict(
        xlabel="learning rate", ylabel="final val loss, whole split, mean of tuning seeds (x: diverged)",
        title="loss vs learning rate (tuning seeds)"), initial=top)


if __name__ == "__main__":
    _common.main(main)
