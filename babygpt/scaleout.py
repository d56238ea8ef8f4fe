"""Spreading a sweep beyond one process: shards for many machines, one GPU per job, claims on runs.

A sweep's run list is the same in every process given the same command, so ``--shard K/N`` can take
the runs at positions i with i % N == K (0 <= K < N, as a Slurm array's task ids count): N machines,
or the N tasks of a job array, share one ``--out`` and never split a run between them.

Two kinds of OS lock (flock, ``babygpt.rundir.RunLock``) live in that shared directory:

  claims/<run>.lock     held by the sweep process while its train.py trains that run: another
                        process skips a claimed run, and a claim dies with its holder
  shards/K-of-N.lock    created when shard K starts and held until it exits: a shard whose file
                        exists but is not held has stopped (finished, or died), and the runs of
                        its slice left unfinished may be retried by another process

The kernel (or the NFSv4 server) drops a flock when its process ends, even on SIGKILL or when a
scheduler cancels the job, so a dead shard never leaves a run locked.
"""

from __future__ import annotations

import glob
import os
import queue
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from .config import set_problems
from .errors import BabyGPTError
from .options import option, repeated_entries
from .rundir import RunLock
from .runstore import STORE


@dataclass(frozen=True)
class Shard:
    index: int  # K, from 0
    count: int  # N

    @classmethod
    def parse(cls, text: str) -> "Shard":
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
        if not match or not int(match[2]) or int(match[1]) >= int(match[2]):
            raise BabyGPTError(f"--shard must be K/N with 0 <= K < N (e.g. --shard 0/4, or --shard "
                               f"$SLURM_ARRAY_TASK_ID/4 in a job array), got '{text}'")
        return cls(int(match[1]), int(match[2]))

    def owns(self, position: int) -> bool:
        """Whether the run at ``position`` of the sweep's run list belongs to this shard."""
        return position % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def file_name(self) -> str:
        return f"{self.index}-of-{self.count}.lock"


