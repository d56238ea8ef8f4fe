"""A sweep's directory: its runs, what each was asked to be, and what each left on disk.

``<root>/runs/<name>`` is a run's ``out_dir`` and ``<root>/logs/<name>.log`` its log; a run that is
over (state.ENDED: finished, collapsed, skipped_out, diverged) is done, and its records move into the
sweep's store, one line of ``<root>/runs.jsonl`` (babygpt.runstore), which is what a clone carries.
``results.csv`` collects one row per run, read from its records. Before
anything runs, every run's settings are checked (as train.py would check them) along with what is
on disk: damaged records, runs made with other settings, and run directories still held by a live
train.py that no sweep process claims (e.g. one orphaned by a sweep that was killed).

A run's name says what the sweep varies, not the settings every run shares (--set, the contents
of its config file), so the directory binds each name to its whole settings from the first write:
``<root>/run_settings/<name>.json``, created exclusively. A second sweep (or a shard) that wants
other settings under the same name is refused before it trains or waits on anything, even while
the first is still running. Running the runs is babygpt.sweep's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field

from .config import FIELDS, changed_settings, load_config, read_config_file, to_dict, with_resolved_dtype
from .errors import BabyGPTError
from .files import user_error, write_csv
from .rundir import RunDir, RunLock, latest_config, read_json, read_record, read_summary
from .runstore import RunStore, pack, run_info, run_summary
from .runtime import auto_dtypes, machine_label
from .scaleout import claim
from .state import ENDED

DONE = ENDED
BINDINGS = "run_settings"  # <root>/run_settings/<run name>.json: the settings each run name is bound to
NOT_COMPARED = ("out_dir", "init_from")  # where a run lives and how it starts, not what it is
MAX_NAME = 200  # bytes of a run's directory name; longer names are cut and given a hash
COLUMNS = ["name", "seed", "status", "exit_code", "diverged_at", "first_nonfinite_at", "iter",
           "final_train_loss", "final_val_loss", "best_val_loss", "val_loss_full", "val_time_full_s", "tune_loss",
           "test_loss", "wall_time_s",
           "num_params", "machine", "out_dir"]


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
            base = os.path.splitext(os.path.basename(self.config))[0]
            # A run that overrides what its config file sets is not that config (prenorm_rms with
            # norm_type=layernorm is a LayerNorm run): its name leads with the overrides instead.
            replaced = set(self.overrides) & config_keys(self.config)
            parts = [*parts, f"from={base}"] if replaced else [base, *parts]
        self.label = self.label or ",".join(parts) or "default"
        name = "__".join([*parts, f"seed={self.seed}"]).replace("/", "_")
        raw = os.fsencode(name)  # the bytes the filesystem sees (surrogate-escaped names included)
        if len(raw) > MAX_NAME:  # a directory name must fit the filesystem (255 bytes)
            digest = hashlib.sha1(raw).hexdigest()[:12]
            name = os.fsdecode(raw[:MAX_NAME - 32]) + f"__{digest}__seed={self.seed}"
        self.name = name


def config_keys(path: str) -> set[str]:
    """The keys a config file sets; none where it cannot be read (SweepDir.check reports that)."""
    try:
        return set(read_config_file(path))
    except (BabyGPTError, OSError):
        return set()


def grid(axes: dict[str, list]) -> list[dict]:
    """The cartesian product of ``{key: [values]}`` as a list of override dicts."""
    combos: list[dict] = [{}]
    for key, values in axes.items():
        combos = [{**c, key: v} for c in combos for v in values]
    return combos


class SweepDir:
    """The runs of a sweep in ``root``: where each lives, its status, the checks, the results table."""

    def __init__(self, root: str, runs: list[Run], base_args: list[str] = (), collect: bool = False):
        names = [r.name for r in runs]
        if len(set(names)) != len(names):
            raise BabyGPTError("the sweep lists the same run twice")
        self.root, self.runs, self.base_args = root, runs, list(base_args)
        # Only reading runs made elsewhere (--collect): dtype=auto means what it meant on the device
        # each run was made on, not on this machine (GPU runs are collected on a laptop).
        self.collect = collect
        self.store = RunStore(root)

    def out_dir(self, run: Run) -> str:
        return os.path.join(self.root, "runs", run.name)

    def status(self, run: Run) -> str | None:
        """The run's status (state.STATUSES): its stored one, else its directory's summary.json; None
        if it has none yet. A damaged record is refused by name."""
        stored = self.store.get(run.name)
        summary = stored["summary"] if stored else read_summary(os.path.join(self.out_dir(run), "summary.json"))
        return summary["status"] if summary else None

    def pack(self, run: Run) -> None:
        """Store the run's records if it is over and not stored yet (its directory stays: working space)."""
        if self.store.get(run.name) is None and os.path.isdir(self.out_dir(run)):
            record = pack(self.out_dir(run), run.name)
            if record is not None:
                self.store.add(record)

    def pack_finished(self) -> None:
        """Store every run that is over but not stored (e.g. one that ended as its sweep was killed)."""
        for run in self.runs:
            self.pack(run)

    def binding(self, run: Run) -> str:
        return os.path.join(self.root, BINDINGS, run.name + ".json")

    def _config_args(self, run: Run) -> list[str]:
        """[CONFIG.py] --key=value ... : the run's settings, without where it runs, each key once (train.py
        refuses a key given twice): a later argument replaces an earlier one of its key, as an
        experiment's --set replaces its tier's budget (the run's own keys and seed, last, replace both)."""
        keyed = {}
        for arg in [*self.base_args, *(f"--{k}={_fmt(v)}" for k, v in run.overrides.items()), f"--seed={run.seed}"]:
            keyed[arg.partition("=")[0]] = arg
        return ([run.config] if run.config else []) + list(keyed.values())

    # ------------------------------------------------------------- checks before any run starts

    def check(self, on_disk: bool = True) -> None:
        """Every problem that would make a run fail or mix wrong results into the table, found
        before anything runs: bad keys or values (as train.py would report them, once each), and
        (``on_disk``) damaged or foreign records, runs bound to other settings, and run directories
        a live process holds. Writes nothing."""
        problems = self._base_arg_problems()
        if problems:  # (a malformed --set, e.g. --set help, must not reach train.py's parser)
            raise BabyGPTError(*problems)
        self._wanted = {}
        for run in self.runs:
            try:
                wanted = load_config(self._config_args(run))
                if not self.collect:  # a run trained here gets this machine's dtype
                    wanted = with_resolved_dtype(wanted)
                self._wanted[run.name] = {k: v for k, v in to_dict(wanted).items() if k not in NOT_COMPARED}
                if on_disk:
                    self._check_on_disk(run)
            except BabyGPTError as e:
                problems += [p for p in e.problems if p not in problems]
        if problems:
            raise BabyGPTError(*problems)

    def _base_arg_problems(self) -> list[str]:
        """Base arguments that are not --KEY=VALUE (e.g. a --set help)."""
        return [f"malformed --set '{arg[2:]}'; write --set key=value" for arg in self.base_args
                if not (arg.startswith("--") and arg[2:].partition("=")[0] and "=" in arg)]

    def _check_on_disk(self, run: Run) -> None:
        self._check_binding(run)  # first: a run another process is training is bound too
        stored = self.store.get(run.name)
        if stored is not None:  # over: what its directory holds, if anything, is no longer read
            self._check_same_settings(run, stored["config"])
            return
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
        read_summary(rundir.summary)
        info = read_record(rundir.config, ("config",))
        if os.path.exists(rundir.ckpt):
            rundir.check("resume")  # a resumable run: its metrics must be readable too
        if info is not None:
            self._check_same_settings(run, info)

    def _check_same_settings(self, run: Run, info: dict) -> None:
        """A run already on disk must have been made with the settings asked for now; otherwise
        its results would be silently mixed into a table that claims other settings."""
        had = latest_config(info)
        if had is None:
            raise BabyGPTError(f"{self.out_dir(run)}/config.json is damaged (no settings in its last resume "
                               f"record); move that run directory aside to run it again")
        shown = self._differences(had, self._wanted[run.name], info.get("device"))
        if shown and self.store.get(run.name) is not None:
            raise BabyGPTError(f"{self.store.path} holds the run {run.name} with other settings ({shown}); use "
                               f"another --out, or delete its line to run it again")
        if shown:
            raise BabyGPTError(f"{self.out_dir(run)} was run with other settings ({shown}); "
                               f"use another --out, or delete that directory to run it again")

    @staticmethod
    def _differences(had: dict, wanted: dict, device: str | None = None) -> str:
        """"learning_rate=0.002 there, 0.001 now, ..." for the first four keys whose values differ
        (config.changed_settings); "" if none do. A dtype still ``auto`` (--collect) matches the
        dtypes auto gives on the ``device`` the run was made on (any device's, if not known)."""
        if wanted.get("dtype") == "auto" and had.get("dtype") in auto_dtypes(device):
            wanted = {**wanted, "dtype": had["dtype"]}
        return ", ".join(f"{k}={old!r} there, {new!r} now" for k, old, new in changed_settings(had, wanted)[:4])

    def check_made_alike(self) -> None:
        """--collect: the runs of one table were made on one kind of device in one dtype (a GPU's
        bfloat16 and a CPU's float32 land a few thousandths apart), else they are refused by kind."""
        kinds: dict[tuple[str, str], str] = {}
        for run in self.runs:
            info = run_info(self.out_dir(run)) or {}
            device, dtype = str(info.get("device")).split(":")[0], (latest_config(info) or {}).get("dtype")
            kinds.setdefault((device, dtype), run.name)
        if len(kinds) > 1:
            shown = "; ".join(f"{dtype} on {device} (e.g. {name})" for (device, dtype), name in kinds.items())
            raise BabyGPTError(f"{self.root} mixes runs made on different devices or dtypes: {shown}; a table "
                               f"compares runs made alike: move the odd runs aside and train them again where "
                               f"the others were made")

    def _check_binding(self, run: Run) -> None:
        """Refuse settings other than those the run's name is bound to in this directory."""
        path = self.binding(run)
        if not os.path.exists(path):
            return
        had = read_json(path)
        if had is None:
            raise BabyGPTError(f"{path} is damaged (not a JSON object); delete it if no sweep is running in "
                               f"{self.root}, then run the sweep again")
        shown = self._differences(had, self._wanted[run.name])
        if shown:
            raise BabyGPTError(f"{self.root} holds the run {run.name} with other settings ({shown}): another "
                               f"sweep made or is making it; use another --out for these settings (nothing was "
                               f"changed)")

    def bind(self) -> None:
        """Bind every run's name to the settings ``check`` found for it (each binding created
        exclusively: of two sweeps that race for a name, one binds it and the other compares). A
        conflict is refused, and the bindings this call made are taken back."""
        made, directory = [], os.path.join(self.root, BINDINGS)
        new_directory = not os.path.isdir(directory)
        try:
            for run in self.runs:
                if self._create_binding(run):
                    made.append(self.binding(run))
        except BaseException:
            for path in made:
                os.remove(path)
            if new_directory:
                with contextlib.suppress(OSError):  # (only if empty: another sweep may have bound runs)
                    os.rmdir(directory)
            raise

    def _create_binding(self, run: Run) -> bool:
        """Bind ``run`` (True), or compare it with its binding if it has one (False)."""
        path = self.binding(run)
        if os.path.exists(path):
            self._check_binding(run)
            return False
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        except OSError as e:
            raise user_error(e, path) from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self._wanted[run.name], f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)  # fails if the name is bound already: the whole file, or nothing
        except FileExistsError:
            self._check_binding(run)
            return False
        except OSError as e:
            raise user_error(e, path) from None
        finally:
            os.remove(tmp)
        return True

    def result(self, run: Run, exit_code: int | None) -> dict:
        out = self.out_dir(run)
        summary = run_summary(out) or {}
        info = run_info(out) or {}
        row = {"name": run.name, "label": run.label, "seed": run.seed, "exit_code": exit_code,
               "status": summary.get("status", "failed"), "num_params": info.get("num_params"),
               "machine": machine_label(summary.get("machine")) if summary else None, "out_dir": out}
        for key in COLUMNS:
            row.setdefault(key, summary.get(key))
        row.update({f"cfg.{k}": v for k, v in run.overrides.items()})
        return row

    def write_csv(self, rows: list[dict]) -> str:
        path = os.path.join(self.root, "results.csv")
        os.makedirs(self.root, exist_ok=True)
        keys = ["label", *COLUMNS] + sorted({k for r in rows for k in r if k.startswith("cfg.")})
        write_csv(path, keys, rows)
        return path
