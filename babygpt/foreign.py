"""Code the program runs but did not write (a config file, an installed package such as a stray
``tensorboard``), kept from ending the process or changing what the rest of the program relies on:
``foreign_code`` stops the calls that would end, signal or take over the process (``ProcessExit``)
and puts back process-wide state the code changed, then reports it (``StateChanged``)."""

from __future__ import annotations

import _thread
import atexit
import builtins
import contextlib
import faulthandler
import gc
import os
import signal
import sys
import threading
import types
import warnings
import weakref

import torch


class ProcessExit(BaseException):
    """A call that would end, replace, fork or signal the process (os._exit(), os.kill(), ...), or leave
    code behind to run later (atexit.register(), a thread), made inside ``foreign_code``: stopped
    before it acts, so the caller can say what did it."""

    def __init__(self, call: str):
        super().__init__(call)
        self.call = call


class StateChanged(BaseException):
    """Process-wide state that code run inside ``foreign_code`` changed (and that was put back):
    ``str()`` says what, e.g. ``replaced sys.stderr``."""

    def __init__(self, changes: list[str]):
        shown = changes[:4] + ([f"{len(changes) - 4} more"] if len(changes) > 4 else [])
        super().__init__(", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0])
        self.changes = changes


# Calls that end the process at once (no cleanup, no message), replace it, fork it, signal it, arm a
# timer that will, or leave code to run at its exit: inside foreign_code, made by the thread that runs
# the foreign code (or one it started), they raise ProcessExit instead.
STOPPED_CALLS = (
    (os, ("_exit", "abort", "kill", "killpg", "fork", "forkpty", "execl", "execle", "execlp", "execlpe", "execv",
          "execve", "execvp", "execvpe")),
    (signal, ("raise_signal", "pthread_kill", "pidfd_send_signal", "alarm", "setitimer")),
    (faulthandler, ("dump_traceback_later",)),  # exit=True ends the process from a C thread, later
    (atexit, ("register",)),
)
THREAD_CALLS = ((threading.Thread, ("start",)), (_thread, ("start_new_thread", "start_new", "start_joinable_thread")))

# Modules whose functions, classes and submodules the program calls after the foreign code ran: one
# that replaced (monkeypatched) any of them is refused, and the original put back.
WATCHED_MODULES = ("os", "posixpath", "ntpath", "sys", "signal", "atexit", "threading", "io", "shutil", "tempfile",
                   "json", "math", "time", "warnings", "subprocess", "torch", "numpy")

STREAMS = ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__")
FD_NAMES = {0: "standard input", 1: "standard output", 2: "standard error"}


def _set_default_device(device) -> None:
    torch.set_default_device(None if device == torch.device("cpu") else device)


# Process-wide settings: (what a change is called, read it, set it back).
SETTINGS = (
    ("the recursion limit (sys.setrecursionlimit)", sys.getrecursionlimit, sys.setrecursionlimit),
    ("the trace function (sys.settrace)", sys.gettrace, sys.settrace),
    ("the profile function (sys.setprofile)", sys.getprofile, sys.setprofile),
    ("the garbage collector (gc.disable)", gc.isenabled, lambda on: gc.enable() if on else gc.disable()),
    ("gradient tracking (torch.set_grad_enabled)", torch.is_grad_enabled, torch.set_grad_enabled),
    ("the default dtype (torch.set_default_dtype)", torch.get_default_dtype, torch.set_default_dtype),
    ("the default device (torch.set_default_device)", torch.get_default_device, _set_default_device),
    ("deterministic algorithms (torch.use_deterministic_algorithms)",
     lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
     lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
)
if hasattr(sys, "get_int_max_str_digits"):
    SETTINGS += (("the integer string limit (sys.set_int_max_str_digits)", sys.get_int_max_str_digits,
                  sys.set_int_max_str_digits),)


def _watched_modules() -> dict[str, types.ModuleType]:
    return {name: module for name, module in list(sys.modules.items())
            if isinstance(module, types.ModuleType) and (name in WATCHED_MODULES or name == "babygpt"
                                                         or name.startswith("babygpt."))}


def _members(module: types.ModuleType) -> dict:
    """What of ``module`` is watched: its functions, classes and modules (other globals, caches and
    counters, change by themselves)."""
    return {k: v for k, v in list(vars(module).items())
            if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType))}


