"""babygpt/norms.py: each norm against PyTorch's own or its formula, values and gradients (Derf's
and the unit-offset gain's included); the registry, its options and the properties each class
declares."""

import functools
import inspect
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from babygpt.model import GPT
from babygpt.norms import (NORMS, BatchNorm, Derf, DyT, LayerNorm, NoNorm, Norm, NormOptions, RMSNorm, RMSNormNoParam,
                           ScaleNorm, build_norm, gain_offset_refusal, norm_class, qk_norm_refusal)
from conftest import tiny_config

D = 32


def _randomize(norm: nn.Module) -> None:
    """Random gains and biases, so a mix-up between gamma and beta cannot pass."""
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))


@pytest.mark.parametrize("path", ["formula", "forward"])
@pytest.mark.parametrize("shape", [(4, 7, D), (3, D), (D,)])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch_values_and_grads(shape, bias, path):
    """The from-scratch formula against F.layer_norm; and forward (which calls the fused kernel)."""
    ours = LayerNorm(D, eps=1e-5, bias=bias).double()
    _randomize(ours)
    w_ref = ours.weight.detach().clone().requires_grad_(True)
    b_ref = ours.bias.detach().clone().requires_grad_(True) if bias else None
    x = (torch.randn(shape, dtype=torch.float64) * 3 + 1).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    y = ours.formula(x) if path == "formula" else ours(x)
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
    ours = LayerNorm(d).formula(x)
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
    norm.formula(x).backward(g)
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


@pytest.mark.parametrize("name", list(NORMS))
def test_every_norm_keeps_float16_finite_and_its_dtype(name):
    x = (torch.randn(2, 3, D) * 300).half()
    y = build_norm(name, D)(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()


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
    assert isinstance(norm, norm_class(NORMS[name])) and isinstance(norm, Norm)
    assert norm(torch.randn(2, D)).shape == (2, D)


def test_unknown_norm_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_norm("rms", D)
    msg = str(err.value)
    assert "unknown norm_type 'rms'" in msg
    for name in NORMS:
        assert name in msg


@pytest.mark.parametrize("name", list(NORMS))
def test_norms_compute_in_float32_under_autocast(name):
    """Inside bfloat16 autocast, a norm's statistics are still float32: its output equals the
    float32 computation rounded once to bfloat16 at the end."""
    norm = build_norm(name, D)
    x = (torch.randn(4, 9, D) * 100 + 50).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, norm(x.float()).bfloat16())


# ------------------------------------------------------------------ the uniform constructor


@pytest.mark.parametrize("name", list(NORMS))
def test_every_norm_is_built_from_dim_options_and_overrides(name):
    """build_norm passes (dim, options, **overrides) to every class: each must take exactly those."""
    cls = norm_class(NORMS[name])
    assert issubclass(cls, Norm)
    params = inspect.signature(cls).parameters
    assert list(params) == ["dim", "options", "overrides"]
    assert params["options"].default == NormOptions()
    assert params["overrides"].kind is inspect.Parameter.VAR_KEYWORD


def test_build_norm_passes_options_and_rejects_unknown_ones():
    assert build_norm("dyt", D, alpha_init=1.7).alpha.item() == pytest.approx(1.7)
    assert build_norm("scalenorm", D, eps=1e-3).eps == 1e-3
    assert build_norm("layernorm", D, bias=False).bias is None
    with pytest.raises(TypeError):
        build_norm("dyt", D, alpha=1.0)  # a misspelt option is an error, not ignored


def test_overrides_replace_the_options_they_name():
    options = NormOptions(eps=1e-3, bias=False, alpha_init=0.9)
    assert build_norm("dyt", D, options).alpha.item() == pytest.approx(0.9)
    assert build_norm("dyt", D, options).bias is None
    ln = build_norm("layernorm", D, options, eps=1e-6)
    assert ln.eps == 1e-6 and ln.bias is None  # eps overridden, bias still from options
    assert LayerNorm(D, eps=1e-6).eps == 1e-6 and DyT(D, alpha_init=0.8).alpha.item() == pytest.approx(0.8)


