"""A run directory (``out_dir``) and the files in it.

  config.json    the resolved TrainConfig, the command line, and each resume
  metrics.jsonl  one JSON object per logged iteration (eval rows add train_loss/val_loss)
  ckpt.pt        the latest state, for --init_from=resume (written at each eval and on interrupt)
  best.pt        the state with the lowest val loss so far, for sampling
  summary.json   how the run ended (one of state.STATUSES), losses (the final one over the whole
                 validation split), the data's n-gram reference losses, time
  .lock          held (an OS lock, flock) by the one process training in the directory

Every file but metrics.jsonl (appended to, row by row) is replaced atomically, so a kill at
any moment leaves loadable files. Under torchrun only rank 0 writes (``writes=False`` elsewhere).
A run owns its directory through ``RunLock`` from its first check to its end: a second process
is refused, and the kernel drops the lock when the owner exits, even on SIGKILL.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import stat

import torch

from .errors import BabyGPTError
from .files import atomic_open, existing_ancestor, path_problem, user_error, write_atomic
from .provenance import RUN_RECORD_FORMAT, source
from .state import AT_END, summary_problems

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not protected from each other there
    fcntl = None


def write_json(path: str, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())


def read_json(path: str) -> dict | None:
    """The JSON object in ``path``, or None if it is missing or unreadable (a FIFO or another file that
    is not a regular one counts as unreadable: opening a FIFO with no writer would block forever)."""
    if os.path.exists(path) and not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError, RecursionError):  # RecursionError: absurdly nested JSON
        return None
    return obj if isinstance(obj, dict) else None


def read_record(path: str, required: tuple[str, ...] = ()) -> dict | None:
    """The JSON object in ``path`` (None if there is no such file), refusing a damaged one
    (not JSON, not an object, or missing a ``required`` key) instead of ignoring it."""
    if not os.path.exists(path):
        return None
    obj = read_json(path)
    missing = [k for k in required if k not in obj] if obj is not None else []
    if obj is None or missing:
        what = f"has no '{missing[0]}'" if missing else "is not a readable JSON object"
        raise BabyGPTError(f"{path} {what}: it is damaged; restore it, or move the run directory "
                           f"aside to start that run afresh")
    return obj


def latest_config(record: dict) -> dict | None:
    """The settings of a run's latest start, from its config.json ``record`` (the last resume's, or
    the first start's); None if that record holds none."""
    resumes = record.get("resumes")
    if resumes is not None and not isinstance(resumes, list):
        return None  # damaged: its readers refuse it
    latest = (resumes or [record])[-1]
    config = latest.get("config") if isinstance(latest, dict) else None
    return config if isinstance(config, dict) else None


def read_summary(path: str) -> dict | None:
    """The summary.json at ``path`` (None if there is none), refusing a damaged one by name: not a
    JSON object, or not what a run writes for its status (state.summary_problems)."""
    summary = read_record(path, ("status",))
    problems = summary_problems(summary) if summary is not None else []
    if problems:
        raise BabyGPTError(f"{path} is damaged ({problems[0]}); restore it, or move the run directory "
                           f"aside to run it again")
    return summary


