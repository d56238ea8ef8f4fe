"""The weights' exponential moving average (babygpt/averaging.py, ema_decay): its formula against a
hand-written reference, that it never changes training, and that a resume continues it exactly."""

import json

import pytest
import torch

from babygpt import cli
from babygpt.averaging import WeightAverage
from babygpt.config import TrainConfig, load_config
from babygpt.errors import BabyGPTError
from babygpt.model import GPT
from babygpt.trainer import train
from conftest import TINY_TRAIN_ARGS, assert_refused_in_process, once, tiny_config

pytestmark = pytest.mark.slow  # not in the fast loop: each test trains runs with a weight average


def test_the_average_follows_its_formula_from_the_initial_weights():
    model = GPT(tiny_config(norm_type="batchnorm"))
    decay = 0.75
    average = WeightAverage(model, decay)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            for b in model.buffers():
                b.add_(1)  # BatchNorm's running statistics (floats) and its step count (an integer)
        average.update(model)
        for k, v in model.state_dict().items():
            expected[k] = decay * expected[k] + (1 - decay) * v if v.is_floating_point() else v.clone()
    for k, v in average.average.items():
        torch.testing.assert_close(v, expected[k])


def test_swapped_in_evaluates_the_average_and_gives_the_weights_back():
    model = GPT(tiny_config())
    own = {k: v.clone() for k, v in model.state_dict().items()}
    average = WeightAverage(model, 0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)
    after = {k: v.clone() for k, v in model.state_dict().items()}
    with average.swapped_in(model):
        for k, v in model.state_dict().items():
            torch.testing.assert_close(v, own[k], rtol=0, atol=0)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, after[k], rtol=0, atol=0)


def _run(small_data, out, *extra):
    cfg = load_config(once(*TINY_TRAIN_ARGS, f"--data_dir={small_data}", f"--out_dir={out}", "--max_iters=6",
                           "--eval_interval=3", *extra))
    return train(cfg)


def _state(out):
    return torch.load(out / "ckpt.pt", weights_only=True)


def test_an_average_never_changes_training_and_is_scored_beside_the_weights(small_data, tmp_path):
    plain = _run(small_data, tmp_path / "plain")
    averaged = _run(small_data, tmp_path / "ema", "--ema_decay=0.9")
    for k in ("val_loss_full", "tune_loss", "test_loss", "final_train_loss"):
        assert averaged[k] == plain[k]  # the same weights, bit for bit
    for k in ("val_loss_full", "tune_loss", "test_loss"):
        assert k + "_ema" not in plain
        assert averaged[k + "_ema"] > 0 and averaged[k + "_ema"] != averaged[k]
    a, b = _state(tmp_path / "plain"), _state(tmp_path / "ema")
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=0, atol=0)
    assert "ema" not in a and set(b["ema"]) == set(b["model"])


def test_a_resumed_average_equals_the_uninterrupted_one(small_data, tmp_path):
    whole = _run(small_data, tmp_path / "whole", "--ema_decay=0.8")
    _run(small_data, tmp_path / "parts", "--ema_decay=0.8", "--max_iters=3")
    resumed = _run(small_data, tmp_path / "parts", "--ema_decay=0.8", "--init_from=resume")
    for k in ("test_loss_ema", "tune_loss_ema", "val_loss_full_ema"):
        assert resumed[k] == whole[k]
    a, b = _state(tmp_path / "whole"), _state(tmp_path / "parts")
    for k, v in a["ema"].items():
        torch.testing.assert_close(b["ema"][k], v, rtol=0, atol=0)


@pytest.mark.parametrize("started,resumed", [("0", "0.9"), ("0.9", "0"), ("0.9", "0.8")])
def test_a_resume_that_changes_ema_decay_is_refused(small_data, tmp_path, capsys, started, resumed):
    args = once(*TINY_TRAIN_ARGS, f"--data_dir={small_data}", f"--out_dir={tmp_path / 'run'}", "--max_iters=2",
                "--eval_interval=2", f"--ema_decay={started}")
    assert cli.run(cli.train_main, args) == 0
    assert_refused_in_process(cli.train_main, once(*args, "--max_iters=4", "--init_from=resume",
                                                   f"--ema_decay={resumed}"),
                              capsys, "ema_decay", f"resume with --ema_decay={float(started)}")


def test_ngpt_refuses_an_average_off_its_sphere():
    with pytest.raises(BabyGPTError, match="ema_decay with norm_placement ngpt"):
        TrainConfig(model=tiny_config(norm_placement="ngpt", norm_type="none", bias=False), weight_decay=0.0,
                    ema_decay=0.9)


def test_summary_json_holds_the_averages_losses(small_data, tmp_path):
    _run(small_data, tmp_path / "run", "--ema_decay=0.5")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"test_loss_ema", "tune_loss_ema", "val_loss_full_ema"} <= set(summary)
