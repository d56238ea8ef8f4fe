"""Fault injection for tests/test_faults.py: make the N-th filesystem write operation fail.

Test code only, never imported by the product. ``install`` wraps, in this process:

  open      builtins.open / io.open for writing (modes w, a, x, +; os.fdopen goes through io.open),
            os.open with O_WRONLY, O_RDWR or O_CREAT (tempfile.mkstemp, lock files), os.mkdir of a
            directory that does not exist yet (os.makedirs goes through it)
  write     .write / .writelines of a file opened for writing as above (its 1st, 4th, 16th, 64th, ...
            call: see _File), os.write
  flush     .flush of such a file, when something was written since the last flush
  fsync     os.fsync (fsync-dir: of a directory, as after a rename)
  replace   os.replace, os.rename, os.link (rename and link: named so)

Only operations on paths under ``root`` count (an fd's path is read from /proc/self/fd). Each one
is a *fault point*, numbered 1, 2, ... in the order they happen; at point ``fail_at`` (and, with
``persist``, at every point after it, like a disk that stays full) the operation raises
OSError(errno) *instead of* happening, as the kernel would say it: with the path for open, mkdir,
replace, rename and link, without one for write, flush and fsync.

The count is kept in-process, or (``counter``: a file path) across processes in a file appended
to with O_APPEND, one byte per point, so that a command and the processes it starts (a sweep and
its train.py) share one numbering. ``log`` (a file path) gets one line per point,
``<n> <op> <pid> <FAIL|ok> <path>``, to learn what each point is.

tests/faults/sitecustomize.py installs it in any Python process started with tests/faults on
PYTHONPATH and BABYGPT_FAULT_CONTROL set (see ``from_env``).
"""

from __future__ import annotations

import builtins
import errno as errno_module
import io
import json
import os
import re

_real = {"open": builtins.open, "io_open": io.open, "os_open": os.open, "write": os.write, "fsync": os.fsync,
         "replace": os.replace, "rename": os.rename, "link": os.link, "mkdir": os.mkdir}

TMP = r"^\.tmp-[a-z0-9_]{8}-"  # babygpt.files.atomic_open's temporary files: .tmp-XXXXXXXX-<name>
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _fd_path(fd) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except (OSError, TypeError):
        return None