@pytest.mark.parametrize("name", list(NORMS))
def test_every_registered_norm_refuses_a_misspelt_override(name):
    """Read off the registry, so that a new entry that skips with_overrides is caught too."""
    with pytest.raises(TypeError):
        norm_class(NORMS[name])(D, alpha=1.0)
    with pytest.raises(TypeError):
        build_norm(name, D, alpha=1.0)


def test_norm_options_problems_name_the_config_fields():
    assert NormOptions().problems() == []
    assert NormOptions(eps=0.0, alpha_init=float("inf")).problems() == [
        "norm_eps must be positive, got 0.0",
        "dyt_alpha_init must be a finite number, got inf",
    ]
    assert NormOptions(alpha_init=-0.5).problems() == ["dyt_alpha_init must be positive, got -0.5"]


def test_a_partial_entry_keeps_its_keywords_over_the_options(monkeypatch):
    """A registered partial fixes its keywords: the options build_norm passes do not undo them."""
    monkeypatch.setitem(NORMS, "layernorm_nobias", functools.partial(LayerNorm, bias=False))
    norm = build_norm("layernorm_nobias", D, NormOptions(eps=1e-6, bias=True))
    assert isinstance(norm, LayerNorm) and norm.bias is None and norm.eps == 1e-6
    assert norm_class(NORMS["layernorm_nobias"]) is LayerNorm
    assert norm_class(functools.partial(functools.partial(DyT, bias=False), alpha_init=2.0)) is DyT
    assert qk_norm_refusal("layernorm_nobias") is None  # read from LayerNorm, not from the name


def test_registry_entries_must_be_norms(monkeypatch):
    for entry in (torch.nn.Identity, functools.partial(torch.nn.LayerNorm, eps=1e-6), "layernorm"):
        with pytest.raises(TypeError, match="Norm subclass"):
            norm_class(entry)
    monkeypatch.setitem(NORMS, "identity", torch.nn.Identity)
    with pytest.raises(TypeError, match="Norm subclass"):
        build_norm("identity", D)


def test_norm_properties_are_declared_by_the_classes():
    """Defaults on Norm; NoNorm is the identity and BatchNorm mixes positions, and no other
    registered class declares either."""
    assert not Norm.is_identity and not Norm.mixes_positions
    classes = [norm_class(entry) for entry in NORMS.values()]
    assert [c for c in classes if c.is_identity] == [NoNorm]
    assert [c for c in classes if c.mixes_positions] == [BatchNorm]
    assert qk_norm_refusal("none") == "the query/key norms would be the identity"
    assert qk_norm_refusal("batchnorm") == ("its statistics over batch and time would let queries and keys "
                                            "see later positions")
    assert [n for n in NORMS if qk_norm_refusal(n)] == ["batchnorm", "none"]
    with pytest.raises(ValueError, match="unknown norm_type 'rms'"):
        qk_norm_refusal("rms")


# ------------------------------------------------------------------ ScaleNorm, DyT, RMSNorm without gain


def test_scalenorm_equals_formula_values_and_grads():
    norm = ScaleNorm(D, eps=1e-5).double()
    assert norm.gain.shape == () and norm.gain.item() == pytest.approx(math.sqrt(D))  # one scalar, sqrt(d)
    with torch.no_grad():
        norm.gain.fill_(2.5)
    x = torch.randn(4, 7, D, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 7, D, dtype=torch.float64)
    y = norm(x)
    expected = 2.5 * x / x.pow(2).sum(-1, keepdim=True).sqrt()  # g * x / ||x||_2
    assert_close(y, expected)
    (y * g).sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    (2.5 * x_ref / x_ref.norm(dim=-1, keepdim=True) * g).sum().backward()
    assert_close(x.grad, x_ref.grad)
    assert_close(norm.gain.grad, (g * x / x.norm(dim=-1, keepdim=True)).sum())  # dL/dg = sum dL/dy * x/||x||


