"""A sweep's CPU runs start as forks of a server that has imported torch (babygpt/launcher.py): each
must be what `python train.py ARGS` started by subprocess would be, to the bit."""

import multiprocessing.forkserver
import os
import subprocess
import sys

import pytest

from babygpt import launcher
from babygpt.state import COMPLETED
from babygpt.sweep import Sweep
from babygpt.sweepdir import Run
from conftest import ROOT, TINY_TRAIN_ARGS, assert_same_weights, once, prepare_small_data

pytestmark = [pytest.mark.slow,  # each starts processes
              pytest.mark.skipif(not launcher.available(), reason="the fork server is used on Linux only")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("launcher"))


def test_a_forked_run_equals_a_new_train_py_process_and_says_the_same(data_dir, tmp_path):
    args = once(f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=10")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = launcher.PreloadedLauncher().start([*args, f"--out_dir={tmp_path / 'forked'}"], str(tmp_path / "forked.log"),
                                             env)
    assert run.wait() == 0 and run.poll() == 0
    with open(tmp_path / "new.log", "w") as log:
        code = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args, f"--out_dir={tmp_path / 'new'}"],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env).returncode
    assert code == 0
    assert_same_weights(tmp_path / "forked" / "ckpt.pt", tmp_path / "new" / "ckpt.pt")
    said = [(tmp_path / f"{name}.log").read_text().replace(str(tmp_path / name), "OUT") for name in ("forked", "new")]
    speedless = [[line.split(" | ")[:3] for line in text.splitlines()] for text in said]  # tokens/s differ
    assert speedless[0] == speedless[1] and "done: 10 iterations" in said[0]


def test_a_refused_run_exits_2_with_its_error_in_the_log(data_dir, tmp_path):
    log = tmp_path / "run.log"
    log.write_text("earlier text\n")  # appended to, as a resumed run's log is
    run = launcher.PreloadedLauncher().start([f"--data_dir={data_dir}", "--n_embd=-1", f"--out_dir={tmp_path / 'out'}"],
                                             str(log), dict(os.environ))
    assert run.wait() == 2
    text = log.read_text()
    assert text.startswith("earlier text\n") and "error: " in text and "Traceback" not in text
    assert not (tmp_path / "out").exists()


def test_the_server_restarts_when_the_environment_changed(data_dir, tmp_path, monkeypatch):
    """A fork inherits the server's imports: a changed environment (e.g. a sitecustomize on PYTHONPATH)
    takes effect at the next sweep, which starts a new server."""
    args = once(f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=1", "--eval_interval=1")
    assert launcher.PreloadedLauncher().start([*args, f"--out_dir={tmp_path / 'a'}"], str(tmp_path / "a.log"),
                                              dict(os.environ)).wait() == 0
    monkeypatch.setenv("BABYGPT_LAUNCHER_TEST", "changed")
    assert launcher._server_env.get("BABYGPT_LAUNCHER_TEST") is None
    assert launcher.PreloadedLauncher().start([*args, f"--out_dir={tmp_path / 'b'}"], str(tmp_path / "b.log"),
                                              dict(os.environ)).wait() == 0
    assert launcher._server_env["BABYGPT_LAUNCHER_TEST"] == "changed"


def server_pid():
    return multiprocessing.forkserver._forkserver._forkserver_pid  # (private: the test's only window on it)


def test_a_fork_runs_in_its_starters_directory_and_a_momentary_variable_keeps_the_server(data_dir, tmp_path,
                                                                                          monkeypatch):
    """Relative paths resolve where the run was started, as for a new process, though the server
    started elsewhere; pytest's PYTEST_CURRENT_TEST, rewritten at every test, does not restart it."""
    args = once(f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=1", "--eval_interval=1")
    pids = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        assert launcher.PreloadedLauncher().start([*args, "--out_dir=out"], "run.log", dict(os.environ)).wait() == 0
        assert (tmp_path / name / "out" / "ckpt.pt").exists() and (tmp_path / name / "run.log").exists()
        pids.append(server_pid())
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another moment")
    assert launcher.PreloadedLauncher().start([*args, "--out_dir=out2"], "run.log", dict(os.environ)).wait() == 0
    pids.append(server_pid())
    assert pids[0] is not None and pids == [pids[0]] * 3


def test_a_sweep_trains_its_cpu_runs_by_fork_with_the_same_results_as_by_new_processes(data_dir, tmp_path,
                                                                                         monkeypatch):
    base = once(f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=10")
    runs = [Run({}, 0), Run({}, 1)]
    started = []
    monkeypatch.setattr(launcher.PreloadedLauncher, "start",
                        lambda self, *a, start=launcher.PreloadedLauncher.start: started.append(a) or start(self, *a))
    forked = Sweep(str(tmp_path / "forked"), runs, base, jobs=2).run(progress=False)
    assert len(started) == 2 and all(r["status"] in COMPLETED for r in forked)
    monkeypatch.setattr(launcher, "available", lambda: False)
    new = Sweep(str(tmp_path / "new"), runs, base, jobs=2).run(progress=False)
    assert len(started) == 2  # the second sweep started new processes
    assert [r["val_loss_full"] for r in forked] == [r["val_loss_full"] for r in new]
