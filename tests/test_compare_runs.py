"""compare.py (babygpt/compare_runs.py): finished runs side by side, only the keys that differ, damaged
runs refused by name. The tests marked slow train two tiny runs; the others read hand-made records."""

import json
import os
import re

import pytest

from babygpt import cli
from babygpt.compare_runs import NO_VERDICT, CompareOptions, main
from babygpt.config import load_config
from babygpt.options import options_of
from babygpt.trainer import train
from conftest import TINY_TRAIN_ARGS, assert_refused_in_process, assert_user_error, once, prepare_small_data

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    data_dir = prepare_small_data(root)
    for name, norm in (("a", "rmsnorm"), ("b", "layernorm")):
        train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={root / name}", *TINY_TRAIN_ARGS,
                           "--max_iters=10", f"--norm_type={norm}")))
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


@pytest.mark.parametrize("damage, fragment", [
    ({"resumes": {"iter": 5}}, "config.json is damaged (its resumes is dict, not a list of starts)"),
    ({"resumes": 3}, "config.json is damaged (its resumes is int, not a list of starts)"),
    ({"num_params": "many"}, "config.json is damaged (its num_params is 'many', not a whole number)"),
    ({"format": 99}, "config.json is damaged (its format 99 is none this code reads"),
    ({"config": {"n_layer": "six"}}, "config.json is damaged (n_layer must be an integer, got 'six')"),
    ({"config": {"norm_type": "nonorm"}}, "config.json is damaged (unknown norm_type 'nonorm'; choose one of:"),
    ({"config": {"n_layer": -3}}, "config.json is damaged (n_layer must be a positive integer, got -3)"),
    ({"config": {"seed": 2 ** 40}}, "config.json is damaged (seed must be in [0, 2**32)"),
    ({"rows": [{"iter": -7, "loss": 2.0}]}, "metrics.jsonl is damaged (its row at iter -7 has a negative iter"),
    ({"summary": {"references": "kn8"}}, "summary.json is damaged (its references is 'kn8', not a table of n-gram "
                                         "losses)"),
    ({"summary": {"references": {"unigram": 3.3, "kn8": "low"}}}, "summary.json is damaged (its references is"),
    ({"summary": {"wall_time_s": -5.0}}, "summary.json is damaged (its wall_time_s is -5.0, not a finite number >= 0"),
    ({"summary": {"best_val_loss": 10 ** 400}}, "summary.json is damaged"),  # beyond a float: no OverflowError
    ({"summary": {"status": "diverged", "diverged_at": 5, "best_val_loss": "Infinity"}},
     "summary.json is damaged (its best_val_loss is 'Infinity', not a finite number >= 0"),
    ({"rows": [{"iter": 0, "loss": "Infinity"}]}, "metrics.jsonl is damaged (its row at iter 0 has loss 'Infinity', "
                                                  "not a number"),
    ({"rows": [{"iter": 0, "resid_rms": [1.0, "x"]}]}, "metrics.jsonl is damaged (its row at iter 0 has resid_rms"),
])
def test_record_fields_of_the_wrong_type_are_refused_by_name(tmp_path, capsys, damage, fragment):
    good = fake_run(tmp_path / "good")
    bad = fake_run(tmp_path / "bad", **damage)
    err = assert_refused_in_process(main, [good, bad], capsys, fragment, str(tmp_path / "bad"))
    assert len(err.splitlines()) == 1


def stored_sweep(root, *names, **damage):
    """A sweep directory whose runs.jsonl holds a run per name (made as fake_run makes them); the last
    one's record changed by ``damage`` (fake_run's arguments)."""
    from babygpt.runstore import RunStore, pack

    store = RunStore(str(root))
    for i, name in enumerate(names):
        run = fake_run(root / "made" / name, **(damage if i == len(names) - 1 else {}))
        record = pack(run)
        with open(store.path, "a", encoding="utf-8") as f:  # (not store.add, which refuses a damaged record)
            f.write(json.dumps(record) + "\n")
    return str(root)


@pytest.mark.parametrize("damage, fragment", [
    ({"config": {"n_layer": "six"}}, "line 2 is damaged (b's config.json: n_layer must be an integer, got 'six')"),
    ({"summary": {"wall_time_s": -1}}, "line 2 is damaged (b's summary.json: its wall_time_s is -1, not a finite "
                                       "number >= 0"),
    ({"rows": [{"iter": 0, "loss": "Infinity"}]}, "line 2 is damaged (b's metrics.jsonl: its row at iter 0 has loss "
                                                  "'Infinity', not a number"),
])
def test_a_stored_run_with_a_field_of_the_wrong_type_is_refused_by_its_line(tmp_path, capsys, damage, fragment):
    sweep = stored_sweep(tmp_path / "sw", "a", "b", **damage)
    assert_refused_in_process(main, [sweep], capsys, os.path.join(sweep, "runs.jsonl"), fragment)


@pytest.mark.parametrize("name", [o.name for o in options_of(CompareOptions).values() if not o.positional])
def test_an_empty_option_value_is_refused_not_read_as_absent(tmp_path, capsys, name):
    runs = [fake_run(tmp_path / "a"), fake_run(tmp_path / "b")]
    err = assert_refused_in_process(main, [*runs, f"--{name}="], capsys, f"--{name} ", "empty")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("twice", [["--plot={x}", "--plot={y}"], ["--plot", "{x}", "--plot={x}"]])
def test_an_option_given_twice_is_refused_by_name(tmp_path, capsys, twice):
    runs = [fake_run(tmp_path / "a"), fake_run(tmp_path / "b")]
    images = {"x": tmp_path / "x.png", "y": tmp_path / "y.png"}
    argv = [*runs, *(arg.format(**images) for arg in twice)]
    assert_refused_in_process(main, argv, capsys, "--plot is given 2 times", "give it once")
    assert not any(image.exists() for image in images.values())


@pytest.mark.parametrize("again", [
    lambda tmp: [str(tmp / "a"), str(tmp / "a")],
    lambda tmp: [str(tmp / "a"), str(tmp / "b"), str(tmp / "a") + "/"],
    lambda tmp: [str(tmp / "a"), str(tmp / "b" / ".." / "a")],
    lambda tmp: [str(tmp / "sw"), str(tmp / "sw" / "runs" / "s")],
], ids=["the same path", "with a slash", "another spelling", "through its sweep"])
def test_a_run_given_twice_is_refused_by_name(tmp_path, capsys, again):
    fake_run(tmp_path / "a")
    fake_run(tmp_path / "b")
    stored_sweep(tmp_path / "sw", "s", "t")
    err = assert_refused_in_process(main, again(tmp_path), capsys, "is named twice", "pass each run once")
    assert len(err.splitlines()) == 1 and ("/a'" in err or "/sw/runs/s'" in err)


def test_null_references_are_a_run_without_floors(tmp_path, capsys):
    assert cli.run(main, [fake_run(tmp_path / "a", summary={"references": None}),
                          fake_run(tmp_path / "b", summary={"references": None})]) == 0
    assert "floors of the data" not in capsys.readouterr().out


def test_a_path_or_value_with_a_pipe_or_line_break_keeps_the_table_whole(tmp_path, capsys):
    a = fake_run(tmp_path / "a|b", config={"data_dir": "x|y"})  # (a text key: any value is valid)
    b = fake_run(tmp_path / "c\nd", config={"data_dir": "z"})
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
