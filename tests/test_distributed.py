"""Data-parallel training under torchrun: 2 CPU processes with the gloo backend.

One 2-rank run is compared with a single-process reference loop that feeds batch 2B made of
the two ranks' batches; a second launch interrupted half way and resumed must end with the
very same weights."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.testing import assert_close

from babygpt.checkpoint import load_checkpoint
from babygpt.config import load_config
from babygpt.data import BatchSampler, load_dataset
from babygpt.distributed import Dist
from babygpt.model import GPT
from babygpt.optim import build_optimizer
from babygpt.state import COMPLETED
from babygpt.trainer import lr_at
from conftest import ROOT, TINY_TRAIN_ARGS, assert_refused_in_process, once, prepare_small_data

pytestmark = [pytest.mark.slow,  # every test here starts processes
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")]

ITERS = 8
ARGS = once(*TINY_TRAIN_ARGS, "--log_interval=1", "--eval_interval=4", f"--lr_decay_iters={ITERS}",
            "--learning_rate=3e-3", "--min_lr=3e-4")


def torchrun(script, *args, cwd):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, script), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One 2-rank run of ITERS iterations through the test worker; its directory and output."""
    tmp = tmp_path_factory.mktemp("ddp")
    data_dir = prepare_small_data(tmp)
    out = tmp / "run"
    proc = torchrun("tests/ddp_worker.py", *ARGS, f"--data_dir={data_dir}", f"--out_dir={out}",
                    f"--max_iters={ITERS}", cwd=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"tmp": tmp, "data_dir": data_dir, "out": out, "proc": proc}


def reference_losses(data_dir, *extra, as_ranks=False):
    """One process, batch 2B: rank 0's batch followed by rank 1's, the same schedule, clipping,
    optimizer (``extra`` arguments, e.g. --optimizer=muon) and QK-Clip (whose maxima over the 2B batch
    are the maxima over the two ranks). ``as_ranks``: each rank's batch goes through forward and backward
    on its own, and the gradient is their average as DDP forms it (each halved, then summed), so the
    step sees the very bits the ranks' step sees."""
    cfg = load_config([*ARGS, f"--data_dir={data_dir}", f"--max_iters={ITERS}", *extra])
    train_data, _, tok = load_dataset(data_dir)
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(tok.vocab_size))
    opt = build_optimizer(model, cfg)  # optimizer adamw: GPT.configure_optimizers' AdamW
    if cfg.qk_clip_tau:
        model.track_max_logits(True)
    samplers = [BatchSampler(train_data, cfg.model.block_size, cfg.batch_size, Dist(r, r, 2).train_seed(cfg.seed))
                for r in range(2)]
    losses = []
    for it in range(ITERS):
        for group in opt.param_groups:
            group["lr"] = lr_at(it, cfg) * group["lr_scale"]
        batches = [s.next_batch() for s in samplers]
        losses.append(rank_averaged_backward(model, batches) if as_ranks else whole_batch_backward(model, batches))
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if cfg.qk_clip_tau:
            model.qk_clip(cfg.qk_clip_tau)
        opt.zero_grad(set_to_none=True)
    return losses, model.state_dict()


def whole_batch_backward(model, batches) -> float:
    """Forward and backward of the ranks' batches as one batch of 2B; its loss."""
    x, y = (torch.cat(parts) for parts in zip(*batches))  # (2B, T)
    loss = model(x, y)[1]
    loss.backward()
    return loss.item()


def rank_averaged_backward(model, batches) -> float:
    """Forward and backward of each rank's batch (B, T) on its own, gradients halved and summed as DDP
    averages them; the mean of the two losses, as the run logs it."""
    losses = [model(x, y)[1] for x, y in batches]
    for loss in losses:
        (loss / len(batches)).backward()
    return (sum(losses) / len(losses)).item()


