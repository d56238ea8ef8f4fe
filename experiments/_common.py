"""What the experiment scripts share: the command line, the run budgets, tables."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from babygpt.cli import run  # noqa: E402
from babygpt.config import FIELDS  # noqa: E402
from babygpt.errors import BabyGPTError, Interrupted, ShardDone, unknown_choice  # noqa: E402
from babygpt.model import PLACEMENTS  # noqa: E402
from babygpt.placements import PLACEMENTS as PLACEMENT_CLASSES  # noqa: E402
from babygpt.runtime import cpu_name, machine_label, seconds_by_depth  # noqa: E402,F401 (exp1, exp4)
from babygpt.options import option, options_of, parse_into, repeated_entries  # noqa: E402,F401
from babygpt.data import load_dataset  # noqa: E402
from babygpt.files import write_atomic  # noqa: E402
from babygpt.rundir import read_json  # noqa: E402
from babygpt import experimentdir  # noqa: E402
from babygpt.experimentdir import OutputDir  # noqa: E402
from babygpt.scaleout import ScaleOutOptions  # noqa: E402
from babygpt.sweep import Sweep, ignored_set_problems, shard_done_message  # noqa: E402

# Training budgets (model shape, context, batch, iterations) of the experiments, one per tier
# (docs/experiments.md, "Budget tiers"): quick only checks that everything runs (<= 60 s); the default is sized so that each
# experiment stays within about 15 minutes on a 2-core CPU; full is train.py's own budget (its
# defaults: 2,400 iterations of the 0.8M-parameter model), for the few configurations that matter.
DEFAULT_BUDGET = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 16,
                  "max_iters": 500, "eval_interval": 50, "eval_iters": 10, "log_interval": 10,
                  "warmup_iters": 50, "dropout": 0.0}
QUICK_BUDGET = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 8,
                "max_iters": 10, "eval_interval": 5, "eval_iters": 2, "log_interval": 5,
                "warmup_iters": 5, "dropout": 0.0}
FULL_BUDGET: dict = {}
# Experiment 2's beyond-n-gram tier: train.py's model at the point where the regime's frontier
# (experiment 11, results/regime) first ended below the plain Kneser-Ney 8-gram with full context,
# the floor it was chosen by. Modified Kneser-Ney scored on the runs' own targets stays below it
# (docs/findings.md), so the tier is the frontier's longest budget, not one past every floor.
BEYOND_BUDGET = {"block_size": 128, "max_iters": 4800}
TIERS = {"quick": QUICK_BUDGET, "default": DEFAULT_BUDGET, "full": FULL_BUDGET, "beyond": BEYOND_BUDGET}


@dataclass
class Options:
    """The options of every experiment; each script subclasses this with its own."""

    quick: bool = option(False, "a tiny version that only checks the pipeline (writes to out/quick/)")
    publish: bool = option(False, "write the tier's directory under results/ (the committed records) instead of "
                                  "out/: for results that are to be committed")
    out: Optional[str] = option(None, "output directory (default: out/<experiment>, out/<tier>/<experiment> "
                                      "for another tier; with --publish, results/ in place of out/)")
    overwrite: bool = option(False, "replace what --out holds even if it was made with other settings")

    def problems(self) -> list[str]:
        """Problems parsing alone cannot see (a value outside a list, options that disagree)."""
        return []


@dataclass
class DataOptions(Options):
    data_dir: str = option("data/shakespeare_char", "prepared data")


@dataclass
class TrainingOptions(ScaleOutOptions, DataOptions):
    """The options of the experiments that train models through a sweep (and can be sharded over
    machines, or collected, like any sweep: babygpt.scaleout)."""

    full: bool = option(False, "the long tier: train.py's own budget (2,400 iterations) for the configurations "
                               "that matter (writes to out/full/, or results/full/ with --publish)")
    jobs: int = option(1, "training runs in parallel")
    set: list[str] = option([], "override a training key for every run, e.g. --set max_iters=1000 (repeatable)",
                            metavar="KEY=VALUE")

    def problems(self) -> list[str]:
        tiers = ["--quick and --full are two tiers; pass one of them"] if self.quick and self.full else []
        jobs = [f"--jobs must be at least 1, got {self.jobs}"] if self.jobs < 1 else []
        return tiers + jobs + self.scale_out_problems()


def parse(cls, argv: list[str], name: str, doc: str):
    """An instance of options dataclass ``cls`` read from ``argv``, checked before anything is
    written; ``doc`` is the script's docstring, whose first line is the --help description. An
    option given an empty value (``--lrs=``) is refused: it would otherwise read as "not given";
    so is --publish with --out, where --out names the directory and --publish would do nothing."""
    args = parse_into(cls, argv, f"python experiments/{name}.py [--key=value ...]", doc.splitlines()[0])
    problems = [f"--{f.name} is empty; give it a value, or leave it out for its default"
                for f in dataclasses.fields(args) if getattr(args, f.name) == ""]
    if args.publish and args.out is not None:  # (output_path: --out wins, so --publish would do nothing)
        problems.append(f"--publish puts the results under results/ in place of out/, but --out {args.out!r} names "
                        f"the directory itself; pass one of them")
    if problems:
        raise BabyGPTError(*problems)
    return args


def placements_option(default: str):
    """The --placements option of the experiments that place one norm_type's norms: its help lists
    every registered placement placement_problems accepts (one that builds norm layers)."""
    accepted = [pl for pl in PLACEMENTS if PLACEMENT_CLASSES[pl].uses_norm_type]
    return option(default, "comma-separated norm placements, among " + ",".join(accepted), metavar="PLACEMENT,...")


def placement_problems(text: str) -> list[str]:
    """The --placements problems of the experiments that place one norm_type's norms: an unknown
    name, or a placement that builds no norm layers (nGPT), which those comparisons cannot hold."""
    names = text.split(",")
    bad = [pl for pl in names if pl not in PLACEMENTS]
    if bad:
        return [unknown_choice("placement", bad[0], PLACEMENTS)]
    return repeated_entries("--placements", names) + [
        f"placement {pl} builds no norm layers, so it has no place in a comparison of where a norm goes; "
        f"compare it through experiments/exp2_norm_comparison.py --configs config/ngpt.py,..."
        for pl in names if not PLACEMENT_CLASSES[pl].uses_norm_type]


# Options that change where or how fast results are made, not what they are.
NOT_SETTINGS = ("out", "overwrite", "jobs", "shard", "collect", "gpus", "publish", "reuse")


def tier(args) -> str:
    """quick, default or full (docs/experiments.md, "Budget tiers"): every training experiment has the same three; experiment 2
    has a fourth, beyond (its --beyond)."""
    if args.quick:
        return "quick"
    return "full" if getattr(args, "full", False) else "beyond" if getattr(args, "beyond", False) else "default"


def output_path(args, name: str) -> str:
    """--out, or the tier's own directory: out/<name> (out/<tier>/<name> for another tier), which git
    ignores, so that no rerun rewrites the committed records; with --publish the same under results/,
    where the default tier's committed results/<name> lives and a quick check can never land."""
    if args.out:
        return args.out
    base = "results" if args.publish else "out"
    return os.path.join(base, name) if tier(args) == "default" else os.path.join(base, tier(args), name)


