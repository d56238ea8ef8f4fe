"""The papers' recipes: DyT as Zhu et al. 2025 train language models, Peri-LN as Kim et al. 2025
define it. Each is checked against its formula written out by hand, and its init statistics."""

import math

import pytest
import torch
from torch.testing import assert_close

from babygpt.config import load_config
from babygpt.errors import BabyGPTError
from babygpt.model import GPT, INITS
from babygpt.norms import DyT, NoNorm, RMSNorm
from conftest import tiny_config


def test_dyt_paper_config_builds_the_recipe():
    cfg = load_config(["config/prenorm_dyt_paper.py"]).model_config(65)
    model = GPT(cfg)
    C = cfg.n_embd
    assert isinstance(model.emb_scale, torch.nn.Parameter)
    assert_close(model.emb_scale.detach(), torch.tensor(math.sqrt(C)))
    dyts = [m for m in model.modules() if isinstance(m, DyT)]
    assert len(dyts) == 2 * cfg.n_layer + 1  # ln1, ln2 per block, and ln_f
    assert all(m.bias is None for m in dyts)  # no beta, as their LLaMA's DyT
    assert all(lin.bias is None for lin in model.modules() if isinstance(lin, torch.nn.Linear))
    assert [b.ln1.alpha.item() for b in model.blocks] == [cfg.dyt_alpha_init_attn] * cfg.n_layer
    assert [b.ln2.alpha.item() for b in model.blocks] + [model.ln_f.alpha.item()] == \
        [cfg.dyt_alpha_init] * (cfg.n_layer + 1)


@pytest.mark.parametrize("attn", [None, 0.8])
def test_dyt_alpha_init_attn_sets_ln1_only(attn):
    model = GPT(tiny_config(norm_type="dyt", dyt_alpha_init=0.2, dyt_alpha_init_attn=attn, n_layer=3))
    want = 0.2 if attn is None else attn
    assert_close(torch.stack([b.ln1.alpha for b in model.blocks]).detach(), torch.full((3,), want))
    assert_close(torch.stack([b.ln2.alpha for b in model.blocks] + [model.ln_f.alpha]).detach(),
                 torch.full((4,), 0.2))


def test_dyt_alpha_init_attn_is_refused_with_a_norm_that_has_no_alpha():
    """A norm without alpha would ignore the option: refused by name, not accepted in silence."""
    with pytest.raises(BabyGPTError, match="dyt_alpha_init_attn is read only with norm_type dyt, not with norm_type "
                                           "rmsnorm"):
        tiny_config(dyt_alpha_init_attn=0.8)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_dyt_alpha_init_attn_is_checked(bad):
    with pytest.raises(BabyGPTError, match="dyt_alpha_init_attn must be positive"):
        tiny_config(dyt_alpha_init_attn=bad)


@pytest.mark.parametrize("init", INITS)
def test_learnable_embedding_scale_starts_at_sqrt_width_and_learns(init):
    """The stream entering block 0 is tok_emb * s + pos_emb with s a learnable scalar, sqrt(C) at init:
    RMS 0.02 sqrt(C + 1) on GPT-2's N(0, 0.02) embeddings, sqrt(1 + 1/C) on Xavier's N(0, 1/C)."""
    C = 96
    model = GPT(tiny_config(n_embd=C, n_head=4, emb_scale_learnable=True, init=init))
    idx = torch.randint(29, (8, 16))
    stream = model.tok_emb(idx) * math.sqrt(C) + model.pos_emb(torch.arange(16))  # (B, T, C)
    want = math.sqrt(1 + 1 / C) if init == "xavier" else 0.02 * math.sqrt(C + 1)
    assert_close(stream.pow(2).mean().sqrt(), torch.tensor(want), rtol=0.1, atol=0)
    assert_close(model.emb_scale.detach(), torch.tensor(math.sqrt(C)))
    model(idx, idx)[1].backward()
    assert model.emb_scale.grad is not None and model.emb_scale.grad.abs() > 0
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)
    no_decay = next(g for g in opt.param_groups if g["weight_decay"] == 0.0)["params"]
    assert any(p is model.emb_scale for p in no_decay)  # a gain: never decayed


def manual_periln_hidden(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Peri-LN written out: x0 = Norm(embedding), x <- x + Norm(Module(Norm(x))) per sublayer, then the
    final Norm; each Norm is RMSNorm, x / sqrt(mean(x^2) + eps) * gain."""
    def rms(x, norm):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight

    T = idx.shape[1]
    x = rms(model.tok_emb(idx) * model.emb_scale + model.pos_emb(torch.arange(T)), model.ln_emb)
    for b in model.blocks:
        x = x + rms(b.sa(rms(x, b.ln1)), b.ln1_out)
        x = x + rms(b.ffwd(rms(x, b.ln2)), b.ln2_out)
    return rms(x, model.ln_f)


@pytest.mark.parametrize("init", INITS)
def test_periln_config_matches_its_formula(init):
    cfg = load_config(["config/periln_rms.py", f"--init={init}", "--n_layer=2", "--n_embd=32",
                       "--n_head=2", "--block_size=16"]).model_config(29)
    model = GPT(cfg)
    assert isinstance(model.ln_emb, RMSNorm) and isinstance(model.blocks[0].ln2_out, RMSNorm)
    for b in model.blocks:  # the output norms' gains start at 1, as the paper's
        assert torch.equal(b.ln1_out.weight, torch.ones(32)) and torch.equal(b.ln2_out.weight, torch.ones(32))
    with torch.no_grad():  # move the gains off 1 so that the check sees each one
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.weight.uniform_(0.5, 1.5)
    idx = torch.randint(29, (3, 16))
    assert_close(model.hidden(idx), manual_periln_hidden(model, idx))


def test_embedding_norm_is_the_identity_when_off():
    model = GPT(tiny_config())
    assert isinstance(model.ln_emb, NoNorm) and not list(model.ln_emb.parameters())


@pytest.mark.parametrize("init", INITS)
def test_embedding_norm_gives_unit_rms_entering_block_0(init):
    """Whatever the init's embedding scale (0.03 under GPT-2, 1 under Xavier), block 0 reads RMS 1, up to
    eps: sqrt(ms / (ms + eps)) for an embedding of mean square ms (0.994 at GPT-2's 0.03)."""
    model = GPT(tiny_config(norm_placement="sandwich", emb_norm=True, init=init))
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    idx = torch.randint(29, (4, 16))
    model(idx)
    ms = (model.tok_emb(idx) * model.emb_scale + model.pos_emb(torch.arange(16))).pow(2).mean(-1)  # (B, T)
    assert_close(seen["x"].pow(2).mean(-1).sqrt(), torch.sqrt(ms / (ms + model.ln_emb.eps)))
    assert seen["x"].pow(2).mean().sqrt() > 0.99
