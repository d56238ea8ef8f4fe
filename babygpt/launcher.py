"""Start a sweep's CPU runs from a process that has already imported torch, so that a run costs its
training and not Python's and torch's start.

A train.py process spends about 5 s of CPU before its first step on the 2-core AVX2 EPYC this project
is tested on: about 2.7 s importing torch and 2.2 s importing torch._dynamo, which torch.optim loads
when the first optimizer is built (``add_param_group`` is wrapped by ``torch._disable_dynamo``). A
quick sweep's runs train for a second or two, so that start was most of their cost. Here
multiprocessing's fork server imports torch, torch._dynamo and the trainer once per sweep; each run
is a fork of it that behaves as ``python train.py ARGS`` started by subprocess would: its own session,
stdin from /dev/null, stdout and stderr appended to the run's log, the sweep's environment, the same
exit codes (negative: killed by that signal).

Used only where forking after importing torch is safe and no GPU is involved: on Linux, for runs
that get no GPU of their own (a fork server never initialises CUDA, but CUDA_VISIBLE_DEVICES must be
set before a process first touches it, so runs pinned to a GPU keep starting as new processes).

One server per environment: a fork inherits what the server imported when it started, so when the
environment has changed since (a test's fault injector, installed by a sitecustomize on PYTHONPATH),
the next sweep stops the server and starts a new one; an experiment's sweeps share one. A fork does
not inherit the server's working directory: it moves to the one its sweep runs in, as a new process
would start there.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
import threading

# What the server imports once: the trainer (torch with it) and what torch.optim would load later.
PRELOAD = ["babygpt.cli", "babygpt.trainer", "torch._dynamo"]

# Variables that name a moment rather than the environment, so a change in them keeps the server:
# pytest rewrites PYTEST_CURRENT_TEST at each phase of each test, and no import reads it (comparing
# it restarted the server, about 5 s of CPU, in every test that runs a sweep).
MOMENTARY = frozenset({"PYTEST_CURRENT_TEST"})


def _environment() -> dict[str, str]:
    """This process's environment as a server started now would inherit it, moments aside."""
    return {k: v for k, v in os.environ.items() if k not in MOMENTARY}


def available() -> bool:
    """Forking a process that has imported torch is safe on Linux (macOS's system frameworks are not
    fork-safe); multiprocessing's fork server exists on POSIX."""
    return sys.platform.startswith("linux") and "forkserver" in multiprocessing.get_all_start_methods()


class ForkedRun:
    """The part of subprocess.Popen a sweep uses (pid, poll, send_signal, wait), for a forked run."""

    def __init__(self, process: multiprocessing.Process):
        self._process = process
        self.pid = process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, signum)

    def wait(self) -> int:
        self._process.join()
        return self._process.exitcode


def train_in_fork(argv: list[str], log_path: str, env: dict[str, str], cwd: str) -> None:
    """The forked run: detach, redirect and move to ``cwd`` as a new train.py process started there
    would be, then train."""
    os.chdir(cwd)  # the server's own directory is where the first sweep of its environment ran
    os.setsid()  # as start_new_session: a Ctrl-C in the terminal reaches the sweep only
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    import torch

    if env.get("OMP_NUM_THREADS"):  # read by torch when it started in the server: apply this run's own
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    from babygpt.cli import run, train_main

    sys.exit(run(train_main, argv))


# The environment the running server started with (None: no server started here, or it was stopped).
_server_env: dict[str, str] | None = None
_STARTING = threading.Lock()  # one start at a time (PreloadedLauncher.start)


def _stop_server() -> None:
    """Stop multiprocessing's fork server. It offers no public way; without the private one the
    server lives on, and a later sweep forks it as it is."""
    global _server_env
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()
        _server_env = None


class PreloadedLauncher:
    """Starts runs as forks of one preloading server, started at the first run; a server started
    under another environment is stopped first."""

    def __init__(self):
        self._context = multiprocessing.get_context("forkserver")
        self._checked = False

    def start(self, argv: list[str], log_path: str, env: dict[str, str]) -> ForkedRun:
        """Fork a run of ``argv``; a sweep's job threads call this at once, so one at a time: a
        thread must not connect to the server while another stops or starts it."""
        global _server_env
        with _STARTING:
            if not self._checked:
                if _server_env is not None and _server_env != _environment():
                    _stop_server()
                if _server_env is None:
                    self._context.set_forkserver_preload(PRELOAD)
                    _server_env = _environment()
                self._checked = True
            process = self._context.Process(target=train_in_fork, args=(argv, log_path, env, os.getcwd()),
                                            daemon=False)
            process.start()
        return ForkedRun(process)
