"""babygpt/plot.py: the loss curves of runs with their reference losses, the divergence marker, and
its command line."""

import os
import subprocess
import sys

import pytest

from babygpt.plot import diverged_at, load_run
from babygpt.sweep import Run, Sweep
from conftest import ROOT, TINY_TRAIN_ARGS, assert_refused_in_process, prepare_small_data

BASE = [a for a in TINY_TRAIN_ARGS if not a.startswith("--device")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("data"))


DIVERGING = {"norm_type": "none", "learning_rate": 1e3, "weight_decay": 0.0, "grad_clip": 0.0, "warmup_iters": 0,
             "min_lr": 0.0, "log_interval": 1}


@pytest.fixture(scope="module")
def small_sweep(data_dir, tmp_path_factory):
    """A finished two-run sweep: one normal run, one that diverges."""
    runs = [Run({"norm_type": "rmsnorm"}, 0), Run(DIVERGING, 0)]
    sweep = Sweep(str(tmp_path_factory.mktemp("sweep")), runs,
                  BASE + [f"--data_dir={data_dir}", "--max_iters=20"], jobs=2)
    return sweep, runs, sweep.run(progress=False)


@pytest.mark.slow
def test_plot_cli_and_divergence_marker(small_sweep, tmp_path, capsys):
    sweep, runs, _ = small_sweep
    assert diverged_at(load_run(sweep.out_dir(runs[1]))) is not None
    assert diverged_at(load_run(sweep.out_dir(runs[0]))) is None
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "babygpt.plot", *[sweep.out_dir(r) for r in runs],
                           "--out", "curves.png"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "curves.png").stat().st_size > 0
    # A directory without metrics is refused: the same main, in this process.
    from babygpt import plot

    assert_refused_in_process(plot.main, [str(tmp_path / "nothing")], capsys, "no metrics.jsonl")


def test_loss_plots_draw_the_runs_reference_losses():
    from babygpt.plot import new_figure, plot_runs

    refs = {"unigram": 3.3473, "bigram": 2.4819, "trigram": 2.0684}
    metrics = [{"iter": 0, "loss": 4.2, "val_loss": 4.2}, {"iter": 5, "loss": 3.0, "val_loss": 3.1}]
    run = {"dir": "r", "metrics": metrics,
           "summary": {"status": "finished", "references": refs}, "info": {}}
    fig, ax = new_figure()
    plot_runs(ax, [run])
    flat = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines() if len(set(line.get_ydata())) == 1}
    assert {f"{name} {nats:.3f}": nats for name, nats in refs.items()}.items() <= flat.items()
    fig, ax = new_figure()
    plot_runs(ax, [{**run, "summary": {}}])  # a run from before references were recorded: no lines
    assert not any(line.get_label().startswith("unigram") for line in ax.get_lines())