class _Snapshot:
    """The process-wide state foreign code could change for the worse, taken before it runs:
    ``restore()`` puts back whatever changed and says what that was."""

    def __init__(self):
        self.streams = {name: getattr(sys, name, None) for name in STREAMS}
        self.open_streams = {name: s for name, s in self.streams.items() if not getattr(s, "closed", True)}
        self.stream_fds = {}
        for name, stream in self.open_streams.items():
            with contextlib.suppress(Exception):  # (a stream without a file descriptor, e.g. io.StringIO)
                self.stream_fds[name] = stream.fileno()
        self.fds = {}
        for fd in FD_NAMES:
            with contextlib.suppress(OSError):
                self.fds[fd] = (os.dup(fd), self._identity(fd))
        self.builtins = dict(vars(builtins))  # all of them: put back first, by _put_builtins_back
        self.modules = dict(sys.modules)
        self.members = {name: _members(module) for name, module in _watched_modules().items()}
        self.handlers = ({s: signal.getsignal(s) for s in signal.valid_signals()}
                         if threading.current_thread() is threading.main_thread() else {})
        self.settings = [getter() for _, getter, _ in SETTINGS]
        self.warning_list = warnings.filters
        self.warning_filters = list(warnings.filters)
        self.environ = dict(os.environ)
        try:
            self.cwd = os.getcwd()
        except OSError:
            self.cwd = None
        self.atexit = atexit._ncallbacks() if hasattr(atexit, "_ncallbacks") else None

    @staticmethod
    def _identity(fd: int):
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_rdev

    def restore(self, exit_handlers_allowed: int = 0) -> list[str]:
        changes = []
        for name, before in self.streams.items():  # first, so that what follows can be reported
            if getattr(sys, name, None) is not before:
                setattr(sys, name, before)
                changes.append(f"replaced sys.{name}")
        reopened = {}
        for name, stream in self.open_streams.items():
            if getattr(stream, "closed", False):  # reopened on its file descriptor, which stays open
                if stream not in reopened and name in self.stream_fds and self._identity(self.stream_fds[name]):
                    line_buffered = getattr(stream, "line_buffering", False)
                    reopened[stream] = open(self.stream_fds[name], "r" if name.endswith("stdin") else "w",
                                            buffering=1 if line_buffered else -1, closefd=False,
                                            encoding=getattr(stream, "encoding", None),
                                            errors=getattr(stream, "errors", None))
                    changes.append(f"closed sys.{name.strip('_')}")
                if stream in reopened:
                    setattr(sys, name, reopened[stream])
        for fd, (saved, identity) in self.fds.items():
            if self._identity(fd) != identity:
                changes.append(f"redirected or closed its {FD_NAMES[fd]} (file descriptor {fd})")
                with contextlib.suppress(OSError):  # (the code may have closed the copy too)
                    os.dup2(saved, fd)
            with contextlib.suppress(OSError):
                os.close(saved)
        for (what, getter, setter), before in zip(SETTINGS, self.settings):
            if getter() != before:  # (first: torch.set_default_dtype rebinds torch.Storage)
                setter(before)
                changes.append(f"changed {what}")
        for name, members in self.members.items():
            module = self.modules[name]
            now = vars(module)
            for key, value in members.items():
                member = now.get(key, _MISSING)
                if member is not value:
                    now[key] = value
                    changes.append(f"{'removed' if member is _MISSING else 'replaced'} {name}.{key}")
        for name, module in self.modules.items():
            now = sys.modules.get(name, _MISSING)
            if now is not module:
                sys.modules[name] = module
                changes.append(f"{'removed' if now is _MISSING else 'replaced'} sys.modules[{name!r}]")
        for signum, before in self.handlers.items():
            if signal.getsignal(signum) != before and before is not None:
                signal.signal(signum, before)
                changes.append(f"changed the {signal.Signals(signum).name} handler (signal.signal)")
        added = [f for f in warnings.filters if f not in self.warning_filters]
        if warnings.filters is not self.warning_list or warnings.filters != self.warning_filters:
            warnings.filters = self.warning_list
            warnings.filters[:] = self.warning_filters
            getattr(warnings, "_filters_mutated", lambda: None)()
            if any(f[0] == "error" for f in added):  # other filters only show or hide warnings
                changes.append("turned warnings into errors (warnings.simplefilter)")
        names = sorted(k for k in set(os.environ) | set(self.environ) if os.environ.get(k) != self.environ.get(k))
        for name in names:
            if name in self.environ:
                os.environ[name] = self.environ[name]
            else:
                del os.environ[name]
        if names:
            changes.append(f"changed the environment ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})")
        if self.cwd is not None:
            with contextlib.suppress(OSError):
                if os.getcwd() != self.cwd:
                    os.chdir(self.cwd)
                    changes.append("changed the working directory (os.chdir)")
        if self.atexit is not None and atexit._ncallbacks() != self.atexit + exit_handlers_allowed:
            changes.append("registered an exit handler (atexit)")  # cannot be undone: the command must stop
        return changes


