"""Fault injection, in the spirit of SQLite's I/O-error tests: the N-th filesystem write operation of
a command fails (ENOSPC, EIO), for every N, and each time the invariants hold.

The harness (tests/faults/fault_injector.py, test code only) numbers a command's *fault points*:
opening a file for writing, its writes (the 1st, 4th, 16th, ... of each file), flushes, fsyncs,
renames and mkdirs under the scenario's directory. A counting pass with no failure learns the
scenario's K points (and is the uninterrupted reference); then for each N the command runs again
from the same starting state with point N failing, and must

  - exit 2 with ``error: ...`` lines only (no traceback), naming the path it could not write;
  - leave every file whole (each .json parses, each .pt loads with weights_only, each .csv has
    full rows, each .png is complete, no ``.tmp-*`` left) and the files that existed before intact
    (a message saying "(X is unchanged)" is taken at its word);
  - be resumable: the same command (train.py with --init_from=resume where a checkpoint exists)
    completes, with exactly the reference's losses, metrics and best.pt.

Every point is tried when BABYGPT_ALL_FAULT_POINTS=1 (about twenty minutes on two cores, run before a
release and after a change to how files are written); otherwise each scenario tries the first and the
last point of each *site*: one operation on one file (its numbers aside) in one process, which is where
the code that handles a failure differs (``one_per_site``).

Scenarios: a training run from scratch; the resume of an interrupted run; a sweep (its train.py a
subprocess that gets the injector through tests/faults/sitecustomize.py, the count shared through a
file); an experiment re-run in place and with --overwrite; and a real full filesystem (a small tmpfs;
skipped where mount is not permitted). Each scenario runs once (a module fixture); the tests below
assert one invariant of one scenario each, so that a known bug marks only its own test xfail.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import pytest
import torch

from babygpt.checkpoint import load_checkpoint
from babygpt.cli import run, train_main
from babygpt.config import load_config
from babygpt.trainer import WALL_CLOCK_FIELDS, Trainer
from conftest import ROOT, experiment_command, once, prepare_small_data

FAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults")
_spec = importlib.util.spec_from_file_location("fault_injector", os.path.join(FAULTS, "fault_injector.py"))
fault_injector = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fault_injector)

# The quick tier's budget (experiments/_common.QUICK_BUDGET): evals (and checkpoints) at 0, 5, 10.
QUICK = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 8, "max_iters": 10,
         "eval_interval": 5, "eval_iters": 2, "log_interval": 5, "warmup_iters": 5, "dropout": 0.0, "device": "cpu"}
QUICK_ARGS = [f"--{k}={v}" for k, v in QUICK.items()]

pytestmark = pytest.mark.slow


# ============================================================================ the harness

@dataclass(frozen=True)
class Point:
    n: int
    op: str  # open, write, flush, fsync, fsync-dir, replace, rename, link, mkdir (see fault_injector)
    path: str  # as the operation saw it
    pid: int

    def where(self, work: str) -> str:
        """The path relative to the scenario's directory, temporary names made comparable."""
        return re.sub(r"\.tmp-[a-z0-9_]{8}(?=-|$)", ".tmp-*", os.path.relpath(self.path, work))

    def target(self) -> str:
        """The file the operation was for: a temporary file stands for the file it would replace."""
        return re.sub(r"\.tmp-[a-z0-9_]{8}-", "", self.path)


@dataclass
class Outcome:
    """What one command did: its exit code (None if an exception escaped: a traceback), stderr,
    the fault points it went through, and the text of the escaped exception."""
    code: int | None
    err: str
    points: list[Point]
    escaped: str = ""
    before_write: dict = field(default_factory=dict)  # see fault_injector.Injector.before_write


@dataclass
class Violation:
    point: Point
    kind: str
    detail: str

    def __str__(self):
        return f"point {self.point.n} ({self.point.op} {os.path.basename(self.point.path)}): {self.kind}: {self.detail}"


@dataclass
class Result:
    """A scenario's record: its fault points, those exercised, and every invariant broken."""
    name: str
    points: list[Point]
    exercised: list[Point] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0

    def broken(self, kinds, where=lambda p: True) -> list[str]:
        return [str(v) for v in self.violations if v.kind in kinds and where(v.point)]


