"""Run many trainings: a list of config overrides x seeds, each a separate train.py process.

Each run gets its own ``out_dir`` under ``<root>/runs/<name>`` and a log under
``<root>/logs/<name>.log``. A run whose ``summary.json`` says it finished or diverged
is not run again, and one that was killed resumes from its checkpoint, so a killed
sweep picks up where it stopped when started again. ``results.csv`` collects one row per
run, read from each run's ``summary.json`` and ``config.json``.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

from tqdm import tqdm

from .config import FIELDS, load_config, to_dict, with_resolved_dtype
from .errors import BabyGPTError
from .options import option, parse_into
from .rundir import read_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")
DONE = ("finished", "diverged")
COLUMNS = ["name", "seed", "status", "exit_code", "diverged_at", "first_nonfinite_at", "iter",
           "final_train_loss", "final_val_loss", "best_val_loss", "wall_time_s", "num_params", "out_dir"]


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
        self.name = "__".join([*parts, f"seed={self.seed}"]).replace("/", "_")


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

    def out_dir(self, run: Run) -> str:
        return os.path.join(self.root, "runs", run.name)

    def status(self, run: Run) -> str | None:
        summary = read_json(os.path.join(self.out_dir(run), "summary.json"))
        return summary["status"] if summary else None

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

    def _execute(self, run: Run) -> int:
        os.makedirs(os.path.join(self.root, "logs"), exist_ok=True)
        env = dict(os.environ)
        if self.jobs > 1:  # share the cores instead of oversubscribing them
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.jobs)))
        with open(os.path.join(self.root, "logs", run.name + ".log"), "a", encoding="utf-8") as log:
            return subprocess.run(self._command(run), stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env).returncode

    def _check_same_settings(self, run: Run) -> None:
        """A run already on disk must have been made with the settings asked for now; otherwise
        its results would be silently mixed into a table that claims other settings."""
        info = read_json(os.path.join(self.out_dir(run), "config.json"))
        if info is None:
            return
        wanted = to_dict(with_resolved_dtype(load_config(self._config_args(run))))  # as config.json has it
        had = (info.get("resumes") or [info])[-1]["config"]  # the settings of its latest start
        diffs = [k for k in wanted if k not in ("out_dir", "init_from") and had.get(k) != wanted[k]]
        if diffs:
            shown = ", ".join(f"{k}={had.get(k)!r} there, {wanted[k]!r} now" for k in diffs[:4])
            raise BabyGPTError(f"{self.out_dir(run)} was run with other settings ({shown}); "
                               f"use another --out, or delete that directory to run it again")

    def run(self, progress: bool = True) -> list[dict]:
        """Run what is not done yet, then write and return the results rows."""
        for run in self.runs:
            self._check_same_settings(run)
        todo = [r for r in self.runs if self.status(r) not in DONE]
        codes: dict[str, int] = {}
        with tqdm(total=len(self.runs), initial=len(self.runs) - len(todo), desc="runs", unit="run",
                  disable=not progress, dynamic_ncols=True) as bar:
            with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                for run, code in zip(todo, pool.map(self._execute, todo)):
                    codes[run.name] = code
                    bar.update(1)
                    bar.set_postfix_str(f"{run.name}: {self.status(run) or f'exit {code}'}")
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
        if not all(s.strip().lstrip("-").isdigit() for s in self.seeds.split(",")):
            problems.append(f"--seeds must be comma-separated integers, got '{self.seeds}'")
        if self.jobs < 1:
            problems.append(f"--jobs must be at least 1, got {self.jobs}")
        if self.config and not os.path.isfile(self.config):
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
    rows = Sweep(args.out, runs, base, args.jobs).run()
    failed = [r for r in rows if r["status"] not in DONE]
    for r in rows:
        print(f"{r['name']}: {r['status']}, final val {r['final_val_loss']}, best val {r['best_val_loss']}")
    print(f"results: {os.path.join(args.out, 'results.csv')}")
    if failed:
        logs = os.path.join(args.out, "logs")
        raise BabyGPTError(f"{len(failed)} run(s) failed (e.g. {failed[0]['name']}); see {logs}/")
    return 0
