"""What a newcomer meets in the first hour: runs that say when their schedule is cut short or when
they resume, and sample.py's conveniences (a run directory as --ckpt, one greedy sample, a readable --help)."""

import pytest

from babygpt import cli
from babygpt.config import TrainConfig, load_config
from babygpt.trainer import train
from conftest import TINY_TRAIN_ARGS, prepare_small_data


@pytest.mark.parametrize("keys,fragment", [
    ({"max_iters": 30, "warmup_iters": 100, "eval_interval": 10}, f"never reaches {TrainConfig().learning_rate:g}"),
    ({"max_iters": 300, "eval_interval": 400, "warmup_iters": 10}, "evaluated at iterations 0, 300 only"),
    ({"max_iters": 300, "lr_decay_iters": 600, "eval_interval": 100, "warmup_iters": 10}, "stops before its learning rate decays"),
])
def test_a_schedule_cut_short_is_named(keys, fragment):
    warnings = TrainConfig(**keys).schedule_warnings()
    assert len(warnings) == 1 and fragment in warnings[0]


def test_the_default_schedule_has_no_warning():
    assert TrainConfig().schedule_warnings() == []


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("first_hour")
    data_dir = prepare_small_data(root)
    argv = [f"--data_dir={data_dir}", f"--out_dir={root / 'run'}", *TINY_TRAIN_ARGS, "--max_iters=10"]
    train(load_config(argv))
    return root / "run", argv


@pytest.mark.slow
def test_a_resumed_run_says_where_it_resumes_and_which_settings_it_changes(run_dir, capsys):
    """A resume takes its settings from the command line and today's defaults, not the checkpoint:
    each one that differs from the run's last start is named, the same settings give no warning."""
    from babygpt.rundir import RunDir
    from babygpt.trainer import resume_changes

    out, argv = run_dir
    assert resume_changes(RunDir(str(out)), load_config([*argv, "--init_from=resume"])) is None
    assert cli.run(cli.train_main, [*argv, "--max_iters=20", "--init_from=resume"]) == 0
    captured = capsys.readouterr()
    assert f"resuming from iteration 10 of 20 ({out}/ckpt.pt)" in captured.out
    assert "changes settings from the run's last start: max_iters 10 -> 20;" in captured.err
    lr = TrainConfig().learning_rate  # the run started at the default: a default changed since reads the same
    assert cli.run(cli.train_main, [*argv, "--max_iters=30", f"--learning_rate={lr / 2}", "--init_from=resume"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "changes settings" in line]
    assert len(warning) == 1 and f"learning_rate {lr!r} -> {lr / 2!r}, max_iters 20 -> 30;" in warning[0]


@pytest.mark.slow
def test_sample_takes_a_run_directory_and_prints_one_greedy_sample(run_dir, capsys):
    out, _ = run_dir
    assert cli.run(cli.sample_main, [f"--ckpt={out}", "--temperature=0", "--max_new_tokens=5", "--device=cpu"]) == 0
    captured = capsys.readouterr()
    assert f"sampling from {out}/best.pt" in captured.err and "1 is printed, not 3" in captured.err
    assert captured.out.count("-" * 40) == 1


def test_sample_help_shows_the_newline_default_as_an_escape(capsys):

    assert cli.run(cli.sample_main, ["--help"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("--start"))
    assert "\\n" in line and "prompt text" in line


def test_bench_help_lists_only_the_keys_bench_reads(capsys):
    from babygpt.bench import NOT_USED, read_args
    from babygpt.options import ShowHelp

    with pytest.raises(ShowHelp) as shown:
        read_args(["--help"])
    listed = {line.split()[0][2:] for line in str(shown.value).splitlines() if line.strip().startswith("--")}
    assert "learning_rate" in listed and "n_layer" in listed and not listed & set(NOT_USED)


def test_a_sweep_run_that_overrides_its_config_is_named_by_the_override():
    import os

    from babygpt.sweep import Run
    from conftest import ROOT

    config = os.path.join(ROOT, "config", "prenorm_rms.py")
    assert Run({"norm_type": "layernorm"}, 0, config).name == "norm_type=layernorm__from=prenorm_rms__seed=0"
    assert Run({"learning_rate": 1e-3}, 0, config).name == "prenorm_rms__learning_rate=0.001__seed=0"  # unchanged