def test_scalenorm_at_init_equals_rmsnorm_and_eps_floors_the_norm():
    x = torch.randn(3, D)
    assert_close(ScaleNorm(D, eps=1e-12)(x), RMSNorm(D, eps=0.0)(x))
    tiny = torch.full((1, D), 1e-9)  # ||x|| = 5.7e-9 < eps: divided by eps instead
    assert_close(ScaleNorm(D, eps=1e-5)(tiny), math.sqrt(D) * tiny / 1e-5)
    zero = torch.zeros(2, D, requires_grad=True)
    ScaleNorm(D)(zero).sum().backward()
    assert torch.isfinite(zero.grad).all()


@pytest.mark.parametrize("bias", [True, False])
def test_dyt_equals_formula_values_and_grads(bias):
    norm = DyT(D, bias=bias, alpha_init=0.8).double()
    assert norm.alpha.shape == () and norm.alpha.item() == pytest.approx(0.8)
    assert torch.equal(norm.weight, torch.ones(D, dtype=torch.float64))
    assert (norm.bias is not None) == bias
    _randomize(norm)
    x = (torch.randn(4, 7, D, dtype=torch.float64) * 3).requires_grad_(True)
    g = torch.randn(4, 7, D, dtype=torch.float64)
    y = norm(x)
    t = torch.tanh(norm.alpha * x)
    expected = norm.weight * t + (norm.bias if bias else 0)
    assert_close(y, expected)
    y.backward(g)
    sech2 = 1 - t.detach() ** 2  # d tanh(u)/du
    assert_close(x.grad, g * norm.weight.detach() * sech2 * norm.alpha.detach())
    assert_close(norm.alpha.grad, (g * norm.weight.detach() * sech2 * x.detach()).sum())
    assert_close(norm.weight.grad, (g * t.detach()).sum(dim=(0, 1)))
    if bias:
        assert_close(norm.bias.grad, g.sum(dim=(0, 1)))


