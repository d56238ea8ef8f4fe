"""TensorBoard logging (babygpt/tracker.py): what metrics.jsonl holds, read back from the event files."""

import json
import math
import os

import pytest

from babygpt import tracker

pytestmark = pytest.mark.slow  # not in the fast loop: each test trains a run into a tracker


def read_events(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_scalars_spread_layers_and_drop_what_is_not_a_finite_number():
    row = {"iter": 5, "loss": 2.5, "val_loss": None, "lr": 1e-3, "resid_rms": [1.0, math.nan, 3.0],
           "diverged_at": 4, "tokens_per_s": math.inf, "flag": True}
    assert tracker.scalars(row) == {"loss": 2.5, "lr": 1e-3, "resid_rms/layer_0": 1.0, "resid_rms/layer_2": 3.0,
                                    "diverged_at": 4.0}


def test_missing_package_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setattr(tracker.importlib.util, "find_spec", lambda name: None)
    assert "pip install tensorboard" in tracker.missing_problem()


@pytest.mark.parametrize("stray", ["", "raise ImportError('half-installed')\n"], ids=["empty", "raising"])
def test_a_tensorboard_that_is_found_but_does_not_work_is_refused_before_the_run_writes(stray, tmp_path, monkeypatch,
                                                                                         capsys):
    """A broken install, or a stray package named tensorboard ahead of the real one on the path,
    passes a look-up but fails on first use: the check uses it, so train.py refuses before its
    out_dir exists."""
    import sys

    from babygpt import cli

    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "__init__.py").write_text(stray)
    ours = lambda: [m for m in sys.modules if m.split(".")[0] == "tensorboard" or m.startswith("torch.utils.tensorboard")]  # noqa: E731
    real = {name: sys.modules.pop(name) for name in ours()}  # put back afterwards: later tests use the real one
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "does not work" in tracker.missing_problem()
        code = cli.run(cli.train_main, ["--tensorboard=true", f"--out_dir={tmp_path / 'run'}", "--device=cpu"])
    finally:
        for name in ours():
            del sys.modules[name]
        sys.modules.update(real)
    err = capsys.readouterr().err
    assert code == 2 and f"the tensorboard package found ({tmp_path / 'tensorboard'}" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_rows_read_back_and_a_resume_purges_the_steps_after_its_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    first = tracker.TensorBoardTracker(str(tmp_path))
    for it, loss in [(0, 4.0), (10, 3.0), (20, 2.5)]:
        first.log({"iter": it, "loss": loss})
    first.close()
    resumed = tracker.TensorBoardTracker(str(tmp_path), resumed_at=10)  # the checkpoint was at 10
    resumed.log({"iter": 20, "loss": 2.4})
    resumed.close()
    assert read_events(os.path.join(tmp_path, tracker.LOG_DIR))["loss"] == [(0, 4.0), (10, 3.0), (20, pytest.approx(2.4))]


def test_a_run_with_tensorboard_logs_what_metrics_jsonl_holds(tmp_path):
    pytest.importorskip("tensorboard")
    from babygpt.config import load_config
    from babygpt.trainer import train
    from conftest import TINY_TRAIN_ARGS, once, prepare_small_data

    data_dir = prepare_small_data(tmp_path)
    out = tmp_path / "run"
    train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, "--max_iters=10",
                       "--tensorboard", "--diag_interval=5")))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    events = read_events(str(out / tracker.LOG_DIR))
    assert events["val_loss"] == [(r["iter"], pytest.approx(r["val_loss"])) for r in rows if "val_loss" in r]
    assert events["loss"] == [(r["iter"], pytest.approx(r["loss"])) for r in rows if r.get("loss") is not None]
    assert [s for s, _ in events["resid_rms/layer_1"]] == [5, 10]


def test_tensorboard_without_the_package_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from babygpt import cli
    from conftest import assert_user_error

    monkeypatch.setattr(tracker.importlib.util, "find_spec", lambda name: None)
    code = cli.run(cli.train_main, [f"--out_dir={tmp_path / 'run'}", "--tensorboard"])
    assert_user_error(capsys.readouterr().err, code, "pip install tensorboard")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("body", ["import sys\nsys.exit(0)\n", "import sys\nsys.exit(3)\n", "raise KeyboardInterrupt\n",
                                  "import os\nos._exit(0)\n", "import os\nos.abort()\n"])
def test_a_stray_tensorboard_package_that_exits_is_refused_not_obeyed(body, tmp_path, monkeypatch):
    import sys

    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "__init__.py").write_text(body)
    ours = lambda: [m for m in sys.modules if m.split(".")[0] == "tensorboard" or m.startswith("torch.utils.tensorboard")]  # noqa: E731
    real = {name: sys.modules.pop(name) for name in ours()}
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        problem = tracker.missing_problem()
        assert "does not work" in problem
        assert "ProcessExit: os." in problem if "os." in body else True  # named, not obeyed
    finally:
        for name in ours():
            del sys.modules[name]
        sys.modules.update(real)


