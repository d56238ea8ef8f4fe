"""compare.py (babygpt/compare_runs.py): finished runs side by side, only the keys that differ, damaged
runs refused by name. The tests marked slow train two tiny runs; the others read hand-made records."""

import json
import os
import re

import pytest

from babygpt import cli
from babygpt.compare_runs import NO_VERDICT, main
from babygpt.config import load_config
from babygpt.trainer import train
from conftest import TINY_TRAIN_ARGS, assert_user_error, prepare_small_data

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    data_dir = prepare_small_data(root)
    for name, norm in (("a", "rmsnorm"), ("b", "layernorm")):
        train(load_config([f"--data_dir={data_dir}", f"--out_dir={root / name}", *TINY_TRAIN_ARGS,
                           "--max_iters=10", f"--norm_type={norm}"]))
    return root


@pytest.mark.slow  # (trains two tiny runs)
def test_the_table_shows_what_differs_and_the_losses(two_runs, capsys):
    assert cli.run(main, [str(two_runs / "a"), str(two_runs / "b")]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "| norm_type |" in header and "out_dir" not in header and "learning_rate" not in header
    row_a = next(line for line in out.splitlines() if line.startswith(f"| {two_runs / 'a'} |"))
    summary = json.loads((two_runs / "a" / "summary.json").read_text())
    assert f"| {summary['status']} | rmsnorm |" in row_a and f"{summary['val_loss_full']:.4f}" in row_a
    assert "floors of the data" in out and NO_VERDICT in out


@pytest.mark.slow  # (trains two tiny runs)
def test_the_overlay_plot_is_written_on_request(two_runs, tmp_path, capsys):
    assert cli.run(main, [str(two_runs / "a"), str(two_runs / "b"), f"--plot={tmp_path / 'p.png'}"]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("damage,fragment", [
    (lambda d: (d / "summary.json").write_text('{"status": "finished"}'), "summary.json is damaged"),
    (lambda d: (d / "config.json").unlink(), "is not a run directory"),
    (lambda d: (d / "config.json").write_text("{"), "config.json is not a readable JSON object"),
])
@pytest.mark.slow  # (trains two tiny runs)
def test_a_damaged_run_is_refused_by_name(damage, fragment, two_runs, tmp_path, capsys):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(two_runs / "b", copy)
    damage(copy)
    code = cli.run(main, [str(two_runs / "a"), str(copy)])
    assert_user_error(capsys.readouterr().err, code, fragment)


@pytest.mark.slow  # (trains two tiny runs)
def test_an_unfinished_run_is_a_row_that_says_so(two_runs, tmp_path, capsys):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(two_runs / "b", copy)
    os.remove(copy / "summary.json")
    assert cli.run(main, [str(two_runs / "a"), str(copy)]) == 0
    assert "no summary (still running, or killed)" in capsys.readouterr().out


@pytest.mark.slow  # (trains two tiny runs)
def test_one_run_is_not_a_comparison(two_runs, capsys):
    code = cli.run(main, [str(two_runs / "a")])
    assert_user_error(capsys.readouterr().err, code, "at least two run directories")


SUMMARY = {"status": "finished", "iter": 10, "val_loss_full": 2.5, "final_val_loss": 2.6, "best_val_loss": 2.6,
           "references": {"unigram": 3.3, "kn8": 1.6}}


def fake_run(directory, config=None, summary=None, rows=None, **info):
    """A run directory as train.py leaves it, written by hand: config.json, summary.json, metrics.jsonl."""
    os.makedirs(directory, exist_ok=True)
    record = {"config": {"data_dir": "data/a", "learning_rate": 1e-3, **(config or {})}, "resumes": [],
              "num_params": 1000, **info}
    (directory / "config.json").write_text(json.dumps(record))
    (directory / "summary.json").write_text(json.dumps({**SUMMARY, **(summary or {})}))
    rows = [{"iter": 0, "loss": 4.2, "val_loss": 4.2}, {"iter": 10, "loss": 2.5, "val_loss": 2.6}] \
        if rows is None else rows
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(directory)


@pytest.mark.parametrize("info, summary, fragment", [
    ({"resumes": {"iter": 5}}, {}, "config.json is damaged (its resumes is dict, not a list of starts)"),
    ({"resumes": 3}, {}, "config.json is damaged (its resumes is int, not a list of starts)"),
    ({"num_params": "many"}, {}, "config.json is damaged (its num_params is 'many', not a whole number)"),
    ({}, {"references": "kn8"}, "summary.json is damaged (its references is 'kn8', not a table of n-gram losses)"),
    ({}, {"references": {"unigram": 3.3, "kn8": "low"}}, "summary.json is damaged (its references is"),
])
def test_record_fields_of_the_wrong_type_are_refused_by_name(tmp_path, capsys, info, summary, fragment):
    good = fake_run(tmp_path / "good")
    bad = fake_run(tmp_path / "bad", summary=summary, **info)
    code = cli.run(main, [good, bad])
    assert_user_error(capsys.readouterr().err, code, fragment, str(tmp_path / "bad"))


def test_null_references_are_a_run_without_floors(tmp_path, capsys):
    assert cli.run(main, [fake_run(tmp_path / "a", summary={"references": None}),
                          fake_run(tmp_path / "b", summary={"references": None})]) == 0
    assert "floors of the data" not in capsys.readouterr().out


def test_a_path_or_value_with_a_pipe_or_line_break_keeps_the_table_whole(tmp_path, capsys):
    a = fake_run(tmp_path / "a|b", config={"init": "x|y"})
    b = fake_run(tmp_path / "c\nd", config={"init": "z"})
    assert cli.run(main, [a, b]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(lines) == 3 and len({len(re.split(r"(?<!\\)\|", line)) for line in lines}) == 1  # as many cells
    assert f"| {tmp_path}/a\\|b | finished | x\\|y |" in lines[1] and f"{tmp_path}/c\\nd" in lines[2]


def test_a_key_an_older_run_lacks_is_its_default_not_a_difference(tmp_path, capsys):
    """A run made before a key existed ran at its default: beside a run at that default, no difference."""
    from babygpt.compare_runs import DEFAULTS

    old = fake_run(tmp_path / "old")
    new = fake_run(tmp_path / "new", config={"z_loss": DEFAULTS["z_loss"], "adam_eps": 1e-6})
    assert cli.run(main, [old, new]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "z_loss" not in header and "| adam_eps |" in header


def test_runs_on_two_corpora_get_a_floors_line_each(tmp_path, capsys):
    a = fake_run(tmp_path / "a")
    b = fake_run(tmp_path / "b", config={"data_dir": "data/b"}, summary={"references": {"unigram": 3.9, "kn8": 2.1}})
    assert cli.run(main, [a, b]) == 0
    out = capsys.readouterr().out
    assert "floors of the data data/a (" in out and "floors of the data data/b (" in out and "3.9000" in out


def test_plot_of_runs_with_nothing_finite_is_refused_before_anything_is_written(tmp_path, capsys):
    a = fake_run(tmp_path / "a", rows=[{"iter": 0, "loss": float("nan")}])
    b = fake_run(tmp_path / "b", rows=[])
    code = cli.run(main, [a, b, f"--plot={tmp_path / 'p.png'}"])
    captured = capsys.readouterr()
    assert_user_error(captured.err, code, "nothing to plot for")
    assert captured.out == "" and not (tmp_path / "p.png").exists()