_MISSING = object()


class foreign_code:  # noqa: N801  (used as a context manager, like contextlib's)
    """Run the block as code the program did not write (a config file, an installed package): the
    calls in STOPPED_CALLS (and, unless ``threads``, starting a thread) raise ProcessExit instead of
    acting, and the process-wide state it changed is put back (the standard streams and their file
    descriptors, builtins, the functions of WATCHED_MODULES and of babygpt, sys.modules entries, signal
    handlers, SETTINGS, warning filters, the environment, the working directory), raising StateChanged
    to say what. A stopped call that the code caught is raised all the same; a KeyboardInterrupt (a
    real Ctrl-C, maybe) goes on as it is, the state put back. Calls made by threads that were already
    running are not stopped: the program's own threads go on as before.

    A class, not a generator: contextlib's generator managers call builtins (next()) on the way out,
    which the code may have deleted; ``__exit__`` puts builtins back before anything else."""

    def __init__(self, threads: bool = False):
        self.threads = threads

    def __enter__(self) -> "foreign_code":
        self.before = _Snapshot()
        self.running = {t.ident for t in threading.enumerate()} - {threading.get_ident()}
        self.calls: list[str] = []
        self.finalizers: list = []  # weakref.finalize's one exit handler, registered with its first use
        self.patched = []
        for owner, names in STOPPED_CALLS + (() if self.threads else THREAD_CALLS):
            for name in names:
                original = vars(owner).get(name)
                if original is not None:
                    self.patched.append((owner, name, original))
                    setattr(owner, name, self._stopped(owner, name, original))
        return self

    def _stopped(self, owner, name: str, original):
        where = f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type) else owner.__name__
        label = f"{where}.{name}()"

        def stop(*args, **kwargs):
            if threading.get_ident() in self.running:  # the program's own threads
                return original(*args, **kwargs)
            if name == "register" and args and _is_finalizer(args[0]):  # Python's own bookkeeping
                self.finalizers.append(args[0])
                return original(*args, **kwargs)
            self.calls.append(label)
            raise ProcessExit(label)
        return stop

    def __exit__(self, kind, raised, tb):
        changed_builtins = _put_builtins_back(self.before.builtins)  # first: what follows calls them
        for owner, name, original in self.patched:
            setattr(owner, name, original)
        changes = sorted(changed_builtins) + self.before.restore(len(self.finalizers))
        if isinstance(raised, KeyboardInterrupt):
            return False
        if changes:
            raise StateChanged([f"called {call}" for call in self.calls] + changes) from None
        if self.calls and not isinstance(raised, ProcessExit):  # stopped, then caught by the code itself
            raise ProcessExit(self.calls[0]) from None
        return False


def _put_builtins_back(saved: dict) -> list[str]:
    """Put back the builtins as ``saved``, calling none of them (the code may have deleted any)."""
    now = builtins.__dict__
    changes = []
    for key in now.keys() | saved.keys():
        if key not in saved:
            del now[key]
            changes.append(f"added builtins.{key}")
        elif now.get(key, _MISSING) is not saved[key]:
            changes.append(f"{'removed' if key not in now else 'replaced'} builtins.{key}")
            now[key] = saved[key]
    return changes


def _is_finalizer(function) -> bool:
    return getattr(function, "__func__", None) is weakref.finalize._exitfunc.__func__
