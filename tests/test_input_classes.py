"""Classes of bad input a hostile tester found, one test (or one parametrised family) per class:
each ends in one 'error:' line naming the problem and its fix, exit 2, and nothing on disk changed;
the numeric keys follow one rule; the messages name what is really wrong.
"""

import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest
import torch

from babygpt import cli, doctables, files, memory, plot
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
    """Every path under ``root`` with its size and modification time (directories as "dir")."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        out.update({os.path.join(dirpath, d): "dir" for d in dirs})
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


def refused(main, argv, capsys, root, *fragments):
    """``main(argv)`` through cli.run: a user error with ``fragments``, and ``root`` unchanged."""
    before = snapshot(root)
    code = cli.run(main, argv)
    err = capsys.readouterr().err
    assert_user_error(err, code, *fragments)
    assert snapshot(root) == before, "a refused command changed files on disk"
    return err


# ============================================================ 1a. a write that fails inside torch.save

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


# ============================================================ 1b. empty or too-short data files

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
def ws(small_data, tmp_path, monkeypatch):
    """A private copy of the small data (in ./data) as the current directory."""
    import shutil

    shutil.copytree(small_data, tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


TRAIN = ["--data_dir=data", "--out_dir=run", *TINY_TRAIN_ARGS, "--max_iters=2"]


@pytest.mark.parametrize("split,tokens,fragment", [
    ("train", 0, "data/train.bin holds 0 tokens"),
    ("val", 0, "data/val.bin holds 0 tokens"),
    ("val", 5, "5 tokens in "),  # fewer than block_size + 1 = 17
    ("train", 16, "16 tokens in "),
])
def test_train_on_empty_or_too_short_data_files(split, tokens, fragment, ws, capsys):
    rewrite_split("data", split, tokens)
    err = refused(cli.train_main, TRAIN, capsys, ws, fragment, "re-run python data/shakespeare_char/prepare.py")
    assert f"{split}.bin" in err


@pytest.mark.parametrize("make,argv,fragment", [
    (lambda d: (d / "fresh").mkdir() or (d / "fresh" / "input.txt").write_text(""),
     ["--data_dir=fresh"], "fresh/input.txt is empty"),
    (lambda d: (d / "empty.txt").write_text(""), ["--input=empty.txt", "--data_dir=new"], "the corpus empty.txt is empty"),
    (lambda d: (d / "short.txt").write_text("abc"), ["--input=short.txt", "--data_dir=new"],
     "the corpus short.txt has only 3 characters"),
])
def test_prepare_with_an_empty_corpus(make, argv, fragment, ws, capsys):
    make(ws)
    refused(lambda a: cli.prepare_main(a, "unused"), argv, capsys, ws, fragment, "prepare.py --data_dir")


# ============================================================ 1c. a checkpoint whose vocabulary does not fit its model

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


# ============================================================ 1d. sizes the memory estimate missed

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


@pytest.mark.slow  # builds and trains 2,000 Blocks in a fresh process
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
model = GPT(GPTConfig(n_layer=2000, n_embd=1, n_head=1, block_size=8, norm_type="none", bias=False))
built = rss()
optimizer = model.configure_optimizers(0.1, 1e-3)
model(x, x)[1].backward()
optimizer.step()
print((built - before) / 2000, (rss() - before) / 2000)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    built, trained = map(float, out.stdout.split())
    assert built >= memory.block_overhead("cpu", training=False)
    assert trained >= memory.block_overhead("cpu", training=True)


# ============================================================ 1e. markdown that is not UTF-8

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


# ============================================================ 2. one rule for every float key

FLOAT_KEYS = sorted(k for k, o in FIELDS.items() if o.type in (float, Optional[float]))


def config_with(key: str, value):
    """The config that holds ``key`` (GPTConfig or TrainConfig), built with ``value`` for it."""
    return GPTConfig(**{key: value}) if key in MODEL_FIELDS else TrainConfig(**{key: value})


def test_every_float_key_is_found():
    assert set(FLOAT_KEYS) == {"learning_rate", "weight_decay", "beta1", "beta2", "adam_eps", "z_loss", "grad_clip",
                               "min_lr", "dropout", "norm_eps", "dyt_alpha_init", "dyt_alpha_init_attn", "mixln_alpha",
                               "layerscale_init", "derf_alpha_init", "derf_shift_init", "rope_base",
                               "logit_softcap", "attn_softcap", "muon_lr", "muon_momentum", "qk_clip_tau", "target_val_loss"}
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


# ============================================================ 3a. the collapse message names a possible cause

UNIFORM = "uniform"  # stands for the loss of uniform guessing over the data's vocabulary, ln V


@pytest.mark.parametrize("iters,loss,argv,says,never", [
    (0, UNIFORM, [], "max_iters=0", "lower learning_rate"),
    (50, UNIFORM, ["--norm_eps=1e30"], "norm_eps=1e+30 is large", "learning_rate"),
    (50, UNIFORM, ["--learning_rate=1e-6", "--min_lr=1e-7"], "higher learning_rate than 1e-06", "lower"),
    (50, 2.0, [], "try a lower learning_rate", "norm_eps"),
    (50, 2.0, ["--norm_eps=1e30", "--norm_type=dyt"], "try a lower learning_rate", "norm_eps"),  # DyT has no eps
])
def test_collapse_advice_names_only_what_can_be_the_cause(iters, loss, argv, says, never, ws):
    if loss == UNIFORM:
        loss = math.log(len(json.load(open("data/meta.json"))["vocab"]))
    cfg = load_config(["--device=cpu", "--data_dir=data", *argv])
    advice = cli.collapse_advice({"status": "collapsed", "iter": iters, "val_loss_full": loss}, cfg)
    assert says in advice and never not in advice


def test_a_run_of_max_iters_0_is_not_told_to_lower_its_learning_rate(ws, capsys):
    assert cli.run(cli.train_main, ["--data_dir=data", "--out_dir=run", *TINY_TRAIN_ARGS, "--max_iters=0"]) == 0
    err = capsys.readouterr().err
    assert "collapsed" in err  # an untrained model is no better than the unigram
    assert "max_iters=0" in err and "try a lower learning_rate" not in err


# ============================================================ 3b. plotting runs with nothing to draw

@pytest.mark.parametrize("rows,argv,fragment", [
    ("", [], "has no rows"),
    ('{"iter": 0, "loss": NaN, "val_loss": NaN}\n{"iter": 5, "loss": NaN}\n', [], "no finite loss or val_loss"),
    ('{"iter": 0, "loss": null}\n', [], "no finite loss or val_loss"),
    ('{"iter": 0, "loss": 4.1}\n', ["--no_train"], "no finite val_loss"),
])
def test_plot_refuses_a_run_with_no_finite_values(rows, argv, fragment, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(rows)
    refused(plot.main, [str(tmp_path / "run"), f"--out={tmp_path / 'runs.png'}", *argv], capsys, tmp_path,
            f"nothing to plot for '{tmp_path / 'run'}'", fragment)


# ============================================================ 3c. the message names the path that is wrong

def test_sample_with_a_directory_as_checkpoint(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    refused(cli.sample_main, [f"--ckpt={tmp_path / 'run'}"], capsys, tmp_path, "is a directory",
            str(tmp_path / "run" / "best.pt"))


def test_train_with_a_directory_as_data_file(ws, capsys):
    os.remove("data/train.bin")
    os.mkdir("data/train.bin")
    refused(cli.train_main, TRAIN, capsys, ws, "'data/train.bin' is a directory, not a data file")


def test_prepare_with_a_directory_as_input(ws, capsys):
    refused(lambda a: cli.prepare_main(a, "unused"), ["--input=data", "--data_dir=new"], capsys, ws,
            "input file 'data' is a directory")


def test_plot_on_a_full_disk_names_the_image(tmp_path, monkeypatch, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"iter": 0, "loss": 4.1, "val_loss": 4.0}\n')
    (tmp_path / "runs.png").write_bytes(b"the old image")
    fill_disk_after(monkeypatch, room=100)
    out = tmp_path / "runs.png"
    refused(plot.main, [str(tmp_path / "run"), f"--out={out}"], capsys, tmp_path, f"writing '{out}' failed",
            "free some disk space", "is unchanged")


# ============================================================ 3d. options accepted and ignored

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
def test_exp2_refuses_a_malformed_lr_list(lrs, fragment):
    from exp2_norm_comparison import Exp2Options

    assert any(fragment in p for p in Exp2Options(quick=True, lrs=lrs).problems())


# ============================================================ 3e. switches that the norm type makes meaningless

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
