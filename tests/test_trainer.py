"""The training loop's parts, in process: eval windows, TrainState, RNG capture, the run directory."""

import dataclasses
import math
import os

import numpy as np
import pytest
import torch

from babygpt.checkpoint import capture_rng, restore_rng
from babygpt.config import load_config
from babygpt.data import BatchSampler
from babygpt.distributed import Dist
from babygpt.state import COMPLETED, TrainState
from babygpt.runtime import CUBLAS_WORKSPACE
from babygpt.trainer import Trainer, estimate_loss, train
from conftest import TINY_TRAIN_ARGS, assert_same_weights, once, prepare_small_data, tiny_config

pytestmark = pytest.mark.slow  # not in the fast loop: each test trains a run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("trainer"))


class RecordingModel(torch.nn.Module):
    """Stands in for a GPT in estimate_loss: remembers every batch it is asked to score."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x, y):
        self.seen.append(x.clone())
        return None, x.float().mean()


class LocalRank(Dist):
    """One rank of a pretend job: who it is, with sums over ranks left to the caller."""

    def sum(self, t):
        return t


def eval_windows(cfg, splits, dist=Dist()):
    model = RecordingModel()
    estimate_loss(model, splits, cfg, torch.device("cpu"), dist)
    return model.seen


def test_eval_windows_do_not_depend_on_seed_or_rank(data_dir):
    """Runs with other seeds score the same text, and under torchrun the ranks share out the very
    batches one process would score (so the loss is the same whatever the world size)."""
    from babygpt.data import load_dataset

    train_data, val_data, _ = load_dataset(data_dir)
    splits = {"val": val_data}
    a, b = (load_config(once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", "--eval_iters=5", "--dtype=float32",
                         f"--seed={s}")) for s in (0, 1234))
    one = eval_windows(a, splits)
    assert len(one) == 5
    for x, y in zip(one, eval_windows(b, splits)):
        assert torch.equal(x, y)
    ranks = [eval_windows(a, splits, LocalRank(r, r, 2)) for r in range(2)]
    assert [len(r) for r in ranks] == [3, 2]  # batches 0, 2, 4 and 1, 3
    for k, x in enumerate(one):
        assert torch.equal(ranks[k % 2][k // 2], x)
    one_batch = load_config(once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", "--eval_iters=1", "--dtype=float32"))
    assert len(eval_windows(one_batch, splits, LocalRank(1, 1, 2))) == 0  # rank 1 scores nothing, still sums
    # Training batches come from the run's own seed: never the eval stream.
    train_batch = BatchSampler(val_data, a.model.block_size, a.batch_size, a.seed).next_batch()[0]
    assert not torch.equal(train_batch, one[0])


def test_train_state_round_trip(data_dir):
    """Every field a TrainState declares survives state_dict / load_state_dict (per-rank parts too)."""
    from babygpt.data import load_dataset

    train_data, _, _ = load_dataset(data_dir)
    sampler = BatchSampler(train_data, 16, 4, seed=3)
    sampler.next_batch()
    state = TrainState(sampler, iter=7, best_val_loss=1.5, last_eval={"iter": 5, "train_loss": 1.4, "val_loss": 1.5},
                       elapsed_s=2.5, first_nonfinite=6, skipped_steps=2, scaler_skipped_steps=1)
    saved = {**state.state_dict(), **state.rank_state(torch.device("cpu"))}
    fresh = TrainState(BatchSampler(train_data, 16, 4, seed=99))
    fresh.load_state_dict(saved)
    fresh.load_rank_state(saved)
    for f in dataclasses.fields(TrainState):
        if f.name not in ("sampler", "pending_rng"):
            assert getattr(fresh, f.name) == getattr(state, f.name), f.name
    assert torch.equal(fresh.sampler.next_batch()[0], state.sampler.next_batch()[0])
    assert fresh.pending_rng is saved["rng"]
    s = fresh.summary("finished", 10, None)
    assert (s["iter"], s["first_nonfinite_at"], s["skipped_steps"], s["final_val_loss"]) == (7, 6, 2, 1.5)
    assert TrainState(sampler).summary("diverged", 10, None)["best_val_loss"] is None  # inf is not JSON


def test_rng_capture_and_restore_cover_every_generator():
    state = capture_rng(torch.device("cpu"))
    expected = (torch.rand(3), np.random.rand(3), __import__("random").random())
    restore_rng(state, torch.device("cpu"))
    again = (torch.rand(3), np.random.rand(3), __import__("random").random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1])
    assert expected[2] == again[2]


def test_mps_rng_state_is_saved_and_restored(monkeypatch):
    """On Apple GPUs dropout draws from the MPS generator: its state must be in the checkpoint."""
    saved = torch.arange(8, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda *a, **k: saved.clone())
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda s, *a, **k: restored.append(s))
    mps = torch.device("mps")
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a: pytest.fail("no CUDA state on mps"))
    state = capture_rng(mps)
    assert torch.equal(state["mps"][0], saved)
    restore_rng(state, mps)
    assert len(restored) == 1 and torch.equal(restored[0], saved)
    old = {k: v for k, v in state.items() if k != "mps"}  # a checkpoint from before the key existed
    restore_rng(old, mps)
    assert len(restored) == 1


def test_trainer_builds_the_configured_init_and_adam_eps(data_dir, tmp_path):
    args = once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'r'}", "--max_iters=2")
    trainer = Trainer(load_config([*args, "--adam_eps=1e-15", "--init=xavier"]))
    assert [g["eps"] for g in trainer.optimizer.param_groups] == [1e-15, 1e-15]
    assert trainer.model.emb_scale == math.sqrt(32)
    assert [g["eps"] for g in Trainer(load_config(args)).optimizer.param_groups] == [1e-8, 1e-8]


def test_building_a_trainer_writes_nothing_and_prints_nothing(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    trainer = Trainer(load_config(once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2")))
    loss = trainer.step(1e-3)
    assert math.isfinite(loss.item()) and trainer.state.iter == 0  # step() does not advance the run's count
    assert not out.exists() and capsys.readouterr().out == ""
    summary = trainer.train()
    assert summary["status"] in COMPLETED and (out / "summary.json").exists()


@pytest.mark.parametrize("z_loss", [0.0, 1e-4, 0.5])
def test_z_loss_adds_the_squared_log_normalizer_to_the_objective_only(data_dir, tmp_path, z_loss):
    """One step's gradient is that of CE + z_loss * mean((log Z)^2), computed by hand on the same batch;
    the loss the step returns (and logs) is the cross-entropy alone."""
    args = once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'z'}", "--grad_clip=0",
            f"--z_loss={z_loss}")
    trainer = Trainer(load_config(args))
    model, sampler = trainer.model, trainer.state.sampler
    before = sampler.state_dict()
    x, y = sampler.next_batch()
    sampler.load_state_dict(before)  # the step draws this same batch
    logits, ce = model(x, y)
    plain = torch.autograd.grad(ce, list(model.parameters()), retain_graph=True)
    expected = torch.autograd.grad(ce + z_loss * torch.logsumexp(logits, dim=-1).pow(2).mean(),
                                   list(model.parameters()))
    captured = {}
    trainer.optimizer.step = lambda: captured.update(grads=[p.grad.clone() for p in model.parameters()])
    step_loss = trainer.step(lr=1e-3)
    torch.testing.assert_close(step_loss, ce.detach())
    for got, want in zip(captured["grads"], expected):
        torch.testing.assert_close(got, want)
    # and the term is there at all: with a coefficient, the gradient differs from plain cross-entropy's
    assert any(not torch.allclose(a, b) for a, b in zip(plain, expected)) == (z_loss > 0)


def test_deterministic_switches_torch_to_deterministic_kernels_and_a_cpu_run_stays_the_same(
        data_dir, tmp_path, deterministic_mode_restored):
    """CPU kernels are deterministic already: the switch must change nothing a CPU run computes."""
    for flag in ("false", "true"):
        s = train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={tmp_path / flag}", *TINY_TRAIN_ARGS,
                               "--max_iters=20", f"--deterministic={flag}")))
        assert s["status"] in COMPLETED
        assert torch.are_deterministic_algorithms_enabled() is (flag == "true")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert_same_weights(tmp_path / "true" / "ckpt.pt", tmp_path / "false" / "ckpt.pt")


def metrics_rows(out_dir):
    import json

    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_target_val_loss_ends_the_run_where_the_full_schedule_would_be_at_that_eval(data_dir, tmp_path):
    """A target every eval reaches ends the run at its first eval after iteration 0, with the weights a
    run cut there by max_iters (the same cosine over 40 iterations) has: nothing else changes."""
    common = once(f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--lr_decay_iters=40")
    s = train(load_config([*common, f"--out_dir={tmp_path / 'target'}", "--max_iters=40", "--target_val_loss=10"]))
    assert s["status"] == "finished" and s["iter"] == 10 and s["target_reached_at"] == 10
    assert s["val_loss_full"] is not None  # scored on the whole split like any finished run
    cut = train(load_config([*common, f"--out_dir={tmp_path / 'cut'}", "--max_iters=10"]))
    assert "target_reached_at" not in cut  # no target, no field
    assert_same_weights(tmp_path / "target" / "ckpt.pt", tmp_path / "cut" / "ckpt.pt")
    evals = [r for r in metrics_rows(tmp_path / "target") if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 10]
    assert 0 <= evals[0]["elapsed_s"] <= evals[1]["elapsed_s"] <= s["wall_time_s"]


def test_a_target_not_reached_trains_to_max_iters_and_says_so(data_dir, tmp_path):
    s = train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *TINY_TRAIN_ARGS, "--max_iters=20",
                           "--target_val_loss=0.01")))
    assert s["status"] in COMPLETED and s["iter"] == 20 and s["target_reached_at"] is None


def test_a_run_that_reached_its_target_resumes_to_nothing_until_the_target_is_lowered(data_dir, tmp_path, capsys):
    args = once(f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *TINY_TRAIN_ARGS, "--max_iters=30")
    train(load_config([*args, "--target_val_loss=10"]))
    before = {name: (tmp_path / name).read_bytes() for name in ("ckpt.pt", "summary.json", "metrics.jsonl")}
    s = train(load_config([*args, "--target_val_loss=10", "--init_from=resume"]))
    assert s["iter"] == 10 and "already reached target_val_loss 10" in capsys.readouterr().err
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    s = train(load_config([*args, "--target_val_loss=0.01", "--init_from=resume"]))
    assert s["status"] in COMPLETED and s["iter"] == 30 and s["target_reached_at"] is None


def test_a_deep_model_says_how_long_its_build_takes_before_building_it(monkeypatch, capsys):
    """Above MANY_BLOCKS blocks, the build's time is estimated (1 and 2 blocks timed) and said first;
    the estimate draws no random numbers that the model's weights see."""
    from babygpt import distributed
    from babygpt import trainer as trainer_module

    cfg = tiny_config(n_layer=3)
    plain = trainer_module.seeded_model(cfg, 0, torch.device("cpu"), distributed.Dist())
    assert "blocks takes about" not in capsys.readouterr().err
    monkeypatch.setattr(trainer_module, "MANY_BLOCKS", 2)
    said = trainer_module.seeded_model(cfg, 0, torch.device("cpu"), distributed.Dist())
    assert "building 3 blocks takes about" in capsys.readouterr().err
    for (name, a), b in zip(plain.state_dict().items(), said.state_dict().values()):
        assert torch.equal(a, b), name
    # 2 blocks: 6 s then 5 s, 10 blocks: 21 s then 22 s -> the fastest, 5 s and 21 s: 1 s + 2 s a block
    ticks = iter([0.0, 6.0, 10.0, 15.0, 20.0, 41.0, 50.0, 72.0])
    assert trainer_module.build_seconds(tiny_config(n_layer=100), clock=lambda: next(ticks)) == 201.0
