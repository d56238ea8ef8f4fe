"""A sweep's finished runs, one line each in ``<root>/runs.jsonl``: the records a clone carries.

A run trains in its own directory ``<root>/runs/<name>/`` (babygpt.rundir: config.json,
metrics.jsonl, summary.json, checkpoints, lock); that directory is working space and is not
committed. Once the run is over (state.ENDED), the sweep appends one line to the store:

  {"format": 3, "name": NAME, "source": {"commit", "dirty", ...},
   "config": <config.json>, "summary": <summary.json>, "metrics": [<metrics.jsonl rows>]}

The three files are kept whole, so a run's directory can be written back from its line byte for
byte (``files``); ``source`` names the code that made the run (provenance.source; for records made
before runs named their commit, the converter infers it from git, and says so). The store is only
appended to (under an exclusive flock, so shards on one filesystem can share it), a run at most
once; a sweep reads a run from its line when there is one, and from its directory otherwise. A
path ``<root>/runs/<name>`` (results.csv's out_dir column) names the run either way: ``load_run``
reads it from wherever it is.

``python -m babygpt.runstore DIR...`` moves the run directories under each DIR into their
sweeps' stores (checked: every file written back from the store equals the original byte for byte
before the original is deleted); runs not yet over are left where they are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .config import FIELDS, convert as convert_setting
from .errors import BabyGPTError, unknown_choice
from .files import user_error
from .model import INITS, PLACEMENTS, RESIDUAL_GATES
from .norms import NORMS
from .provenance import ROOT, RUN_RECORD_FORMAT
from .rundir import RunDir, latest_config, read_record, read_summary
from .state import ENDED, is_finite_number, summary_problems

try:
    import fcntl
except ImportError:  # Windows: appends are not protected from each other there
    fcntl = None

STORE = "runs.jsonl"
RUNS_DIR = "runs"
STORE_FORMAT = 3  # a line's layout (1 and 2 are config.json's: see provenance.RUN_RECORD_FORMAT)
FILES = ("config.json", "summary.json", "metrics.jsonl")


def _dump(obj) -> str:
    """A record file's text as rundir writes it (write_json: indent 2 and a newline)."""
    return json.dumps(obj, indent=2) + "\n"


def files(record: dict) -> dict[str, str]:
    """{file name: its text} of a stored run's directory, as the run wrote them."""
    return {"config.json": _dump(record["config"]), "summary.json": _dump(record["summary"]),
            "metrics.jsonl": "".join(json.dumps(row) + "\n" for row in record["metrics"])}


def record_problem(record) -> str | None:
    """What makes a store line not one this module writes, or None."""
    if not isinstance(record, dict) or record.get("format") != STORE_FORMAT:
        return f"not a format-{STORE_FORMAT} run record"
    name = record.get("name")
    problem = name_problem(name)
    if problem:
        return problem
    if not isinstance(record.get("config"), dict):
        return f"{name}: no settings in its config"
    problem = config_problem(record["config"])
    if problem:
        return f"{name}'s config.json: {problem}"
    if not isinstance(record.get("summary"), dict) or summary_problems(record["summary"]):
        return f"{name}: its summary is damaged"
    if record["summary"]["status"] not in ENDED:
        return f"{name}: a run that is not over ({record['summary']['status']})"
    problem = summary_fields_problem(record["summary"])
    if problem:
        return f"{name}'s summary.json: {problem}"
    metrics = record.get("metrics")
    if not isinstance(metrics, list) or not all(isinstance(r, dict) and type(r.get("iter")) is int for r in metrics):
        return f"{name}: its metrics are not rows"
    problem = metrics_problem(metrics)
    if problem:
        return f"{name}'s metrics.jsonl: {problem}"
    if not isinstance(record.get("source"), dict):
        return f"{name}: no source"
    return None


def name_problem(name) -> str | None:
    """Why ``name`` cannot name a stored run, or None. Its directory is ``<root>/runs/<name>`` (where
    a run's files are read and written back), so a name is one plain path component: a separator or
    a ``..`` would reach outside the sweep."""
    if not isinstance(name, str) or not name:
        return "no run name"
    if name in (".", "..") or "\0" in name or any(sep in name for sep in ("/", os.sep, os.altsep) if sep):
        return f"its name {name!r} is not a run name (one path component, not '.' or '..', without '/' or NUL)"
    return None


