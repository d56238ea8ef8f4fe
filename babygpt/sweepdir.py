"""A sweep's directory: its runs, what each was asked to be, and what each left on disk.

``<root>/runs/<name>`` is a run's ``out_dir`` and ``<root>/logs/<name>.log`` its log; a run whose
``summary.json`` says it finished or diverged is done. ``results.csv`` collects one row per run,
read from its ``summary.json`` and ``config.json``. Before anything runs, every run's settings are
checked (as train.py would check them) along with what is on disk: damaged records, runs made with
other settings, and run directories still held by a live train.py that no sweep process claims
(e.g. one orphaned by a sweep that was killed). Running the runs is babygpt.sweep's.
"""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass, field

from .config import FIELDS, TrainConfig, load_config, to_dict, with_resolved_dtype
from .errors import BabyGPTError
from .rundir import RunDir, RunLock, read_json, read_record
from .scaleout import claim
from .state import COMPLETED

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


class SweepDir:
    """The runs of a sweep in ``root``: where each lives, its status, the checks, the results table."""

    def __init__(self, root: str, runs: list[Run], base_args: list[str] = ()):
        names = [r.name for r in runs]
        if len(set(names)) != len(names):
            raise BabyGPTError("the sweep lists the same run twice")
        self.root, self.runs, self.base_args = root, runs, list(base_args)

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
        if claim(self.root, run.name).holder() is not None:
            return  # another process of this sweep (a shard) is training it, and checked it
        holder = RunLock(out).holder()  # (probed only when unclaimed: a claimed run's train.py may be taking it)
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