def read_points(log: str) -> list[Point]:
    points = []
    if os.path.exists(log):
        with open(log, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                n, op, pid, _, path = line.rstrip("\n").split(" ", 4)
                points.append(Point(int(n), op, path, int(pid)))
    return points


class Faults:
    """The injector's settings for one command: where points count, which fails, and the files
    that share the count with child processes (through the environment)."""

    def __init__(self, root: str, scratch: str, fail_at: int | None = None, errno_: int = errno.ENOSPC):
        self.root, self.fail_at, self.errno = root, fail_at, errno_
        fd, self.counter = tempfile.mkstemp(dir=scratch, prefix="counter-")
        os.close(fd)
        fd, self.log = tempfile.mkstemp(dir=scratch, prefix="log-")
        os.close(fd)

    def env(self) -> dict:
        """The environment of a command under this injector; its settings go to the scratch
        directory's control file (fault_injector.write_control), so that the environment is the
        same for every command of a scenario."""
        control = os.path.join(os.path.dirname(self.counter), "control.json")
        fault_injector.write_control(control, self.root, self.fail_at, errno.errorcode[self.errno],
                                     counter=self.counter, log=self.log)
        path = os.pathsep.join(p for p in (FAULTS, os.environ.get("PYTHONPATH")) if p)
        return {"PYTHONPATH": path, "BABYGPT_FAULT_CONTROL": control, "OMP_NUM_THREADS": "1",
                "PYTHONDONTWRITEBYTECODE": "1"}

    def points(self) -> list[Point]:
        return read_points(self.log)


def _clear_pending_overwrites():
    """An experiment that failed part-way through --overwrite notes its directory for the rest of the
    process (babygpt.experimentdir); in-process runs each start as a new process would."""
    with contextlib.suppress(ImportError, AttributeError):
        from babygpt import experimentdir
        experimentdir._PENDING.clear()


def in_process(fn, argv: list[str], faults: Faults | None) -> Outcome:
    """Run ``fn(argv)`` as the command line does (babygpt.cli.run: exit code, stderr), with the
    injector (``faults``; None: none) in this process and, through the environment, in any process
    it starts."""
    _clear_pending_overwrites()
    injector, env = None, {}
    if faults is not None:
        injector = fault_injector.Injector(faults.root, faults.fail_at, faults.errno, counter=faults.counter,
                                           log=faults.log)
        env = faults.env()
    saved = {k: os.environ.get(k) for k in env}
    err, escaped, code = io.StringIO(), "", None
    os.environ.update(env)
    if injector:
        injector.install()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = run(fn, argv)
    except Exception as e:  # what would be a traceback: what the harness looks for
        escaped = "".join(traceback.format_exception(e))
    finally:
        if injector:
            injector.uninstall()
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return Outcome(code, err.getvalue(), faults.points() if faults else [], escaped,
                   injector.before_write if injector else {})


def as_subprocess(script: str, argv: list[str], faults: Faults, cwd: str) -> Outcome:
    env = {**os.environ, **faults.env()}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    return Outcome(proc.returncode, proc.stderr, faults.points(), proc.stderr if "Traceback" in proc.stderr else "")


# ---------------------------------------------------------------------------- invariants

PNG_END = b"IEND\xaeB`\x82"


def file_problems(path: str) -> str | None:
    """Why the file at ``path`` is not whole (None if it is), judged by its kind."""
    name = os.path.basename(path)
    try:
        if name.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                if not isinstance(json.load(f), dict):
                    return "not a JSON object"
        elif name.endswith(".pt"):
            load_checkpoint(path)
        elif name == "metrics.jsonl":
            with open(path, "rb") as f:
                lines = f.read().split(b"\n")
            for line in lines[:-1]:  # only the last line may be cut short (a kill mid-append)
                json.loads(line)
        elif name.endswith(".csv"):
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
            if not rows or any(len(r) != len(rows[0]) for r in rows):
                return f"{len(rows)} rows, not all as long as the header"
        elif name.endswith(".png"):
            with open(path, "rb") as f:
                data = f.read()
            if not data.endswith(PNG_END):
                return f"a PNG of {len(data)} bytes without its end chunk"
        elif name.endswith(".md"):
            with open(path, encoding="utf-8") as f:
                if not f.read().endswith("\n"):
                    return "cut short"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:120]}"
    return None


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def snapshot(directory: str) -> dict[str, bytes]:
    """{path: bytes} of every file under ``directory``."""
    files = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                files[path] = f.read()
    return files


def fault_violations(outcome: Outcome, point: Point, expected: str, work: str, said: str) -> list[Violation]:
    """The invariants right after the command that failed at ``point`` (``expected``: what the
    counting pass saw there): it was reached, and ``reported_violations``, ``disk_violations``."""
    fired = [p for p in outcome.points if p.n == point.n]
    found = []
    if not fired or f"{fired[0].op} {fired[0].where(work)}" != expected:
        found.append(Violation(point, "not-reached", f"point {point.n} was {fired[0] if fired else 'never reached'}, "
                                                     f"expected {expected}"))
    fired = fired[0] if fired else point
    target = fired.target()
    # The file itself must be named; its directory will do for an operation on the directory, a
    # lock file, or a temporary file whose final name is not in its own.
    precise = fired.op not in ("mkdir", "fsync-dir") and not os.path.basename(target).startswith(".")
    paths = (target,) if precise else (target, os.path.dirname(target))
    return found + reported_violations(outcome, point, said, paths) + disk_violations(outcome, point, work)


