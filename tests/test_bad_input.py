"""Refusals of bad input at the command-line entry points (train.py, sample.py, prepare.py, plot,
bench.py, doctables, the experiments' options) and in the configuration beneath them: one 'error:'
line per problem naming it and its fix, exit 2, no traceback, nothing on disk changed; the numeric
keys follow one rule; the messages name what is really wrong.

Each case runs the real command-line entry point in-process (the same code as train.py /
sample.py, without paying a Python start-up per case) inside a scratch directory.
"""

import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import shutil
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest
import torch

from babygpt import cli, data, doctables, files, memory, plot
from babygpt.bench import NOT_USED, read_args
from babygpt.checkpoint import save_checkpoint
from babygpt.config import FIELDS, MODEL_FIELDS, TrainConfig, build_config, load_config
from babygpt.errors import BabyGPTError
from babygpt.model import GPT, GPTConfig
from babygpt.norms import NORMS, norm_class
from babygpt.options import FLOAT32_MAX, FLOAT32_TINY
from conftest import ROOT, TINY_TRAIN_ARGS, assert_user_error, prepare_small_data

sys.path.insert(0, os.path.join(ROOT, "experiments"))


def snapshot(root):
    """Every path under ``root`` with its size and modification time (directories, ``root`` included,
    as ("dir", their modification time): a file made and deleted again still changes its directory's)."""
    out = {str(root): ("dir", os.stat(root).st_mtime_ns)}
    for dirpath, dirs, names in os.walk(root):
        out.update({os.path.join(dirpath, d): ("dir", os.stat(os.path.join(dirpath, d)).st_mtime_ns) for d in dirs})
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))  # a symlink as itself (it may point nowhere)
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A prepared corpus and one finished tiny run (out/) to point bad commands at."""
    root = tmp_path_factory.mktemp("bad")
    prepare_small_data(root)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert cli.run(cli.train_main, ["--data_dir=data", "--out_dir=out", "--max_iters=10",
                                        *TINY_TRAIN_ARGS]) == 0
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def ws(workspace, tmp_path, monkeypatch):
    """A private copy of the workspace as the current directory; the network is unreachable."""
    root = tmp_path / "ws"
    shutil.copytree(workspace, root)
    monkeypatch.chdir(root)

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")
    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    return root


def check(main, argv, capsys, root, *fragments):
    before = snapshot(root)
    code = cli.run(main, argv)
    err = capsys.readouterr().err
    assert_user_error(err, code, *fragments)
    assert snapshot(root) == before, "a refused command changed files on disk"


TRAIN = ["--data_dir=data", "--out_dir=new", *TINY_TRAIN_ARGS, "--max_iters=10"]


def train_args(*extra) -> list[str]:
    """TRAIN with ``extra`` in place of TRAIN's own values of the keys it sets (train.py refuses a key
    given twice)."""
    keys = {arg.partition("=")[0] for arg in extra}
    return [arg for arg in TRAIN if arg.partition("=")[0] not in keys] + list(extra)

TRAIN_CASES = {
    "unknown_key": (["--learnig_rate=1e-3"], ["unknown config key 'learnig_rate'", "did you mean"]),
    "wrong_type": (["--batch_size=eight"], ["batch_size must be an integer"]),
    "malformed_arg": (["--max_iters"], ["malformed argument '--max_iters'"]),
    "missing_config_file": (["config/nope.py"], ["config file 'config/nope.py' not found"]),
    "n_embd_not_divisible": (["--n_embd=30", "--n_head=4"], ["n_embd (30) must be divisible by n_head (4)"]),
    "zero_size": (["--n_layer=0"], ["n_layer must be a positive integer"]),
    "negative_size": (["--batch_size=-3"], ["batch_size must be a positive integer"]),
    "block_size_vs_val_split": (["--block_size=5000"], ["block_size (5000) must be smaller than the val split"]),
    "unknown_norm_type": (["--norm_type=batch"], ["unknown norm_type 'batch'", "choose one of: layernorm, rmsnorm",
                                                             "did you mean 'batchnorm'"]),
    "unknown_placement": (["--norm_placement=middle"], ["unknown norm_placement 'middle'"]),
    "unknown_device": (["--device=tpu"], ["unknown device 'tpu'"]),
    "unknown_dtype": (["--dtype=float8"], ["unknown dtype 'float8'"]),
    "resume_without_checkpoint": (["--init_from=resume"], ["cannot resume: no checkpoint"]),
    "resume_other_architecture": (["--out_dir=out", "--init_from=resume", "--max_iters=20", "--n_embd=64"],
                                  ["different architecture", "n_embd=32 there, 64 here"]),
    "out_dir_is_a_file": (["--out_dir=data/meta.json"], ["is a file, not a directory"]),
    "scratch_over_existing_run": (["--out_dir=out"], ["already holds a run"]),
    "empty_out_dir": (["--out_dir="], ["--out_dir was given an empty value"]),
    "out_dir_inside_a_file": (["--out_dir=data/meta.json/run"], ["cannot be created", "is a file"]),
    "data_dir_is_a_file": (["--data_dir=data/meta.json"], ["data_dir 'data/meta.json' is a file"]),
    "seed_out_of_range": (["--seed=-1"], ["seed must be in [0, 2**32)"]),
    "key_given_twice": (["--seed=1", "--seed=2"], ["--seed is given 2 times ('1', '2'); give it once"]),
    # Values that would overflow in the optimizer or in a tensor size, refused before training.
    "infinite_learning_rate": (["--learning_rate=inf"], ["learning_rate must be a finite number"]),
    "absurd_learning_rate": (["--learning_rate=1e38"], ["learning_rate must be in (0, 1000]", "overflow"]),
    "decay_flips_weights": (["--learning_rate=20", "--weight_decay=0.5"],
                            ["learning_rate x weight_decay must be below 1"]),
    "int_beyond_64_bits": (["--gradient_accumulation_steps=1e20"], ["must fit in 64 bits"]),
    # Memory that cannot be allocated: refused from a lower bound, before any tensor exists.
    "huge_batch": (["--batch_size=1000000000000"], ["needs at least", "reduce batch_size"]),
    "huge_width": (["--n_embd=40000000", "--n_head=4"], ["needs at least", "n_embd=40000000"]),
    "huge_depth": (["--n_layer=1000000000"], ["needs at least", "n_layer=1000000000"]),
    "out_dir_name_too_long": (["--out_dir=runs/" + "x" * 300], ["longer than the filesystem's limit"]),
}


@pytest.mark.parametrize("case", TRAIN_CASES)
@pytest.mark.slow
def test_train_bad_input(case, ws, capsys):
    argv, fragments = TRAIN_CASES[case]
    check(cli.train_main, train_args(*argv), capsys, ws, *fragments)


def test_train_config_file_with_syntax_error(ws, capsys):
    (ws / "broken.py").write_text("n_layer = (\n")
    check(cli.train_main, ["broken.py", *TRAIN], capsys, ws, "broken.py' has a syntax error at line 1")


CONFIG_FILES = {  # what a config file holds -> what the error says
    "json": ('{"n_layer": 6, "learning_rate": 0.001}\n', ["sets no keys", "JSON and YAML are not read"]),
    "yaml": ("n_layer: 6\nlearning_rate: 0.001\n", ["sets no keys", "`n_layer = 6`"]),
    "empty": ("", ["sets no keys"]),
    "calls_exit": ("n_layer = 4\nexit()\n", ["called exit()"]),
    "sys_exit_zero": ("import sys\nsys.exit(0)\n", ["called exit()"]),
    "raises": ("n_layer = 1 / 0\n", ["failed when run: ZeroDivisionError"]),
}


@pytest.mark.parametrize("case", CONFIG_FILES)
def test_train_config_file_that_says_nothing_or_exits(case, ws, capsys):
    text, fragments = CONFIG_FILES[case]
    (ws / "cfg.py").write_text(text)
    check(cli.train_main, ["cfg.py", *TRAIN], capsys, ws, *fragments)


@pytest.mark.parametrize("content,fragment", [(b"n_layer = 4  # \xe9t\xe9\n", "is not UTF-8 text"),
                                              (b"n_layer = 4\x00\n", "has a syntax error")])
def test_train_config_file_not_text(content, fragment, ws, capsys):
    (ws / "cfg.py").write_bytes(content)
    check(cli.train_main, ["cfg.py", *TRAIN], capsys, ws, fragment)


def test_train_config_file_is_a_directory(ws, capsys):
    os.makedirs("cfgdir.py")
    check(cli.train_main, ["cfgdir.py", *TRAIN], capsys, ws, "is not a regular file")


def test_train_resume_with_damaged_config_json(ws, capsys):
    (ws / "out" / "config.json").write_text('{"config": {"n_layer": 2}')  # cut short
    check(cli.train_main, train_args("--out_dir=out", "--init_from=resume", "--max_iters=20"), capsys, ws,
          "config.json is not a readable JSON object", "damaged")


@pytest.mark.parametrize("damage", ["not json\n", "[1, 2]\n", '{"loss": 1.0}\n'])
def test_train_resume_with_damaged_metrics_row(damage, ws, capsys):
    """Only a last line cut short by a kill may be dropped; a bad row inside the file is damage,
    refused rather than silently deleted by the resume's truncation."""
    path = ws / "out" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + [damage] + lines[1:]))
    check(cli.train_main, train_args("--out_dir=out", "--init_from=resume", "--max_iters=20"), capsys, ws,
          "metrics.jsonl line 2 is not a metrics row")