def settings(args, name: str) -> dict:
    """What the results in an output directory were made with (settings.json)."""
    return {"experiment": name, **{k: v for k, v in dataclasses.asdict(args).items() if k not in NOT_SETTINGS}}


def defaults(args) -> dict:
    """Each setting's default value (settings.json from before an option existed lacks its key)."""
    return {name: o.default for name, o in options_of(type(args), NOT_SETTINGS).items()}


def claim(path: str, args, name: str, sweep=None) -> str:
    """Make ``path`` this experiment's output directory and return it (babygpt.experimentdir). Results
    made there with other settings (or by an unknown command) are refused, or with --overwrite
    moved aside until the new ones are complete. Everything is checked first (the directory, the
    experiment's ``sweep``, the data), so a refused experiment changes nothing on disk."""
    out = OutputDir(path, settings(args, name), args.overwrite, getattr(args, "collect", False), defaults(args))
    problems = []
    try:
        out.check()
    except BabyGPTError as e:
        problems += e.problems
    if sweep is not None:  # the runs' own settings (a bad --set) are named beside a refused --out, not hidden by it
        try:
            sweep.check(on_disk=not (out.replace or problems))
        except BabyGPTError as e:
            problems += e.problems
    if problems:
        raise BabyGPTError(*problems)
    if sweep is not None and getattr(args, "collect", False):  # nothing is written for a collect that cannot be
        sweep.check_collectable()
    if getattr(args, "data_dir", None):  # the data's problems show now, before --out is touched
        load_dataset(args.data_dir)
    return out.claim()


