"""compare.py: finished runs side by side, only the keys that differ, damaged runs refused by name."""

import json
import os

import pytest

from babygpt import cli
from babygpt.compare_runs import NO_VERDICT, main
from babygpt.config import load_config
from babygpt.trainer import train
from conftest import TINY_TRAIN_ARGS, assert_user_error, prepare_small_data

pytestmark = pytest.mark.slow  # (trains two tiny runs)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    data_dir = prepare_small_data(root)
    for name, norm in (("a", "rmsnorm"), ("b", "layernorm")):
        train(load_config([f"--data_dir={data_dir}", f"--out_dir={root / name}", *TINY_TRAIN_ARGS,
                           "--max_iters=10", f"--norm_type={norm}"]))
    return root


def test_the_table_shows_what_differs_and_the_losses(two_runs, capsys):
    assert cli.run(main, [str(two_runs / "a"), str(two_runs / "b")]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "| norm_type |" in header and "out_dir" not in header and "learning_rate" not in header
    row_a = next(line for line in out.splitlines() if line.startswith(f"| {two_runs / 'a'} |"))
    summary = json.loads((two_runs / "a" / "summary.json").read_text())
    assert f"| {summary['status']} | rmsnorm |" in row_a and f"{summary['val_loss_full']:.4f}" in row_a
    assert "floors of the data" in out and NO_VERDICT in out


def test_the_overlay_plot_is_written_on_request(two_runs, tmp_path, capsys):
    assert cli.run(main, [str(two_runs / "a"), str(two_runs / "b"), f"--plot={tmp_path / 'p.png'}"]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("damage,fragment", [
    (lambda d: (d / "summary.json").write_text('{"status": "finished"}'), "summary.json is damaged"),
    (lambda d: (d / "config.json").unlink(), "is not a run directory"),
    (lambda d: (d / "config.json").write_text("{"), "config.json is not a readable JSON object"),
])
def test_a_damaged_run_is_refused_by_name(damage, fragment, two_runs, tmp_path, capsys):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(two_runs / "b", copy)
    damage(copy)
    code = cli.run(main, [str(two_runs / "a"), str(copy)])
    assert_user_error(capsys.readouterr().err, code, fragment)


def test_an_unfinished_run_is_a_row_that_says_so(two_runs, tmp_path, capsys):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(two_runs / "b", copy)
    os.remove(copy / "summary.json")
    assert cli.run(main, [str(two_runs / "a"), str(copy)]) == 0
    assert "no summary (still running, or killed)" in capsys.readouterr().out


def test_one_run_is_not_a_comparison(two_runs, capsys):
    code = cli.run(main, [str(two_runs / "a")])
    assert_user_error(capsys.readouterr().err, code, "at least two run directories")