def test_train_read_only_out_dir(ws, capsys, monkeypatch):
    """As root (CI) chmod does not stop writes, so the refusal is driven through os.access."""
    os.makedirs("locked")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (not os.path.abspath(p).endswith("locked")
                                                              and real_access(p, mode, **kw)))
    check(cli.train_main, train_args("--out_dir=locked/run"), capsys, ws, "is not writable", "choose another --out_dir")


def test_train_read_only_unprepared_data_dir(ws, capsys, monkeypatch):
    os.makedirs("ro_data")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (not os.path.abspath(p).endswith("ro_data")
                                                              and real_access(p, mode, **kw)))
    check(cli.train_main, ["--data_dir=ro_data", *TRAIN[1:]], capsys, ws, "is not prepared", "read-only",
          "--data_dir")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_train_cuda_without_gpu(ws, capsys):
    check(cli.train_main, train_args("--device=cuda"), capsys, ws, "no CUDA GPU is available")


def test_train_missing_data_without_network(ws, capsys):
    check(cli.train_main, ["--data_dir=nodata", *TRAIN[1:]], capsys, ws,
          "could not download TinyShakespeare", "by hand", "nodata/input.txt")


def test_train_corrupt_input_txt(ws, capsys):
    os.makedirs("shakes")
    (ws / "shakes" / "input.txt").write_text("First Citizen:\nBefore we proceed")  # truncated copy
    check(cli.train_main, ["--data_dir=shakes", *TRAIN[1:]], capsys, ws, "sha256 differs")


def test_train_truncated_bin(ws, capsys):
    path = ws / "data" / "val.bin"
    path.write_bytes(path.read_bytes()[:-7])
    check(cli.train_main, TRAIN, capsys, ws, "val.bin holds", "truncated or stale", "re-prepare")


def test_train_corrupt_meta_json(ws, capsys):
    (ws / "data" / "meta.json").write_text('{"vocab": ')
    check(cli.train_main, TRAIN, capsys, ws, "cannot read", "meta.json")


def test_train_foreign_meta_json(ws, capsys):
    (ws / "data" / "meta.json").write_text('{"vocab_size": 65, "itos": {}}')
    check(cli.train_main, TRAIN, capsys, ws, "is not a BabyGPT meta.json")


def test_train_scratch_over_a_run_without_ckpt(ws, capsys):
    """A run whose ckpt.pt was deleted still has best.pt and summary.json: not overwritten."""
    os.remove(ws / "out" / "ckpt.pt")
    check(cli.train_main, train_args("--out_dir=out"), capsys, ws, "already holds a run")