def reported_violations(outcome: Outcome, point: Point, said: str, paths) -> list[Violation]:
    """Exit 2, ``error: ...`` lines only on stderr (a sweep's progress bar aside), no traceback, and
    one of ``paths`` named in ``said`` (stderr, and for a sweep its runs' logs)."""
    if outcome.escaped or "Traceback" in said:
        text = outcome.escaped or said
        return [Violation(point, "traceback", text.strip().splitlines()[-1] if text.strip() else "?")]
    if outcome.code != 2:
        return [Violation(point, "exit", f"exit {outcome.code}: {outcome.err.strip()[-300:]}")]
    found = []
    lines = [s for s in re.split(r"[\r\n]+", outcome.err) if s.strip() and not s.startswith("runs:")]
    if not lines or not all(s.startswith("error: ") for s in lines):
        found.append(Violation(point, "stderr", outcome.err.strip()[-300:]))
    if not any(path in said for path in paths):
        found.append(Violation(point, "no-path", f"{paths[0]!r} not named in: {outcome.err.strip()[-300:]}"))
    return found


def disk_violations(outcome: Outcome, point: Point, work: str) -> list[Violation]:
    """Every file under ``work`` whole, no temporary file left, and each "(X is unchanged)" true
    (X as it was when its atomic write began)."""
    found = []
    leftovers = [os.path.relpath(os.path.join(d, n), work) for d, _, names in os.walk(work) for n in names
                 if n.startswith(".tmp-")]
    if leftovers:
        found.append(Violation(point, "tmp-left", ", ".join(leftovers)))
    for parent, _, names in os.walk(work):
        for name in names:
            problem = file_problems(os.path.join(parent, name))
            if problem:
                found.append(Violation(point, "damaged", f"{os.path.relpath(os.path.join(parent, name), work)}: {problem}"))
    for claimed in re.findall(r"\((\S+) is unchanged\)", outcome.err):
        if claimed in outcome.before_write and fault_injector.identity(claimed) != outcome.before_write[claimed]:
            found.append(Violation(point, "false-unchanged",
                                   f"the error says {os.path.basename(claimed)} is unchanged, but it was replaced"))
    return found


def exercise(name: str, points: list[Point], chosen: list[Point], attempt, minimum: int) -> Result:
    """For each chosen point: ``attempt(point)`` (the command failing there, then the checks and the
    recovery) returns its violations."""
    started = time.perf_counter()
    result = Result(name, points)
    for point in chosen:
        result.exercised.append(point)
        result.violations += attempt(point)
    result.seconds = time.perf_counter() - started
    kinds = {}
    for v in result.violations:
        kinds.setdefault(v.kind, []).append(v.point.n)
    print(f"\n{name}: {len(points)} fault points, {len(chosen)} exercised, {result.seconds:.1f} s; violations: "
          + ("; ".join(f"{k} at {ns}" for k, ns in kinds.items()) or "none"))
    for v in result.violations[:40]:
        print("   ", v)
    assert len(points) >= minimum and chosen, f"{name}: {len(points)} fault points, {len(chosen)} exercised"
    return result


ALL_POINTS = os.environ.get("BABYGPT_ALL_FAULT_POINTS") == "1"


def one_per_site(points: list[Point], work: str) -> list[Point]:
    """The first and last point of each site (an operation on one file, its numbers aside, in this
    process or a child), or every point under BABYGPT_ALL_FAULT_POINTS=1. A file written at each
    evaluation fails the same way at each, through the same code; a site's first and last point
    are the file's first write and its write at the end of the run."""
    if ALL_POINTS:
        return points
    sites: dict[tuple, list[Point]] = {}
    for p in points:
        sites.setdefault((p.pid == os.getpid(), p.op, re.sub(r"[0-9]+", "N", p.where(work))), []).append(p)
    return sorted({q for group in sites.values() for q in (group[0], group[-1])}, key=lambda p: p.n)


def comparable(rows):
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS} for r in rows]


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def same_run(run_dir: str, reference: str) -> list[tuple[str, str]]:
    """(kind, detail) of each way ``run_dir`` differs from the uninterrupted ``reference``: its
    summary's losses, its metrics (exact: resume is bit-identical on CPU), its ckpt.pt and best.pt."""
    found = []
    got, want = summary(run_dir), summary(reference)
    for key in ("status", "iter", "final_val_loss", "best_val_loss", "val_loss_full", "final_train_loss"):
        if got.get(key) != want.get(key):
            found.append(("result", f"summary {key} {got.get(key)!r}, reference {want.get(key)!r}"))
    if comparable(metrics(run_dir)) != comparable(metrics(reference)):
        found.append(("result", f"metrics rows at {[r['iter'] for r in metrics(run_dir)]} differ from the "
                                f"reference's at {[r['iter'] for r in metrics(reference)]}"))
    for name, kind in (("ckpt.pt", "result"), ("best.pt", "best")):
        got, want = load_checkpoint(os.path.join(run_dir, name)), load_checkpoint(os.path.join(reference, name))
        same = got["iter"] == want["iter"] and all(torch.equal(got["model"][k], want["model"][k]) for k in want["model"])
        if not same:
            found.append((kind, f"{name} holds iteration {got['iter']} (best_val_loss {got['best_val_loss']:.6f}), "
                                f"the reference's iteration {want['iter']} (best_val_loss "
                                f"{want['best_val_loss']:.6f}); summary best_val_loss {summary(run_dir)['best_val_loss']:.6f}"))
    return found


