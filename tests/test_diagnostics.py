"""Per-layer diagnostics (diag_interval): values, shapes, no effect on training, absent when off."""

import json
import math

import pytest
import torch
from torch.testing import assert_close

from babygpt.config import load_config
from babygpt.diagnostics import KEYS, SIGNED, LayerDiagnostics, angular_distance, removal_loss_deltas, token_independence
from babygpt.model import GPT
from babygpt.plot import main as plot_main
from babygpt.trainer import train
from conftest import TINY_TRAIN_ARGS, assert_user_error, once, prepare_small_data, tiny_config

pytestmark = pytest.mark.slow  # not in the fast loop: each test trains a run with diagnostics, or plots one


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("diag"))


def rows(out):
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


@pytest.mark.parametrize("placement,norm,init", [("pre", "rmsnorm", "gpt2"), ("post", "layernorm", "gpt2"),
                                                 ("sandwich", "dyt", "gpt2"), ("deepnorm", "layernorm", "xavier"),
                                                 ("pre", "none", "xavier"), ("post", "layernorm", "xavier")])
def test_stream_values_match_a_manual_forward(placement, norm, init):
    model = GPT(tiny_config(norm_placement=placement, norm_type=norm, init=init, qk_norm=norm == "rmsnorm"))
    idx = torch.randint(29, (3, 16))
    diag = LayerDiagnostics(model)
    diag.stream(idx)
    assert model.training  # the mode it had
    with torch.no_grad():
        model.eval()
        x = model.tok_emb(idx) * model.emb_scale + model.pos_emb(torch.arange(16))
        expected = {"resid_rms": [], "resid_max": [], "token_independence": [], "attn_logit_max": []}
        for block in model.blocks:
            attention_input = x if placement in ("post", "deepnorm") else block.ln1(x)
            q, k, _ = block.sa.heads(attention_input)  # (B, H, T, D)
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            expected["attn_logit_max"].append(scores[..., torch.ones(16, 16).tril().bool()].max().item())
            x = block(x)
            expected["resid_rms"].append(x.pow(2).mean().sqrt().item())
            expected["resid_max"].append(x.abs().max().item())
            same = x.mean(dim=1, keepdim=True).expand_as(x)  # the part that is equal at every position
            expected["token_independence"].append((same.pow(2).sum() / x.pow(2).sum()).item())
        expected["output_logz"] = [torch.logsumexp(model.lm_head(model.ln_f(x)), dim=-1).mean().item()]
    for key, values in expected.items():
        assert_close(torch.tensor(diag.values[key]), torch.tensor(values), msg=key)
    assert ("tanh_saturation" in diag.values) == ("tanh_input_rms" in diag.values) == (norm == "dyt")


@pytest.mark.parametrize("alpha", [1.0, 4.0])
def test_tanh_saturation_counts_dyt_inputs_beyond_the_knee(alpha):
    model = GPT(tiny_config(norm_type="dyt", init="xavier", dyt_alpha_init=alpha)).eval()
    idx = torch.randint(29, (3, 16))
    diag = LayerDiagnostics(model)
    diag.stream(idx)
    expected, rms = [], []
    with torch.no_grad():
        x = model.tok_emb(idx) * model.emb_scale + model.pos_emb(torch.arange(16))  # (B, T, C)
        for block in model.blocks:  # Pre-LN: ln1 reads the stream, then ln2 the stream after attention
            first = alpha * x
            x = x + block.sa(block.ln1(x))
            second = alpha * x
            x = x + block.ffwd(block.ln2(x))
            both = torch.cat([first.flatten(), second.flatten()])
            expected.append((both.abs() >= 2).float().mean().item())
            rms.append(both.pow(2).mean().sqrt().item())
    assert_close(torch.tensor(diag.values["tanh_saturation"]), torch.tensor(expected))
    assert_close(torch.tensor(diag.values["tanh_input_rms"]), torch.tensor(rms))
    assert 0 < max(expected) < 1  # the case tests something: some inputs are saturated, not all