def test_a_bad_training_key_beside_ngpt_is_reported_not_hidden():
    """The stand-in config made where the training keys fail must not add a problem of its own: nGPT's
    model with the default weight_decay used to be refused, and only that was said."""
    _, problems = build_config({"norm_placement": "ngpt", "norm_type": "none", "bias": False, "weight_decay": 0.0,
                                "learning_rate": -1.0})
    assert len(problems) == 1 and problems[0].startswith("learning_rate must be in (0, "), problems


def _fifo(path):
    os.mkfifo(path)


# Refusals that come after the run took its directory's lock (.lock): the lock file, and any directory
# made for it, must go again, and the directories' modification times come back.
LOCKED_REFUSALS = {
    "metrics.jsonl a FIFO": ("fresh", "metrics.jsonl", _fifo, [], "is not a regular file"),
    "metrics.jsonl a directory": ("fresh", "metrics.jsonl", os.mkdir, [], "is not a regular file"),
    "config.json a FIFO": ("fresh", "config.json", _fifo, [], "is not a regular file"),
    "summary.json a directory": ("fresh", "summary.json", os.mkdir, [], "is not a regular file"),
    "tensorboard a file": ("fresh", "tensorboard", lambda p: open(p, "w").close(), ["--tensorboard=true"],
                           "not a directory"),
    "tensorboard a FIFO": ("fresh", "tensorboard", _fifo, ["--tensorboard=true"], "not a directory"),
    "resume into a new nested directory": ("a/b/c", None, None, ["--init_from=resume"], "no checkpoint"),
}


@pytest.mark.parametrize("case", LOCKED_REFUSALS, ids=str)
@pytest.mark.slow
def test_a_refusal_after_the_lock_leaves_no_lock_file_and_no_new_mtime(case, ws, capsys):
    out_dir, name, make, extra, fragment = LOCKED_REFUSALS[case]
    if name:
        os.makedirs(ws / out_dir)
        make(str(ws / out_dir / name))
        os.utime(ws / out_dir, ns=(10**18, 10**18))  # a time no step of the command could write by chance
    if case.startswith("tensorboard"):
        pytest.importorskip("tensorboard")
    check(cli.train_main, train_args(f"--out_dir={out_dir}", *extra), capsys, ws, fragment)


def test_train_resume_corrupt_checkpoint(ws, capsys):
    path = ws / "out" / "ckpt.pt"
    path.write_bytes(path.read_bytes()[:5000])
    check(cli.train_main, train_args("--out_dir=out", "--init_from=resume", "--max_iters=20"), capsys, ws,
          "not a readable checkpoint", "truncated or corrupt")


SAMPLE_CASES = {
    "missing_checkpoint": (["--ckpt=out/none.pt"], ["checkpoint 'out/none.pt' not found"]),
    "not_a_checkpoint": (["--ckpt=out/metrics.jsonl"], ["not a readable checkpoint"]),
    "prompt_out_of_vocabulary": (["--ckpt=out/ckpt.pt", "--start=Zany?"], ["not in the model's vocabulary", "'Z'"]),
    "num_samples_zero": (["--ckpt=out/ckpt.pt", "--num_samples=0"], ["--num_samples must be positive"]),
    "max_new_tokens_negative": (["--ckpt=out/ckpt.pt", "--max_new_tokens=-5"], ["--max_new_tokens must be positive"]),
    "top_k_above_vocab": (["--ckpt=out/ckpt.pt", "--top_k=1000"], ["--top_k must be between 1 and the vocabulary"]),
    "negative_temperature": (["--ckpt=out/ckpt.pt", "--temperature=-1"], ["--temperature must be a finite number >= 0"]),
    "nan_temperature": (["--ckpt=out/ckpt.pt", "--temperature=nan"], ["temperature must be a finite number"]),
    "missing_prompt_file": (["--ckpt=out/ckpt.pt", "--start=FILE:nope.txt"], ["cannot read prompt file 'nope.txt'"]),
    "unknown_option": (["--ckpt=out/ckpt.pt", "--temp=1"], ["unknown option '--temp'", "did you mean '--temperature'"]),
    "cuda_without_gpu": (["--ckpt=out/ckpt.pt", "--device=cuda"], ["no CUDA GPU"]),
    "endless_prompt_file": (["--ckpt=out/ckpt.pt", "--start=FILE:/dev/zero"], ["longer than 1 MiB"]),
    "prompt_file_is_a_directory": (["--ckpt=out/ckpt.pt", "--start=FILE:data"], ["prompt file 'data' is a directory"]),
}


@pytest.mark.parametrize("case", SAMPLE_CASES)
def test_sample_bad_input(case, ws, capsys):
    if case == "cuda_without_gpu" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    argv, fragments = SAMPLE_CASES[case]
    check(cli.sample_main, argv, capsys, ws, *fragments)


def test_sample_corrupt_checkpoint(ws, capsys):
    path = ws / "out" / "best.pt"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    check(cli.sample_main, ["--ckpt=out/best.pt"], capsys, ws, "not a readable checkpoint")


def test_sample_non_babygpt_checkpoint(ws, capsys):
    torch.save({"model": {"w": torch.zeros(2)}, "iter": 3}, ws / "other.pt")  # a valid torch file
    check(cli.sample_main, ["--ckpt=other.pt"], capsys, ws, "is not a BabyGPT checkpoint")


def test_debug_flag_shows_traceback(ws, capsys):
    assert cli.run(cli.train_main, train_args("--n_layer=0", "--debug")) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "error: n_layer must be a positive integer" in err


def test_sample_checkpoint_describing_a_huge_model(ws, capsys):
    """The model is never built: its weights alone would not fit in this machine's memory."""
    ckpt = torch.load(ws / "out" / "best.pt", weights_only=True)
    ckpt["model_config"].update(n_layer=4000, n_embd=65536, n_head=1)
    torch.save(ckpt, ws / "huge.pt")
    check(cli.sample_main, ["--ckpt=huge.pt"], capsys, ws, "the model in 'huge.pt'", "needs at least",
          "smaller model")