@dataclass
class ScaleOutOptions:
    """The command-line options of every sweep (experiments/sweep.py and the training experiments)."""

    shard: Optional[str] = option(None, "run only slice K of N of the runs (K from 0), e.g. one task of a "
                                        "Slurm array; every shard writes into the same --out", metavar="K/N")
    collect: bool = option(False, "train nothing: read every finished run in --out and write the tables "
                                  "(after the shards have finished)")
    gpus: Optional[str] = option(None, "comma-separated GPU indices the jobs are pinned to, one job per "
                                       "entry at a time (default: every visible GPU, round-robin)")
    reuse: Optional[str] = option(None, "sweep directories (comma-separated, e.g. a committed results/ one) whose "
                                        "stored runs are copied instead of trained: a run of the same name and "
                                        "settings, made on this kind of machine (CPU model and threads, or GPU; "
                                        "torch)", metavar="DIR,...")

    def scale_out_problems(self) -> list[str]:
        # every sweep takes --set (declared beside its own options): each KEY=VALUE is read here, with
        # the other options, before --out is looked at
        problems = set_problems(getattr(self, "set", []))
        if self.shard is not None:
            try:
                Shard.parse(self.shard)
            except BabyGPTError as e:
                problems += e.problems
            if self.collect:
                problems.append("--collect trains nothing, so it takes no --shard; run it once, after the shards")
            if getattr(self, "overwrite", False):
                problems.append("--overwrite with --shard would let one shard delete the others' runs; "
                                "clear --out once before starting the shards")
        if self.gpus is not None and not re.fullmatch(r"\d+(,\d+)*", self.gpus.replace(" ", "")):
            problems.append(f"--gpus must be comma-separated GPU indices (e.g. --gpus 0,1), got '{self.gpus}'")
        problems += repeated_entries("--reuse", self.reuse_list())
        problems += [f"--reuse {d!r} holds no runs.jsonl; pass sweep directories whose runs are stored, e.g. "
                     f"results/full/exp2_gpt2" for d in self.reuse_list() if not os.path.isfile(os.path.join(d, STORE))]
        return problems

    def shard_spec(self) -> Shard | None:
        return Shard.parse(self.shard) if self.shard is not None else None

    def gpu_list(self) -> list[int] | None:
        return [int(g) for g in self.gpus.replace(" ", "").split(",")] if self.gpus is not None else None

    def reuse_list(self) -> list[str]:
        return [d for d in (self.reuse or "").split(",") if d]


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as its children must name them in CUDA_VISIBLE_DEVICES: the
    entries of our own CUDA_VISIBLE_DEVICES (a scheduler's allocation) or 0..n-1; [] without CUDA."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ours = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return ours[:count] if len(ours) >= count and ours else [str(i) for i in range(count)]


def pinned_gpus(requested: list[int] | None, visible: list[str]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each job slot's GPU: ``requested`` (indices into the visible
    GPUs, as torch numbers them) or every visible GPU; [] (no pinning) on a machine without CUDA."""
    if requested is None:
        return list(visible)
    if not visible:
        raise BabyGPTError("--gpus was given but this machine has no CUDA GPU visible; drop --gpus to run on the CPU")
    bad = [g for g in requested if g >= len(visible)]
    if bad:
        raise BabyGPTError(f"--gpus {bad[0]}: only {len(visible)} GPU(s) are visible (indices 0-{len(visible) - 1})")
    return [visible[g] for g in requested]


class DeviceSlots:
    """One GPU per running job. Job slot i holds ``gpus[i % len(gpus)]``, and a job takes a free slot
    for as long as it runs, so with ``jobs`` <= the GPUs no two jobs ever share one, and beyond that
    no GPU runs more than ceil(jobs / len(gpus)) of them. Without GPUs every job gets None."""

    def __init__(self, gpus: list[str], jobs: int):
        self._free: queue.Queue = queue.Queue()
        for i in range(jobs):
            self._free.put(gpus[i % len(gpus)] if gpus else None)

    @contextmanager
    def take(self):
        gpu = self._free.get()  # never waits: the sweep runs at most ``jobs`` jobs at once
        try:
            yield gpu
        finally:
            self._free.put(gpu)


def claim(root: str, run_name: str) -> RunLock:
    """The lock a sweep process holds on a run while it trains it (acquire() is None if taken)."""
    return RunLock(os.path.join(root, "claims"), run_name + ".lock")


_HELD: dict[str, RunLock] = {}  # the shard records this process holds, by path, until it exits


def hold_shard(root: str, shard: Shard) -> None:
    """Mark ``shard`` as running in ``root`` for the rest of this process; refuse a second copy of the
    same shard and a shard of another split of the same sweep."""
    other = [os.path.basename(p) for p in glob.glob(os.path.join(root, "shards", "*-of-*.lock"))
             if not os.path.basename(p).endswith(f"-of-{shard.count}.lock")]
    if other:
        raise BabyGPTError(f"{root} holds shards of another split ({other[0][:-5]}); use the same N in --shard K/N "
                           f"for every shard of a sweep (or, once none of them runs, delete {os.path.join(root, 'shards')})")
    lock = RunLock(os.path.join(root, "shards"), shard.file_name())
    if lock.path in _HELD:
        return
    holder = lock.acquire()
    if holder is not None:
        raise BabyGPTError(f"shard {shard} of {root} is already running (process {holder or '(on another machine)'}); "
                           f"each shard runs once at a time")
    _HELD[lock.path] = lock


def shard_state(root: str, shard: Shard) -> str:
    """'waiting' (never started), 'running', or 'stopped' (finished or died)."""
    lock = RunLock(os.path.join(root, "shards"), shard.file_name())
    if not os.path.exists(lock.path):
        return "waiting"
    return "stopped" if lock.holder() is None else "running"


def recorded_split(root: str) -> int | None:
    """N of the shards that have written into ``root`` (None if no shard has)."""
    counts = {int(m[1]) for p in glob.glob(os.path.join(root, "shards", "*-of-*.lock"))
              if (m := re.search(r"-of-(\d+)\.lock$", p))}
    return max(counts) if counts else None
