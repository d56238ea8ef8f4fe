"""The block of today's open models, each switch against its formula written out by
hand: RoPE, OLMo 2's width QK-norm, relu2 and SwiGLU, split q/k/v, zero-init projections, the
residual lambdas, the soft-caps and QK-Clip; and with every switch off, today's model."""

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from babygpt.diagnostics import LayerDiagnostics
from babygpt.errors import BabyGPTError
from babygpt.model import GPT, GPTConfig, FeedForward, Rotary, ffn_hidden
from conftest import ROOT, tiny_config


def seeded(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_config(**overrides)).eval()


def randomize_gains(model: GPT, seed: int = 1) -> None:
    """Norm gains away from 1, so that where a norm sits shows in the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".ln" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))


TOKENS = torch.randint(29, (2, 16), generator=torch.Generator().manual_seed(3))


# ------------------------------------------------------------------ every switch off: today's model


def test_defaults_build_todays_state_dict_keys():
    block = ["ln1.weight", "sa.qkv.weight", "sa.qkv.bias", "sa.proj.weight", "sa.proj.bias", "ln2.weight",
             "ffwd.fc.weight", "ffwd.fc.bias", "ffwd.proj.weight", "ffwd.proj.bias"]
    want = (["tok_emb.weight", "pos_emb.weight"] + [f"blocks.{i}.{k}" for i in range(2) for k in block]
            + ["ln_f.weight", "lm_head.weight"])
    model = GPT(tiny_config())
    assert list(model.state_dict()) == want
    assert model.blocks[0].sa.rotary is None and model.resid_lambdas is None and model.blocks[0].ffwd.up is None


def test_rope_model_has_no_position_embedding_and_keeps_its_tables_out_of_the_state_dict():
    model = GPT(tiny_config(pos="rope"))
    assert model.pos_emb is None
    assert not any("pos_emb" in k or k.endswith(("cos", "sin")) for k in model.state_dict())
    assert model.blocks[0].sa.rotary.cos.shape == (16, 8)  # (block_size, D/2)


# ------------------------------------------------------------------ RoPE


def test_rotary_is_the_complex_rotation():
    """Channel pair (i, i + D/2) as the complex number x_i + i x_{i+D/2}, times e^(i m theta_i)."""
    D, T, base = 8, 12, 100.0
    x = torch.randn(2, 3, T, D, dtype=torch.float64)
    rotary = Rotary(D, T, base).double()
    theta = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    z = torch.complex(x[..., :D // 2], x[..., D // 2:]) * torch.polar(torch.ones(T, D // 2, dtype=torch.float64),
                                                                       torch.arange(T).double()[:, None] * theta)
    assert_close(rotary(x), torch.cat([z.real, z.imag], dim=-1))
    assert_close(rotary(x[..., 4:7, :], start=4), torch.cat([z.real, z.imag], dim=-1)[..., 4:7, :])


def test_rotated_dot_product_depends_on_the_offset_only():
    D = 16
    rotary = Rotary(D, 32, 10000.0).double()
    q, k = torch.randn(1, 1, 1, D, dtype=torch.float64), torch.randn(1, 1, 1, D, dtype=torch.float64)
    dot = lambda m, n: (rotary(q, m) * rotary(k, n)).sum().item()  # noqa: E731
    assert dot(5, 2) == pytest.approx(dot(9, 6)) == pytest.approx(dot(3, 0)) == pytest.approx(dot(30, 27))
    assert dot(5, 2) != pytest.approx(dot(5, 3))


ROPE_VARIANTS = [dict(), dict(qk_norm=True), dict(qk_norm=True, qk_norm_order="rope_norm"),
                 dict(attn_softcap=2.0), dict(qk_norm=True, qk_norm_scope="width", qk_norm_order="rope_norm"),
                 dict(split_qkv=True, mlp="swiglu", residual_lambdas=True, logit_softcap=3.0)]


@pytest.mark.parametrize("extra", ROPE_VARIANTS)
def test_rope_kv_cache_logits_match_the_full_forward(extra):
    model = seeded(pos="rope", **extra)
    randomize_gains(model)
    from babygpt.model import KVCache
    cache = KVCache(model.config, 2, "cpu", torch.float32)
    steps = [model(TOKENS[:, :5], cache=cache)[0]] + [model(TOKENS[:, t:t + 1], cache=cache)[0] for t in range(5, 16)]
    assert_close(torch.cat(steps, dim=1), model(TOKENS)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("extra", ROPE_VARIANTS)
@pytest.mark.slow
def test_rope_greedy_samples_with_and_without_cache_are_identical_past_block_size(extra):
    model = seeded(pos="rope", **extra)
    randomize_gains(model)
    with torch.no_grad():  # larger weights, so the samples are not one repeated token
        for p in model.parameters():
            p.mul_(8 if p.dim() == 2 else 1)
    prompt = TOKENS[:, :3]
    cached = model.generate(prompt, 40, temperature=0)  # 43 tokens: the window jumps past block_size 16
    assert torch.equal(cached, model.generate(prompt, 40, temperature=0, use_cache=False))
    assert len(set(cached[0].tolist())) > 2


def test_qk_norm_order_matters_only_when_the_gains_are_not_one():
    norm_rope, rope_norm = (seeded(pos="rope", qk_norm=True, qk_norm_order=o) for o in ("norm_rope", "rope_norm"))
    # unit gains: RMSNorm of a rotated head is the rotated RMSNorm (the rotation keeps the RMS)
    assert_close(norm_rope(TOKENS)[0], rope_norm(TOKENS)[0])
    for model in (norm_rope, rope_norm):
        randomize_gains(model)
    assert not torch.allclose(norm_rope(TOKENS)[0], rope_norm(TOKENS)[0], atol=1e-4)


# ------------------------------------------------------------------ OLMo 2's width QK-norm


def test_width_qk_norm_is_rmsnorm_over_the_whole_projection_then_split():
    model = seeded(qk_norm=True, qk_norm_scope="width", norm_eps=1e-6)
    randomize_gains(model)
    sa, C, H = model.blocks[0].sa, 32, 2
    assert sa.q_norm.weight.shape == (C,)
    x = torch.randn(2, 5, C)
    q, k, v = sa.qkv(x).split(C, dim=2)
    rms = lambda t, g: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * g  # noqa: E731
    heads = lambda t: t.view(2, 5, H, C // H).transpose(1, 2)  # noqa: E731
    got = sa.heads(x)
    assert_close(got[0], heads(rms(q, sa.q_norm.weight)))
    assert_close(got[1], heads(rms(k, sa.k_norm.weight)))
    assert_close(got[2], heads(v))


def test_olmo2_config_is_the_recipe():
    from babygpt.config import load_config
    cfg = load_config(["config/olmo2_rms.py", "--device=cpu"])
    m = cfg.model_config(29)
    assert (m.norm_placement, m.norm_type, m.qk_norm, m.qk_norm_scope, m.norm_eps) == \
        ("output", "rmsnorm", True, "width", 1e-6)
    assert cfg.z_loss == 1e-5 and (m.init, m.init_depth_factor) == ("gpt2", False)
    model = GPT(m)
    assert model.blocks[0].sa.q_norm.weight.shape == (m.n_embd,)
    assert_close(model.blocks[0].sa.proj.weight.std(), torch.tensor(0.02), rtol=0.05, atol=0)  # no depth factor


# ------------------------------------------------------------------ the MLPs


def test_relu2_and_swiglu_follow_their_formulas():
    x = torch.randn(2, 5, 32)
    torch.manual_seed(0)
    relu2 = FeedForward(tiny_config(mlp="relu2"))
    assert_close(relu2(x), relu2.proj(F.relu(relu2.fc(x)) ** 2))
    swiglu = FeedForward(tiny_config(mlp="swiglu"))
    W, V, W2 = swiglu.fc, swiglu.up, swiglu.proj
    assert_close(swiglu(x), W2(W(x) * torch.sigmoid(W(x)) * V(x)))
    assert (W.out_features, V.out_features, W2.in_features) == (88, 88, 88)  # 8 * 32 / 3 = 85.3 -> 88


@pytest.mark.parametrize("C", [32, 128, 384])
def test_swiglu_keeps_the_gelu_mlp_parameter_count(C):
    count = lambda mlp: sum(p.numel() for p in FeedForward(tiny_config(n_embd=C, mlp=mlp)).parameters())  # noqa: E731
    assert count("swiglu") == pytest.approx(count("gelu"), rel=0.04)
    assert ffn_hidden(tiny_config(n_embd=C, mlp="swiglu")) % 8 == 0


# ------------------------------------------------------------------ split q, k, v


@pytest.mark.parametrize("extra", [dict(), dict(init="xavier"), dict(norm_placement="deepnorm"),
                                   dict(pos="rope", qk_norm=True), dict(bias=False)])
def test_split_qkv_starts_as_the_fused_layer(extra):
    fused, split = seeded(**extra), seeded(split_qkv=True, **extra)
    for a, b in zip(fused.blocks, split.blocks):
        assert torch.equal(a.sa.qkv.weight, torch.cat([b.sa.q.weight, b.sa.k.weight, b.sa.v.weight]))
    assert_close(split(TOKENS)[0], fused(TOKENS)[0], atol=0, rtol=0)
    assert {k for k in split.state_dict() if ".sa.q." in k} == {"blocks.0.sa.q.weight", "blocks.1.sa.q.weight"} | (
        set() if extra.get("bias") is False else {"blocks.0.sa.q.bias", "blocks.1.sa.q.bias"})


def test_ngpt_keeps_split_q_k_v_rows_on_the_sphere():
    model = seeded(norm_placement="ngpt", norm_type="none", split_qkv=True)
    for block in model.blocks:
        for w in (block.sa.q.weight, block.sa.k.weight, block.sa.v.weight):
            assert_close(w.norm(dim=1), torch.ones(32))


# ------------------------------------------------------------------ zero-init projections, lambdas


def test_zero_init_proj_makes_every_block_the_identity_at_init():
    zero, plain = seeded(zero_init_proj=True), seeded()
    for block in zero.blocks:
        assert not block.sa.proj.weight.any() and not block.ffwd.proj.weight.any()
    assert torch.equal(zero.blocks[0].sa.qkv.weight, plain.blocks[0].sa.qkv.weight)  # the other draws unchanged
    assert torch.equal(zero.tok_emb.weight, plain.tok_emb.weight)
    assert_close(zero(TOKENS)[0], zero.lm_head(zero.ln_f(zero.embed(TOKENS))))


def test_residual_lambdas_start_neutral_and_follow_the_formula():
    plain, lam = seeded(), seeded(residual_lambdas=True)
    assert torch.equal(lam.resid_lambdas.detach(), torch.ones(2)) and not lam.x0_lambdas.any()
    assert_close(lam(TOKENS)[0], plain(TOKENS)[0], atol=0, rtol=0)
    with torch.no_grad():
        lam.resid_lambdas.copy_(torch.tensor([0.7, 1.3]))
        lam.x0_lambdas.copy_(torch.tensor([0.2, -0.4]))
    x0 = x = lam.embed(TOKENS)
    for i, block in enumerate(lam.blocks):
        x = block(lam.resid_lambdas[i] * x + lam.x0_lambdas[i] * x0)
    assert_close(lam.hidden(TOKENS), lam.ln_f(x))
    no_decay = lam.configure_optimizers(0.1, 1e-3).param_groups[1]["params"]
    assert any(p is lam.resid_lambdas for p in no_decay) and any(p is lam.x0_lambdas for p in no_decay)


# ------------------------------------------------------------------ soft-caps


def test_logit_softcap_is_cap_tanh_and_bounds_the_logits():
    plain, capped = seeded(), seeded(logit_softcap=0.05)
    raw = plain(TOKENS)[0]
    logits, loss = capped(TOKENS, TOKENS)
    assert logits.dtype == torch.float32
    assert_close(logits, 0.05 * torch.tanh(raw / 0.05))
    assert logits.abs().max() <= 0.05 and raw.abs().max() > 0.05
    assert_close(loss, F.cross_entropy(logits.flatten(0, 1), TOKENS.flatten()))


def test_attn_softcap_caps_the_scores_before_the_mask_and_softmax():
    model = seeded(attn_softcap=0.5)
    sa = model.blocks[0].sa
    with torch.no_grad():
        sa.qkv.weight.mul_(40)
    x = torch.randn(2, 6, 32)
    q, k, v = sa.heads(x)
    raw = q @ k.transpose(-2, -1) / math.sqrt(16)
    assert raw.abs().max() > 0.5
    scores = (0.5 * torch.tanh(raw / 0.5)).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    assert_close(sa.attention_logits(x), scores)
    want = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, 6, 32)
    assert_close(sa(x), sa.proj(want))


# ------------------------------------------------------------------ QK-Clip


@pytest.mark.parametrize("extra", [dict(), dict(split_qkv=True), dict(pos="rope", bias=False)])
def test_qk_clip_brings_a_runaway_head_down_to_tau_and_leaves_the_others(extra):
    model = seeded(**extra).train()
    sa = model.blocks[1].sa
    with torch.no_grad():  # head 0 of layer 1 (query rows 0..15) far above the rest; biases not 0
        (sa.q.weight if sa.split else sa.qkv.weight)[:16].mul_(300)
        for lin in (sa.q, sa.k, sa.v) if sa.split else (sa.qkv,):
            if lin.bias is not None:
                lin.bias.normal_(0, 0.02)
    model.track_max_logits(True)
    model(TOKENS)
    peaks = model.tracked_max_logits()
    assert peaks.shape == (2, 2)
    tau = 0.5 * peaks[1, 0].item()
    assert tau > peaks.flatten()[[0, 1, 3]].max()  # only that head is above tau
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert torch.equal(model.qk_clip(tau), peaks)
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == ({"blocks.1.sa.q.weight", "blocks.1.sa.k.weight"} if sa.split else {"blocks.1.sa.qkv.weight"}) \
        | ({"blocks.1.sa.q.bias", "blocks.1.sa.k.bias"} if sa.split and sa.q.bias is not None else set()) \
        | ({"blocks.1.sa.qkv.bias"} if not sa.split and sa.qkv.bias is not None else set())
    q_w, k_w, _, _ = sa.query_key_weights()
    old_q = before["blocks.1.sa.q.weight"] if sa.split else before["blocks.1.sa.qkv.weight"][:32]
    assert torch.equal(q_w[16:], old_q[16:]) and not torch.equal(q_w[:16], old_q[:16])
    with pytest.raises(RuntimeError, match="track_max_logits"):
        model.tracked_max_logits()  # reset by qk_clip
    model(TOKENS)
    again = model.tracked_max_logits()
    assert again[1, 0].item() == pytest.approx(tau, rel=1e-4)
    assert_close(again.flatten()[[0, 1, 3]], peaks.flatten()[[0, 1, 3]])


def test_qk_clip_tracks_training_forwards_only_and_refuses_qk_norm():
    model = seeded()
    model.track_max_logits(True)
    model(TOKENS)  # eval mode: not tracked
    with pytest.raises(RuntimeError):
        model.tracked_max_logits()
    with pytest.raises(ValueError, match="qk_norm"):
        seeded(qk_norm=True).qk_clip(1.0)
    assert tiny_config(norm_placement="hybrid").qk_clip_refusal() is not None


# ------------------------------------------------------------------ diagnostics


def test_diagnostics_log_the_max_attention_logit_per_head():
    model = seeded()
    diag = LayerDiagnostics(model)
    diag.stream(TOKENS)
    per_head = diag.values["attn_logit_max_head"]
    assert len(per_head) == 2 and all(len(h) == 2 for h in per_head)
    for layer, block in enumerate(model.blocks):
        x = block.ln1(model.embed(TOKENS) if layer == 0 else model.blocks[0](model.embed(TOKENS)))
        assert_close(torch.tensor(per_head[layer]), block.sa.attention_logits(x).amax(dim=(0, 2, 3)))
    assert diag.values["attn_logit_max"] == [max(h) for h in per_head]
    assert diag.row(4)["attn_logit_max_head"] == per_head


# ------------------------------------------------------------------ refused combinations


@pytest.mark.parametrize("overrides,fragment", [
    (dict(qk_norm_order="rope_norm", qk_norm=True), "needs pos rope; set pos rope or qk_norm_order norm_rope"),
    (dict(pos="rope", qk_norm_order="rope_norm"), "set qk_norm true or qk_norm_order norm_rope"),
    (dict(qk_norm_scope="width"), "set qk_norm true or qk_norm_scope head"),
    (dict(qk_norm=True, qk_norm_scope="width", qk_scale="learned"), "set qk_norm_scope head or qk_scale fixed"),
    (dict(rope_base=500000.0), "set pos rope or leave rope_base at 10000"),
    (dict(pos="rope", n_embd=30, n_head=2), "head size n_embd / n_head must be even"),
    (dict(pos="alibi"), "unknown pos 'alibi'"),
    (dict(mlp="swish"), "unknown mlp 'swish'"),
    (dict(norm_placement="ngpt", norm_type="none", mlp="relu2"), "set mlp gelu or swiglu"),
    (dict(norm_placement="ngpt", norm_type="none", residual_lambdas=True), "set residual_lambdas false"),
    (dict(norm_placement="ngpt", norm_type="none", zero_init_proj=True), "set zero_init_proj false"),
    (dict(zero_init_proj=True, residual_gate="rezero", norm_type="none"), "neither gets a gradient"),
    (dict(zero_init_proj=True, init_depth_factor=True), "leave init_depth_factor unset"),
    (dict(logit_softcap=-1.0), "logit_softcap"),
])
def test_invalid_combinations_are_refused_with_the_fix(overrides, fragment):
    with pytest.raises(BabyGPTError) as err:
        tiny_config(**overrides)
    assert any(fragment in p and "\n" not in p for p in err.value.problems), err.value.problems


def test_every_switch_together_builds_and_trains_a_step():
    cfg = tiny_config(pos="rope", qk_norm=True, qk_norm_scope="width", qk_norm_order="rope_norm", mlp="swiglu",
                      split_qkv=True, zero_init_proj=True, residual_lambdas=True, logit_softcap=15.0,
                      attn_softcap=50.0, bias=False)
    assert GPTConfig.problems(cfg) == []
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = model.configure_optimizers(0.1, 1e-2)
    loss = model(TOKENS, TOKENS)[1]
    loss.backward()
    opt.step()
    assert math.isfinite(model(TOKENS, TOKENS)[1].item())


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_the_stack_speed_experiments_nanogpt_generate_is_this_models_greedy_sampling(pos, monkeypatch):
    """experiments/exp13_stack_speed.py times nanoGPT's way of generating against the KV cache: within
    block_size the two must produce the same tokens, or the comparison would be of different work."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp13_stack_speed as exp13

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, pos=pos)).eval()
    idx = torch.zeros(1, 1, dtype=torch.long)
    with torch.inference_mode():
        assert torch.equal(exp13.nanogpt_generate(model, idx, 15), model.generate(idx, 15, temperature=0))
