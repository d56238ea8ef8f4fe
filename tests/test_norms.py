"""Our from-scratch norms against PyTorch's own, values and gradients."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from babygpt.norms import NORMS, LayerNorm, NoNorm, RMSNorm, build_norm

D = 32


def _randomize(norm: nn.Module) -> None:
    """Random gains and biases, so a mix-up between gamma and beta cannot pass."""
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))


@pytest.mark.parametrize("shape", [(4, 7, D), (3, D), (D,)])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch_values_and_grads(shape, bias):
    ours = LayerNorm(D, eps=1e-5, bias=bias).double()
    _randomize(ours)
    w_ref = ours.weight.detach().clone().requires_grad_(True)
    b_ref = ours.bias.detach().clone().requires_grad_(True) if bias else None
    x = (torch.randn(shape, dtype=torch.float64) * 3 + 1).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    y = ours(x)
    y_ref = F.layer_norm(x_ref, (D,), w_ref, b_ref, eps=1e-5)
    assert_close(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert_close(x.grad, x_ref.grad)
    assert_close(ours.weight.grad, w_ref.grad)
    if bias:
        assert_close(ours.bias.grad, b_ref.grad)
    else:
        assert ours.bias is None


@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_rmsnorm_matches_torch_values_and_grads(eps):
    ours, ref = RMSNorm(D, eps=eps), nn.RMSNorm(D, eps=eps)  # torch's default eps differs: pass it
    _randomize(ours)
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
    x = (torch.randn(4, 7, D) * 2).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    y, y_ref = ours(x), ref(x_ref)
    assert_close(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert_close(x.grad, x_ref.grad)
    assert_close(ours.weight.grad, ref.weight.grad)


def test_layernorm_uses_biased_variance():
    """torch.var divides by d - 1 by default; LayerNorm divides by d. At d = 8 the two differ by ~6%."""
    d = 8
    x = torch.randn(5, d)
    ours = LayerNorm(d)(x)
    mean = x.mean(-1, keepdim=True)
    unbiased = (x - mean) / torch.sqrt(torch.var(x, dim=-1, keepdim=True) + 1e-5)
    biased = (x - mean) / torch.sqrt(torch.var(x, dim=-1, keepdim=True, correction=0) + 1e-5)
    assert_close(ours, F.layer_norm(x, (d,), eps=1e-5))
    assert_close(ours, biased)
    assert not torch.allclose(ours, unbiased, rtol=1e-2, atol=1e-3)


def test_layernorm_param_grads_match_analytic_formula():
    """dL/dgamma = sum over positions of dL/dy * x_hat; dL/dbeta = sum of dL/dy."""
    norm = LayerNorm(D).double()
    _randomize(norm)
    x = torch.randn(6, 5, D, dtype=torch.float64)
    g = torch.randn(6, 5, D, dtype=torch.float64)
    norm(x).backward(g)
    x_hat = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + 1e-5)
    assert_close(norm.weight.grad, (g * x_hat).sum(dim=(0, 1)))
    assert_close(norm.bias.grad, g.sum(dim=(0, 1)))


def test_rmsnorm_weight_grad_matches_analytic_formula():
    norm = RMSNorm(D).double()
    x = torch.randn(6, 5, D, dtype=torch.float64)
    g = torch.randn(6, 5, D, dtype=torch.float64)
    norm(x).backward(g)
    x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert_close(norm.weight.grad, (g * x_hat).sum(dim=(0, 1)))


def test_rmsnorm_float16_does_not_overflow():
    x = torch.full((2, 3, D), 300.0, dtype=torch.float16)
    naive_ms = x.pow(2).mean(-1, keepdim=True)  # in float16: 300^2 = 90000 > 65504 -> inf
    assert torch.isinf(naive_ms).all()
    naive = x * torch.rsqrt(naive_ms + 1e-5)  # rsqrt(inf) = 0 wipes out the signal
    assert (naive == 0).all()
    y = RMSNorm(D)(x)
    assert y.dtype == torch.float16
    assert torch.isfinite(y).all()
    assert_close(y, torch.ones_like(y))


def test_layernorm_float16_large_values_finite_and_dtype_kept():
    x = (torch.randn(2, 3, D) * 300).half()
    y = LayerNorm(D)(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    assert_close(y, F.layer_norm(x.float(), (D,)).half())


def test_init_values():
    ln, rms = LayerNorm(D), RMSNorm(D)
    assert torch.equal(ln.weight, torch.ones(D)) and torch.equal(ln.bias, torch.zeros(D))
    assert torch.equal(rms.weight, torch.ones(D))
    assert len(list(NoNorm(D).parameters())) == 0


def test_none_is_identity():
    x = torch.randn(3, D)
    assert torch.equal(build_norm("none", D)(x), x)


@pytest.mark.parametrize("name", list(NORMS))
def test_build_norm_builds_each_registered_name(name):
    norm = build_norm(name, D, eps=1e-6, bias=True)
    assert isinstance(norm, NORMS[name])
    assert norm(torch.randn(2, D)).shape == (2, D)


def test_unknown_norm_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_norm("rms", D)
    msg = str(err.value)
    assert "unknown norm_type 'rms'" in msg
    for name in NORMS:
        assert name in msg


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
def test_norms_compute_in_float32_under_autocast(name):
    """Inside bfloat16 autocast, a norm's statistics are still float32: its output equals the
    float32 computation rounded once to bfloat16 at the end."""
    norm = build_norm(name, D)
    x = (torch.randn(4, 9, D) * 100 + 50).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, norm(x.float()).bfloat16())