@pytest.mark.parametrize("argv,fragment", [
    (["--out=out"], "--out 'out' is a directory"),
    (["--out=curves.xyz"], "format '.xyz' is not supported"),
    (["--out=curves"], "has no extension"),
    (["--out=data/meta.json/curves.png"], "is a file; fix the path"),
])
def test_plot_bad_output_path(argv, fragment, ws, capsys):
    from babygpt import plot

    check(plot.main, ["out", *argv], capsys, ws, fragment)


def test_plot_damaged_summary(ws, capsys):
    (ws / "out" / "summary.json").write_text("[]")
    from babygpt import plot

    check(plot.main, ["out", "--out=c.png"], capsys, ws, "summary.json is not a readable JSON object")


@pytest.mark.parametrize("argv,fragment", [
    (["--json=out"], "--json 'out' is a directory"),
    (["--json=figures.txt"], "format '.txt' is not supported"),
])
def test_bench_bad_output_path(argv, fragment, ws, capsys):
    from babygpt import bench

    check(bench.main, train_args(*argv), capsys, ws, fragment)


DAMAGED_CHECKPOINTS = {  # field -> a value a damaged (or hand-edited) checkpoint might hold
    "python_rng": (("rng", "python"), "x"),
    "torch_rng": (("rng", "torch"), torch.zeros(3)),
    "numpy_rng": (("rng", "numpy"), ["MT19937", [1, 2]]),
    "best_val_loss": (("best_val_loss",), "x"),
    "elapsed": (("elapsed_s",), "x"),
    "fractional_iter": (("iter",), 5.5),
    "negative_iter": (("iter",), -5),
    "text_iter": (("iter",), "5"),
    "model_config_list": (("model_config",), [1, 2]),
}


@pytest.mark.parametrize("case", DAMAGED_CHECKPOINTS)
@pytest.mark.slow
def test_train_resume_from_a_checkpoint_with_damaged_fields(case, ws, capsys):
    """Refused before config.json or metrics.jsonl are touched (the generator states included)."""
    keys, value = DAMAGED_CHECKPOINTS[case]
    ckpt = torch.load(ws / "out" / "ckpt.pt", weights_only=True)
    node = ckpt
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    torch.save(ckpt, ws / "out" / "ckpt.pt")
    check(cli.train_main, train_args("--out_dir=out", "--init_from=resume", "--max_iters=20"), capsys, ws, "damaged")


@pytest.mark.parametrize("record", ['{"config": 5}', '{"config": {}, "resumes": 5}', "[" * 100000])
def test_train_resume_with_malformed_config_json(record, ws, capsys):
    (ws / "out" / "config.json").write_text(record)
    check(cli.train_main, train_args("--out_dir=out", "--init_from=resume", "--max_iters=20"), capsys, ws, "damaged")


def test_train_resume_with_absurdly_nested_metrics(ws, capsys):
    with open(ws / "out" / "metrics.jsonl", "a") as f:
        f.write("[" * 100000 + "\n" + '{"iter": 10}\n')
    check(cli.train_main, train_args("--out_dir=out", "--init_from=resume", "--max_iters=20"), capsys, ws,
          "is not a metrics row")


@pytest.mark.parametrize("make,fragment", [
    (lambda: os.symlink("loop_b", "loop_a") or os.symlink("loop_a", "loop_b"), "symlink loop"),
    (lambda: os.symlink("nowhere/at/all", "dangling"), "already there"),
])
def test_train_out_dir_through_a_broken_symlink(make, fragment, ws, capsys):
    make()
    target = "loop_a/run" if "loop" in fragment else "dangling"
    check(cli.train_main, train_args(f"--out_dir={target}"), capsys, ws, fragment)


def test_train_out_dir_with_a_nul_byte_or_too_long_in_total(ws, capsys):
    check(cli.train_main, train_args("--out_dir=out/a\0b"), capsys, ws, "contains a NUL byte")
    check(cli.train_main, train_args("--out_dir=" + "/".join(["a" * 250] * 20)), capsys, ws,
          "longer than the filesystem's limit")


@pytest.mark.parametrize("text,fragment", [("raise BaseException('boom')\n", "failed when run: BaseException"),
                                           ("n_layer = 4\x00\n", "syntax error")])
def test_train_config_file_raising_anything(text, fragment, ws, capsys):
    (ws / "cfg.py").write_text(text)
    check(cli.train_main, ["cfg.py", *TRAIN], capsys, ws, fragment)


def test_config_file_with_a_byte_order_mark_is_read():
    from babygpt.config import read_config_file

    import tempfile
    with tempfile.NamedTemporaryFile("wb", suffix=".py", delete=False) as f:
        f.write("\ufeffn_layer = 3\n".encode("utf-8"))
    assert read_config_file(f.name) == {"n_layer": 3}
    os.remove(f.name)


def test_sample_temperature_that_would_overflow(ws, capsys):
    check(cli.sample_main, ["--ckpt=out/ckpt.pt", "--temperature=1e-320"], capsys, ws,
          "--temperature must be 0 (greedy) or at least 0.001")


def test_plot_formats_needing_latex_and_damaged_diagnostics(ws, capsys):
    from babygpt import plot

    check(plot.main, ["out", "--out=c.pgf"], capsys, ws, "format '.pgf' is not supported")
    with open(ws / "out" / "metrics.jsonl", "a") as f:
        f.write('{"iter": 11, "resid_rms": [1, "x"], "grad_norm": 7, "update_ratio": []}\n')
    check(plot.main, ["out", "--diag", "--out=d.png"], capsys, ws, "diagnostics rows", "damaged")


def refused(main, argv, capsys, root, *fragments):
    """``main(argv)`` through cli.run: a user error with ``fragments``, and ``root`` unchanged."""
    before = snapshot(root)
    code = cli.run(main, argv)
    err = capsys.readouterr().err
    assert_user_error(err, code, *fragments)
    assert snapshot(root) == before, "a refused command changed files on disk"
    return err


# ============================================================ a write that fails inside torch.save

BIG_STATE = {"w": torch.zeros(100_000)}  # 400 kB: more than the small disks below hold