def fresh(base: str, name: str) -> str:
    return tempfile.mkdtemp(prefix=name + "-", dir=base)


class Scenario:
    """A command and its starting state; subclasses say how to run, recover and judge it."""

    name = "scenario"
    errno = errno.ENOSPC
    minimum = 1  # fewer fault points than this fails the scenario: its command no longer writes what it did

    def __init__(self, base: str):
        self.base = base
        self.scratch = os.path.join(base, "scratch")  # the counters and logs: outside every scenario's root

    def setup(self, work: str) -> None:
        """Make the starting state in the empty directory ``work``."""

    def command(self, work: str, faults: Faults) -> Outcome:
        raise NotImplementedError

    def recover(self, work: str) -> Outcome:
        """What a user runs after the error (the same command by default)."""
        return self.command(work, Faults(work, self.scratch))

    def said(self, work: str, outcome: Outcome) -> str:
        """Where the command reports a failure."""
        return outcome.err

    def kept(self, point: Point, work: str, before: dict) -> list[Violation]:
        """Violations of 'the files that existed before are intact' beyond every file being whole."""
        return []

    def final(self, work: str, reference: str) -> list[tuple[str, str]]:
        """(kind, detail) of each way the recovered ``work`` differs from the uninterrupted ``reference``."""
        return []

    def select(self, points: list[Point]) -> list[Point]:
        return one_per_site(points, self.reference)

    def run(self) -> Result:
        """The counting pass (which is also the reference), then one attempt per selected point."""
        self.reference = work = fresh(self.base, self.name + "-reference")
        self.setup(work)
        outcome = self.command(work, Faults(work, self.scratch))
        assert outcome.code == 0 and not outcome.escaped, outcome.escaped or outcome.err
        points = outcome.points
        assert [p.n for p in points] == list(range(1, len(points) + 1))
        expected = {p.n: f"{p.op} {p.where(work)}" for p in points}
        return exercise(self.name, points, self.select(points), lambda p: self.attempt(p, expected[p.n]),
                        self.minimum)

    def attempt(self, point: Point, expected: str) -> list[Violation]:
        work = fresh(self.base, self.name)
        self.setup(work)
        before = snapshot(work)
        outcome = self.command(work, Faults(work, self.scratch, point.n, self.errno))
        found = fault_violations(outcome, point, expected, work, self.said(work, outcome))
        found += self.kept(point, work, before)
        again = self.recover(work)
        if again.code != 0 or again.escaped:
            found.append(Violation(point, "resume", (again.escaped or again.err).strip()[-300:]))
        else:
            found += [Violation(point, kind, detail) for kind, detail in self.final(work, self.reference)]
        shutil.rmtree(work, ignore_errors=True)
        return found


class Training(Scenario):
    """train.py in this process (babygpt.cli.run(train_main)): from scratch, or resuming ``template``."""

    def __init__(self, base, data_dir, name="train", template=None, errno_=errno.ENOSPC, stride=1, minimum=50):
        super().__init__(base)
        self.data_dir, self.name, self.template, self.errno = data_dir, name, template, errno_
        self.stride, self.minimum = stride, minimum

    def setup(self, work):
        if self.template:
            shutil.copytree(self.template, os.path.join(work, "run"))

    def argv(self, work, resume):
        return once(f"--data_dir={self.data_dir}", f"--out_dir={os.path.join(work, 'run')}", *QUICK_ARGS,
                f"--init_from={'resume' if resume else 'scratch'}")

    def command(self, work, faults):
        return in_process(train_main, self.argv(work, self.template is not None), faults)

    def recover(self, work):
        resume = os.path.exists(os.path.join(work, "run", "ckpt.pt"))
        return in_process(train_main, self.argv(work, resume), Faults(work, self.scratch))

    def kept(self, point, work, before):
        return earlier_files_kept(point, os.path.join(work, "run"), before)

    def final(self, work, reference):
        return same_run(os.path.join(work, "run"), os.path.join(reference, "run"))

    def select(self, points):
        return one_per_site(points[::self.stride], self.reference)


class InterruptAt(torch.nn.Module):
    """Wraps a model; SIGINT (as from Ctrl-C) during the ``k``-th training forward pass."""

    def __init__(self, model, k):
        super().__init__()
        self.model, self.k, self.calls = model, k, 0

    def forward(self, x, y):
        out = self.model(x, y)
        if self.training:
            self.calls += 1
            if self.calls == self.k:
                os.kill(os.getpid(), signal.SIGINT)  # the run checkpoints after this step and stops
        return out


def interrupted_run(base, data_dir, at=7) -> str:
    """A run of the quick budget stopped by Ctrl-C at iteration ``at`` (summary.json: interrupted)."""
    out = os.path.join(fresh(base, "interrupted"), "run")
    cfg = load_config(once(f"--data_dir={data_dir}", f"--out_dir={out}", *QUICK_ARGS))
    s = Trainer(cfg, wrap_model=lambda model: InterruptAt(model, at)).train()
    assert s["status"] == "interrupted" and s["iter"] == at
    return out


