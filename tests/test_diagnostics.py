"""Per-layer diagnostics (diag_interval): values, shapes, no effect on training, absent when off."""

import json

import pytest
import torch
from torch.testing import assert_close

from babygpt.config import load_config
from babygpt.diagnostics import KEYS, LayerDiagnostics
from babygpt.model import GPT
from babygpt.plot import main as plot_main
from babygpt.trainer import train
from conftest import TINY_TRAIN_ARGS, assert_user_error, prepare_small_data, tiny_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("diag"))


def rows(out):
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


@pytest.mark.parametrize("placement,norm", [("pre", "rmsnorm"), ("post", "layernorm"), ("sandwich", "dyt"),
                                            ("deepnorm", "layernorm"), ("pre", "none")])
def test_stream_rms_matches_a_manual_forward(placement, norm):
    model = GPT(tiny_config(norm_placement=placement, norm_type=norm))
    idx = torch.randint(29, (3, 16))
    diag = LayerDiagnostics(model)
    diag.stream(idx)
    assert model.training  # the mode it had
    with torch.no_grad():
        model.eval()
        x = model.tok_emb(idx) + model.pos_emb(torch.arange(16))
        expected = []
        for block in model.blocks:
            x = block(x)
            expected.append(x.pow(2).mean().sqrt().item())
    assert_close(torch.tensor(diag.values["resid_rms"]), torch.tensor(expected))


def test_grad_norm_and_update_ratio_match_manual_values():
    model = GPT(tiny_config())
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    idx = torch.randint(29, (3, 16))
    model(idx, idx)[1].backward()
    diag = LayerDiagnostics(model)
    diag.grads()
    old = [torch.cat([p.detach().flatten().clone() for p in b.parameters()]) for b in model.blocks]
    grads = [torch.cat([p.grad.flatten() for p in b.parameters()]) for b in model.blocks]
    diag.before_update()
    opt.step()
    diag.after_update()
    new = [torch.cat([p.detach().flatten() for p in b.parameters()]) for b in model.blocks]
    assert_close(torch.tensor(diag.values["grad_norm"]), torch.stack([g.norm() for g in grads]))
    assert_close(torch.tensor(diag.values["update_ratio"]),
                 torch.stack([(n - o).norm() / o.norm() for n, o in zip(new, old)]))


def test_diagnostics_rows_shapes_and_no_effect_on_training(data_dir, tmp_path):
    common = [f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=12", "--log_interval=1", "--dropout=0.1"]
    train(load_config([*common, f"--out_dir={tmp_path / 'off'}"]))
    train(load_config([*common, f"--out_dir={tmp_path / 'on'}", "--diag_interval=4"]))
    off, on = rows(tmp_path / "off"), rows(tmp_path / "on")
    assert not any(k in r for r in off for k in KEYS)  # absent when switched off
    diag = [r for r in on if "resid_rms" in r]
    assert [r["iter"] for r in diag] == [4, 8, 12]
    for r in diag:
        for k in KEYS:
            assert len(r[k]) == 2 and all(v > 0 and v == v for v in r[k]), (k, r[k])  # n_layer values
    loss = lambda rs: [(r["iter"], r["loss"]) for r in rs if "loss" in r]  # noqa: E731
    assert loss(on) == loss(off)  # measuring does not change the run (dropout RNG included)


def test_plot_diag_draws_and_refuses_runs_without_diagnostics(data_dir, tmp_path, capsys):
    common = [f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=10"]
    train(load_config([*common, f"--out_dir={tmp_path / 'on'}", "--diag_interval=2"]))
    assert plot_main([str(tmp_path / "on"), "--diag", "--at=2,10", f"--out={tmp_path / 'd.png'}"]) == 0
    assert (tmp_path / "d.png").stat().st_size > 10_000
    train(load_config([*common, f"--out_dir={tmp_path / 'off'}"]))
    from babygpt.cli import run
    assert run(plot_main, [str(tmp_path / "off"), "--diag", f"--out={tmp_path / 'x.png'}"]) == 2
    assert_user_error(capsys.readouterr().err, 2, "no diagnostics", "--diag_interval")
    assert run(plot_main, [str(tmp_path / "on"), "--diag", "--at=3", f"--out={tmp_path / 'x.png'}"]) == 2
    assert_user_error(capsys.readouterr().err, 2, "no diagnostics at iteration(s) [3]")
    assert not (tmp_path / "x.png").exists()