def _brief(value) -> str:
    """``value`` as a message quotes it: its repr, cut to 40 characters (a record's field may be huge)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def config_problem(info: dict) -> str | None:
    """What makes ``info`` (a run's config.json) not one a run of this code wrote, or None: a format
    this code does not know, resumes that are not a list, no settings, a num_params that is not a
    count, or settings no config could have (``settings_problem``)."""
    version = info.get("format", 1)  # (format 1 records predate the key)
    if type(version) is not int or not 1 <= version <= RUN_RECORD_FORMAT:
        return f"its format {_brief(version)} is none this code reads (1 to {RUN_RECORD_FORMAT})"
    if not isinstance(info.get("resumes", []), list):
        return f"its resumes is {type(info['resumes']).__name__}, not a list of starts"
    settings = latest_config(info)
    if settings is None:
        return "no settings in its last start"
    if info.get("num_params") is not None and type(info["num_params"]) is not int:
        return f"its num_params is {_brief(info['num_params'])}, not a whole number"
    return settings_problem(settings)


# The keys whose values are names from a registry, with the names a run may have used.
CHOICES = {"norm_type": NORMS, "norm_placement": PLACEMENTS, "init": INITS, "residual_gate": RESIDUAL_GATES}


def settings_problem(settings: dict) -> str | None:
    """The first setting of a run's config.json ("config") that no run could have had, or None: a
    value that does not convert to its key's declared type, one outside the key's declared range, or
    a name none of its registry's entries has. Each key alone: the rules between keys are today's
    (a rule made stricter later must not make old records unreadable), and a key this code no
    longer has is left alone, so a record keeps what its run was made with."""
    for key, value in settings.items():
        if key not in FIELDS:
            continue
        try:
            value = convert_setting(key, value, from_cli=False)
        except ValueError as e:
            return str(e)
        problem = FIELDS[key].range_problem(value)
        if problem:
            return problem
        if key in CHOICES and value not in CHOICES[key]:
            return unknown_choice(key, value, CHOICES[key])
    return None


def _is_number(value) -> bool:
    return is_finite_number(value)


def summary_fields_problem(summary: dict) -> str | None:
    """The first field of ``summary`` (a summary.json that state.summary_problems accepts) of a kind
    no run writes, or None: a loss (``*_loss``, or ``*_loss_ema``: the weights' average's) or a time in
    seconds (``*_s``) that is not a finite
    number >= 0, or n-gram floors (``references*``) that are not a table of losses. Null is a value
    a run writes (a loss that was not finite, floors it could not compute)."""
    for key, value in summary.items():
        if value is None:
            continue
        if key.startswith("references"):
            ok, want = isinstance(value, dict) and all(map(_is_number, value.values())), "a table of n-gram losses"
        elif key.endswith(("_loss", "_loss_ema", "_s")):
            ok, want = _is_number(value) and value >= 0, "a finite number >= 0"
        else:
            continue
        if not ok:
            return f"its {key} is {_brief(value)}, not {want}"
    return None


def metrics_problem(rows: list[dict]) -> str | None:
    """The first value of the metrics ``rows`` of a kind no run writes, or None: each is a number
    (null where it was not finite) or, for the diagnostics, a list of them (per block, per head);
    ``iter`` is a step, 0 or more."""
    for row in rows:
        if row.get("iter", 0) < 0:  # (rundir.metrics_rows keeps only rows whose iter is an int)
            return f"its row at iter {row['iter']} has a negative iter, which no run logs"
        for key, value in row.items():
            if not _is_metric(value):
                return f"its row at iter {row.get('iter')} has {key} {_brief(value)}, not a number"
    return None


def _is_metric(value) -> bool:
    pending = [value]  # (a loop, not recursion: JSON nests lists deeper than Python's stack allows)
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif item is not None and type(item) not in (int, float):
            return False
    return True


class RunStore:
    """``<root>/runs.jsonl``: read (parsed once per change of the file) and appended to."""

    def __init__(self, root: str):
        self.root = root
        self.path = os.path.join(root, STORE)
        self._cache: tuple[tuple, dict[str, dict]] | None = None

    def exists(self) -> bool:
        return os.path.isfile(self.path)

    def records(self) -> dict[str, dict]:
        """{run name: record}, in the order they were stored. A line cut short at the end (an append
        a kill interrupted) is ignored; any other damage, or one run stored twice with different
        contents, is refused by line."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise user_error(e, self.path) from None
        key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._parse())
        return self._cache[1]

    def _parse(self) -> dict[str, dict]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise user_error(e, self.path, doing="reading") from None
        lines = data.split(b"\n")
        found: dict[str, dict] = {}
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                record = None
            problem = record_problem(record)
            if record is None and number == len(lines):  # the last line, not JSON: an append cut short
                continue
            if problem:
                raise BabyGPTError(f"{self.path} line {number} is damaged ({problem}); restore the file "
                                   f"from git, or delete that line to train that run again")
            if found.get(record["name"], record) != record:
                raise BabyGPTError(f"{self.path} holds {record['name']} twice, with different records (line "
                                   f"{number}); keep one of them")
            found[record["name"]] = record
        return found

    def get(self, name: str) -> dict | None:
        return self.records().get(name)

    def add(self, record: dict) -> bool:
        """Append ``record`` unless its run is stored already (looked up again under the lock, so
        that two processes storing one run store it once). True if it was appended."""
        problem = record_problem(record)
        if problem:
            raise BabyGPTError(f"cannot store a run in {self.path}: {problem}")
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        try:
            os.makedirs(self.root, exist_ok=True)
            with open(self.path, "ab+") as f:
                if fcntl is not None:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                self._cache = None
                if record["name"] in self.records():
                    return False
                self._drop_cut_line(f)
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise user_error(e, self.path) from None
        self._cache = None
        return True

    @staticmethod
    def _drop_cut_line(f) -> None:
        """Truncate a last line an interrupted append left without its newline (under the lock no
        other process is writing), so that the next line starts on a line of its own."""
        f.seek(0)
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)
        f.seek(0, os.SEEK_END)


