"""Run many trainings: a list of config overrides x seeds, each a separate train.py process.

Each run gets its own ``out_dir`` under ``<root>/runs/<name>`` and a log under
``<root>/logs/<name>.log``. A run whose ``summary.json`` says it finished or diverged
is not run again, and one that was killed resumes from its checkpoint, so a killed
sweep picks up where it stopped when started again. ``results.csv`` collects one row per
run, read from each run's ``summary.json`` and ``config.json``.

Before any run starts, every run's settings are checked (as train.py would check them) along
with what is already on disk: damaged records, runs made with other settings, and run
directories still held by a live train.py (e.g. one orphaned by a sweep that was killed).
SIGINT or SIGTERM to the sweep is passed on to the runs in progress, which checkpoint and stop;
no new run starts, and the sweep exits 130 or 143. Run it again to resume.
"""

from __future__ import annotations

import csv
import hashlib
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

from tqdm import tqdm

from .config import FIELDS, TrainConfig, load_config, to_dict, with_resolved_dtype
from .errors import BabyGPTError, Interrupted
from .options import option, parse_into
from .rundir import RunDir, RunLock, read_json, read_record
from .signals import signal_name
from .state import COMPLETED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")
DONE = (*COMPLETED, "diverged")
MAX_NAME = 200  # bytes of a run's directory name; longer names are cut and given a hash
COLUMNS = ["name", "seed", "status", "exit_code", "diverged_at", "first_nonfinite_at", "iter",
           "final_train_loss", "final_val_loss", "best_val_loss", "val_loss_full", "val_time_full_s", "wall_time_s",
           "num_params", "out_dir"]


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass
class Run:
    overrides: dict  # config key -> value
    seed: int
    config: str | None = None  # an optional config file, applied before the overrides
    label: str = ""  # what the run is called in tables; defaults to the overrides
    name: str = field(init=False)

    def __post_init__(self):
        unknown = [k for k in self.overrides if k not in FIELDS]
        if unknown:
            raise BabyGPTError(f"unknown config key(s) in sweep: {', '.join(unknown)}")
        parts = [f"{k}={_fmt(v)}" for k, v in self.overrides.items()]
        if self.config:
            parts.insert(0, os.path.splitext(os.path.basename(self.config))[0])
        self.label = self.label or ",".join(parts) or "default"
        name = "__".join([*parts, f"seed={self.seed}"]).replace("/", "_")
        raw = os.fsencode(name)  # the bytes the filesystem sees (surrogate-escaped names included)
        if len(raw) > MAX_NAME:  # a directory name must fit the filesystem (255 bytes)
            digest = hashlib.sha1(raw).hexdigest()[:12]
            name = os.fsdecode(raw[:MAX_NAME - 32]) + f"__{digest}__seed={self.seed}"
        self.name = name


def grid(axes: dict[str, list]) -> list[dict]:
    """The cartesian product of ``{key: [values]}`` as a list of override dicts."""
    combos: list[dict] = [{}]
    for key, values in axes.items():
        combos = [{**c, key: v} for c in combos for v in values]
    return combos