def test_token_independence_is_one_for_a_position_free_stream_and_small_otherwise():
    same = torch.randn(4, 1, 32).expand(4, 64, 32)  # every position holds its sequence's vector
    assert_close(token_independence(same), torch.tensor(1.0))
    unrelated = torch.randn(4, 64, 32)
    assert token_independence(unrelated) < 3 / 64  # about 1/T


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
    common = once(f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=12", "--log_interval=1", "--dropout=0.1")
    train(load_config([*common, f"--out_dir={tmp_path / 'off'}"]))
    train(load_config([*common, f"--out_dir={tmp_path / 'on'}", "--diag_interval=4"]))
    off, on = rows(tmp_path / "off"), rows(tmp_path / "on")
    assert not any(k in r for r in off for k in KEYS)  # absent when switched off
    diag = [r for r in on if "resid_rms" in r]
    assert [r["iter"] for r in diag] == [4, 8, 12]
    for r in diag:
        assert r["tanh_saturation"] is None and r["tanh_input_rms"] is None  # no DyT in this model
        assert len(r["output_logz"]) == 1 and math.isfinite(r["output_logz"][0])  # one value, any sign
        for k in set(KEYS) - {"tanh_saturation", "tanh_input_rms", "output_logz"}:
            positive = k not in SIGNED  # (skipping a block may lower the loss)
            assert len(r[k]) == 2 and all(v == v and (v > 0 or not positive) for v in r[k]), (k, r[k])  # n_layer values
    loss = lambda rs: [(r["iter"], r["loss"]) for r in rs if "loss" in r]  # noqa: E731
    assert loss(on) == loss(off)  # measuring does not change the run (dropout RNG included)


def test_plot_diag_draws_and_refuses_runs_without_diagnostics(data_dir, tmp_path, capsys):
    common = once(f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--max_iters=10")
    train(load_config([*common, f"--out_dir={tmp_path / 'on'}", "--diag_interval=2"]))
    assert plot_main([str(tmp_path / "on"), "--diag", "--at=2,10", f"--out={tmp_path / 'd.png'}"]) == 0
    assert (tmp_path / "d.png").stat().st_size > 10_000
    from matplotlib.image import imread

    height, width = imread(str(tmp_path / "d.png")).shape[:2]
    assert width < 2 * height  # a grid of quantities, not one long row
    train(load_config([*common, f"--out_dir={tmp_path / 'off'}"]))
    from babygpt.cli import run
    assert run(plot_main, [str(tmp_path / "off"), "--diag", f"--out={tmp_path / 'x.png'}"]) == 2
    assert_user_error(capsys.readouterr().err, 2, "no diagnostics", "--diag_interval")
    assert run(plot_main, [str(tmp_path / "on"), "--diag", "--at=3", f"--out={tmp_path / 'x.png'}"]) == 2
    assert_user_error(capsys.readouterr().err, 2, "no diagnostics at iteration(s) [3]")
    assert not (tmp_path / "x.png").exists()


def test_angular_distance_against_closed_forms():
    a = torch.randn(2, 5, 8)
    torch.testing.assert_close(angular_distance(a, 3 * a), torch.tensor(0.0), atol=1e-6, rtol=0)  # scale only
    torch.testing.assert_close(angular_distance(a, -a), torch.tensor(1.0))
    e0, e1 = torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)
    e0[..., 0], e1[..., 1] = 1.0, 1.0
    torch.testing.assert_close(angular_distance(e0, e1), torch.tensor(0.5))  # orthogonal
    torch.testing.assert_close(angular_distance(e0, e0 + e1), torch.tensor(0.25))  # 45 degrees


def test_removal_loss_delta_is_the_loss_of_the_model_without_that_block():
    from conftest import tiny_config

    from babygpt.model import GPT

    model = GPT(tiny_config(n_layer=3)).eval()
    idx = torch.randint(0, 29, (2, 16))
    deltas = removal_loss_deltas(model, idx)

    def loss_without(skip):
        x = model.ln_emb(model.tok_emb(idx) * model.emb_scale + model.pos_emb(torch.arange(16)))
        for layer, block in enumerate(model.blocks):
            x = x if layer == skip else block(x)
        logits = model.lm_head(model.ln_f(x))[:, :-1]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())

    expected = [(loss_without(skip) - loss_without(None)).item() for skip in range(3)]
    torch.testing.assert_close(torch.tensor(deltas), torch.tensor(expected), atol=1e-5, rtol=0)