def test_rmsnorm_noparam_equals_rmsnorm_with_unit_gain():
    norm = RMSNormNoParam(D, eps=1e-6)
    assert len(list(norm.parameters())) == 0
    x = torch.randn(4, 7, D) * 2
    assert_close(norm(x), F.rms_norm(x, (D,), eps=1e-6))
    assert_close(norm(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


# ------------------------------------------------------------------ BatchNorm


def _bn_pair(bias=True):
    """Our BatchNorm and nn.BatchNorm1d with the same random affine parameters (float64)."""
    ours, ref = BatchNorm(D, eps=1e-5, bias=bias).double(), nn.BatchNorm1d(D, eps=1e-5, momentum=0.1).double()
    _randomize(ours)
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias if bias else torch.zeros(D))
    return ours, ref


def _compare_bn(ours, ref, x, g, bias=True):
    """Forward and backward through both; ours takes (B, T, C), nn.BatchNorm1d (B, C, T)."""
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y = ours(x1)
    y_ref = ref(x2.transpose(1, 2)).transpose(1, 2)
    assert_close(y, y_ref)
    y.backward(g)
    y_ref.backward(g)
    assert_close(x1.grad, x2.grad)
    assert_close(ours.weight.grad, ref.weight.grad)
    if bias:
        assert_close(ours.bias.grad, ref.bias.grad)


@pytest.mark.parametrize("bias", [True, False])
def test_batchnorm_matches_torch_train_and_eval(bias):
    ours, ref = _bn_pair(bias)
    for _ in range(3):  # training: batch statistics over B and T; running stats updated each time
        x = torch.randn(4, 7, D, dtype=torch.float64) * 2 + 1
        _compare_bn(ours, ref, x, torch.randn_like(x), bias)
        assert_close(ours.running_mean, ref.running_mean)
        assert_close(ours.running_var, ref.running_var)  # updated with the unbiased variance
    ours.eval(), ref.eval()
    for m in (ours, ref):
        m.zero_grad()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    _compare_bn(ours, ref, x, torch.randn_like(x), bias)
    assert_close(ours.running_mean, ref.running_mean)  # eval does not update the running stats


def test_batchnorm_statistics_span_batch_and_time():
    """Training output is (x - mean over B*T) / sqrt(biased var over B*T + eps), per channel."""
    norm = BatchNorm(D)
    x = torch.randn(3, 6, D) * 4 + 2
    flat = x.reshape(-1, D)
    expected = (x - flat.mean(0)) / torch.sqrt(flat.var(0, correction=0) + 1e-5)
    assert_close(norm(x), expected)
    assert_close(norm.running_mean, 0.1 * flat.mean(0))
    assert_close(norm.running_var, 0.9 + 0.1 * flat.var(0, correction=1))
    assert_close(BatchNorm(D)(flat), expected.reshape(-1, D))  # (N, C) works too


def test_batchnorm_needs_more_than_one_value_per_channel_in_training():
    with pytest.raises(ValueError, match="more than one position"):
        BatchNorm(D)(torch.randn(1, 1, D))
    assert BatchNorm(D).eval()(torch.randn(1, 1, D)).shape == (1, 1, D)  # running stats: fine in eval


def test_new_norms_init_values():
    assert [p.numel() for p in ScaleNorm(D).parameters()] == [1]
    assert sum(p.numel() for p in DyT(D).parameters()) == 2 * D + 1
    assert sum(p.numel() for p in DyT(D, bias=False).parameters()) == D + 1
    bn = BatchNorm(D)
    assert torch.equal(bn.weight, torch.ones(D)) and torch.equal(bn.bias, torch.zeros(D))
    assert torch.equal(bn.running_mean, torch.zeros(D)) and torch.equal(bn.running_var, torch.ones(D))
    assert {n for n, _ in bn.named_buffers()} == {"running_mean", "running_var"}
    assert len(list(RMSNormNoParam(D).parameters())) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layernorm_forward_equals_formula_in_low_precision_and_under_autocast(dtype):
    norm = LayerNorm(D)
    _randomize(norm)
    x = (torch.randn(4, 7, D) * 5 + 2).to(dtype)
    assert_close(norm(x), norm.formula(x))
    assert norm(x).dtype == dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_close(norm(x), norm.formula(x))


def test_batchnorm_running_statistics_ignore_a_non_finite_batch():
    """nonfinite=skip drops a bad step; the running statistics must not keep its NaN for ever."""
    bn = BatchNorm(D)
    bn(torch.randn(4, 8, D))
    before = (bn.running_mean.clone(), bn.running_var.clone())
    bad = torch.randn(4, 8, D)
    bad[0, 0, 0] = float("nan")
    bn(bad)
    assert_close((bn.running_mean, bn.running_var), before)
    bn(torch.randn(4, 8, D))
    assert torch.isfinite(bn.running_mean).all() and not torch.equal(bn.running_mean, before[0])


# ------------------------------------------------------------------ Derf


@pytest.mark.parametrize("bias", [True, False])
def test_derf_equals_the_erf_formula_values_and_grads(bias):
    """y = gamma * erf(alpha x + s) + beta, and every gradient by d erf(u)/du = 2/sqrt(pi) exp(-u^2)."""
    norm = Derf(D, bias=bias, derf_alpha_init=0.8, derf_shift_init=0.3).double()
    assert norm.alpha.shape == () and norm.alpha.item() == pytest.approx(0.8)
    assert norm.shift.shape == () and norm.shift.item() == pytest.approx(0.3)  # one scalar, as in the code
    assert torch.equal(norm.weight, torch.ones(D, dtype=torch.float64))
    assert (norm.bias is not None) == bias
    _randomize(norm)
    x = (torch.randn(4, 7, D, dtype=torch.float64) * 3).requires_grad_(True)
    g = torch.randn(4, 7, D, dtype=torch.float64)
    y = norm(x)
    a, s, w = norm.alpha.detach(), norm.shift.detach(), norm.weight.detach()
    u = a * x.detach() + s
    assert_close(y, w * torch.special.erf(u) + (norm.bias.detach() if bias else 0))
    y.backward(g)
    slope = 2 / math.sqrt(math.pi) * torch.exp(-u ** 2)  # d erf(u)/du
    assert_close(x.grad, g * w * slope * a)
    assert_close(norm.alpha.grad, (g * w * slope * x.detach()).sum())
    assert_close(norm.shift.grad, (g * w * slope).sum())
    assert_close(norm.weight.grad, (g * torch.special.erf(u)).sum(dim=(0, 1)))
    if bias:
        assert_close(norm.bias.grad, g.sum(dim=(0, 1)))


def test_derf_parameters_and_declared_properties():
    assert sum(p.numel() for p in Derf(D).parameters()) == 2 * D + 2  # gamma, beta, alpha, s
    assert sum(p.numel() for p in Derf(D, bias=False).parameters()) == D + 2
    assert Derf.squashes and Derf.has_gain and not Derf.fixes_vector_size and not Derf.mixes_positions
    norm = Derf(D, derf_alpha_init=2.0, derf_shift_init=-0.5)
    x = torch.randn(3, D)
    assert_close(norm.squash_input(x), 2.0 * x - 0.5)  # what erf reads, as the diagnostics measure it
    # the saturation threshold is where erf is as flat, relative to its slope at 0, as tanh at DyT's 2.0
    assert math.exp(-Derf.saturation ** 2) == pytest.approx(1 - math.tanh(2.0) ** 2)


def test_derf_options_reach_every_derf_in_the_model():
    model = GPT(tiny_config(norm_type="derf", qk_norm=True, derf_alpha_init=1.3, derf_shift_init=0.2))
    derfs = [m for m in model.modules() if isinstance(m, Derf)]
    assert len(derfs) == 2 * 2 + 2 * 2 + 1  # ln1, ln2, q_norm, k_norm per block, and ln_f
    assert all(m.alpha.item() == pytest.approx(1.3) and m.shift.item() == pytest.approx(0.2) for m in derfs)
    model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)  # alpha and s: in the non-decayed group