class RunLock:
    """An exclusive, non-blocking flock on ``<directory>/.lock``. The lock belongs to the open
    file: it ends when the process exits however it ends, so a killed run never leaves it stuck.
    The file is never written, and a holder that was refused after taking it (``undo``) deletes what
    it made, so a refused process changes nothing on disk. Whoever takes the lock checks that the
    file it locked is still the one at the path, so that a deletion never lets two processes hold it;
    the holder's pid is read from /proc/locks."""

    NAME = ".lock"
    TRIES = 10  # takes after which a lock file deleted under us each time is an error

    def __init__(self, directory: str, name: str = NAME):
        # (a sweep also uses this for its claims on runs and its shards' records: babygpt.scaleout)
        self.directory, self.path = directory, os.path.join(directory, name)
        self._fd: int | None = None
        self._made = None  # what acquire found: (anchor, its names and stat, the directory's names or None, had a lock)

    def acquire(self) -> int | None:
        """Take the lock, creating the directory if needed; None once held, or the holder's pid
        (0 if unknown) if another process has it."""
        if fcntl is None:
            return None
        for _ in range(self.TRIES):
            try:
                self._made = self._made or self._found()
                os.makedirs(self.directory, exist_ok=True)
                fd = self._open(os.O_CREAT)
            except OSError as e:
                raise user_error(e, self.directory) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                _raise_if_unsupported(e, self.directory)
                return _flock_holder(self.path)  # held through another open file
            if self._still_at_path(fd):
                self._fd = fd
                return None
            os.close(fd)  # the holder before us deleted it as we opened it: take the new one
        raise BabyGPTError(f"{self.path} was deleted each of {self.TRIES} times this process locked it; "
                           f"stop whatever deletes it, then run the command again")

    def _found(self) -> tuple:
        """What is there before acquire creates anything, for ``undo``."""
        anchor = existing_ancestor(self.directory)
        own = sorted(os.listdir(self.directory)) if os.path.isdir(self.directory) else None
        return anchor, sorted(os.listdir(anchor)), os.stat(anchor), own, os.path.lexists(self.path)

    def _still_at_path(self, fd: int) -> bool:
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            return False
        here = os.fstat(fd)
        return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)

    def undo(self) -> None:
        """For a holder refused before it wrote anything: delete the lock file and the directories
        that acquire created, and put back the modification time of the directory they were made in,
        while still holding the lock. Where anything else appeared meanwhile, all is left as it is."""
        if self._fd is None or self._made is None:
            return
        anchor, anchor_names, anchor_stat, own, had_lock = self._made
        try:
            now = sorted(os.listdir(self.directory))
            if had_lock or now != sorted((own or []) + [self.NAME]):
                return
            os.unlink(self.path)
            if own is None:  # created here, with any parents below anchor
                directory = os.path.abspath(self.directory)
                while directory != anchor:
                    os.rmdir(directory)
                    directory = os.path.dirname(directory)
            if sorted(os.listdir(anchor)) == anchor_names:
                os.utime(anchor, ns=(anchor_stat.st_atime_ns, anchor_stat.st_mtime_ns))
        except OSError:
            return  # (best effort: a refusal's own message matters more than this clean-up)

    def _open(self, flags: int = 0) -> int:
        """A descriptor of the lock file; never blocks (a FIFO put in its place would wait for a
        writer forever), and refuses anything but a regular file by name."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | flags, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BabyGPTError(f"{self.path} is not a regular file; delete it (no process holds a lock "
                               f"through it), then run the command again")
        return fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def holder(self) -> int | None:
        """The pid holding the lock now (0 if unknown), without taking it; None if it is free."""
        if fcntl is None or not os.path.exists(self.path):
            return None
        try:
            fd = self._open()
        except FileNotFoundError:  # deleted by a holder refused just now (undo)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted only if nobody holds it exclusively
            return None
        except OSError as e:
            _raise_if_unsupported(e, self.directory)
            return _flock_holder(self.path)
        finally:
            os.close(fd)


def _raise_if_unsupported(e: OSError, directory: str) -> None:
    """A filesystem without flock (e.g. Lustre mounted without -o flock) must not read as 'held by
    someone' forever: say so."""
    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise BabyGPTError(f"the filesystem of '{directory}' does not support file locks (flock: {e.strerror}); "
                           f"put the output on a filesystem that does (local disk, NFSv4, Lustre mounted with "
                           f"-o flock)") from None


