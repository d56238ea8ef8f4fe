"""Issue 51: Derf, unit-offset gains, and the pre + post-main and parallel-residual placements.

The registry-wide tests (tests/test_norms.py over NORMS, tests/test_model.py over the placement x
norm_type grid) cover the new entries too; these check what is specific to each one against
hand-written formulas.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from babygpt.model import GPT, Block, KVCache
from babygpt.norms import (NORMS, Derf, NoNorm, Norm, NormOptions, RMSNormNoParam, build_norm, gain_offset_refusal,
                           norm_class)
from babygpt.placements import PLACEMENTS as PLACEMENT_CLASSES
from conftest import tiny_config

D = 32
GAINED = [n for n in NORMS if norm_class(NORMS[n]).has_gain]


def _randomize(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))


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


# ------------------------------------------------------------------ pre + post-main norm, parallel residual


def _random_block(placement, norm="layernorm", **overrides):
    cfg = tiny_config(norm_placement=placement, norm_type=norm, **overrides)
    block = Block(cfg)
    for p in block.parameters():  # random gains and biases, so a swapped norm cannot pass
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.3)
    return cfg, block


@pytest.mark.parametrize("norm", ["layernorm", "derf"])
def test_prepost_block_is_norm_of_x_plus_f_of_norm_x(norm):
    cfg, block = _random_block("prepost", norm)
    assert all(isinstance(getattr(block, n), Norm) for n in ("ln1", "ln2", "ln1_post", "ln2_post"))
    assert len({id(getattr(block, n)) for n in ("ln1", "ln2", "ln1_post", "ln2_post")}) == 4  # four distinct
    x = torch.randn(2, 5, cfg.n_embd)
    h = block.ln1_post(x + block.sa(block.ln1(x)))
    assert_close(block(x), block.ln2_post(h + block.ffwd(block.ln2(h))))


def test_parallel_block_adds_both_sublayers_of_the_same_stream():
    cfg, block = _random_block("parallel")
    assert block.ln1 is not block.ln2 and not hasattr(block, "ln1_post")  # two norms (GPT-NeoX), no more
    x = torch.randn(2, 5, cfg.n_embd)
    assert_close(block(x), x + block.sa(block.ln1(x)) + block.ffwd(block.ln2(x)))


def test_parallel_dropout_acts_on_each_branch_before_the_one_add():
    cfg, block = _random_block("parallel", dropout=0.3)
    block.train()
    seen = {}
    for name in ("sa", "ffwd", "drop"):  # attention has its own dropout too: compare what was computed
        getattr(block, name).register_forward_hook(lambda m, args, out, name=name: seen.setdefault(name, []).append(
            (args[0], out)))
    x = torch.randn(2, 5, cfg.n_embd)
    out = block(x)
    (a_in, a_out), (f_in, f_out) = seen["drop"]
    assert torch.equal(a_in, seen["sa"][0][1]) and torch.equal(f_in, seen["ffwd"][0][1])
    assert not torch.equal(a_out, a_in)  # it drops
    with torch.no_grad():
        assert_close(seen["ffwd"][0][0], block.ln2(x))  # both branches read the block's input x
    assert_close(out, x + a_out + f_out)


@pytest.mark.parametrize("placement,final", [("prepost", False), ("parallel", True)])
def test_new_placements_declare_their_final_norm(placement, final):
    cls = PLACEMENT_CLASSES[placement]
    assert cls.final_norm is final and cls.uses_norm_type and not cls.on_sphere
    assert not cls.normalizes_qkv and not cls.profiles
    model = GPT(tiny_config(norm_placement=placement, norm_type="rmsnorm"))
    assert isinstance(model.ln_f, NoNorm) is (not final)
    forced = GPT(tiny_config(norm_placement=placement, norm_type="rmsnorm", final_norm=not final))
    assert isinstance(forced.ln_f, NoNorm) is final


@pytest.mark.parametrize("placement", ["prepost", "parallel"])
@pytest.mark.parametrize("norm", ["rmsnorm", "derf"])
def test_new_placements_sample_the_same_with_and_without_the_kv_cache(placement, norm):
    cfg = tiny_config(norm_placement=placement, norm_type=norm)
    model = GPT(cfg).eval()
    idx = torch.randint(cfg.vocab_size, (2, 3))
    assert torch.equal(model.generate(idx, 30, temperature=0, use_cache=True),
                       model.generate(idx, 30, temperature=0, use_cache=False))
    x = torch.randint(cfg.vocab_size, (2, cfg.block_size))
    cache = KVCache(cfg, 2, "cpu", torch.float32)
    steps = [model(x[:, :4], cache=cache)[0]] + [model(x[:, t:t + 1], cache=cache)[0] for t in range(4, 16)]
    assert_close(torch.cat(steps, dim=1), model(x)[0])