def budget_args(args, extra: dict | None = None, runs=()) -> list[str]:
    """The tier's budget (minus the keys the ``runs`` set themselves), ``extra``, then --set."""
    budget = dict(TIERS[tier(args)])
    budget.update(extra or {})
    budget = {k: v for k, v in budget.items() if not any(k in run.overrides for run in runs)}
    for line in budget_over_config(budget, runs):
        print(f"warning: {line}", file=sys.stderr, flush=True)
    ignored = ignored_set_problems(args.set, list(runs))
    if ignored:
        raise BabyGPTError(*ignored)
    return [f"--{k}={v}" for k, v in budget.items()] + [f"--data_dir={args.data_dir}"] + \
        [f"--{s}" for s in args.set]


def budget_over_config(budget: dict, runs) -> list[str]:
    """One line per config file that sets a key the tier's budget sets for every run (nGPT's
    warmup_iters = 0): the budget wins, so that every configuration of a table trains alike, and
    the user is told rather than left to find it in config.json."""
    from babygpt.config import read_config_file

    lines = []
    for path in sorted({run.config for run in runs if run.config}):
        try:
            own = read_config_file(path)
        except BabyGPTError:
            continue  # the sweep's own check reports an unreadable config
        clash = {k: v for k, v in own.items() if k in budget and budget[k] != v}
        lines += [f"{path} sets {k} = {v!r}; this tier's budget trains every run with {k}={budget[k]!r}"
                  for k, v in clash.items()]
    return lines


def sweep(out: str, runs: list, base_args: list[str], args) -> Sweep:
    """The experiment's sweep, spread as the command line asks (--jobs, --shard, --gpus, --collect)."""
    return Sweep(out, runs, base_args, args.jobs, args.shard_spec(), args.gpu_list(), args.collect,
                 args.reuse_list())


def finished_rows(sweep, last: bool = True) -> dict:
    """Run the sweep; its rows by run name. Runs that crashed or were refused (not finished, not
    diverged) stop the experiment with a pointer to their logs. A shard waits for the other shards'
    runs unless this is the experiment's ``last`` sweep, after which it stops (ShardDone): the
    report is written by --collect once every shard has finished. A sweep without runs (exp9 when
    no run crossed) trains and writes nothing."""
    from babygpt.sweep import DONE

    if not sweep.runs:
        rows = None if sweep.shard is not None and last else []
    else:
        rows = sweep.run(wait=not last)
    if rows is None:
        raise ShardDone(shard_done_message(sweep))
    failed = [r["name"] for r in rows if r["status"] not in DONE]
    if failed:
        raise BabyGPTError(f"{len(failed)} of {len(rows)} runs failed (first: {failed[0]}); "
                           f"see {os.path.join(sweep.root, 'logs', failed[0] + '.log')}")
    return {r["name"]: r for r in rows}


def training_time(rows) -> str:
    """How much training a report's runs cost, summed from their own records, and where they
    trained: the report's wall time and machine are only its invocation's, which skips runs already
    done (a campaign's runs may come from several sessions and machines)."""
    rows = list(rows)
    return (f"{count_runs(len(rows))}, {sum(r['wall_time_s'] or 0 for r in rows):.0f} s of training summed over "
            f"runs (the wall time above is this invocation's, which skips runs already done); "
            f"{trained_on(rows)}")


def trained_on(rows) -> str:
    """The machines a report's runs trained on, with how many each (each row's "machine", from its
    run's summary.json), most runs first: "trained on AMD EPYC (AVX-512 bf16), 1 thread: all 24 runs"."""
    counts = Counter(r.get("machine") or machine_label(None) for r in rows)
    if not counts:
        return "no runs trained"
    if len(counts) == 1:
        return f"trained on {next(iter(counts))}: " + ("all " if len(rows) > 1 else "") + count_runs(len(rows))
    return "trained on " + "; ".join(f"{label}: {count_runs(n)}" for label, n in counts.most_common())


def count_runs(n: int) -> str:
    """"1 run", "2 runs", ..."""
    return "1 run" if n == 1 else f"{n} runs"


