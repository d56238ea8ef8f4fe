"""Bad input: one 'error:' line per problem, exit 2, no traceback, nothing on disk changed.

Each case runs the real command-line entry point in-process (the same code as train.py /
sample.py, without paying a Python start-up per case) inside a scratch directory.
"""

import os
import shutil

import pytest
import torch

from babygpt import cli, data
from conftest import TINY_TRAIN_ARGS, assert_user_error, prepare_small_data


def snapshot(root):
    """Every file and directory under root, with sizes and modification times."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.join(dirpath, name)] = "dir"
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)  # a symlink as itself (it may point nowhere)
            out[path] = (st.st_size, st.st_mtime_ns)
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
    "empty_out_dir": (["--out_dir="], ["out_dir is empty"]),
    "out_dir_inside_a_file": (["--out_dir=data/meta.json/run"], ["cannot be created", "is a file"]),
    "data_dir_is_a_file": (["--data_dir=data/meta.json"], ["data_dir 'data/meta.json' is a file"]),
    "seed_out_of_range": (["--seed=-1"], ["seed must be in [0, 2**32)"]),
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
def test_train_bad_input(case, ws, capsys):
    argv, fragments = TRAIN_CASES[case]
    check(cli.train_main, TRAIN + argv, capsys, ws, *fragments)


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
    check(cli.train_main, [*TRAIN, "--out_dir=out", "--init_from=resume", "--max_iters=20"], capsys, ws,
          "config.json is not a readable JSON object", "damaged")


@pytest.mark.parametrize("damage", ["not json\n", "[1, 2]\n", '{"loss": 1.0}\n'])
def test_train_resume_with_damaged_metrics_row(damage, ws, capsys):
    """Only a last line cut short by a kill may be dropped; a bad row inside the file is damage,
    refused rather than silently deleted by the resume's truncation."""
    path = ws / "out" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + [damage] + lines[1:]))
    check(cli.train_main, [*TRAIN, "--out_dir=out", "--init_from=resume", "--max_iters=20"], capsys, ws,
          "metrics.jsonl line 2 is not a metrics row")


def test_train_read_only_out_dir(ws, capsys, monkeypatch):
    """As root (CI) chmod does not stop writes, so the refusal is driven through os.access."""
    os.makedirs("locked")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (not os.path.abspath(p).endswith("locked")
                                                              and real_access(p, mode, **kw)))
    check(cli.train_main, [*TRAIN, "--out_dir=locked/run"], capsys, ws, "is not writable", "choose another --out_dir")


def test_train_read_only_unprepared_data_dir(ws, capsys, monkeypatch):
    os.makedirs("ro_data")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (not os.path.abspath(p).endswith("ro_data")
                                                              and real_access(p, mode, **kw)))
    check(cli.train_main, ["--data_dir=ro_data", *TRAIN[1:]], capsys, ws, "is not prepared", "read-only",
          "--data_dir")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_train_cuda_without_gpu(ws, capsys):
    check(cli.train_main, TRAIN + ["--device=cuda"], capsys, ws, "no CUDA GPU is available")


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
    check(cli.train_main, [*TRAIN, "--out_dir=out"], capsys, ws, "already holds a run")


def test_train_resume_corrupt_checkpoint(ws, capsys):
    path = ws / "out" / "ckpt.pt"
    path.write_bytes(path.read_bytes()[:5000])
    check(cli.train_main, [*TRAIN, "--out_dir=out", "--init_from=resume", "--max_iters=20"], capsys, ws,
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
    "prompt_file_is_a_directory": (["--ckpt=out/ckpt.pt", "--start=FILE:data"], ["cannot read prompt file 'data'"]),
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
    assert cli.run(cli.train_main, TRAIN + ["--n_layer=0", "--debug"]) == 2
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

    check(bench.main, [*TRAIN, *argv], capsys, ws, fragment)


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
def test_train_resume_from_a_checkpoint_with_damaged_fields(case, ws, capsys):
    """Refused before config.json or metrics.jsonl are touched (the generator states included)."""
    keys, value = DAMAGED_CHECKPOINTS[case]
    ckpt = torch.load(ws / "out" / "ckpt.pt", weights_only=True)
    node = ckpt
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    torch.save(ckpt, ws / "out" / "ckpt.pt")
    check(cli.train_main, [*TRAIN, "--out_dir=out", "--init_from=resume", "--max_iters=20"], capsys, ws, "damaged")


@pytest.mark.parametrize("record", ['{"config": 5}', '{"config": {}, "resumes": 5}', "[" * 100000])
def test_train_resume_with_malformed_config_json(record, ws, capsys):
    (ws / "out" / "config.json").write_text(record)
    check(cli.train_main, [*TRAIN, "--out_dir=out", "--init_from=resume", "--max_iters=20"], capsys, ws, "damaged")


def test_train_resume_with_absurdly_nested_metrics(ws, capsys):
    with open(ws / "out" / "metrics.jsonl", "a") as f:
        f.write("[" * 100000 + "\n" + '{"iter": 10}\n')
    check(cli.train_main, [*TRAIN, "--out_dir=out", "--init_from=resume", "--max_iters=20"], capsys, ws,
          "is not a metrics row")


@pytest.mark.parametrize("make,fragment", [
    (lambda: os.symlink("loop_b", "loop_a") or os.symlink("loop_a", "loop_b"), "symlink loop"),
    (lambda: os.symlink("nowhere/at/all", "dangling"), "already there"),
])
def test_train_out_dir_through_a_broken_symlink(make, fragment, ws, capsys):
    make()
    target = "loop_a/run" if "loop" in fragment else "dangling"
    check(cli.train_main, [*TRAIN, f"--out_dir={target}"], capsys, ws, fragment)


def test_train_out_dir_with_a_nul_byte_or_too_long_in_total(ws, capsys):
    check(cli.train_main, [*TRAIN, "--out_dir=out/a\0b"], capsys, ws, "contains a NUL byte")
    check(cli.train_main, [*TRAIN, "--out_dir=" + "/".join(["a" * 250] * 20)], capsys, ws,
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