def earlier_files_kept(point: Point, out: str, before: dict) -> list[Violation]:
    """What a run directory held before the command is still there: a checkpoint at least as
    recent, the metrics rows up to it, and config.json's record of the run."""
    ckpt = os.path.join(out, "ckpt.pt")
    if ckpt not in before:
        return []
    was = torch.load(io.BytesIO(before[ckpt]), weights_only=True)["iter"]
    if not os.path.exists(ckpt):
        return [Violation(point, "earlier", "ckpt.pt is gone")]
    found = []
    if file_problems(ckpt) is None and load_checkpoint(ckpt)["iter"] < was:
        found.append(Violation(point, "earlier", f"ckpt.pt went back from iteration {was}"))
    old_rows = [json.loads(line) for line in before[os.path.join(out, "metrics.jsonl")].splitlines() if line]
    try:
        rows = [r for r in metrics(out) if r["iter"] <= was]
    except (OSError, ValueError) as e:
        rows = [f"unreadable: {e}"]
    if rows != [r for r in old_rows if r["iter"] <= was]:
        found.append(Violation(point, "earlier", f"metrics rows up to iteration {was} changed"))
    try:
        with open(os.path.join(out, "config.json")) as f:
            argv = json.load(f).get("argv")
    except (OSError, ValueError) as e:
        argv = f"unreadable: {e}"
    if argv != json.loads(before[os.path.join(out, "config.json")])["argv"]:
        found.append(Violation(point, "earlier", "config.json lost the run's command line"))
    return found


class SweepScenario(Scenario):
    """experiments/sweep.py --seeds 0,1 in a sweep directory where --seeds 0 has finished: the sweep
    (babygpt.sweep.main through babygpt.cli.run, as experiments/sweep.py runs it) in this process,
    its train.py a subprocess that shares the count (tests/faults/sitecustomize.py)."""

    name = "sweep"
    minimum = 3

    def __init__(self, base, data_dir, template):
        super().__init__(base)
        self.data_dir, self.template = data_dir, template

    @staticmethod
    def argv(data_dir, out, seeds):
        return [*(f"--set={k}={v}" for k, v in QUICK.items()), f"--set=data_dir={data_dir}", "--seeds", seeds,
                "--out", out]

    def setup(self, work):
        shutil.copytree(self.template, os.path.join(work, "sweep"))

    def command(self, work, faults):
        from babygpt.sweep import main as sweep_main
        return in_process(sweep_main, self.argv(self.data_dir, os.path.join(work, "sweep"), "0,1"), faults)

    def said(self, work, outcome):
        logs = os.path.join(work, "sweep", "logs")
        text = [outcome.err]
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            with open(os.path.join(logs, name), errors="replace") as f:
                text.append(f.read())
        return "\n".join(text)

    def kept(self, point, work, before):
        """The finished run of seed 0 is untouched, byte for byte."""
        root = os.path.join(work, "sweep")
        done = [p for p in before if os.sep + "runs" + os.sep in p and "seed=0" in p
                or os.sep + "run_settings" + os.sep in p and "seed=0" in p]
        changed = [os.path.relpath(p, root) for p in done if read_bytes(p) != before[p]]
        return [Violation(point, "earlier", f"changed: {', '.join(changed)}")] if changed else []

    def final(self, work, reference):
        found = []
        rows, want = results(os.path.join(work, "sweep")), results(os.path.join(reference, "sweep"))
        for r, w in zip(rows, want):
            for key in ("name", "status", "iter", "final_val_loss", "best_val_loss", "val_loss_full"):
                if r.get(key) != w.get(key):
                    found.append(("result", f"results.csv {r.get('name')} {key} {r.get(key)!r}, reference {w.get(key)!r}"))
        if len(rows) != len(want):
            found.append(("result", f"results.csv has {len(rows)} rows, the reference {len(want)}"))
        name = [r["name"] for r in want if r["seed"] == "1"][0]
        found += same_run(os.path.join(work, "sweep", "runs", name), os.path.join(reference, "sweep", "runs", name))
        return found

    def select(self, points):
        """A train.py costs seconds here, so three points, not all (the training scenarios go through
        all of train.py's): the sweep process's first write that publishes a file (before any
        train.py starts) and its last (results.csv, after they ended), and of its train.py's, the
        rename of its second ckpt.pt (mid-run)."""
        own = [p for p in points if p.pid == os.getpid() and not os.path.basename(p.path).startswith(".tmp-")]
        table = [p for p in points if p.pid == os.getpid() and os.path.basename(p.target()) == "results.csv"]
        child = [p for p in points if p.pid != os.getpid() and p.op == "replace" and p.path.endswith("ckpt.pt")]
        return sorted({own[0], *table[-1:], *child[1:2]}, key=lambda p: p.n)


def results(sweep_dir):
    with open(os.path.join(sweep_dir, "results.csv"), newline="") as f:
        return list(csv.DictReader(f))


EXP1_FILES = ("settings.json", "gradient_vanishing.csv", "gradient_vanishing.png", "report.md")