def reference_losses(data_dir: str) -> dict:
    """The data's reference losses with full context (babygpt.ngram.floors: the add-one unigram,
    and Kneser-Ney and modified Kneser-Ney n = 2..10), read from data_dir/floors.json when it was
    made from these splits."""
    from babygpt.ngram import data_floors

    train, val, tok = load_dataset(data_dir)
    return data_floors(data_dir, train, val, tok.vocab_size)


@dataclass
class Floors:
    """The n-gram floors a table's runs are read against: scored on the runs' own targets with the
    context each target had (``scheme``, see babygpt.ngram.scheme_contexts), and how, in words."""

    refs: dict
    scheme: str
    how: str


def block_size_of(rows) -> int | None:
    """The context length the runs of ``rows`` trained with (their config.json), None if no run has one."""
    from babygpt.runstore import run_info

    for row in rows:
        info = run_info(row["out_dir"]) if row.get("out_dir") else None
        if info:
            return int(info["config"]["block_size"])
    return None


def matched_floors(data_dir: str, rows) -> Floors | None:
    """The floors of the text the runs of ``rows`` are scored on, under their own scoring: the test
    part in sliding windows (verdicts.loss_split is "test"), else the whole validation split in the
    non-overlapping windows of trainer.full_split_loss. None without a finished run."""
    from babygpt.verdicts import loss_split
    from babygpt.data import tune_and_test
    from babygpt.ngram import scheme_floors
    from babygpt.trainer import eval_stride

    rows = list(rows)
    block = block_size_of(r for r in rows if r["status"] == "finished")
    if block is None:
        return None
    train, val, tok = load_dataset(data_dir)
    if loss_split(rows) == "test":
        stride = eval_stride(block)
        scheme, text = f"sliding{block}s{stride}", tune_and_test(val)[1]
        how = (f"the test part (the second half of the validation split) in windows of {block} characters "
               f"every {stride}, as the runs' test_loss scores it")
    else:
        scheme, text = f"windows{block}", val
        how = (f"the whole validation split in consecutive windows of {block} characters, as the runs' "
               f"val_loss_full scores it (a window's first targets see fewer characters)")
    return Floors(scheme_floors(data_dir, train, text, tok.vocab_size, scheme), scheme, how)


def references_section(refs: dict, matched: Floors | None = None) -> str:
    """The report's table of reference points: every n-gram model with full context, and where the
    runs were scored on other targets or with less context (``matched``), the same models scored as
    the runs were; the strongest of each row in bold; and what 'collapsed' means."""
    from babygpt.ngram import COLLAPSE_MARGIN, FAMILIES, label, parse_key, strongest

    orders = sorted({parse_key(k)[1] for k in refs if parse_key(k)})
    rows = [("full context", refs)] + ([(f"as the runs: `{matched.scheme}`", matched.refs)] if matched else [])
    body = []
    for scored, values in rows:
        best = strongest(values)
        for family in FAMILIES:
            cells = [values.get(family.key(n)) for n in orders]
            if all(v is None for v in cells):  # e.g. floors from before modified Kneser-Ney
                continue
            body.append([f"{family.name}, {scored}", f"{values['unigram']:.4f}"]
                        + ["—" if v is None else f"**{v:.4f}**" if best and family.key(n) == best[0] else f"{v:.4f}"
                           for n, v in zip(orders, cells)])
    strongest_lines = "; ".join(f"{scored}: {label(strongest(values)[0])}, {strongest(values)[1]:.4f}"
                                for scored, values in rows if strongest(values))
    return ("Reference points of the data: the cross-entropy under n-gram models whose counts come from the "
            "train split (`python -m babygpt.references`). The unigram is add-one smoothed character "
            "frequencies; the others are interpolated Kneser-Ney (KN, one discount per order; Kneser & Ney "
            "1995) and modified Kneser-Ney (three discounts per order; Chen & Goodman 1998) of n characters, "
            "their discounts chosen on a held-out tenth of the train split, never on the validation split. "
            "*Full context* scores the validation split from its tenth character on, each target with its "
            "n − 1 characters before it"
            + (f"; *as the runs* scores {matched.how}, each model using at most the characters the "
               f"transformer had" if matched else "")
            + f". Strongest: {strongest_lines}. A run that ends within {COLLAPSE_MARGIN:g} nats of the unigram "
            "loss, or above it, is *collapsed*:\n\n"
            + table_marker("references")
            + markdown_table(["model (nats)", "unigram", *[f"n = {n}" for n in orders]], body))