class FailingFile:
    """A file whose writes fail with ``errno`` once ``room`` bytes have gone through (a full disk)."""

    def __init__(self, file, room: int, error: int = errno.ENOSPC):
        self.file, self.room, self.error = file, room, error

    def write(self, data):
        if len(data) > self.room:
            raise OSError(self.error, os.strerror(self.error))
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def fill_disk_after(monkeypatch, room: int):
    real = os.fdopen
    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: FailingFile(real(fd, mode), room))


def assert_old_file_kept(path, old: bytes):
    assert path.read_bytes() == old
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".tmp-")] == []


def test_a_full_disk_inside_torch_save_names_the_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"the old checkpoint")
    fill_disk_after(monkeypatch, room=1000)
    with pytest.raises(BabyGPTError) as err:
        save_checkpoint(BIG_STATE, str(path))
    assert str(path) in str(err.value) and "free some disk space" in str(err.value)
    assert f"({path} is unchanged)" in str(err.value)
    assert_old_file_kept(path, b"the old checkpoint")


@contextlib.contextmanager
def small_disk(directory, size="300k"):
    """A real tmpfs of ``size`` mounted on ``directory``; the test is skipped where mounting is not permitted."""
    os.makedirs(directory)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_really_full_disk_inside_torch_save_names_the_checkpoint(tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        path = disk / "ckpt.pt"
        save_checkpoint({"w": torch.zeros(10)}, str(path))
        old = path.read_bytes()
        with pytest.raises(BabyGPTError, match="free some disk space") as err:
            save_checkpoint(BIG_STATE, str(path))
        assert f"writing '{path}' failed" in str(err.value) and "is unchanged" in str(err.value)
        assert_old_file_kept(path, old)


def test_torchs_own_write_failure_message_is_a_user_error_too(tmp_path):
    """torch may hide the OSError entirely: its writer's message alone still names the file."""
    path = tmp_path / "ckpt.pt"
    with pytest.raises(BabyGPTError, match=re.escape(f"writing '{path}' failed: ") + ".*PytorchStreamWriter failed"):
        with files.atomic_open(str(path)):
            raise RuntimeError("[enforce fail at inline_container.cc:623] . PytorchStreamWriter failed writing "
                               "file data/0: file write failed")
    assert not path.exists()


def test_other_errors_inside_atomic_open_keep_their_traceback(tmp_path):
    with pytest.raises(RuntimeError, match="a bug"):
        with files.atomic_open(str(tmp_path / "x")):
            raise RuntimeError("a bug")


def test_a_failure_after_the_rename_does_not_claim_the_old_file_is_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):  # the directory's fsync, after os.replace
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)
    monkeypatch.setattr(files.os, "fsync", fsync)
    with pytest.raises(BabyGPTError, match="in place, but its rename may not survive") as err:
        files.write_atomic(str(path), b"new")
    assert "unchanged" not in str(err.value) and path.read_bytes() == b"new"


# ============================================================ empty or too-short data files

@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return prepare_small_data(root)


def rewrite_split(data_dir, split: str, tokens: int):
    """``split``.bin cut to its first ``tokens`` ids, and meta.json saying so (a consistent short file)."""
    path = os.path.join(data_dir, f"{split}.bin")
    ids = np.fromfile(path, dtype=np.uint16)[:tokens]
    ids.tofile(path)
    meta_path = os.path.join(data_dir, "meta.json")
    meta = json.load(open(meta_path))
    meta[f"{split}_tokens"] = tokens
    with open(meta_path, "w") as f:
        json.dump(meta, f)