def test_two_ranks_equal_one_process_with_twice_the_batch(ddp_run):
    rows = [json.loads(line) for line in open(ddp_run["out"] / "metrics.jsonl")]
    logged = [r["loss"] for r in rows if r["iter"] > 0]
    ref_losses, ref_state = reference_losses(ddp_run["data_dir"])
    assert len(logged) == ITERS
    assert_close(torch.tensor(logged), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    ddp_state = load_checkpoint(str(ddp_run["out"] / "ckpt.pt"))["model"]
    for name, ref in ref_state.items():
        assert_close(ddp_state[name], ref, rtol=1e-4, atol=1e-5, msg=name)


def test_parameters_identical_on_both_ranks(ddp_run):
    ranks = json.load(open(ddp_run["out"] / "ranks.json"))
    assert ranks["world_size"] == 2 and ranks["status"] in COMPLETED
    assert ranks["param_norm"] > 0
    assert ranks["max_abs_diff"] == 0.0


def test_only_rank_zero_writes_and_prints(ddp_run):
    out, proc = ddp_run["out"], ddp_run["proc"]
    iters = [json.loads(line)["iter"] for line in open(out / "metrics.jsonl")]
    assert iters == list(range(ITERS + 1))  # each row once: rank 1 wrote nothing
    assert proc.stdout.count(f"step {ITERS} |") == 1
    summary = json.load(open(out / "summary.json"))
    assert summary["world_size"] == 2 and summary["status"] in COMPLETED
    assert sorted(os.listdir(out)) == [".lock", "best.pt", "ckpt.pt", "config.json", "metrics.jsonl", "ranks.json",
                                       "summary.json"]


def test_resume_under_torchrun_matches_the_uninterrupted_run(ddp_run):
    tmp, data_dir = ddp_run["tmp"], ddp_run["data_dir"]
    out = tmp / "resumed"
    common = [*ARGS, f"--data_dir={data_dir}", f"--out_dir={out}"]
    first = torchrun("train.py", *common, f"--max_iters={ITERS // 2}", cwd=tmp)
    assert first.returncode == 0, first.stderr
    second = torchrun("train.py", *common, f"--max_iters={ITERS}", "--init_from=resume", cwd=tmp)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("done:") == 1
    resumed = load_checkpoint(str(out / "ckpt.pt"))
    straight = load_checkpoint(str(ddp_run["out"] / "ckpt.pt"))
    assert resumed["iter"] == straight["iter"] == ITERS
    for name, value in straight["model"].items():
        assert torch.equal(resumed["model"][name], value), name
    assert len(resumed["ranks"]) == 2


def test_resume_with_another_number_of_processes_is_refused(ddp_run, tmp_path, capsys):
    """The 2-process run resumed by one process (train.py's main, in this one) is refused."""
    import shutil

    from babygpt import cli

    out = tmp_path / "run"
    shutil.copytree(ddp_run["out"], out)
    assert_refused_in_process(cli.train_main, [*ARGS, f"--data_dir={ddp_run['data_dir']}", f"--out_dir={out}",
                                               f"--max_iters={ITERS + 2}", "--init_from=resume"], capsys,
                              "written by 2 process(es), this run has 1")


def test_malformed_torchrun_environment_is_a_one_line_error(tmp_path):
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(once(sys.executable, os.path.join(ROOT, "train.py"), *TINY_TRAIN_ARGS,
                           f"--out_dir={tmp_path / 'run'}", "--data_dir=nowhere"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "LOCAL_RANK not" in proc.stderr and "torchrun" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_nan_on_one_rank_stops_every_rank_at_the_same_iteration(ddp_run, tmp_path):
    """Rank 1 alone produces a NaN loss from its 6th step on: the averaged loss carries it to
    rank 0, and both ranks stop at the same metrics row with status diverged."""
    out = tmp_path / "div"
    env = {**os.environ, "NAN_RANK": "1", "NAN_FROM": "6"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "tests", "ddp_worker.py"), *ARGS, f"--data_dir={ddp_run['data_dir']}",
           f"--out_dir={out}", "--max_iters=20"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    # The ranks' own messages come before torchrun's summary of the failure: show both.
    assert proc.returncode == 0, proc.stderr[:4000] + "\n...\n" + proc.stderr[-1500:]
    ranks = json.load(open(out / "ranks.json"))
    assert [s["status"] for s in ranks["summaries"]] == ["diverged", "diverged"]
    assert {s["iter"] for s in ranks["summaries"]} == {6}  # log_interval 1: stopped at once, together
    assert {s["diverged_at"] for s in ranks["summaries"]} == {6}
    assert json.load(open(out / "summary.json"))["status"] == "diverged"


# ------------------------------------------------------------------ optimizer muon

MUON = ["--optimizer=muon", "--qk_clip_tau=0.01"]  # a tau the initial logits pass: QK-Clip acts too


@pytest.fixture(scope="module")
def muon_run(ddp_run):
    """The same 2-rank run under optimizer muon with QK-Clip (maxima all-reduced across the ranks)."""
    out = ddp_run["tmp"] / "muon"
    proc = torchrun("tests/ddp_worker.py", *ARGS, *MUON, f"--data_dir={ddp_run['data_dir']}", f"--out_dir={out}",
                    f"--max_iters={ITERS}", cwd=ddp_run["tmp"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {**ddp_run, "out": out, "proc": proc}


def test_muon_ranks_stay_identical(muon_run):
    """DDP averages the gradients before the step, so every rank runs the same Muon step; QK-Clip
    clips the same heads on every rank, by the maxima over all of them."""
    ranks = json.load(open(muon_run["out"] / "ranks.json"))
    assert ranks["status"] in COMPLETED and ranks["max_abs_diff"] == 0.0
    rows = [json.loads(line) for line in open(muon_run["out"] / "metrics.jsonl")]
    assert rows[1]["qk_clipped_heads"] > 0


def test_muon_two_ranks_equal_one_process_averaging_the_two_gradients(muon_run):
    """Bit for bit: Newton-Schulz runs in bfloat16, where a gradient summed in another order (one batch of
    2B instead of two of B) rounds apart and the difference grows step by step, so the reference forms
    the gradient exactly as DDP does."""
    rows = [json.loads(line) for line in open(muon_run["out"] / "metrics.jsonl")]
    logged = [r["loss"] for r in rows if r["iter"] > 0]
    ref_losses, ref_state = reference_losses(muon_run["data_dir"], *MUON, as_ranks=True)
    assert len(logged) == ITERS
    assert_close(torch.tensor(logged), torch.tensor(ref_losses), rtol=1e-6, atol=1e-6)
    ddp_state = load_checkpoint(str(muon_run["out"] / "ckpt.pt"))["model"]
    for name, ref in ref_state.items():
        assert torch.equal(ddp_state[name], ref), name