def _flock_holder(path: str) -> int:
    """The pid of the process holding a flock on ``path``, from Linux's /proc/locks
    (``1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF``); 0 where unknown."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for fields in (line.split() for line in lines):
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == device and fields[4].isdigit():
            return int(fields[4])
    return 0


def in_use_message(directory: str, pid: int) -> str:
    holder = f"process {pid}" if pid else "another process"
    return (f"out_dir '{directory}' is in use by {holder}, which is training there; wait for it to end "
            f"(or stop it), or choose another --out_dir (nothing was changed)")


def run_record(config: dict, argv: list[str], device, num_params: int, world_size: int) -> dict:
    """config.json of a new run: the resolved config, the command line, where it runs and which code
    (provenance.source: the git commit and whether the tree was dirty)."""
    record = {"format": RUN_RECORD_FORMAT, "config": config, "argv": argv, "device": str(device),
              "torch": torch.__version__, "source": source(), "num_params": num_params, "resumes": []}
    if world_size > 1:
        record["world_size"] = world_size
    return record


@contextlib.contextmanager
def owned(directory: str, dist, device: torch.device):
    """Hold ``directory``'s RunLock for the block, or refuse with the holder's pid. Under torchrun
    rank 0 takes it for the whole job, and every rank learns its answer, so that all refuse together."""
    lock = RunLock(directory)
    holder = lock.acquire() if dist.is_main else None
    if dist.enabled:  # (holder pid + 1) or 0 from rank 0, 0 from the others
        code = torch.tensor([0 if holder is None else holder + 1], dtype=torch.long, device=device)
        holder = int(dist.sum(code).item()) - 1
        holder = None if holder < 0 else holder
    if holder is not None:
        raise BabyGPTError(in_use_message(directory, holder))
    try:
        yield
    except BabyGPTError:  # refused: leave the directory as it was found
        lock.undo()
        raise
    finally:
        lock.release()


class RunDir:
    def __init__(self, path: str, writes: bool = True):
        self.path, self.writes = path, writes
        self.mirror = None  # also given every metrics row (a TensorBoardTracker, tensorboard = True)
        self.ckpt = os.path.join(path, "ckpt.pt")
        self.best = os.path.join(path, "best.pt")
        self.metrics = os.path.join(path, "metrics.jsonl")
        self.config = os.path.join(path, "config.json")
        self.summary = os.path.join(path, "summary.json")

    def check_not_in_use(self) -> None:
        """Refuse a directory another process is training in (checked first: it is the reason)."""
        holder = RunLock(self.path).holder() if os.path.isdir(self.path) else None
        if holder is not None:
            raise BabyGPTError(in_use_message(self.path, holder))

    def check(self, init_from: str) -> None:
        """Refuse, before anything is written, an out_dir that would lose data or cannot work."""
        if not self.path.strip():
            raise BabyGPTError("out_dir is empty; pass --out_dir=DIR")
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise BabyGPTError(f"out_dir '{self.path}' is a file, not a directory; choose another --out_dir")
        problem = path_problem(self.path)  # a NUL byte, a name or path too long for the filesystem
        if problem:
            raise BabyGPTError(f"out_dir {problem}; choose another --out_dir")
        ancestor = existing_ancestor(self.path)
        if not os.path.isdir(ancestor):
            raise BabyGPTError(f"out_dir '{self.path}' cannot be created: '{ancestor}' is a file; "
                               f"choose another --out_dir")
        if not os.access(ancestor, os.W_OK):
            raise BabyGPTError(f"out_dir '{self.path}' is not writable ('{ancestor}' is read-only to you); "
                               f"choose another --out_dir or fix its permissions")
        for path in (self.config, self.metrics, self.summary, self.ckpt, self.best):
            if os.path.lexists(path) and not os.path.isfile(path):  # a FIFO, a directory, a dangling link
                raise BabyGPTError(f"{path} is not a regular file; move it aside (a run writes it as a file)")
        # A run that wrote any checkpoint or summary is kept; a directory with only the logs of a
        # run killed before its first checkpoint may be reused (best.pt is written before ckpt.pt,
        # so a run stopped between the two at its first eval leaves an iteration-0 best.pt alone).
        if init_from == "scratch" and (any(os.path.exists(p) for p in (self.ckpt, self.summary))
                                       or os.path.exists(self.best) and not self._untrained_best()):
            raise BabyGPTError(f"out_dir '{self.path}' already holds a run; continue it with "
                               f"--init_from=resume, or choose another --out_dir (nothing was overwritten)")
        if init_from == "resume" and not os.path.exists(self.ckpt):
            raise BabyGPTError(f"cannot resume: no checkpoint at {self.ckpt}; train from scratch first "
                               f"(drop --init_from=resume) or point --out_dir at an existing run")
        if init_from == "resume":  # damaged records are refused now, not replaced at start()
            record = read_record(self.config, ("config",))
            if record and not (isinstance(record["config"], dict) and isinstance(record.get("resumes", []), list)):
                raise BabyGPTError(f"{self.config} is damaged (its config or resumes has the wrong type); restore "
                                   f"it, or move the run directory aside to start that run afresh")
            self.metrics_rows()

    def last_settings(self) -> dict | None:
        """The settings of the run's latest start (config.json's form), None before its first."""
        record = read_record(self.config, ("config",))
        return latest_config(record) if record else None

    def _untrained_best(self) -> bool:
        """Whether best.pt holds the model as initialised (iteration 0): nothing trained is lost."""
        from .checkpoint import load_checkpoint

        try:
            return load_checkpoint(self.best).get("iter") == 0
        except BabyGPTError:
            return False

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
            record = read_record(self.config) or {**info, "resumes": []}
            record.setdefault("resumes", []).append(
                {"iter": resumed_at, "argv": info["argv"], "config": info["config"], "source": info.get("source")})
        write_json(self.config, record)

    def metrics_rows(self) -> list[dict]:
        """The rows of metrics.jsonl. Only its last line may be cut short (by a kill mid-append):
        that one is dropped; any other unreadable line means the file is damaged."""
        if not os.path.exists(self.metrics):
            return []
        if not os.path.isfile(self.metrics):  # (a FIFO would block the read)
            raise BabyGPTError(f"{self.metrics} is not a regular file; move it aside (a run writes it as a file)")
        with open(self.metrics, "rb") as f:
            lines = f.read().split(b"\n")
        rows = []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
                if not isinstance(row.get("iter"), int):
                    raise ValueError
                rows.append(row)
            except (ValueError, AttributeError, RecursionError):
                if line.strip() and number < len(lines):
                    raise BabyGPTError(f"{self.metrics} line {number} is not a metrics row: the file is "
                                       f"damaged; repair or delete that line, then resume") from None
        return rows

    def _truncate_metrics(self, last_iter: int) -> None:
        """Keep only the metrics rows up to ``last_iter``; a row cut short by a kill is dropped too."""
        rows = [json.dumps(row) + "\n" for row in self.metrics_rows() if row["iter"] <= last_iter]
        with atomic_open(self.metrics) as f:
            f.write("".join(rows).encode())

    def log(self, row: dict, sync: bool = False) -> None:
        """Append one metrics row; with ``sync``, it reaches the disk before anything written after it."""
        if not self.writes:
            return
        try:
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
                if sync:  # eval rows reach the disk before the checkpoint that follows them
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as e:  # e.g. the disk filled up: the checkpoints written so far are whole
            raise user_error(e, self.metrics) from None
        if self.mirror is not None:
            self.mirror.log(row)

    def finished_summary(self, at_iter: int) -> dict | None:
        """summary.json if it records this run reached its end at ``at_iter``, else None."""
        summary = read_summary(self.summary)
        done = summary and summary["status"] in AT_END and summary.get("iter") == at_iter
        return summary if done else None

    def write_summary(self, summary: dict) -> None:
        if self.writes:
            write_json(self.summary, summary)