def test_a_file_where_the_event_files_go_is_refused_before_the_run_writes(tmp_path, capsys):
    from babygpt import cli
    from conftest import prepare_small_data

    out = tmp_path / "run"
    out.mkdir()
    (out / "tensorboard").write_text("in the way")
    code = cli.run(cli.train_main, ["--tensorboard=true", f"--out_dir={out}", "--device=cpu", "--max_iters=1",
                                    f"--data_dir={prepare_small_data(tmp_path)}"])
    err = capsys.readouterr().err
    assert code == 2 and "is where tensorboard = True writes its event files, but it is not a directory" in err
    assert set(os.listdir(out)) - {".lock"} == {"tensorboard"}  # nothing written (the run lock aside)


@pytest.mark.parametrize("body, change", [
    ("import sys\nsys.stderr = None\n", "StateChanged: replaced sys.stderr"),
    ("import builtins\nbuiltins.print = None\n", "StateChanged: replaced builtins.print"),
    ("import atexit\natexit.register(print, 'goodbye')\n", "ProcessExit: atexit.register()"),
    ("import os\nos.kill(os.getpid(), 0)\n", "ProcessExit: os.kill()"),
], ids=["stderr", "print", "atexit", "kill"])
def test_a_stray_tensorboard_package_that_changes_the_process_is_refused_and_undone(body, change, tmp_path,
                                                                                     monkeypatch):
    """As a config file: a package imported for tensorboard = True that replaces the streams later
    messages go to, or a builtin, or that signals the process or leaves an exit handler, is named as
    not working, and what it changed is put back."""
    import builtins
    import sys

    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "__init__.py").write_text(body)
    ours = lambda: [m for m in sys.modules if m.split(".")[0] == "tensorboard" or m.startswith("torch.utils.tensorboard")]  # noqa: E731
    real = {name: sys.modules.pop(name) for name in ours()}
    monkeypatch.syspath_prepend(str(tmp_path))
    stderr, names = sys.stderr, dict(vars(builtins))
    try:
        problem = tracker.missing_problem()
        assert sys.stderr is stderr and builtins.print is names["print"]  # put back
        assert "does not work" in problem and change in problem, problem
    finally:
        builtins.__dict__.update(names)
        sys.stderr = stderr
        for name in ours():
            del sys.modules[name]
        sys.modules.update(real)


def full_disk_for(monkeypatch, where: str) -> None:
    """Every record written to an event file under ``where``, after the file's first (its header),
    fails as on a full disk."""
    import errno

    from tensorboard.summary.writer import record_writer

    real = record_writer.RecordWriter.write

    def write(self, data):
        if os.fsencode(where) in self._writer.filename and getattr(self, "header_written", False):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.header_written = True
        return real(self, data)
    monkeypatch.setattr(record_writer.RecordWriter, "write", write)


def test_a_full_disk_under_the_event_files_is_named_with_the_fix(tmp_path, monkeypatch):
    """The event files are written by tensorboard's own thread: its OSError is raised by the next row
    (or the close), naming the event file and the fix, and not raised twice."""
    pytest.importorskip("tensorboard")
    from babygpt.errors import BabyGPTError

    full_disk_for(monkeypatch, str(tmp_path))
    board = tracker.TensorBoardTracker(str(tmp_path))
    board.log({"iter": 0, "loss": 4.0})
    board.writer.flush()  # (waits until tensorboard's thread has written the row)
    with pytest.raises(BabyGPTError) as refused:
        board.log({"iter": 1, "loss": 3.0})
    (message,) = refused.value.problems
    assert message.startswith(f"writing '{tmp_path / tracker.LOG_DIR / 'events.out.tfevents.'}")
    assert message.endswith("failed: No space left on device; free some disk space, or run without "
                            "tensorboard = True")
    board.close()  # reported once: the run's close after the error does not raise it again


def test_a_run_whose_event_files_fill_the_disk_stops_naming_the_file(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tensorboard")
    from babygpt import cli
    from conftest import TINY_TRAIN_ARGS, assert_user_error, once, prepare_small_data

    out = tmp_path / "run"
    full_disk_for(monkeypatch, str(out))
    code = cli.run(cli.train_main, once(f"--data_dir={prepare_small_data(tmp_path)}", f"--out_dir={out}",
                                        *TINY_TRAIN_ARGS, "--max_iters=10", "--tensorboard"))
    err = capsys.readouterr().err
    assert_user_error(err, code, f"error: writing '{out / tracker.LOG_DIR / 'events.out.tfevents.'}",
                      "failed: No space left on device; free some disk space")
    assert "Exception in thread" not in err


def test_a_full_disk_under_the_check_is_named_as_the_disk_not_the_package(tmp_path, monkeypatch):
    """The check writes into a temporary directory: a full disk there is not a broken install."""
    pytest.importorskip("tensorboard")
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    full_disk_for(monkeypatch, str(tmp_path))
    problem = tracker.missing_problem()
    assert problem.startswith(f"tensorboard = True checks its writer in a temporary directory first, and writing "
                              f"'{tmp_path}{os.sep}")
    assert problem.endswith("failed: No space left on device; free some disk space") and "reinstall" not in problem