@pytest.fixture
def data_ws(small_data, tmp_path, monkeypatch):
    """A private copy of the small data (in ./data) as the current directory."""
    import shutil

    shutil.copytree(small_data, tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


DATA_WS_TRAIN = ["--data_dir=data", "--out_dir=run", *TINY_TRAIN_ARGS, "--max_iters=2"]


@pytest.mark.parametrize("split,tokens,fragment", [
    ("train", 0, "data/train.bin holds 0 tokens"),
    ("val", 0, "data/val.bin holds 0 tokens"),
    ("val", 5, "5 tokens in "),  # fewer than block_size + 1 = 17
    ("train", 16, "16 tokens in "),
])
def test_train_on_empty_or_too_short_data_files(split, tokens, fragment, data_ws, capsys):
    rewrite_split("data", split, tokens)
    err = refused(cli.train_main, DATA_WS_TRAIN, capsys, data_ws, fragment,
                  "re-run python data/shakespeare_char/prepare.py")
    assert f"{split}.bin" in err


@pytest.mark.parametrize("make,argv,fragment", [
    (lambda d: (d / "fresh").mkdir() or (d / "fresh" / "input.txt").write_text(""),
     ["--data_dir=fresh"], "fresh/input.txt is empty"),
    (lambda d: (d / "empty.txt").write_text(""), ["--input=empty.txt", "--data_dir=new"], "the corpus empty.txt is empty"),
    (lambda d: (d / "short.txt").write_text("abc"), ["--input=short.txt", "--data_dir=new"],
     "the corpus short.txt has only 3 characters"),
])
def test_prepare_with_an_empty_corpus(make, argv, fragment, data_ws, capsys):
    make(data_ws)
    refused(lambda a: cli.prepare_main(a, "unused"), argv, capsys, data_ws, fragment, "prepare.py --data_dir")


# ============================================================ a checkpoint whose vocabulary does not fit its model

def write_checkpoint(path, vocab, vocab_size: int = 8):
    cfg = GPTConfig(vocab_size=vocab_size, n_layer=1, n_head=1, n_embd=8, block_size=8)
    save_checkpoint({"model": GPT(cfg).state_dict(), "model_config": dataclasses.asdict(cfg), "vocab": vocab},
                    str(path))


@pytest.mark.parametrize("vocab,fragment", [
    (list("abc"), "its vocabulary has 3 characters but its model's embedding has 8 rows"),
    (list("abcdefghijkl"), "its vocabulary has 12 characters"),
    (list("abcdefga"), "lists a character twice"),
    (["ab", *"cdefgh"], "not a list of single characters"),
    ("abcdefgh", "not a list of single characters"),
])
def test_sample_refuses_a_checkpoint_whose_vocabulary_does_not_fit(vocab, fragment, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path / "odd.pt", vocab)
    refused(cli.sample_main, ["--ckpt=odd.pt", "--start=a", "--max_new_tokens=30", "--num_samples=1"],
            capsys, tmp_path, "'odd.pt' is damaged", fragment)


def test_sample_reads_a_consistent_checkpoint(tmp_path, capsys):
    write_checkpoint(tmp_path / "ok.pt", list("abcdefgh"))
    assert cli.run(cli.sample_main, [f"--ckpt={tmp_path / 'ok.pt'}", "--start=a", "--max_new_tokens=5",
                                     "--num_samples=1"]) == 0


# ============================================================ sizes the memory estimate missed

GiB = 2**30


@pytest.fixture
def eight_gib_free(monkeypatch):
    """This machine has 8 GiB free, whatever it really has: the refusals below do not depend on it."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: 8 * GiB)


@pytest.mark.parametrize("argv,fragment", [
    # A million layers of width 1: 12 weights each, but each Block's modules and tensors cost tens of kB.
    (["--n_layer=1000000", "--n_embd=1", "--n_head=1", "--batch_size=1", "--block_size=8"], "n_layer=1000000"),
    # Attention with dropout on a CPU keeps (B, H, T, T) weights per layer for the backward pass.
    (["--dropout=0.1", "--block_size=16384", "--n_embd=8", "--n_head=8", "--n_layer=1", "--batch_size=4"],
     "or set dropout=0"),
    # The diagnostics materialize one layer's (B, H, T, T) attention logits.
    (["--diag_interval=1", "--block_size=65536", "--n_embd=8", "--n_head=8", "--n_layer=1", "--batch_size=1"],
     "or set diag_interval=0"),
])
def test_sizes_beyond_memory_are_refused_before_anything_is_built(argv, fragment, eight_gib_free):
    with pytest.raises(BabyGPTError, match="needs at least") as err:
        load_config(["--device=cpu", *argv])
    assert fragment in str(err.value)


def test_the_same_sizes_without_the_costly_part_are_not_refused(eight_gib_free):
    load_config(["--device=cpu", "--dropout=0", "--block_size=16384", "--n_embd=8", "--n_head=8", "--n_layer=1",
                 "--batch_size=4"])  # fused attention: no attention weights kept
    load_config(["--device=cpu", "--n_layer=1000", "--n_embd=1", "--n_head=1"])


def test_sampling_counts_the_kv_cache():
    cfg = GPTConfig(n_layer=64, n_embd=8, n_head=1, block_size=2**20)
    cache = memory.inference_bytes(cfg, "cpu", kv_cache=True) - memory.inference_bytes(cfg, "cpu")
    assert cache == 2 * 2 * 64 * 2**20 * 8  # keys and values, 2 bytes each at the least


@pytest.mark.slow  # builds and trains 500 Blocks in a fresh process
def test_the_block_overhead_is_a_lower_bound():
    """What a fresh process really uses for the smallest Blocks exceeds what the estimate assumes."""
    code = """
import torch
from babygpt.model import GPT, GPTConfig
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
x = torch.zeros(1, 8, dtype=torch.long)
small = GPT(GPTConfig(n_layer=1, n_embd=1, n_head=1, block_size=8, norm_type="none", bias=False))
small(x, x)[1].backward()
before = rss()
model = GPT(GPTConfig(n_layer=500, n_embd=1, n_head=1, block_size=8, norm_type="none", bias=False))
built = rss()
optimizer = model.configure_optimizers(0.1, 1e-3)
model(x, x)[1].backward()
optimizer.step()
print((built - before) / 500, (rss() - before) / 500)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    built, trained = map(float, out.stdout.split())
    assert built >= memory.block_overhead("cpu", training=False)
    assert trained >= memory.block_overhead("cpu", training=True)


# ============================================================ markdown that is not UTF-8

NOT_UTF8 = b"# Results\n\nloss \xff\xfe 2.1\n"


@pytest.mark.parametrize("argv", [[], ["--check"]])
def test_doctables_refuses_a_markdown_file_that_is_not_utf8(argv, tmp_path, capsys):
    (tmp_path / "doc.md").write_bytes(NOT_UTF8)
    refused(doctables.main, [str(tmp_path / "doc.md"), *argv], capsys, tmp_path,
            f"'{tmp_path / 'doc.md'}' is not UTF-8 text (bad byte at offset 16)")


def test_doctables_refuses_a_report_that_is_not_utf8(tmp_path, capsys):
    (tmp_path / "report.md").write_bytes(NOT_UTF8)
    (tmp_path / "doc.md").write_text(f"<!-- generated: {tmp_path / 'report.md'}#t -->\n|a|\n<!-- end generated -->\n")
    refused(doctables.main, [str(tmp_path / "doc.md")], capsys, tmp_path,
            f"report '{tmp_path / 'report.md'}' is not UTF-8 text")


# ============================================================ one rule for every float key

FLOAT_KEYS = sorted(k for k, o in FIELDS.items() if o.type in (float, Optional[float]))


def config_with(key: str, value):
    """The config that holds ``key`` (GPTConfig or TrainConfig), built with ``value`` for it."""
    return GPTConfig(**{key: value}) if key in MODEL_FIELDS else TrainConfig(**{key: value})


def test_every_float_key_is_found():
    assert set(FLOAT_KEYS) == {"learning_rate", "weight_decay", "beta1", "beta2", "adam_eps", "z_loss", "grad_clip",
                               "min_lr", "dropout", "norm_eps", "dyt_alpha_init", "dyt_alpha_init_attn", "mixln_alpha",
                               "layerscale_init", "derf_alpha_init", "derf_shift_init", "rope_base",
                               "logit_softcap", "attn_softcap", "muon_lr", "muon_momentum", "qk_clip_tau", "target_val_loss",
                               "ema_decay"}
    assert (FLOAT32_MAX, FLOAT32_TINY) == (torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny)


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value,fragment", [
    (float("inf"), "must be a finite number"),
    (float("nan"), "must be a finite number"),
    (1e39, "got 1e+39"),  # inf in float32: refused by the key's own range, or else as not a float32
    (1e-40, "underflows to 0 in float32"),  # nonzero, but 0 in float32 (or below the key's range)
    ("below", "must be"),  # one below the key's lowest value
])
def test_every_float_key_must_be_finite_in_range_and_a_float32(key, value, fragment):
    valid = FIELDS[key].valid
    if value == "below":
        value = valid.low - 1
    elif value == 1e-40 and not valid.contains(value):  # e.g. rope_base > 1: its own range refuses it first
        fragment = "must be"
    with pytest.raises(BabyGPTError, match=key) as err:
        config_with(key, value)
    assert fragment in str(err.value)


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_declares_its_range_and_its_default_passes(key):
    valid = FIELDS[key].valid
    assert valid is not None, f"{key} declares no valid=Range(...)"
    config_with(key, FIELDS[key].default)
    if valid.high >= FLOAT32_MAX:  # the largest float32 is a value like any other
        assert valid.problem(key, FLOAT32_MAX) is None


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_is_refused_from_the_command_line_the_same_way(key):
    with pytest.raises(BabyGPTError, match=f"{key} must be .*got 1e\\+39"):
        load_config(["--device=cpu", f"--{key}=1e39"])