class ExperimentScenario(Scenario):
    """experiments/exp1_gradient_vanishing.py --quick (it writes settings.json, a CSV, a PNG and
    report.md), in this process, over earlier results in its --out: made with the same settings
    (it regenerates them in place), or (``overwrite``) with --depth 4, replaced by --overwrite."""

    minimum = 10

    def __init__(self, base, template, overwrite):
        super().__init__(base)
        self.template, self.overwrite = template, overwrite
        self.name = "exp1-overwrite" if overwrite else "exp1-rerun"
        self.main = experiment_command("exp1_gradient_vanishing")

    def setup(self, work):
        shutil.copytree(self.template, os.path.join(work, "exp1"))

    def command(self, work, faults):
        return in_process(self.main, ["--quick", "--out", os.path.join(work, "exp1"),
                                      *(["--overwrite"] if self.overwrite else [])], faults)

    def kept(self, point, work, before):
        """Each earlier result is still there, whole: in --out, or (--overwrite) kept aside. A re-run
        with the same settings makes the same CSV and PNG, byte for byte."""
        found = []
        out, aside = os.path.join(work, "exp1"), os.path.join(work, ".exp1.replaced")
        for name in EXP1_FILES:
            old = before[os.path.join(out, name)]
            places = [os.path.join(out, name)] + ([os.path.join(aside, name)] if self.overwrite else [])
            now = [read_bytes(p) for p in places if os.path.exists(p)]
            kept = old in now if self.overwrite or name != "report.md" else any(now)
            if not kept:
                found.append(Violation(point, "earlier", f"the earlier {name} is "
                                                         f"{'damaged' if now else 'gone'}"))
        return found

    def final(self, work, reference):
        found = []
        for name in EXP1_FILES[:3]:
            with open(os.path.join(work, "exp1", name), "rb") as f, \
                    open(os.path.join(reference, "exp1", name), "rb") as g:
                if f.read() != g.read():
                    found.append(("result", f"{name} differs from the reference's"))
        if os.path.exists(os.path.join(work, ".exp1.replaced")):
            found.append(("result", "the replaced results are still kept aside after the command completed"))
        return found


# ============================================================================ fixtures