def table_section(heading: str, intro: str, key: str, table: str) -> str:
    """A report section: its heading, what its table shows, and the table marked for the docs."""
    return f"## {heading}\n\n{intro}\n\n{table_marker(key)}{table}\n\n"


def table_marker(key: str) -> str:
    """The line before a report's table that README and docs blocks name (babygpt.doctables)."""
    return f"<!-- table: {key} -->\n"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def made_by(command: str) -> str:
    """A report's lines on what made it: the command, and the machine and torch it ran on."""
    import torch

    return f"Command: `{command}`\n\nMachine: {cpu_name()}, {os.cpu_count()} CPUs, torch {torch.__version__}"


def write_report(path: str, title: str, command: str, body: str, started: float) -> None:
    text = f"# {title}\n\n{made_by(command)}; wall time {time.time() - started:.0f} s\n\n{body}\n"
    # surrogateescape: a path given on the command line in another encoding is kept byte for byte
    write_atomic(path, text.encode("utf-8", "surrogateescape"))
    experimentdir.commit(os.path.dirname(path))  # the results are complete: what --overwrite replaced goes now
    print(text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))


def command_line() -> str:
    return " ".join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


@dataclass
class Experiment:
    """One invocation of an experiment script (``begin``): its options, tier, output directory and
    start time, with the steps every experiment takes with them."""

    name: str
    args: Options
    tier: str
    out: str
    started: float

    def budget(self, extra: dict | None = None) -> dict:
        """The tier's training budget with the experiment's own ``extra`` keys."""
        return {**TIERS[self.tier], **(extra or {})}

    def budget_line(self, extra: dict | None = None, leave_out=()) -> str:
        """The report's first words: the tier and its budget per run, less the keys ``leave_out``
        (those the experiment's runs set themselves)."""
        budget = {k: v for k, v in self.budget(extra).items() if k not in leave_out}
        return f"Tier `{self.tier}`. Budget per run: {budget or 'train.py defaults'}"

    def claim(self, sweep=None) -> str:
        """Make the output directory this experiment's (``claim``) and return it."""
        return claim(self.out, self.args, self.name, sweep)

    def sweep(self, runs: list, extra: dict | None = None, out: str | None = None) -> Sweep:
        """A sweep of ``runs`` in ``out`` (the output directory unless given) with the tier's budget,
        ``extra`` and --set (``budget_args``)."""
        return sweep(out or self.out, runs, budget_args(self.args, extra, runs), self.args)

    def train(self, runs: list, extra: dict | None = None, last: bool = True) -> tuple[Sweep, dict]:
        """Claim the output directory for the sweep of ``runs`` and run it: the sweep and its rows
        by run name (``finished_rows``, whose ``last`` this passes on)."""
        runs_sweep = self.sweep(runs, extra)
        self.claim(runs_sweep)
        return runs_sweep, finished_rows(runs_sweep, last)

    def write_report(self, title: str, body: str) -> None:
        """report.md in the output directory, with this command line and wall time."""
        write_report(os.path.join(self.out, "report.md"), title, command_line(), body, self.started)


def begin(cls, argv: list[str], name: str, doc: str) -> Experiment:
    """The experiment ``name`` as ``argv`` asks for it (options dataclass ``cls``: ``parse``), its
    clock started; nothing is written yet."""
    args = parse(cls, argv, name, doc)
    return Experiment(name, args, tier(args), output_path(args, name), time.time())


def main(fn) -> None:
    """Run an experiment's ``fn(argv)`` as a command: errors as one line each (exit 2), SIGINT and
    SIGTERM as exit 130 and 143 (a sweep first lets its running train.py checkpoint)."""
    def stop(signum, frame):
        raise Interrupted(signum, f"stopped by {signal.Signals(signum).name}; finished runs and results "
                                  f"are kept: run the same command again to continue")
    signal.signal(signal.SIGTERM, stop)
    sys.exit(run(noting_replaced(fn), sys.argv[1:]))


def noting_replaced(fn):
    """``fn``, whose error or stop also says where the results --overwrite was replacing are kept."""
    def command(argv):
        try:
            return fn(argv)
        except BabyGPTError as e:
            note = experimentdir.pending_note()
            raise BabyGPTError(*e.problems, *([note] if note else [])) from None
        except Interrupted as e:
            note = experimentdir.pending_note()
            raise Interrupted(e.signum, f"{e}; {note}" if note else str(e)) from None
    return command