# ============================================================ the collapse message names a possible cause

UNIFORM = "uniform"  # stands for the loss of uniform guessing over the data's vocabulary, ln V


@pytest.mark.parametrize("iters,loss,argv,says,never", [
    (0, UNIFORM, [], "max_iters=0", "lower learning_rate"),
    (50, UNIFORM, ["--norm_eps=1e30"], "norm_eps=1e+30 is large", "learning_rate"),
    (50, UNIFORM, ["--learning_rate=1e-6", "--min_lr=1e-7"], "higher learning_rate than 1e-06", "lower"),
    (50, 2.0, [], "try a lower learning_rate", "norm_eps"),
])
def test_collapse_advice_names_only_what_can_be_the_cause(iters, loss, argv, says, never, data_ws):
    if loss == UNIFORM:
        loss = math.log(len(json.load(open("data/meta.json"))["vocab"]))
    cfg = load_config(["--device=cpu", "--data_dir=data", *argv])
    advice = cli.collapse_advice({"status": "collapsed", "iter": iters, "val_loss_full": loss}, cfg)
    assert says in advice and never not in advice


@pytest.mark.slow
def test_a_run_of_max_iters_0_is_not_told_to_lower_its_learning_rate(data_ws, capsys):
    assert cli.run(cli.train_main, ["--data_dir=data", "--out_dir=run", *TINY_TRAIN_ARGS, "--max_iters=0"]) == 0
    err = capsys.readouterr().err
    assert "collapsed" in err  # an untrained model is no better than the unigram
    assert "max_iters=0" in err and "try a lower learning_rate" not in err


# ============================================================ plotting runs with nothing to draw