@pytest.fixture(scope="module")
def base():
    """A directory for the scenarios, on tmpfs where there is one (fsync is free there)."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    path = tempfile.mkdtemp(prefix="babygpt-faults-", dir=shm)
    os.makedirs(os.path.join(path, "scratch"))  # the injector's counters and logs, outside every scenario
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models train several times faster on one thread, on a machine with other work too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_dir(base):
    data = prepare_small_data(fresh(base, "data"))
    # The data's n-gram floors are cached beside it by the first run: train once, outside any scenario.
    with contextlib.redirect_stdout(io.StringIO()):
        assert run(train_main, once(f"--data_dir={data}", f"--out_dir={fresh(base, 'warmup')}", *QUICK_ARGS)) == 0
    return data


@pytest.fixture(scope="module")
def train_scenario(base, data_dir):
    scenario = Training(base, data_dir)
    return scenario, scenario.run()


@pytest.fixture(scope="module")
def resume_scenario(base, data_dir, train_scenario):
    with contextlib.redirect_stdout(io.StringIO()):
        template = interrupted_run(base, data_dir)
    scenario = Training(base, data_dir, "resume", template, minimum=25)
    result = scenario.run()
    # Ctrl-C at iteration 7, then a resume, is the uninterrupted run (to the bit, on CPU).
    assert same_run(os.path.join(scenario.reference, "run"), os.path.join(train_scenario[0].reference, "run")) == []
    return scenario, result


@pytest.fixture(scope="module")
def eio_scenario(base, data_dir):
    scenario = Training(base, data_dir, "train-EIO", errno_=errno.EIO, stride=6, minimum=10)
    return scenario, scenario.run()


@pytest.fixture(scope="module")
def sweep_scenario(base, data_dir):
    from babygpt.sweep import main as sweep_main

    template = os.path.join(fresh(base, "sweep-template"), "sweep")
    first = in_process(sweep_main, SweepScenario.argv(data_dir, template, "0"), None)
    assert first.code == 0, first.escaped or first.err
    scenario = SweepScenario(base, data_dir, template)
    return scenario, scenario.run()


@contextlib.contextmanager
def drawing_skipped():
    """matplotlib draws nothing: each figure is saved as the same few bytes of PNG, through the same
    babygpt.plot.save (so written at the same fault points). Drawing is most of an experiment's
    --quick time, run about seventy times here; these scenarios test what is written and how, and
    the quick-mode tests (test_experiments) draw the figures."""
    from matplotlib.figure import Figure

    one_pixel = io.BytesIO()
    Figure(figsize=(0.01, 0.01)).savefig(one_pixel, dpi=100, format="png")  # a whole PNG, ending in IEND

    def savefig(self, target, **kwargs):
        target.write(one_pixel.getvalue())

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", savefig)
        patch.setattr(Figure, "tight_layout", lambda self, *a, **k: None)
        yield


def experiment_template(base, overwrite):
    out = os.path.join(fresh(base, "exp1-template"), "exp1")
    main = experiment_command("exp1_gradient_vanishing")
    _clear_pending_overwrites()
    with contextlib.redirect_stdout(io.StringIO()):
        assert run(main, ["--quick", "--out", out, *(["--depth", "4"] if overwrite else [])]) == 0
    return out


@pytest.fixture(scope="module")
def exp1_rerun_scenario(base):
    with drawing_skipped():
        scenario = ExperimentScenario(base, experiment_template(base, False), overwrite=False)
        return scenario, scenario.run()


@pytest.fixture(scope="module")
def exp1_overwrite_scenario(base):
    with drawing_skipped():
        scenario = ExperimentScenario(base, experiment_template(base, True), overwrite=True)
        return scenario, scenario.run()


# ============================================================================ the tests

ERROR_EXIT = ("traceback", "exit", "stderr", "no-path", "not-reached")  # exit 2, error: lines naming the path
FILES_WHOLE = ("tmp-left", "damaged", "earlier")  # no half-written, lost or changed earlier file
MESSAGE_TRUE = ("false-unchanged",)  # "(X is unchanged)" only when it is
RESUMABLE = ("resume", "result")  # the same command completes, to the reference's losses and metrics
BEST = ("best",)  # ... and best.pt is the reference's

# Bugs this suite found are fixed; a new one gets a constant here, naming it, and case(..., bug=...)
# marks its tests xfail(strict=True) until it is fixed.


def torch_save_write(p):
    return p.op == "write" and p.target().endswith(".pt")


def in_place_file(p):
    """The result tables and plots (once written in place, now through a temporary file and a rename)."""
    return os.path.basename(p.target()) in ("gradient_vanishing.csv", "gradient_vanishing.png", "results.csv")


def aside_then_new_settings(p):
    """The points of an --overwrite between moving the old results aside and the new settings.json."""
    return p.op == "mkdir" or os.path.basename(p.target()) == "settings.json"


def everywhere(p):
    return True


def _not(predicate):
    return lambda p: not predicate(p)


# Under pytest-xdist (conftest.ONE_WORKER_MODULES) each scenario's tests go to one worker, so that its
# module fixture is built once; the scenarios themselves spread over the workers. A scenario built on
# another's (resume and the full disk on training) shares its group.
GROUPS = {"train_scenario": "faults-train", "resume_scenario": "faults-train", "full_disk": "faults-train",
          "eio_scenario": "faults-eio", "sweep_scenario": "faults-sweep",
          "exp1_rerun_scenario": "faults-exp1-rerun", "exp1_overwrite_scenario": "faults-exp1-overwrite"}


def grouped(scenario):
    return pytest.mark.xdist_group(GROUPS[scenario])


def case(scenario, invariant, kinds, where=everywhere, bug=None):
    marks = [grouped(scenario)] + ([pytest.mark.xfail(strict=True, reason=bug)] if bug else [])
    return pytest.param(scenario, kinds, where, id=f"{scenario.removesuffix('_scenario')}-{invariant}", marks=marks)


CASES = [
    *(c for name in ("train_scenario", "resume_scenario") for c in (
        case(name, "error-exit", ERROR_EXIT, _not(torch_save_write)),
        case(name, "error-exit-inside-torch.save", ERROR_EXIT, torch_save_write),
        case(name, "files-whole", FILES_WHOLE),
        case(name, "message-true", MESSAGE_TRUE),
        case(name, "resumable", RESUMABLE),
        case(name, "best.pt", BEST),
    )),
    case("eio_scenario", "all-invariants", ERROR_EXIT + FILES_WHOLE + RESUMABLE),
    case("sweep_scenario", "error-exit", ERROR_EXIT, _not(in_place_file)),
    case("sweep_scenario", "error-exit-results.csv", ERROR_EXIT, in_place_file),
    case("sweep_scenario", "files-whole", FILES_WHOLE, _not(in_place_file)),
    case("sweep_scenario", "files-whole-results.csv", FILES_WHOLE, in_place_file),
    case("sweep_scenario", "resumable", RESUMABLE + BEST),
    *(c for name in ("exp1_rerun_scenario", "exp1_overwrite_scenario") for c in (
        case(name, "error-exit", ERROR_EXIT, _not(in_place_file)),
        case(name, "error-exit-csv-png", ERROR_EXIT, in_place_file),
        case(name, "files-whole", FILES_WHOLE, _not(in_place_file)),
        case(name, "files-whole-csv-png", FILES_WHOLE, in_place_file),
        case(name, "message-true", MESSAGE_TRUE),
    )),
    case("exp1_rerun_scenario", "resumable", RESUMABLE),
    case("exp1_overwrite_scenario", "resumable", RESUMABLE, _not(aside_then_new_settings)),
    case("exp1_overwrite_scenario", "resumable-after-moving-aside", RESUMABLE, aside_then_new_settings),
]


@pytest.mark.parametrize("scenario,kinds,where", CASES)
def test_fault_points(scenario, kinds, where, request):
    """One invariant over the scenario's fault points (those ``where`` selects; at least one)."""
    _, result = request.getfixturevalue(scenario)
    points = [p for p in result.exercised if where(p)]
    assert points, "no fault point of this kind: the scenario changed; revisit the selection"
    broken = result.broken(kinds, where)
    assert not broken, f"{len(broken)} violations at {len(points)} fault points:\n" + "\n".join(broken[:20])