# ---------------------------------------------------------------- experiment 2's LRs, shared
# Experiment 2's default-tier budget and LR helpers, and its record of tuned LRs, which experiments
# 6 to 11 read to train each configuration at the LR experiment 2 tuned for it.
# 400 iterations (not 500), evals every 100: the cost of ~20 runs per configuration (the LR search
# on 2 seeds, then 5 evaluation seeds).
EXP2_BUDGET = {"max_iters": 400, "eval_interval": 100}
TUNED_FILE = "tuned_lrs.json"


def config_path(name: str) -> str:
    return os.path.join(ROOT, "config", name + ".py")


def lr_overrides(lr: float, muon: bool = False) -> dict:
    """A grid point's keys: the peak LR and min_lr a tenth of it, so the schedule keeps its shape
    across the grid. ``muon``: the run trains with optimizer muon, and its Muon group takes the same
    LR (``muon_tie_problems`` says why that is one LR, not two)."""
    return {"learning_rate": lr, "min_lr": lr / 10, **({"muon_lr": lr} if muon else {})}


def resolved_keys(config: str, sets: list[str], keys: tuple[str, ...]) -> dict:
    """{key: its value for a run of ``config`` under --set ``sets``}: the --set value, else the
    config file's, else the default. A file or --set that cannot be read gives the default here;
    the sweep's own check names that problem."""
    from babygpt.config import parse_train_args

    # Only KEY=VALUE entries: a malformed one ("--set help") is named by the sweep's check, not read here
    values, _, _ = parse_train_args([config, *(f"--{s}" for s in sets if "=" in s and not s.startswith("-"))])
    return {k: values.get(k, FIELDS[k].default) for k in keys}


def muon_configurations(configs: dict, sets: list[str]) -> frozenset:
    """The names of ``configs`` ({name: config file}) that train with optimizer muon under --set ``sets``."""
    return frozenset(name for name, path in configs.items() if trains_with_muon(path, sets))


def trains_with_muon(config: str, sets: list[str]) -> bool:
    return resolved_keys(config, sets, ("optimizer",))["optimizer"] == "muon"


def muon_tie_problems(configs: list[str], sets: list[str]) -> list[str]:
    """An LR search over a configuration trained by Muon moves one LR: learning_rate (AdamW's, for the
    embeddings, head, gains and scalars) and muon_lr (the blocks' matrices) together. That is Liu et
    al. 2025 (arXiv:2502.16982, section 2.2) and their released code (MoonshotAI/Moonlight,
    examples/toy_train.py: one lr for both groups): muon_adjust_lr match_rms_adamw scales Muon's update
    to AdamW's RMS so that AdamW's LR and weight decay carry over. Under muon_adjust_lr original the
    two groups' updates have different sizes, so one LR for both would not be a choice anyone tunes:
    refused."""
    problems = []
    for config in configs:
        keys = resolved_keys(config, sets, ("optimizer", "muon_adjust_lr"))
        if keys["optimizer"] == "muon" and keys["muon_adjust_lr"] != "match_rms_adamw":
            problems.append(f"{config} trains with optimizer muon and muon_adjust_lr {keys['muon_adjust_lr']}: the "
                            f"LR search moves learning_rate and muon_lr together, which assumes Muon's update is "
                            f"sized like AdamW's; use muon_adjust_lr match_rms_adamw (--set "
                            f"muon_adjust_lr=match_rms_adamw)")
    return problems


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def lr_list_problems(text: str) -> list[str]:
    """What is wrong with an --lrs list: empty, not comma-separated numbers, an LR twice (the grid
    would silently have one point fewer), or an LR that train.py refuses (learning_rate's declared
    range, checked here before any run starts)."""
    try:
        lrs = floats(text) if text.strip() else []
    except ValueError:
        return [f"--lrs takes comma-separated numbers, e.g. 1e-3,3e-3, got {text!r}"]
    if not lrs:
        return [f"--lrs takes comma-separated learning rates, e.g. 1e-3,3e-3, got {text!r}"]
    problems = [p for p in (FIELDS["learning_rate"].valid.problem("--lrs", lr) for lr in lrs) if p]
    twice = sorted({lr for lr in lrs if lrs.count(lr) > 1})
    if twice:
        problems.append(f"--lrs lists {', '.join(f'{lr:g}' for lr in twice)} more than once; give each LR once")
    return problems


