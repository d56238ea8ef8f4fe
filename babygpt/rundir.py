"""A run directory (``out_dir``) and the files in it.

  config.json    the resolved TrainConfig, the command line, and each resume
  metrics.jsonl  one JSON object per logged iteration (eval rows add train_loss/val_loss)
  ckpt.pt        the latest state, for --init_from=resume (written at each eval and on interrupt)
  best.pt        the state with the lowest val loss so far, for sampling
  summary.json   how the run ended: finished | diverged | interrupted, losses, iterations, time

Every file but metrics.jsonl (appended to, row by row) is replaced atomically, so a kill at
any moment leaves loadable files. Under torchrun only rank 0 writes (``writes=False`` elsewhere).
"""

from __future__ import annotations

import glob
import json
import os

import torch

from .errors import BabyGPTError
from .files import atomic_open, write_atomic


def write_json(path: str, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())


def read_json(path: str) -> dict | None:
    """The JSON object in ``path``, or None if it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_record(config: dict, argv: list[str], device, num_params: int, world_size: int) -> dict:
    """config.json of a new run: the resolved config, the command line, where it runs."""
    record = {"config": config, "argv": argv, "device": str(device), "torch": torch.__version__,
              "num_params": num_params, "resumes": []}
    if world_size > 1:
        record["world_size"] = world_size
    return record


class RunDir:
    def __init__(self, path: str, writes: bool = True):
        self.path, self.writes = path, writes
        self.ckpt = os.path.join(path, "ckpt.pt")
        self.best = os.path.join(path, "best.pt")
        self.metrics = os.path.join(path, "metrics.jsonl")
        self.config = os.path.join(path, "config.json")
        self.summary = os.path.join(path, "summary.json")

    def check(self, init_from: str) -> None:
        """Refuse, before anything is written, an out_dir that would lose data or cannot work."""
        if not self.path.strip():
            raise BabyGPTError("out_dir is empty; pass --out_dir=DIR")
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise BabyGPTError(f"out_dir '{self.path}' is a file, not a directory; choose another --out_dir")
        ancestor = os.path.abspath(self.path)
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            raise BabyGPTError(f"out_dir '{self.path}' cannot be created: '{ancestor}' is a file; "
                               f"choose another --out_dir")
        # A run that wrote any checkpoint or summary is kept; a directory with only the logs of a
        # run killed before its first checkpoint may be reused.
        if init_from == "scratch" and any(os.path.exists(p) for p in (self.ckpt, self.best, self.summary)):
            raise BabyGPTError(f"out_dir '{self.path}' already holds a run; continue it with "
                               f"--init_from=resume, or choose another --out_dir (nothing was overwritten)")
        if init_from == "resume" and not os.path.exists(self.ckpt):
            raise BabyGPTError(f"cannot resume: no checkpoint at {self.ckpt}; train from scratch first "
                               f"(drop --init_from=resume) or point --out_dir at an existing run")

    def start(self, info: dict, resumed_at: int | None) -> None:
        """Create the directory and record this start in config.json: ``info`` for a new run; for
        a resume (``resumed_at``: the checkpoint's iteration), one more entry in the run's list of
        resumes. Metrics rows after the checkpoint are dropped: they will be logged again."""
        if not self.writes:
            return
        os.makedirs(self.path, exist_ok=True)
        for stale in glob.glob(os.path.join(self.path, ".tmp-*")):  # left by a kill mid-write
            os.remove(stale)
        self._truncate_metrics(-1 if resumed_at is None else resumed_at)
        record = info
        if resumed_at is not None:
            record = read_json(self.config) or {**info, "resumes": []}
            record.setdefault("resumes", []).append(
                {"iter": resumed_at, "argv": info["argv"], "config": info["config"]})
        write_json(self.config, record)

    def _truncate_metrics(self, last_iter: int) -> None:
        """Keep only the metrics rows up to ``last_iter``; a row cut short by a kill is dropped too."""
        rows = []
        if os.path.exists(self.metrics):
            with open(self.metrics, encoding="utf-8") as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue
                    if row["iter"] <= last_iter:
                        rows.append(line if line.endswith("\n") else line + "\n")
        with atomic_open(self.metrics) as f:
            f.write("".join(rows).encode())

    def log(self, row: dict, sync: bool = False) -> None:
        """Append one metrics row; with ``sync``, it reaches the disk before anything written after it."""
        if not self.writes:
            return
        with open(self.metrics, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            if sync:  # eval rows reach the disk before the checkpoint that follows them
                f.flush()
                os.fsync(f.fileno())

    def write_summary(self, summary: dict) -> None:
        if self.writes:
            write_json(self.summary, summary)
