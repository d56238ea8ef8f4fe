"""The command-line scripts train.py, sample.py and prepare.py end to end, as a user runs them (CPU,
tiny model); and train.py's messages, in process: a schedule cut short, a resume's changed settings."""

import json
import os
import subprocess
import sys

import pytest
import torch

from babygpt import cli
from babygpt.config import TrainConfig, load_config
from conftest import ROOT, TINY_TRAIN_ARGS as TINY, assert_refused_in_process, once, prepare_small_data, run_script
from conftest import assert_user_error as conftest_assert_user_error

# The end-to-end tests run the scripts as processes: each is marked slow.


def run(script, *args, cwd):
    return run_script(script, *args, cwd=cwd)


def assert_user_error(proc, *fragments):
    conftest_assert_user_error(proc.stderr, proc.returncode, *fragments)


def read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A prepared small corpus and one 20-iteration training run on it."""
    work = tmp_path_factory.mktemp("cli")
    prepare_small_data(work)
    proc = run("train.py", "--data_dir=data", "--out_dir=out", "--max_iters=20", *TINY, cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return work, proc


@pytest.mark.slow
def test_training_run_writes_checkpoint_config_and_metrics(run_dir):
    work, proc = run_dir
    out = work / "out"
    assert "step 20 | train" in proc.stdout
    rows = read_metrics(out)
    assert [r["iter"] for r in rows] == [0, 5, 10, 15, 20]
    for r in rows[1:]:
        assert {"iter", "loss", "lr", "tokens_per_s"} <= r.keys() and r["tokens_per_s"] > 0
    evals = [r for r in rows if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 10, 20]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)  # plain tensors and Python values only
    assert ckpt["iter"] == 20 and ckpt["config"]["max_iters"] == 20
    assert ckpt["best_val_loss"] == pytest.approx(min(r["val_loss"] for r in evals))
    run_info = json.loads((out / "config.json").read_text())
    assert run_info["config"]["n_embd"] == 32 and "--max_iters=20" in run_info["argv"]
    assert (out / "best.pt").exists()


@pytest.mark.slow
def test_resume_continues_the_iteration_count(run_dir, tmp_path):
    work, _ = run_dir
    out = tmp_path / "resumed"
    out.mkdir()
    for name in ("ckpt.pt", "metrics.jsonl", "config.json"):
        (out / name).write_bytes((work / "out" / name).read_bytes())
    proc = run("train.py", f"--data_dir={work / 'data'}", f"--out_dir={out}", "--max_iters=30",
               "--init_from=resume", *TINY, cwd=work)
    assert proc.returncode == 0, proc.stderr
    rows = read_metrics(out)
    assert [r["iter"] for r in rows] == [0, 5, 10, 15, 20, 25, 30]
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter"] == 30
    resumes = json.loads((out / "config.json").read_text())["resumes"]
    assert resumes[0]["iter"] == 20


# Refusals whose process behaviour (exit 2, one line) test_train_reports_config_problems_without_traceback
# checks run train.py's main in this process, as train.py runs it.

@pytest.mark.slow
def test_scratch_run_refuses_to_overwrite_a_run(run_dir, monkeypatch, capsys):
    work, _ = run_dir
    monkeypatch.chdir(work)
    before = (work / "out" / "ckpt.pt").read_bytes()
    assert_refused_in_process(cli.train_main, ["--data_dir=data", "--out_dir=out", "--max_iters=20", *TINY], capsys,
                              "already holds a run", "--init_from=resume")
    assert (work / "out" / "ckpt.pt").read_bytes() == before


@pytest.mark.slow
def test_resume_with_other_architecture_is_refused(run_dir, monkeypatch, capsys):
    work, _ = run_dir
    monkeypatch.chdir(work)
    args = [a for a in TINY if not a.startswith("--n_layer")]
    assert_refused_in_process(cli.train_main, ["--data_dir=data", "--out_dir=out", "--max_iters=40",
                                               "--init_from=resume", "--n_layer=3", *args], capsys,
                              "different architecture", "n_layer=2 there, 3 here")


@pytest.mark.slow
def test_sample_from_checkpoint(run_dir):
    work, _ = run_dir
    proc = run("sample.py", "--ckpt=out/ckpt.pt", "--start=To be", "--num_samples=2",
               "--max_new_tokens=30", "--device=cpu", cwd=work)
    assert proc.returncode == 0, proc.stderr
    samples = proc.stdout.split("-" * 40 + "\n")
    assert len(samples) == 3 and samples[-1] == ""
    for s in samples[:2]:
        assert s.startswith("To be") and len(s) == len("To be") + 30 + 1  # prompt + new + newline


def sample_in_process(argv, capsys) -> str:
    """sample.py's main through babygpt.cli.run, as sample.py runs it, in this process (sample.py
    runs as a process in test_sample_from_checkpoint): what it printed."""
    capsys.readouterr()
    code = cli.run(cli.sample_main, argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.slow
def test_sample_greedy_is_reproducible_and_reads_file_prompts(run_dir, monkeypatch, capsys):
    work, _ = run_dir
    monkeypatch.chdir(work)
    (work / "prompt.txt").write_text("12: To be")
    args = ["--ckpt=out/best.pt", "--num_samples=1", "--max_new_tokens=25", "--temperature=0", "--device=cpu"]
    from_file = sample_in_process(["--start=FILE:prompt.txt", *args], capsys)
    inline = sample_in_process(["--start=12: To be", *args], capsys)
    assert from_file == inline and from_file.startswith("12: To be")


@pytest.mark.slow
def test_sample_kv_cache_and_recomputation_print_the_same_text(run_dir, monkeypatch, capsys):
    work, _ = run_dir
    monkeypatch.chdir(work)
    args = ["--ckpt=out/ckpt.pt", "--start=To be", "--num_samples=2", "--max_new_tokens=60", "--device=cpu"]
    cached = sample_in_process(args, capsys)
    assert cached == sample_in_process([*args, "--no_kv_cache"], capsys) and cached.count("To be") == 2


@pytest.mark.slow
def test_sample_rejects_out_of_vocabulary_prompt(run_dir):
    work, _ = run_dir
    proc = run("sample.py", "--ckpt=out/ckpt.pt", "--start=Zebra!", "--device=cpu", cwd=work)
    assert_user_error(proc, "not in the model's vocabulary", "'Z'", "'!'")


@pytest.mark.slow
def test_train_help_lists_keys(tmp_path):
    proc = run("train.py", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    for key in ("--learning_rate", "--norm_type", "--final_norm", "--init_from", "--compile"):
        assert key in proc.stdout


@pytest.mark.slow
def test_train_reports_config_problems_without_traceback(tmp_path):
    proc = run("train.py", "--learnig_rate=1", "--n_embd=100", "--n_head=3", cwd=tmp_path)
    assert_user_error(proc, "did you mean 'learning_rate'", "divisible by n_head")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_prepare_script_with_input(tmp_path):
    (tmp_path / "my.txt").write_text("hello world\n" * 50)
    proc = run("data/shakespeare_char/prepare.py", "--input=my.txt", "--data_dir=mine", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "vocab 9, 540 train and 60 val tokens" in proc.stdout  # h e l o w r d, space, newline
    meta = json.loads((tmp_path / "mine" / "meta.json").read_text())
    assert meta["vocab"] == sorted(set("hello world\n"))
    assert (tmp_path / "mine" / "train.bin").stat().st_size == 2 * 540


@pytest.mark.slow
def test_sample_into_a_closed_pipe_is_quiet(run_dir):
    """sample.py ... | head: the reader goes away; no traceback."""
    work, _ = run_dir
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "sample.py"), "--ckpt=out/ckpt.pt",
                             "--device=cpu", "--num_samples=50", "--max_new_tokens=200"],
                            cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(20)
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and proc.returncode == 0, err


# ------------------------------------------------------------------ train.py's messages, in process


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


@pytest.mark.slow
def test_a_resumed_run_says_where_it_resumes_and_which_settings_it_changes(tiny_run, capsys):
    """A resume takes its settings from the command line and today's defaults, not the checkpoint:
    each one that differs from the run's last start is named, the same settings give no warning."""
    from babygpt.rundir import RunDir
    from babygpt.trainer import resume_changes

    out, argv = tiny_run
    assert resume_changes(RunDir(str(out)), load_config([*argv, "--init_from=resume"])) is None
    assert cli.run(cli.train_main, once(*argv, "--max_iters=20", "--init_from=resume")) == 0
    captured = capsys.readouterr()
    assert f"resuming from iteration 10 of 20 ({out}/ckpt.pt)" in captured.out
    assert "changes settings from the run's last start: max_iters 10 -> 20;" in captured.err
    lr = TrainConfig().learning_rate  # the run started at the default: a default changed since reads the same
    assert cli.run(cli.train_main, once(*argv, "--max_iters=30", f"--learning_rate={lr / 2}", "--init_from=resume")) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "changes settings" in line]
    assert len(warning) == 1 and f"learning_rate {lr!r} -> {lr / 2!r}, max_iters 20 -> 30;" in warning[0]