def identity(path: str) -> tuple | None:
    """What changes when a file is replaced or written to, even with the same bytes."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class Injector:
    def __init__(self, root: str, fail_at: int | None = None, errno: int = errno_module.ENOSPC,
                 persist: bool = False, counter: str | None = None, log: str | None = None):
        self._counter_fd = self._log_fd = None
        self._saved: list[tuple[object, str, object]] = []
        self.configure(root, fail_at, errno, persist, counter, log)

    def configure(self, root: str, fail_at: int | None = None, errno: int = errno_module.ENOSPC,
                  persist: bool = False, counter: str | None = None, log: str | None = None) -> None:
        """Count from zero under ``root``, failing at ``fail_at`` (see the module's docstring)."""
        self._close()
        self.root = os.path.join(os.path.realpath(root), "")
        self.fail_at, self.errno, self.persist = fail_at, errno, persist
        self.count = 0
        self.fired: list[tuple[int, str, str]] = []  # (point, op, path) of each failure raised here
        self.points: list[tuple[int, str, str]] = []  # every point this process saw (in-process use)
        # (inode, size, mtime_ns) of a file (None: absent) as its temporary replacement was opened:
        # what a message "(X is unchanged)" can be checked against
        self.before_write: dict[str, tuple | None] = {}
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self._counter_fd = _real["os_open"](counter, flags, 0o644) if counter else None
        self._log_fd = _real["os_open"](log, flags, 0o644) if log else None

    def _close(self) -> None:
        for fd in (self._counter_fd, self._log_fd):
            if fd is not None:
                os.close(fd)
        self._counter_fd = self._log_fd = None

    # ------------------------------------------------------------------ the points

    def covers(self, path) -> bool:
        if path is None or isinstance(path, int):
            return False
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return os.path.join(real, "").startswith(self.root)

    def _next(self) -> int:
        if self._counter_fd is None:
            self.count += 1
            return self.count
        _real["write"](self._counter_fd, b"x")  # O_APPEND: the offset after it is this point's number
        return os.lseek(self._counter_fd, 0, os.SEEK_CUR)

    def point(self, op: str, path, named: bool) -> None:
        """Count an operation on ``path``; raise the injected error if it is the one to fail."""
        if not self.covers(path):
            return
        path = os.fsdecode(path)
        parent, name = os.path.split(path)
        if op == "open" and re.match(TMP, name):  # an atomic write begins: remember what it replaces
            target = os.path.join(parent, re.sub(TMP, "", name))
            self.before_write[target] = identity(target)
        n = self._next()
        fail = self.fail_at is not None and (n == self.fail_at or (self.persist and n > self.fail_at))
        self.points.append((n, op, path))
        if self._log_fd is not None:
            line = f"{n} {op} {os.getpid()} {'FAIL' if fail else 'ok'} {path}\n"
            _real["write"](self._log_fd, line.encode("utf-8", "surrogateescape"))
        if fail:
            self.fired.append((n, op, path))
            if named:
                raise OSError(self.errno, os.strerror(self.errno), path)
            raise OSError(self.errno, os.strerror(self.errno))

    # ------------------------------------------------------------------ the wrappers

    def _open(self, real):
        injector = self

        def open_(file, mode="r", *args, **kwargs):
            writes = any(c in mode for c in "wax+")
            path = _fd_path(file) if isinstance(file, int) else file
            if not (writes and injector.covers(path)):
                return real(file, mode, *args, **kwargs)
            if not isinstance(file, int):
                injector.point("open", path, named=True)
            return _File(real(file, mode, *args, **kwargs), os.fsdecode(path), injector)
        return open_

    def _os_open(self, path, flags, *args, **kwargs):
        if flags & WRITE_FLAGS:
            self.point("open", path, named=True)
        return _real["os_open"](path, flags, *args, **kwargs)

    def _write(self, fd, data):
        self.point("write", _fd_path(fd), named=False)
        return _real["write"](fd, data)

    def _fsync(self, fd):
        path = _fd_path(fd.fileno() if hasattr(fd, "fileno") else fd)
        self.point("fsync-dir" if path and os.path.isdir(path) else "fsync", path, named=False)
        return _real["fsync"](fd)

    def _move(self, op):
        def move(src, dst, *args, **kwargs):
            if self.covers(dst) or self.covers(src):
                self._move_point(op, src, dst, dst if self.covers(dst) else src)
            return _real[op](src, dst, *args, **kwargs)
        return move

    def _move_point(self, op, src, dst, path):
        try:
            self.point(op, path, named=True)
        except OSError as e:  # as the kernel reports it: both names
            raise OSError(e.errno, e.strerror, os.fsdecode(src), None, os.fsdecode(dst)) from None

    def _mkdir(self, path, *args, **kwargs):
        if not os.path.exists(path):
            self.point("mkdir", path, named=True)
        return _real["mkdir"](path, *args, **kwargs)

    # ------------------------------------------------------------------ install / remove

    def install(self, patch=None) -> "Injector":
        """Patch the functions; ``patch(obj, name, value)`` (pytest's monkeypatch.setattr) undoes
        itself at the end of the test, else ``uninstall`` does."""
        def setattr_(obj, name, value):
            if patch is not None:
                patch(obj, name, value)
            else:
                self._saved.append((obj, name, getattr(obj, name)))
                setattr(obj, name, value)
        setattr_(builtins, "open", self._open(_real["open"]))
        setattr_(io, "open", self._open(_real["io_open"]))
        setattr_(os, "open", self._os_open)
        setattr_(os, "write", self._write)
        setattr_(os, "fsync", self._fsync)
        setattr_(os, "replace", self._move("replace"))
        setattr_(os, "rename", self._move("rename"))
        setattr_(os, "link", self._move("link"))
        setattr_(os, "mkdir", self._mkdir)
        return self

    def uninstall(self) -> None:
        while self._saved:
            obj, name, value = self._saved.pop()
            setattr(obj, name, value)
        self._close()


class _File:
    """A file opened for writing, whose writes and flush are fault points. Of the many write calls
    one file may get (torch.save makes ~500 for a small checkpoint), the 1st, 4th, 16th, 64th, ...
    are points: the same code path fails at each, early or late in the file."""

    def __init__(self, f, path: str, injector: Injector):
        self._f, self._path, self._injector = f, path, injector
        self._dirty = False
        self._writes = 0

    def _written(self):
        self._writes += 1
        self._dirty = True
        if self._writes & (self._writes - 1) == 0 and self._writes.bit_length() % 2:  # 1, 4, 16, 64, ...: a power of four
            self._injector.point("write", self._path, named=False)

    def write(self, data):
        self._written()
        return self._f.write(data)

    def writelines(self, lines):
        self._written()
        return self._f.writelines(lines)

    def flush(self):
        if self._dirty:
            self._dirty = False
            self._injector.point("flush", self._path, named=False)
        return self._f.flush()

    def __enter__(self):
        self._f.__enter__()
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


ERRNOS = {"ENOSPC": errno_module.ENOSPC, "EIO": errno_module.EIO, "EDQUOT": errno_module.EDQUOT}


def write_control(path: str, root: str, fail_at: int | None = None, errno: str = "ENOSPC", persist: bool = False,
                  counter: str | None = None, log: str | None = None) -> None:
    """The settings of the next command's injectors, in the file BABYGPT_FAULT_CONTROL names: a file
    and not the environment, so that the environment stays the same from one command to the next
    and a sweep's fork server (babygpt/launcher.py), which restarts when it changes, serves them all."""
    settings = {"root": root, "fail_at": fail_at, "errno": errno, "persist": persist, "counter": counter, "log": log}
    with _real["open"](path, "w") as f:
        json.dump(settings, f)


def read_control(path: str) -> dict:
    with _real["open"](path) as f:
        settings = json.load(f)
    return {**settings, "errno": ERRNOS[settings["errno"]]}


def from_env(environ=os.environ) -> Injector | None:
    """The injector BABYGPT_FAULT_CONTROL's file asks for (write_control), re-read in each forked
    child (a sweep's runs are forks of a server started before this command), or None without it."""
    control = environ.get("BABYGPT_FAULT_CONTROL")
    if not control:
        return None
    injector = Injector(**read_control(control))
    os.register_at_fork(after_in_child=lambda: injector.configure(**read_control(control)))
    return injector