def pack(run_dir: str, name: str | None = None, inferred_source: dict | None = None) -> dict | None:
    """The store line of the run in ``run_dir`` if it is over, else None. Its source is the one its
    latest start recorded, else ``inferred_source``, else unknown (commit None)."""
    rundir = RunDir(run_dir)
    summary = read_summary(rundir.summary)
    if summary is None or summary["status"] not in ENDED:
        return None
    config = read_record(rundir.config, ("config",))
    if config is None:
        raise BabyGPTError(f"{run_dir} has a summary but no config.json: it is damaged; move it aside to "
                           f"train that run again")
    starts = [config, *[r for r in config.get("resumes") or [] if isinstance(r, dict)]]
    recorded = next((s["source"] for s in reversed(starts) if isinstance(s.get("source"), dict)), None)
    return {"format": STORE_FORMAT, "name": name or os.path.basename(os.path.normpath(run_dir)),
            "source": recorded or inferred_source or {"commit": None, "dirty": None},
            "config": config, "summary": summary, "metrics": rundir.metrics_rows()}


def store_of(run_path: str) -> tuple[RunStore, str] | None:
    """(the store, the run's name) for a path ``<root>/runs/<name>``, None for any other path."""
    parent, name = os.path.split(os.path.normpath(run_path))
    if os.path.basename(parent) != RUNS_DIR or not name:
        return None
    return _store(os.path.dirname(parent)), name


_STORES: dict[str, RunStore] = {}


def _store(root: str) -> RunStore:
    """One RunStore per root in this process, so that each file is parsed once."""
    key = os.path.abspath(root)
    if key not in _STORES:
        _STORES[key] = RunStore(root)
    return _STORES[key]


def stored(run_path: str) -> dict | None:
    """The store line of the run at ``run_path`` (``<root>/runs/<name>``), None if not stored."""
    found = store_of(run_path)
    return found[0].get(found[1]) if found else None


def load_run(run_path: str) -> dict:
    """{"dir", "metrics", "summary" (or {}), "info" (config.json)} of the run at ``run_path``: its
    store line if it has one, else its directory's files."""
    record = stored(run_path)
    if record is not None:
        return {"dir": run_path, "metrics": record["metrics"], "summary": record["summary"], "info": record["config"]}
    rundir = RunDir(run_path)
    if not os.path.isfile(rundir.metrics):
        raise BabyGPTError(f"no metrics.jsonl in '{run_path}'; pass the out_dir of a training run (or the "
                           f"<sweep>/runs/<name> of a run its sweep stored)")
    return {"dir": run_path, "metrics": rundir.metrics_rows(),
            "summary": read_summary(rundir.summary) or {}, "info": read_record(rundir.config) or {}}


def run_info(run_path: str) -> dict | None:
    """config.json of the run at ``run_path`` (stored or in its directory), None if it has none."""
    record = stored(run_path)
    return record["config"] if record is not None else read_record(os.path.join(run_path, "config.json"))


def run_summary(run_path: str) -> dict | None:
    """summary.json of the run at ``run_path`` (stored or in its directory), None if it has none."""
    record = stored(run_path)
    return record["summary"] if record is not None else read_summary(os.path.join(run_path, "summary.json"))