@pytest.mark.parametrize("field,value,message", [
    ("derf_alpha_init", 0.0, "derf_alpha_init must be positive"),
    ("derf_alpha_init", float("nan"), "derf_alpha_init must be a finite number"),
    ("derf_shift_init", 11.0, "derf_shift_init must be in [-10, 10]"),
])
def test_derf_options_are_checked(field, value, message):
    problems = NormOptions(**{field: value}).problems()
    assert len(problems) == 1 and problems[0].startswith(message), problems


# ------------------------------------------------------------------ unit-offset gains

GAINED = [n for n in NORMS if norm_class(NORMS[n]).has_gain]


def test_every_norm_declares_whether_it_has_a_gain():
    classes = {norm_class(entry) for entry in NORMS.values()}
    assert {c for c in classes if not c.has_gain} == {RMSNormNoParam, NoNorm}
    assert not Norm.has_gain
    assert [n for n in NORMS if gain_offset_refusal(n)] == ["rmsnorm_noparam", "none"]
    assert NormOptions(gain_offset=True).problems("none") == [
        "norm_gain_offset has no effect with norm_type none: it has no gain to offset; set norm_gain_offset false"]
    assert NormOptions(gain_offset=True).problems("rmsnorm") == []
    assert NormOptions(gain_offset=False).problems("none") == []  # off: nothing to refuse


