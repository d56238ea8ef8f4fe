"""Run a sweep: many trainings, each a separate train.py process (the runs and their records:
babygpt.sweepdir).

A run found done is not run again, and one that was killed resumes from its checkpoint, so a
killed sweep picks up where it stopped when started again. SIGINT or SIGTERM to the sweep is passed
on to the runs in progress, which checkpoint and stop; no new run starts, and the sweep exits 130 or
143. Run it again to resume. SIGUSR1 drains it instead: the runs in progress train to their end, no
new run starts, and the sweep exits 128 + its number (138 on Linux) if it left runs not done.

Beyond one process (babygpt.scaleout): ``shard=K/N`` trains only its slice of the runs, then retries
runs of shards that stopped without finishing them, and (``wait``) waits for the rest; ``collect``
trains nothing and writes the table from what the shards left (made on any machine, but all on
one kind of device in one dtype); with CUDA, each job is pinned to
its own GPU. Every process claims a run before training it, so no two ever train the same run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from tqdm import tqdm

from . import launcher
from .errors import BabyGPTError, Interrupted
from .experimentdir import SETTINGS_FILE, made_by
from .launcher import PreloadedLauncher
from .options import empty_entry_problems, option, parse_into
from .rundir import RunLock, latest_config
from .runstore import RunStore
from .runtime import machine, machine_label, resolve_device, same_kind
from .scaleout import DeviceSlots, ScaleOutOptions, Shard, claim, hold_shard, pinned_gpus, recorded_split, \
    shard_state, visible_gpus
from .signals import signal_name
from .sweepdir import COLUMNS, DONE, MAX_NAME, Run, SweepDir, grid

# The sweep's API, in one place for scripts (the run list and its records are babygpt.sweepdir's).
__all__ = ["COLUMNS", "DONE", "MAX_NAME", "Run", "SKIPPED", "Sweep", "SweepOptions", "grid", "ignored_set_problems",
           "main", "parse_value", "shard_done_message"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")
SKIPPED = "skipped"  # _execute's answer for a run another process claimed or finished first
# Finish the runs in progress and start no more: for a machine lent for a fixed time, or a
# scheduler's warning before its limit (Slurm's --signal=USR1@120). POSIX only.
DRAIN_SIGNAL = getattr(signal, "SIGUSR1", None)
# Set once DRAIN_SIGNAL arrives, for the whole process: an experiment runs its sweeps one after
# another (an LR search's rounds), and a drain that came as one ended must stop the next as well.
_drained_by: int | None = None


class SignalRelay:
    """A sweep's signals. SIGINT or SIGTERM is remembered (``stop``) and passed on, once, to each
    train.py in progress, which checkpoints and stops; DRAIN_SIGNAL is remembered for the whole
    process (``draining``) and never reaches the children. Either wakes ``wake``'s waiters at once."""

    def __init__(self):
        self.stop: int | None = None  # the signal the sweep was asked to stop by
        self.wake = threading.Event()
        self._children: dict[int, subprocess.Popen] = {}  # pid -> running train.py
        self._signalled: dict[int, object] = {}  # pids already sent the stop signal (once each)

    @property
    def draining(self) -> int | None:
        return _drained_by

    @property
    def halting(self) -> bool:
        """Stopped or drained: start no more runs and wait for no other process's."""
        return bool(self.stop or self.draining)

    @contextmanager
    def installed(self):
        """The handlers, for the duration (signals reach the main thread only)."""
        handling = threading.current_thread() is threading.main_thread()
        handlers = {signal.SIGINT: self._on_stop, signal.SIGTERM: self._on_stop}
        if DRAIN_SIGNAL is not None:
            handlers[DRAIN_SIGNAL] = self._on_drain
        previous = {s: signal.signal(s, h) for s, h in handlers.items()} if handling else {}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    @contextmanager
    def watching(self, child: subprocess.Popen):
        """``child`` gets the stop signal while it runs, also one that came while it was starting."""
        self._children[child.pid] = child
        try:
            if self.stop:
                self._pass_on(child, self.stop)
            yield
        finally:
            del self._children[child.pid]

    def _pass_on(self, child: subprocess.Popen, signum: int) -> None:
        """Send ``signum`` to ``child`` unless it was sent one already (by the handler or by the
        worker thread that started it: setdefault decides atomically which of them sends)."""
        token = object()
        if self._signalled.setdefault(child.pid, token) is token and child.poll() is None:
            child.send_signal(signum)

    def _on_stop(self, signum, frame) -> None:
        self.stop = self.stop or signum
        self.wake.set()
        for child in list(self._children.values()):
            self._pass_on(child, self.stop)

    def _on_drain(self, signum, frame) -> None:
        """The runs in progress train on to their end (their children never see this signal: each
        has its own session); waits for other shards' runs end at once."""
        global _drained_by
        _drained_by = signum
        self.wake.set()