def stored_file(path: str) -> str | None:
    """The text of ``<root>/runs/<name>/<file>`` (one of FILES) as its run wrote it, if that run is
    stored; None otherwise (its directory, if any, is then where the file is)."""
    directory, name = os.path.split(path)
    record = stored(directory) if name in FILES else None
    return files(record)[name] if record is not None else None


def stored_files(root: str, store_paths) -> set[str]:
    """The paths, relative to ``root``, of every file the runs of the stores at ``store_paths``
    (relative paths of runs.jsonl files) wrote: each readable with ``stored_file``."""
    found = set()
    for store_path in store_paths:
        sweep = os.path.dirname(store_path)
        for name in _store(os.path.join(root, sweep)).records():
            found |= {f"{sweep}/{RUNS_DIR}/{name}/{file}" for file in FILES}
    return found


def runs_under(root: str) -> list[str]:
    """The run paths ``<root>/runs/<name>`` of a sweep: stored ones, then directories not stored."""
    names = list(_store(root).records())
    directory = os.path.join(root, RUNS_DIR)
    if os.path.isdir(directory):
        names += sorted(n for n in os.listdir(directory) if n not in names and not n.startswith("."))
    return [os.path.join(root, RUNS_DIR, n) for n in names]


def expand_runs(paths: list[str]) -> list[str]:
    """The run paths the command-line ``paths`` name: a sweep's directory (one with a runs.jsonl)
    stands for all of its runs; any other path for itself."""
    return [run for p in paths for run in (runs_under(p) if _store(p).exists() else [p])]


# ------------------------------------------------------------------ moving old layouts into stores

def commits_that_added(paths: list[str]) -> dict[str, str]:
    """{path relative to the repository: the commit that added it}, from one pass over git's log
    (empty where git is missing)."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "log", "--diff-filter=A", "--name-only", "--format=@%H", "--",
                              *paths], capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    added, commit = {}, None
    for line in out.splitlines():
        if line.startswith("@"):
            commit = line[1:]
        elif line:
            added.setdefault(line, commit)
    return added


def parent_of(commit: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", f"{commit}^"], capture_output=True, text=True,
                              check=True, stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def inferred(added_in: str | None) -> dict:
    """The source of a run recorded before runs named their commit: the commit checked out when its
    record was committed (the parent of the commit that added it); whether that tree had changes is
    not known."""
    if added_in is None:
        return {"commit": None, "dirty": None, "inferred": "not committed: no commit known"}
    return {"commit": parent_of(added_in), "dirty": None,
            "inferred": f"the parent of {added_in}, the commit that added this record"}


def convert(sweep_root: str, added: dict[str, str]) -> tuple[int, int]:
    """Move the finished runs of ``<sweep_root>/runs/`` into its store: (moved, left). Each run's
    files are compared with the store's copy byte for byte before they are deleted."""
    store, moved, left = _store(sweep_root), 0, 0
    for path in runs_under(sweep_root):
        if store.get(os.path.basename(path)) is not None:
            continue  # moved already (its directory may keep checkpoints, which are not records)
        relative = os.path.relpath(os.path.join(path, "config.json"), ROOT)
        record = pack(path, inferred_source=inferred(added.get(relative)))
        if record is None:
            left += 1
            continue
        store.add(record)
        kept = files(store.get(record["name"]))
        for name in FILES:
            with open(os.path.join(path, name), encoding="utf-8") as f:
                if f.read() != kept[name]:
                    raise BabyGPTError(f"{path}/{name} does not equal its stored copy; nothing of it was deleted")
        for name in FILES:
            os.remove(os.path.join(path, name))
        if not os.listdir(path):
            os.rmdir(path)
        moved += 1
    return moved, left


def sweep_roots(directory: str) -> list[str]:
    """Every directory at or below ``directory`` that holds a runs/ folder of run directories."""
    return sorted(top for top, dirs, _ in os.walk(directory) if RUNS_DIR in dirs
                  and os.path.basename(top) != RUNS_DIR)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m babygpt.runstore DIR...\nMove the finished run directories of every sweep "
              "under DIR into its runs.jsonl (checked byte for byte first).")
        return 0 if argv else 2
    missing = [d for d in argv if not os.path.isdir(d)]
    if missing:
        raise BabyGPTError(f"'{missing[0]}' is not a directory; pass the sweep or results directories to convert")
    roots = [r for d in argv for r in sweep_roots(d)]
    added = commits_that_added(roots)
    for root in roots:
        moved, left = convert(root, added)
        print(f"{root}: {moved} run(s) moved into {STORE}" + (f", {left} not over left in place" if left else ""))
    return 0


if __name__ == "__main__":
    from .cli import run

    sys.exit(run(main, sys.argv[1:]))