@pytest.mark.parametrize("name", GAINED)
def test_gain_offset_stores_w_from_zero_and_equals_the_plain_norm_at_init(name):
    """gamma = g0 + w with w starting at 0: at init, the same output and input gradient as the plain norm."""
    plain, offset = build_norm(name, D), build_norm(name, D, gain_offset=True)
    w = getattr(offset, offset.gain_name)
    assert torch.equal(w, torch.zeros_like(w))  # w starts at 0 ...
    assert_close(offset.gamma(), getattr(plain, plain.gain_name), rtol=0, atol=0)  # ... and gamma at g0
    assert offset.gain_offset == pytest.approx(1.0 if name != "scalenorm" else math.sqrt(D))
    assert [n for n, _ in offset.named_parameters()] == [n for n, _ in plain.named_parameters()]  # same keys
    x1 = (torch.randn(4, 7, D) * 2).requires_grad_(True)
    x2 = x1.detach().clone().requires_grad_(True)
    g = torch.randn(4, 7, D)
    y1, y2 = plain(x1), offset(x2)
    assert_close(y2, y1)
    y1.backward(g)
    y2.backward(g)
    assert_close(x2.grad, x1.grad)
    # d loss / d w equals d loss / d gamma of the plain norm: Adam moves w as it would move gamma
    assert_close(getattr(offset, offset.gain_name).grad, getattr(plain, plain.gain_name).grad)


@pytest.mark.parametrize("name", GAINED)
def test_gain_offset_output_is_the_plain_norm_with_gamma_one_plus_w(name):
    plain, offset = build_norm(name, D).double(), build_norm(name, D, gain_offset=True).double()
    _randomize(offset)
    with torch.no_grad():  # the plain norm with gamma = g0 + w and the other parameters copied
        for (n, p), q in zip(plain.named_parameters(), offset.parameters()):
            p.copy_(q + offset.gain_offset if n == plain.gain_name else q)
    x = torch.randn(4, 7, D, dtype=torch.float64)
    assert_close(offset(x), plain(x))
    assert_close(offset.gamma(), getattr(offset, offset.gain_name) + offset.gain_offset)


@pytest.mark.parametrize("offset,target", [(True, 1.0), (False, 0.0)])
def test_weight_decay_of_w_pulls_gamma_towards_one(offset, target):
    """Decoupled weight decay alone (zero gradient): with the unit offset gamma = 1 + w decays to 1,
    without it gamma itself decays to 0."""
    norm = build_norm("rmsnorm", D, gain_offset=offset)
    with torch.no_grad():
        norm.weight.add_(0.5)  # gamma = 1.5 either way
    before = (norm.gamma().detach() - target).abs()
    opt = torch.optim.AdamW([norm.weight], lr=0.1, weight_decay=1.0)
    for _ in range(10):
        norm.weight.grad = torch.zeros_like(norm.weight)
        opt.step()
    after = (norm.gamma().detach() - target).abs()
    assert torch.all(after < 0.5 * before)
    assert_close(after, before * 0.9 ** 10)  # (1 - lr * wd) per step, towards the target


@pytest.mark.parametrize("placement,norm", [("pre", n) for n in GAINED if n != "batchnorm"]
                         + [(p, "rmsnorm") for p in ("post", "sandwich", "prepost", "parallel", "admin")])
def test_gain_offset_model_equals_the_plain_model_at_init(placement, norm):
    """Same seed, same weights, same logits: the offset changes the parametrization, not the model."""
    cfg = dict(norm_placement=placement, norm_type=norm, qk_norm=True)
    torch.manual_seed(0)
    plain = GPT(tiny_config(**cfg)).eval()
    torch.manual_seed(0)
    offset = GPT(tiny_config(norm_gain_offset=True, **cfg)).eval()
    assert plain.state_dict().keys() == offset.state_dict().keys()
    gains = [m for m in offset.modules() if isinstance(m, Norm) and m.has_gain]
    assert gains and all(m.gain_offset > 0 for m in gains)  # every gain in the model, q/k norms included
    x = torch.randint(29, (2, 16))
    assert_close(offset(x)[0], plain(x)[0])
    offset.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)  # w: still a norm parameter