class Sweep(SweepDir):
    """Runs a sweep's runs: ``jobs`` train.py at a time, only ``shard``'s slice (then what stopped
    shards left), each on its own GPU where there are GPUs; or (``collect``) none."""

    POLL_S = 2.0  # how often a process waiting for other processes' runs looks again

    def __init__(self, root: str, runs: list[Run], base_args: list[str] = (), jobs: int = 1,
                 shard: Shard | None = None, gpus: list[int] | None = None, collect: bool = False,
                 reuse: list[str] = ()):
        super().__init__(root, runs, base_args, collect)
        self.jobs = jobs
        self.reuse = list(reuse)  # sweep directories whose stored runs are copied instead of trained
        self.shard, self.gpus = shard, gpus
        self.signals = SignalRelay()
        self.exit_codes: dict[str, int] = {}
        self._launcher: PreloadedLauncher | None = None  # while run() trains: starts the CPU runs

    def check(self, on_disk: bool = True) -> None:
        """SweepDir.check, and the GPUs --gpus asks for: all refused before anything is written."""
        if self.jobs < 1:
            raise BabyGPTError(f"--jobs must be at least 1, got {self.jobs}")
        pinned_gpus(self.gpus, visible_gpus())
        for directory in self.reuse:  # a damaged store is refused now, before bind writes anything
            RunStore(directory).records()
        super().check(on_disk)

    def _command(self, run: Run) -> list[str]:
        out = self.out_dir(run)
        resume = os.path.exists(os.path.join(out, "ckpt.pt"))  # a killed or interrupted run
        return [sys.executable, TRAIN_PY, *self._config_args(run), f"--out_dir={out}",
                f"--init_from={'resume' if resume else 'scratch'}"]

    def _execute(self, run: Run, slots: DeviceSlots) -> int | str | None:
        """Claim the run and train it to its end: train.py's exit code; SKIPPED if another process
        claimed or finished it first; None if the sweep was stopped or drained before it started."""
        if self.signals.halting:
            return None
        lock = claim(self.root, run.name)
        if lock.acquire() is not None:
            return SKIPPED
        try:
            if self.status(run) in DONE:  # finished by another process since this one looked
                return SKIPPED
            with slots.take() as gpu:
                code = self._spawn(run, gpu)
            self.pack(run)
            return code
        finally:
            lock.release()

    def _spawn(self, run: Run, gpu: str | None) -> int | None:
        os.makedirs(os.path.join(self.root, "logs"), exist_ok=True)
        env = dict(os.environ)
        if self.jobs > 1:  # share the cores instead of oversubscribing them
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.jobs)))
        if gpu is not None:  # the child sees only its own GPU, as cuda:0
            env["CUDA_VISIBLE_DEVICES"] = gpu
        log_path = os.path.join(self.root, "logs", run.name + ".log")
        if gpu is None and self._launcher is not None:  # a fork of a process that has imported torch
            child = self._launcher.start(self._command(run)[2:], log_path, env)
            with self.signals.watching(child):
                return child.wait()
        with open(log_path, "a", encoding="utf-8") as log:
            if gpu is not None:
                log.write(f"[sweep] CUDA_VISIBLE_DEVICES={gpu}\n")
                log.flush()
            # Its own session: a Ctrl-C in the terminal reaches the sweep only, which passes it on
            # once (a second signal would make train.py die at once, without its checkpoint).
            child = subprocess.Popen(self._command(run), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            with self.signals.watching(child):
                return child.wait()

    def run(self, progress: bool = True, wait: bool = True) -> list[dict] | None:
        """Check everything, run what is not done yet, then write and return the results rows.
        A shard trains its own slice and the runs that stopped shards left; with ``wait`` it then
        waits for every other run, else it returns None. Raises Interrupted (after the runs in
        progress have checkpointed) on SIGINT/SIGTERM, and (after they have ended) on
        DRAIN_SIGNAL if it leaves runs it did not start."""
        self.check()
        if self.collect:
            return self._collected()
        if self.shard is not None:
            hold_shard(self.root, self.shard)
        self.bind()
        self.pack_finished()
        self.copy_reused()
        slots = DeviceSlots(pinned_gpus(self.gpus, visible_gpus()), self.jobs)
        codes = self.exit_codes = {}  # train.py's exit code, by run, of the runs trained here
        # the CPU runs fork a server that has imported torch where that is safe (launcher.py)
        self._launcher = PreloadedLauncher() if launcher.available() else None
        with self.signals.installed(), tqdm(total=len(self.runs), desc="runs", unit="run", disable=not progress,
                                            dynamic_ncols=True) as bar:
            batch = self.mine()
            while not self.signals.halting:
                self._train(batch, slots, codes, bar)
                batch = self._wait_for_others(codes, bar, wait or self.shard is None)
                if not batch:
                    break
        stop, drain = self.signals.stop, self.signals.draining
        if stop:
            stopped = sum(1 for code in codes.values() if code == 128 + stop)
            raise Interrupted(stop, f"sweep stopped by {signal_name(stop)}: {stopped} run(s) in "
                                    f"progress saved a checkpoint; run the same command again to resume")
        left = [r for r in self.runs if self.status(r) not in DONE] if drain else []
        if left:
            raise Interrupted(drain, f"sweep drained by {signal_name(drain)}: the runs it had "
                                     f"started have ended, {len(left)} run(s) are not done; run the "
                                     f"same command again to train them")
        if self.shard is not None and not wait:
            return None
        rows = [self.result(r, codes.get(r.name)) for r in self.runs]
        self.write_csv(rows)
        return rows

    def copy_reused(self) -> None:
        """Copy into this sweep's store the runs --reuse's stores hold that this sweep would train:
        the same name and settings, made on this kind of machine (a table is made on one kind).
        Says what it copied and what it trains again because it was made elsewhere."""
        copied, elsewhere = {}, {}
        for run in (r for r in self.runs if self.status(r) not in DONE):
            for directory in self.reuse:
                record = RunStore(directory).get(run.name)
                if record is None or self._differences(latest_config(record["config"]) or {}, self._wanted[run.name],
                                                       record["config"].get("device")):
                    continue
                if not same_kind(record["summary"].get("machine"), self.machine_here(run)):
                    elsewhere.setdefault(directory, machine_label(record["summary"].get("machine")))
                    continue
                self.store.add({**record, "copied_from": directory})
                copied[directory] = copied.get(directory, 0) + 1
                break
        for directory, count in copied.items():
            print(f"reused {count} run(s) from {directory} (same settings, same kind of machine)", file=sys.stderr)
        for directory, label in elsewhere.items():
            print(f"--reuse {directory}: runs with these settings were made on {label}, another kind of machine "
                  f"than this one: they are trained here, so that the table compares runs made alike", file=sys.stderr)

    def machine_here(self, run: Run) -> dict:
        """The machine record a run of this sweep would write: this device, with the threads its job gets."""
        device = resolve_device(self._wanted[run.name].get("device", "auto"))
        here = machine(device)
        if device.type != "cuda":
            threads = os.environ.get("OMP_NUM_THREADS") or (max(1, (os.cpu_count() or 1) // self.jobs)
                                                             if self.jobs > 1 else None)
            here["threads"] = int(threads) if threads and threads.isdigit() else here["threads"]
        return here

    def mine(self) -> list[Run]:
        """The runs this process trains first: its shard's slice, or all of them."""
        return [r for i, r in enumerate(self.runs) if self.shard is None or self.shard.owns(i)]

    def _train(self, runs: list[Run], slots: DeviceSlots, codes: dict, bar) -> None:
        bar.n = sum(self.status(r) in DONE for r in self.runs)
        bar.refresh()
        todo = [r for r in runs if self.status(r) not in DONE]
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            for run, code in zip(todo, pool.map(lambda r: self._execute(r, slots), todo)):
                if code is not None and code != SKIPPED:
                    codes[run.name] = code
                    bar.update(1)
                    bar.set_postfix_str(f"{run.name}: {self.status(run) or f'exit {code}'}")

    def _wait_for_others(self, codes: dict, bar, wait: bool) -> list[Run]:
        """The runs left for this process to take (runs nobody is on whose shard stopped), waiting
        while others train the rest if ``wait``; [] when nothing is left to do or wait for."""
        said = None
        while not self.signals.halting:
            pending = [r for r in self.runs if r.name not in codes and self.status(r) not in DONE]
            free = [r for r in pending if self._abandoned(r)]
            if free or not pending or not wait:
                return free
            if len(pending) != said:
                said = len(pending)
                bar.write(f"{self._who()}: waiting for {said} run(s) that other processes are training or "
                          f"will train ({self._shard_states()})", file=sys.stderr)
            bar.n = len(self.runs) - len(pending)
            bar.refresh()
            self.signals.wake.wait(self.POLL_S)
        return []

    def _abandoned(self, run: Run) -> bool:
        """Nobody trains ``run`` now, and no shard that is still running or yet to start owns it."""
        # the claim first: a claimed run's train.py may be taking its run lock, which a probe would refuse
        if claim(self.root, run.name).holder() is not None or RunLock(self.out_dir(run)).holder() is not None:
            return False
        if self.shard is None:
            return True
        owner = Shard(self.runs.index(run) % self.shard.count, self.shard.count)
        return owner == self.shard or shard_state(self.root, owner) == "stopped"

    def _who(self) -> str:
        return f"shard {self.shard}" if self.shard is not None else "sweep"

    def _shard_states(self) -> str:
        count = self.shard.count if self.shard is not None else recorded_split(self.root)
        if count is None:
            return "no shards"
        states = {k: shard_state(self.root, Shard(k, count)) for k in range(count)}
        return ", ".join(f"shard {k}/{count} {state}" for k, state in states.items())

    def check_collectable(self) -> None:
        """--collect: every run has finished (checked before anything is written)."""
        missing = [r for r in self.runs if self.status(r) not in DONE]
        if missing:
            count = recorded_split(self.root)
            owner = f" (shard {self.runs.index(missing[0]) % count}/{count})" if count else ""
            raise BabyGPTError(f"{len(missing)} of {len(self.runs)} runs in {self.root} have not finished "
                               f"(first: {missing[0].name}{owner}; {self._shard_states()}); run the shards that "
                               f"own them again, or this command without --collect to train them here")

    def _collected(self) -> list[dict]:
        """The results of runs other processes trained (--collect): all must have finished."""
        self.check_collectable()
        self.check_made_alike()
        self.pack_finished()
        rows = [self.result(r, None) for r in self.runs]
        self.write_csv(rows)
        return rows


def shard_done_message(sweep: Sweep) -> str:
    """What a shard says when its part is done: how far the sweep is, and how to merge. Raises if a
    run it trained failed (so that a job array marks the task failed)."""
    failed = [r.name for r in sweep.runs if r.name in sweep.exit_codes and sweep.status(r) not in DONE]
    if failed:
        raise BabyGPTError(f"shard {sweep.shard}: {len(failed)} run(s) failed (e.g. {failed[0]}); see "
                           f"{os.path.join(sweep.root, 'logs', failed[0] + '.log')}")
    done = sum(sweep.status(r) in DONE for r in sweep.runs)
    return (f"shard {sweep.shard}: done; {done} of {len(sweep.runs)} runs of the sweep have finished. Once every "
            f"shard has, write the tables: the same command with --collect in place of --shard {sweep.shard}")


# The keys a sweep sets for every run itself, and what sets them: a --set or --grid of one would be
# silently replaced (a --grid seed=1,2 would train every run at --seeds' 0).
SWEEP_OWN = {"seed": "--seeds", "out_dir": "--out", "init_from": "the sweep"}


def ignored_set_problems(sets: list[str], runs: list[Run]) -> list[str]:
    """Problems for --set KEY=VALUE options whose key every run sets itself (the seed, the run
    directory, or a grid axis): they would be silently replaced."""
    own = dict(SWEEP_OWN)
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
class SweepGrid:
    """What experiments/sweep.py runs: the config, the grid, the fixed keys, the seeds."""

    config: Optional[str] = option(None, "config file applied to every run", positional=True, metavar="CONFIG.py")
    grid: list[str] = option([], "one grid axis, KEY=V1,V2,... (repeatable)")
    set: list[str] = option([], "KEY=VALUE fixed for every run (repeatable)")
    seeds: str = option("0", "comma-separated seeds", metavar="SEED,...")
    jobs: int = option(1, "runs in parallel")
    out: str = option("out/sweep", "sweep directory (out/ is git-ignored: a sweep to commit names a results/ one)")

    def axes(self) -> dict[str, list]:
        """{key: [values]} of the --grid options (well-formed: see problems)."""
        return {key: [parse_value(v) for v in values.split(",")]
                for key, _, values in (spec.partition("=") for spec in self.grid)}

    def seed_list(self) -> list[int]:
        return [int(s) for s in self.seeds.split(",")]

    def problems(self) -> list[str]:
        specs = [spec.partition("=") for spec in self.grid]
        problems = [f"malformed --grid '{key}{eq}{values}'; write --grid key=value1,value2"
                    for key, eq, values in specs if not (key and values)]
        problems += [p for key, _, values in specs if key and values
                     for p in empty_entry_problems(f"--grid {key}", values)]
        keys = [key for key, _, _ in specs]
        problems += [f"--grid {key} is given {keys.count(key)} times; list all its values in one --grid {key}=..."
                     for key in dict.fromkeys(keys) if keys.count(key) > 1]
        problems += [f"--grid {key} has no effect: each run's {key} is set by {SWEEP_OWN[key]}"
                     + ("; list the seeds there instead, e.g. --seeds 0,1,2" if key == "seed" else "; drop it")
                     for key in dict.fromkeys(keys) if key in SWEEP_OWN]
        if not all(_is_int(s) for s in self.seeds.split(",")):
            problems.append(f"--seeds must be comma-separated integers, got '{self.seeds}'")
        if self.jobs < 1:
            problems.append(f"--jobs must be at least 1, got {self.jobs}")
        if self.config and not os.path.exists(self.config):
            problems.append(f"config file '{self.config}' not found; check the path")
        return problems + self.out_problems()

    def out_problems(self) -> list[str]:
        """An --out that holds an experiment's results: the sweep's runs and results.csv would mix with
        them, under a settings.json that no longer says what made them (the experiment refuses a
        sweep's directory in turn, as files of unknown origin)."""
        experiment = made_by(self.out)
        if experiment is None:
            return []
        return [f"--out '{self.out}' holds the results of experiment {experiment} (its {SETTINGS_FILE} says so); a "
                f"sweep would mix its runs and results.csv into them: use another --out"]


@dataclass
class SweepOptions(ScaleOutOptions, SweepGrid):
    """experiments/sweep.py's command line: the grid, then how it is spread (listed in that order)."""

    def problems(self) -> list[str]:
        return SweepGrid.problems(self) + self.scale_out_problems()


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
    sweep = Sweep(args.out, runs, base, args.jobs, args.shard_spec(), args.gpu_list(), args.collect,
                  args.reuse_list())
    rows = sweep.run(wait=False)
    if rows is None:  # a shard: the table is written once every shard has finished
        print(shard_done_message(sweep))
        return 0
    failed = [r for r in rows if r["status"] not in DONE]
    for r in rows:
        print(f"{r['name']}: {r['status']}, final val {r['final_val_loss']}, best val {r['best_val_loss']}")
    print(f"results: {os.path.join(args.out, 'results.csv')}")
    if failed:
        logs = os.path.join(args.out, "logs")
        raise BabyGPTError(f"{len(failed)} run(s) failed (e.g. {failed[0]['name']}); see {logs}/")
    return 0