@pytest.mark.parametrize("rows,argv,fragment", [
    ("", [], "has no rows"),
    ("garbage", [], "holds no complete metrics row"),  # (was told "no rows", as if untrained)
    ('{"iter": 0, "loss": NaN, "val_loss": NaN}\n{"iter": 5, "loss": NaN}\n', [], "no finite loss or val_loss"),
    ('{"iter": 0, "loss": null}\n', [], "no finite loss or val_loss"),
    ('{"iter": 0, "loss": 4.1}\n', ["--no_train"], "no finite val_loss"),
])
def test_plot_refuses_a_run_with_no_finite_values(rows, argv, fragment, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(rows)
    refused(plot.main, [str(tmp_path / "run"), f"--out={tmp_path / 'runs.png'}", *argv], capsys, tmp_path,
            f"nothing to plot for '{tmp_path / 'run'}'", fragment)


# ============================================================ the message names the path that is wrong

def test_sample_with_a_directory_as_checkpoint(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    refused(cli.sample_main, [f"--ckpt={tmp_path / 'run'}"], capsys, tmp_path, "is a directory",
            str(tmp_path / "run" / "best.pt"))


def test_train_with_a_directory_as_data_file(data_ws, capsys):
    os.remove("data/train.bin")
    os.mkdir("data/train.bin")
    refused(cli.train_main, DATA_WS_TRAIN, capsys, data_ws, "'data/train.bin' is a directory, not a data file")


def test_prepare_with_a_directory_as_input(data_ws, capsys):
    refused(lambda a: cli.prepare_main(a, "unused"), ["--input=data", "--data_dir=new"], capsys, data_ws,
            "input file 'data' is a directory")


def test_plot_on_a_full_disk_names_the_image(tmp_path, monkeypatch, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"iter": 0, "loss": 4.1, "val_loss": 4.0}\n')
    (tmp_path / "runs.png").write_bytes(b"the old image")
    fill_disk_after(monkeypatch, room=100)
    out = tmp_path / "runs.png"
    refused(plot.main, [str(tmp_path / "run"), f"--out={out}"], capsys, tmp_path, f"writing '{out}' failed",
            "free some disk space", "is unchanged")


# ============================================================ options accepted and ignored

@pytest.mark.parametrize("key", NOT_USED)
def test_bench_refuses_training_keys_it_does_not_use(key):
    value = "resume" if key == "init_from" else "x" if key == "out_dir" else "5"
    with pytest.raises(BabyGPTError, match=f"--{key}: bench.py does not use it"):
        read_args(["--device=cpu", f"--{key}={value}"])


def test_bench_takes_a_config_file_that_sets_them():
    cfg, _ = read_args([os.path.join(ROOT, "config", "prenorm_rms.py"), "--device=cpu"])
    assert cfg.out_dir == "out/prenorm_rms"  # set by the file, not asked for: no problem


@pytest.mark.parametrize("lrs,fragment", [
    ("", "--lrs takes comma-separated learning rates"),
    (" ", "--lrs takes comma-separated learning rates"),
    (",", "--lrs takes comma-separated numbers"),
    ("1e-3,,3e-3", "--lrs takes comma-separated numbers"),
    ("1e-3,1e-3", "--lrs lists 0.001 more than once"),
    ("5000", "--lrs must be in (0, 1000]"),
    ("1e-50", "underflows to 0 in float32"),
])
@pytest.mark.slow
def test_exp2_refuses_a_malformed_lr_list(lrs, fragment):
    from exp2_norm_comparison import Exp2Options

    assert any(fragment in p for p in Exp2Options(quick=True, lrs=lrs).problems())


def test_an_experiment_names_a_bad_set_even_where_its_out_holds_other_results(ws, capsys):
    """The bad --set is the real problem: reported (every one of them), not hidden behind "made with
    other settings", which it would only cause."""
    import exp7_lr_sensitivity as exp7

    os.makedirs("exp7")
    (ws / "exp7" / "settings.json").write_text(json.dumps({"experiment": "exp7_lr_sensitivity", "quick": True,
                                                           "set": ["max_iters=5"]}))
    before = snapshot(ws)
    code = cli.run(exp7.main, ["--quick", "--out=exp7", "--set", "max_iter=3", "--set", "dropout=x"])
    assert_user_error(capsys.readouterr().err, code,
                      "--set max_iter=3: unknown config key 'max_iter' (did you mean 'max_iters'?)",
                      "--set dropout=x: dropout must be a finite number, got 'x'")
    assert snapshot(ws) == before
    # a --set outside its key's declared range is refused on its own, as those above
    code = cli.run(exp7.main, ["--quick", "--out=exp7", "--set", "warmup_iters=-1"])
    assert_user_error(capsys.readouterr().err, code, "--set warmup_iters=-1: warmup_iters must be >= 0, got -1")
    assert snapshot(ws) == before
    # one in range that a rule between keys refuses: named beside the refused --out
    code = cli.run(exp7.main, ["--quick", "--out=exp7", "--set", "lr_decay_iters=1"])
    err = capsys.readouterr().err
    assert_user_error(err, code, "lr_decay_iters (1) must be >= warmup_iters", "exp7 was made with other settings")
    assert snapshot(ws) == before


# ============================================================ switches that the norm type makes meaningless

@pytest.mark.parametrize("norm_type", sorted(NORMS))
@pytest.mark.parametrize("switch", [{"emb_norm": True}, {"final_norm": True}])
def test_a_norm_switch_is_refused_where_the_norm_is_the_identity(norm_type, switch):
    name = next(iter(switch))
    if norm_class(NORMS[norm_type]).is_identity:
        with pytest.raises(BabyGPTError, match=f"{name} has no effect with norm_type '{norm_type}'"):
            GPTConfig(norm_type=norm_type, **switch)
    else:
        GPTConfig(norm_type=norm_type, **switch)


def test_without_the_switch_norm_type_none_is_fine():
    assert GPTConfig(norm_type="none", emb_norm=False, final_norm=None).norm_type == "none"
    cfg, problems = build_config({"norm_type": "none", "device": "cpu"})
    assert problems == [] and cfg.model.norm_type == "none"


@pytest.mark.parametrize("damage", ["overflowing_weight", "negative_running_var"])
def test_sample_refuses_a_model_whose_finite_weights_compute_nonfinite_logits(tmp_path, capsys, damage):
    """Finite weights, NaN logits: sample.py printed text from them with exit 0; now one line naming
    the checkpoint, exit 2, nothing printed to stdout."""
    norm_type = "batchnorm" if damage == "negative_running_var" else "rmsnorm"
    cfg = GPTConfig(vocab_size=3, block_size=8, n_layer=1, n_head=1, n_embd=8, norm_type=norm_type)
    model = GPT(cfg)
    with torch.no_grad():
        if damage == "overflowing_weight":
            model.blocks[0].ffwd.fc.weight.fill_(3e38)  # finite in float32; its sums overflow to inf, then inf - inf
        else:
            model.blocks[0].ln1.running_var.fill_(-1.0)  # sqrt of a negative variance: NaN
    assert all(torch.isfinite(t).all() for t in model.state_dict().values() if t.is_floating_point())
    path = str(tmp_path / "bad.pt")
    save_checkpoint({"model": model.state_dict(), "model_config": dataclasses.asdict(cfg), "vocab": ["a", "b", "c"],
                     "iter": 10}, path)
    code = cli.run(cli.sample_main, [f"--ckpt={path}", "--device=cpu", "--max_new_tokens=5", "--start=ab"])
    out, err = capsys.readouterr()
    assert out == ""
    assert_user_error(err, code, "computes non-finite logits", "bad.pt")


def test_sample_refuses_a_checkpoint_with_nonfinite_weights(tmp_path, capsys):
    """A NaN weight still samples text that looks ordinary: it is refused, naming the tensor."""
    from babygpt.checkpoint import load_checkpoint

    cfg = GPTConfig(vocab_size=3, block_size=8, n_layer=1, n_head=1, n_embd=8)
    model = GPT(cfg)
    with torch.no_grad():
        model.blocks[0].ffwd.fc.weight[0, 0] = float("nan")
    path = str(tmp_path / "nan.pt")
    save_checkpoint({"model": model.state_dict(), "model_config": dataclasses.asdict(cfg), "vocab": ["a", "b", "c"],
                     "iter": 10}, path)
    assert load_checkpoint(path)["iter"] == 10
    code = cli.run(cli.sample_main, [f"--ckpt={path}", "--device=cpu", "--max_new_tokens=5"])
    assert_user_error(capsys.readouterr().err, code, "non-finite weights", "blocks.0.ffwd")


def test_qk_scale_learned_needs_two_positions_for_its_start_value():
    """Its start value log2(T^2 - T) is undefined at block_size 1: refused, naming the fix."""
    with pytest.raises(BabyGPTError, match=r"qk_scale learned starts at log2\(T\^2 - T\), which needs block_size >= 2, got 1"):
        GPTConfig(qk_norm=True, qk_scale="learned", block_size=1)
    assert GPTConfig(qk_norm=True, qk_scale="learned", block_size=2).block_size == 2