def initial_loss(run_dir: str) -> float:
    """The val loss a run measured at iteration 0, before any update."""
    from babygpt.plot import load_run  # here: plotting loads matplotlib

    rows = load_run(run_dir)["metrics"]
    first = next((r for r in rows if r.get("iter") == 0 and r.get("val_loss") is not None), None)
    if first is None:
        raise BabyGPTError(f"{run_dir} has no evaluation at iteration 0; delete it and run the experiment again")
    return first["val_loss"]


MAX_SECONDS = 3600  # an experiment whose estimated compute exceeds this is refused: its defaults take minutes
SAY_SECONDS = 30  # an experiment whose estimate exceeds this says so before it starts (as train.py's deep builds do)


def check_size(what: str, needed_bytes: int, seconds, fix: str) -> None:
    """Refuse ``what``, with the figure, when it needs more memory than is free, or an estimated
    time above MAX_SECONDS (checked before anything is written: a size that would be killed by the
    OS, or run for hours, is a typo more often than a plan); an estimate above SAY_SECONDS is said
    on stderr before the experiment starts, so that minutes of silence are expected.
    ``seconds()`` estimates the time; it is called only once the memory fits (it runs a little of
    the experiment to time it)."""
    import torch

    from babygpt.memory import memory_problem

    problem = memory_problem(needed_bytes, torch.device("cpu"), what, fix)
    if problem:
        raise BabyGPTError(problem)
    estimate = seconds()
    if estimate > MAX_SECONDS:
        raise BabyGPTError(f"{what} would take about {estimate / 3600:,.1f} hours on this machine (timed at 1 and 2 "
                           f"blocks now), more than the {MAX_SECONDS // 60} minutes an experiment here allows; {fix}")
    if estimate > SAY_SECONDS:
        print(f"{what} takes about {estimate:,.0f} s here (timed at 1 and 2 blocks now)",
              file=sys.stderr, flush=True)


def read_record(paths, configs) -> dict:
    """{"tuned": {name: LR}, "second": {name: runner-up LR}} from default-tier output directories
    (a path or a list; for each configuration, the first directory that tuned it)."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    records = []
    for path in paths:
        record = read_json(os.path.join(path, TUNED_FILE))
        if record is None and os.path.lexists(os.path.join(path, TUNED_FILE)):
            raise BabyGPTError(f"{os.path.join(path, TUNED_FILE)} is not a readable JSON object: it is damaged; "
                               f"restore it (git checkout), or run that tier again")
        if record is None:
            raise BabyGPTError(f"no {TUNED_FILE} in '{path}'; run the default tier first "
                               f"(python experiments/exp2_norm_comparison.py with the same --configs) or pass --tuned_from DIR")
        records.append(tuple(record.get(key) if isinstance(record.get(key), dict) else {}
                             for key in ("tuned", "second")))
        damaged = [(key, name, lrs[name]) for key, lrs in zip(("tuned", "second"), records[-1]) for name in configs
                   if lrs.get(name) is not None and not _is_lr(lrs[name])]
        if damaged:
            key, name, value = damaged[0]
            raise BabyGPTError(f"{os.path.join(path, TUNED_FILE)} is damaged: its {key} LR for {name} is {value!r}, "
                               f"not a learning rate train.py accepts; restore it (git checkout), or run that tier "
                               f"again")
    tuned, second = {}, {}
    for name in configs:
        found = next(((t, s) for t, s in records if isinstance(t.get(name, ""), (int, float, type(None)))), None)
        if found is not None:
            tuned[name] = found[0][name]
            if isinstance(found[1].get(name), (int, float)):
                second[name] = found[1][name]
    missing = [name for name in configs if name not in tuned]
    if missing:
        where = ", ".join(f"{p}/{TUNED_FILE}" for p in paths)
        raise BabyGPTError(f"{where} has no tuned LR for {', '.join(missing)}; run the default tier with these "
                           f"configurations first")
    return {"tuned": tuned, "second": second}


def _is_lr(value) -> bool:
    """A number train.py takes as learning_rate (its declared range)."""
    return type(value) in (int, float) and FIELDS["learning_rate"].valid.problem("learning_rate", value) is None


def read_tuned(path: str, configs) -> dict:
    """The tuned LR of each configuration from a default-tier output directory (None: all diverged)."""
    return read_record(path, configs)["tuned"]