@grouped("sweep_scenario")
def test_sweep_script_exits_2_on_a_fault_in_the_sweep_process(base, data_dir, sweep_scenario):
    """experiments/sweep.py itself, as a process (the scenario runs its main in this one): a fault in
    its own first write (binding a run's name) is one 'error:' line naming the file, exit 2."""
    scenario, result = sweep_scenario
    point = next(p for p in result.points if p.pid == os.getpid())
    work = fresh(base, "sweep-script")
    scenario.setup(work)
    faults = Faults(work, scenario.scratch, point.n)
    outcome = as_subprocess("experiments/sweep.py", SweepScenario.argv(data_dir, os.path.join(work, "sweep"), "0,1"),
                            faults, cwd=work)
    fired = [p for p in outcome.points if p.n == point.n]
    assert fired and fired[0].op == point.op, (point, fired)
    assert not reported_violations(outcome, point, outcome.err, (os.path.dirname(fired[0].target()),)), outcome.err
    assert not disk_violations(outcome, point, work)


# ---------------------------------------------------------------------------- a real full filesystem

# Where in a checkpoint the disk fills (inside torch.save's zip writer, whose own error hides the OSError)
# shifts by a page with the bytes before it; eight levels make it certain that some fill mid-file.
FILL_LEVELS = {"full from the start": 8 << 10,
               **{f"fills mid-run ({kb} kB free)": kb << 10 for kb in range(300, 1100, 100)}}


@pytest.fixture(scope="module")
def full_disk(base, data_dir, train_scenario):
    """Train into a small tmpfs (2 MiB) that a filler file leaves with little space: full from the start,
    or filling at some checkpoint (the first ones take ~140 kB each, the later ones ~370 kB). Then
    delete the filler and run again (resuming where there is a checkpoint). Returns {label: (violations
    at the failure, violations after the recovery, whether a checkpoint was left)}; skipped where
    mount is not permitted."""
    outcomes = {}
    for label, free in FILL_LEVELS.items():
        mnt = fresh(base, "tmpfs")
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            pytest.skip(f"cannot mount a tmpfs here ({getattr(e, 'stderr', b'') or e!s}); run as root to test a real full disk")
        try:
            stat = os.statvfs(mnt)
            filler = os.path.join(mnt, "filler")
            with open(filler, "wb") as f:
                f.write(b"\0" * (stat.f_bavail * stat.f_frsize - free))
            out = os.path.join(mnt, "run")
            argv = once(f"--data_dir={data_dir}", f"--out_dir={out}", *QUICK_ARGS)
            outcome = in_process(train_main, argv, None)
            point = Point(0, label, out, os.getpid())
            os.remove(filler)  # free the space
            at_failure = reported_violations(outcome, point, outcome.err, (out,))
            at_failure += disk_violations(outcome, point, mnt)
            ckpt = os.path.exists(os.path.join(out, "ckpt.pt"))
            again = in_process(train_main, [*argv, f"--init_from={'resume' if ckpt else 'scratch'}"], None)
            if again.code != 0:
                after = [Violation(point, "resume", (again.escaped or again.err).strip()[-300:])]
            else:
                after = [Violation(point, k, d) for k, d in same_run(out, os.path.join(train_scenario[0].reference, "run"))]
            outcomes[label] = (at_failure, after, ckpt)
        finally:
            subprocess.run(["umount", mnt], capture_output=True)
    print("\nfull disk:", {label: [str(v) for v in a + b] for label, (a, b, _) in outcomes.items()})
    return outcomes


@grouped("full_disk")
def test_a_full_disk_leaves_whole_files_and_a_resumable_run(full_disk):
    """At every fill level: every file whole, no temporary file left, and once space is freed the run
    completes (resuming from its checkpoint) to the uninterrupted run's results."""
    assert [label for label, (_, _, ckpt) in full_disk.items() if ckpt] == list(FILL_LEVELS)[1:]  # mid-run
    problems = [v for at_failure, after, _ in full_disk.values() for v in at_failure + after
                if v.kind not in ERROR_EXIT]
    assert not problems, [str(v) for v in problems]


@grouped("full_disk")
def test_a_disk_full_from_the_start_exits_2_naming_the_file(full_disk):
    at_failure, _, _ = full_disk["full from the start"]
    assert not at_failure, [str(v) for v in at_failure]


@grouped("full_disk")
def test_a_disk_that_fills_mid_run_exits_2_naming_the_file(full_disk):
    problems = [v for at_failure, _, _ in full_disk.values() for v in at_failure if v.kind in ERROR_EXIT]
    assert not problems, [str(v) for v in problems]