class Sweep:
    def __init__(self, root: str, runs: list[Run], base_args: list[str] = (), jobs: int = 1):
        names = [r.name for r in runs]
        if len(set(names)) != len(names):
            raise BabyGPTError("the sweep lists the same run twice")
        self.root, self.runs, self.base_args, self.jobs = root, runs, list(base_args), jobs
        self._stop: int | None = None  # the signal the sweep was asked to stop by
        self._children: dict[int, subprocess.Popen] = {}  # pid -> running train.py
        self._signalled: dict[int, object] = {}  # pids already sent the stop signal (once each)

    def out_dir(self, run: Run) -> str:
        return os.path.join(self.root, "runs", run.name)

    def status(self, run: Run) -> str | None:
        summary = read_json(os.path.join(self.out_dir(run), "summary.json"))
        return summary.get("status") if summary else None

    def _config_args(self, run: Run) -> list[str]:
        """[CONFIG.py] --key=value ... : the run's settings, without where it runs."""
        args = [run.config] if run.config else []
        return args + self.base_args + [f"--{k}={_fmt(v)}" for k, v in run.overrides.items()] + \
            [f"--seed={run.seed}"]

    def _command(self, run: Run) -> list[str]:
        out = self.out_dir(run)
        resume = os.path.exists(os.path.join(out, "ckpt.pt"))  # a killed or interrupted run
        return [sys.executable, TRAIN_PY, *self._config_args(run), f"--out_dir={out}",
                f"--init_from={'resume' if resume else 'scratch'}"]

    # ------------------------------------------------------------- checks before any run starts

    def check(self, on_disk: bool = True) -> None:
        """Every problem that would make a run fail or mix wrong results into the table, found
        before anything runs: bad keys or values (as train.py would report them, once each), and
        (``on_disk``) damaged or foreign records, and run directories a live process holds."""
        problems = self._base_arg_problems()
        if problems:  # (a malformed --set, e.g. --set help, must not reach train.py's parser)
            raise BabyGPTError(*problems)
        for run in self.runs:
            try:
                wanted = load_config(self._config_args(run))
                if on_disk:
                    self._check_on_disk(run, wanted)
            except BabyGPTError as e:
                problems += [p for p in e.problems if p not in problems]
        if problems:
            raise BabyGPTError(*problems)

    def _base_arg_problems(self) -> list[str]:
        """Base arguments that are not --KEY=VALUE (e.g. a --set help)."""
        return [f"malformed --set '{arg[2:]}'; write --set key=value" for arg in self.base_args
                if not (arg.startswith("--") and arg[2:].partition("=")[0] and "=" in arg)]

    def _check_on_disk(self, run: Run, wanted) -> None:
        out = self.out_dir(run)
        if not os.path.isdir(out):
            return
        holder = RunLock(out).holder()
        if holder is not None:
            raise BabyGPTError(f"{out} is being trained by process {holder or '(unknown)'}, not by this sweep "
                               f"(left running by a sweep that was killed?); wait for it or stop it, then "
                               f"run the sweep again")
        rundir = RunDir(out)
        read_record(rundir.summary, ("status",))
        info = read_record(rundir.config, ("config",))
        if os.path.exists(rundir.ckpt):
            rundir.check("resume")  # a resumable run: its metrics must be readable too
        if info is not None:
            self._check_same_settings(run, info, to_dict(with_resolved_dtype(wanted)))

    def _check_same_settings(self, run: Run, info: dict, wanted: dict) -> None:
        """A run already on disk must have been made with the settings asked for now; otherwise
        its results would be silently mixed into a table that claims other settings."""
        latest = (info.get("resumes") or [info])[-1]  # the settings of its latest start
        had = latest.get("config") if isinstance(latest, dict) else None
        if not isinstance(had, dict):
            raise BabyGPTError(f"{self.out_dir(run)}/config.json is damaged (no settings in its last resume "
                               f"record); move that run directory aside to run it again")
        # A key missing there is a field added since that run was made; it ran as that field's default
        # (a new field defaults to the behaviour from before it existed: init, adam_eps, z_loss, ...).
        defaults = to_dict(TrainConfig())
        diffs = [k for k in wanted if k not in ("out_dir", "init_from") and had.get(k, defaults.get(k)) != wanted[k]]
        if diffs:
            shown = ", ".join(f"{k}={had.get(k)!r} there, {wanted[k]!r} now" for k in diffs[:4])
            raise BabyGPTError(f"{self.out_dir(run)} was run with other settings ({shown}); "
                               f"use another --out, or delete that directory to run it again")

    # ------------------------------------------------------------- running

    def _execute(self, run: Run) -> int | None:
        """Run one train.py to its end; None if the sweep was stopped before it started."""
        if self._stop:
            return None
        os.makedirs(os.path.join(self.root, "logs"), exist_ok=True)
        env = dict(os.environ)
        if self.jobs > 1:  # share the cores instead of oversubscribing them
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.jobs)))
        with open(os.path.join(self.root, "logs", run.name + ".log"), "a", encoding="utf-8") as log:
            # Its own session: a Ctrl-C in the terminal reaches the sweep only, which passes it on
            # once (a second signal would make train.py die at once, without its checkpoint).
            child = subprocess.Popen(self._command(run), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            self._children[child.pid] = child
            try:
                if self._stop:  # the signal came while it was starting
                    self._pass_on(child, self._stop)
                return child.wait()
            finally:
                del self._children[child.pid]

    def _pass_on(self, child: subprocess.Popen, signum: int) -> None:
        """Send ``signum`` to ``child`` unless it was sent one already (by the handler or by the
        worker thread that started it: setdefault decides atomically which of them sends)."""
        token = object()
        if self._signalled.setdefault(child.pid, token) is token and child.poll() is None:
            child.send_signal(signum)

    def _on_signal(self, signum, frame) -> None:
        self._stop = self._stop or signum
        for child in list(self._children.values()):
            self._pass_on(child, self._stop)

    def run(self, progress: bool = True) -> list[dict]:
        """Check everything, run what is not done yet, then write and return the results rows.
        Raises Interrupted (after the runs in progress have checkpointed) on SIGINT/SIGTERM."""
        self.check()
        todo = [r for r in self.runs if self.status(r) not in DONE]
        codes: dict[str, int] = {}
        handling = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if handling else {}
        try:
            with tqdm(total=len(self.runs), initial=len(self.runs) - len(todo), desc="runs", unit="run",
                      disable=not progress, dynamic_ncols=True) as bar:
                with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                    for run, code in zip(todo, pool.map(self._execute, todo)):
                        if code is not None:
                            codes[run.name] = code
                            bar.update(1)
                            bar.set_postfix_str(f"{run.name}: {self.status(run) or f'exit {code}'}")
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if self._stop:
            stopped = sum(1 for code in codes.values() if code == 128 + self._stop)
            raise Interrupted(self._stop, f"sweep stopped by {signal_name(self._stop)}: {stopped} run(s) in "
                                          f"progress saved a checkpoint; run the same command again to resume")
        rows = [self.result(r, codes.get(r.name)) for r in self.runs]
        self.write_csv(rows)
        return rows

    def result(self, run: Run, exit_code: int | None) -> dict:
        out = self.out_dir(run)
        summary = read_json(os.path.join(out, "summary.json")) or {}
        info = read_json(os.path.join(out, "config.json")) or {}
        row = {"name": run.name, "label": run.label, "seed": run.seed, "exit_code": exit_code,
               "status": summary.get("status", "failed"), "num_params": info.get("num_params"),
               "out_dir": out}
        for key in COLUMNS:
            row.setdefault(key, summary.get(key))
        row.update({f"cfg.{k}": v for k, v in run.overrides.items()})
        return row

    def write_csv(self, rows: list[dict]) -> str:
        path = os.path.join(self.root, "results.csv")
        os.makedirs(self.root, exist_ok=True)
        keys = ["label", *COLUMNS] + sorted({k for r in rows for k in r if k.startswith("cfg.")})
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        return path


def ignored_set_problems(sets: list[str], runs: list[Run]) -> list[str]:
    """Problems for --set KEY=VALUE options whose key every run sets itself (the seed, the run
    directory, or a grid axis): they would be silently replaced."""
    own = {"seed": "--seeds", "out_dir": "--out", "init_from": "the sweep"}
    for run in runs:
        own.update({key: "the sweep's own grid" for key in run.overrides})
    keys = dict.fromkeys(s.partition("=")[0] for s in sets)
    return [f"--set {key} has no effect: each run's {key} is set by {own[key]}" for key in keys if key in own]


def _is_int(text: str) -> bool:
    try:
        int(text.strip())
    except ValueError:
        return False
    return text.strip().lstrip("-").isascii()  # int() also reads other scripts' digits


def parse_value(text: str):
    """A grid value from the command line: int, float, true/false, none, or a string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass
class SweepOptions:
    """experiments/sweep.py's command line."""

    config: Optional[str] = option(None, "config file applied to every run", positional=True, metavar="CONFIG.py")
    grid: list[str] = option([], "one grid axis, KEY=V1,V2,... (repeatable)")
    set: list[str] = option([], "KEY=VALUE fixed for every run (repeatable)")
    seeds: str = option("0", "comma-separated seeds")
    jobs: int = option(1, "runs in parallel")
    out: str = option("results/sweep", "sweep directory")

    def axes(self) -> dict[str, list]:
        """{key: [values]} of the --grid options (well-formed: see problems)."""
        return {key: [parse_value(v) for v in values.split(",")]
                for key, _, values in (spec.partition("=") for spec in self.grid)}

    def seed_list(self) -> list[int]:
        return [int(s) for s in self.seeds.split(",")]

    def problems(self) -> list[str]:
        problems = [f"malformed --grid '{spec}'; write --grid key=value1,value2"
                    for spec in self.grid if not spec.partition("=")[2]]
        keys = [spec.partition("=")[0] for spec in self.grid]
        problems += [f"--grid {key} is given {keys.count(key)} times; list all its values in one --grid {key}=..."
                     for key in dict.fromkeys(keys) if keys.count(key) > 1]
        if not all(_is_int(s) for s in self.seeds.split(",")):
            problems.append(f"--seeds must be comma-separated integers, got '{self.seeds}'")
        if self.jobs < 1:
            problems.append(f"--jobs must be at least 1, got {self.jobs}")
        if self.config and not os.path.exists(self.config):
            problems.append(f"config file '{self.config}' not found; check the path")
        return problems


SWEEP_USAGE = "python experiments/sweep.py [CONFIG.py] --grid KEY=V1,V2 [--grid ...] [--seeds 0,1,2] [--out DIR]"
SWEEP_EXAMPLE = ("example: python experiments/sweep.py config/prenorm_rms.py --grid norm_type=layernorm,rmsnorm "
                 "--grid learning_rate=1e-3,3e-3 --seeds 0,1,2 --set max_iters=500 --out results/my_sweep")


def main(argv: list[str]) -> int:
    args = parse_into(SweepOptions, argv, SWEEP_USAGE,
                      "Run train.py over a grid of config overrides x seeds.\n" + SWEEP_EXAMPLE)
    axes, seeds = args.axes(), args.seed_list()
    base = [f"--{s}" for s in args.set]
    runs = [Run(o, seed, args.config) for o in grid(axes) for seed in seeds]
    ignored = ignored_set_problems(args.set, runs)
    if ignored:
        raise BabyGPTError(*ignored)
    rows = Sweep(args.out, runs, base, args.jobs).run()
    failed = [r for r in rows if r["status"] not in DONE]
    for r in rows:
        print(f"{r['name']}: {r['status']}, final val {r['final_val_loss']}, best val {r['best_val_loss']}")
    print(f"results: {os.path.join(args.out, 'results.csv')}")
    if failed:
        logs = os.path.join(args.out, "logs")
        raise BabyGPTError(f"{len(failed)} run(s) failed (e.g. {failed[0]['name']}); see {logs}/")
    return 0
