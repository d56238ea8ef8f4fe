"""The 2019-2025 variants that came after Mix-LN, LayerNorm Scaling and the output norm:
HybridNorm and HybridNorm* (placements), Admin (a placement whose init is profiled), SkipInit (a
residual gate), and the two learnable forms of QK-norm's logit scale. Each against a hand-written
reference of its formula; the placement x norm grid of test_model.py covers them too."""

import math
import os

import pytest
import torch
from torch.testing import assert_close

from babygpt.config import load_config
from babygpt.errors import BabyGPTError
from babygpt.model import GPT
from babygpt.norms import NoNorm, RMSNorm
from conftest import ROOT, tiny_config
from test_variants import _randomize_norms, assert_causal_and_cache_exact


def split_heads(t, H):
    B, T, C = t.shape
    return t.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)


def causal_attention(q, k, v, scale):
    """softmax(scale * q k^T) v with the causal mask, (B, H, T, D) each; scale a number or (H, 1, 1)."""
    T = q.shape[2]
    att = (q @ k.transpose(-2, -1)) * scale
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return att @ v


def merge_heads(y):
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


def rms(t, gain, eps=1e-5):
    return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * gain


# ------------------------------------------------------------------ HybridNorm


def test_hybrid_attention_normalizes_queries_keys_and_values_per_head():
    """Zhuo et al.'s attention: softmax(N(Q) N(K)^T / sqrt(D)) N(V), each norm over D with one gain
    shared by the heads (the code's q_norm, k_norm, v_norm of size head_dim)."""
    cfg = tiny_config(norm_placement="hybrid", norm_type="rmsnorm")
    model = GPT(cfg)
    _randomize_norms(model)  # three different gains, so a q/k/v mix-up cannot pass
    sa = model.blocks[0].sa
    assert all(m.weight.shape == (cfg.n_embd // cfg.n_head,) for m in (sa.q_norm, sa.k_norm, sa.v_norm))
    x = torch.randn(2, 6, cfg.n_embd)
    q, k, v = (split_heads(t, cfg.n_head) for t in sa.qkv(x).split(cfg.n_embd, dim=2))
    q, k, v = rms(q, sa.q_norm.weight), rms(k, sa.k_norm.weight), rms(v, sa.v_norm.weight)
    y = causal_attention(q, k, v, 1 / math.sqrt(cfg.n_embd // cfg.n_head))
    assert_close(sa(x), sa.proj(merge_heads(y)))


def test_hybrid_block_adds_the_ffn_to_the_normalized_stream():
    """x' = x + attn(x) (no norm on the stream), then N(x') + FFN(N(x')): the residual is taken
    after the norm (the code's ffn_residual_after_norm)."""
    cfg = tiny_config(norm_placement="hybrid", norm_type="rmsnorm")
    model = GPT(cfg)
    _randomize_norms(model)
    block = model.blocks[1]
    assert isinstance(block.ln1, NoNorm) and isinstance(block.ln2, RMSNorm)
    x = torch.randn(2, 6, cfg.n_embd)
    h = rms(x + block.sa(x), block.ln2.weight)
    assert_close(block(x), h + block.ffwd(h))
    assert isinstance(model.ln_f, RMSNorm)  # as in the code: the stream's last add is un-normalized


def test_hybrid_star_makes_block_0_pre_ln_and_keeps_its_qkv_norms():
    cfg = tiny_config(norm_placement="hybrid_star", norm_type="rmsnorm", n_layer=3)
    model = GPT(cfg)
    _randomize_norms(model)
    assert [b.placement.name for b in model.blocks] == ["hybrid_first", "hybrid", "hybrid"]
    first = model.blocks[0]
    assert isinstance(first.ln1, RMSNorm) and first.sa.v_norm is not None
    x = torch.randn(2, 6, cfg.n_embd)
    h = x + first.sa(rms(x, first.ln1.weight))
    assert_close(first(x), h + first.ffwd(rms(h, first.ln2.weight)))


@pytest.mark.parametrize("placement", ["hybrid", "hybrid_star"])
def test_hybrid_refuses_qk_norm_it_already_has(placement):
    with pytest.raises(BabyGPTError, match=f"norm_placement {placement} already normalizes queries, keys and values"):
        tiny_config(norm_placement=placement, qk_norm=True)


@pytest.mark.parametrize("norm_type,reason", [("batchnorm", "see later positions"), ("none", "would be the identity")])
def test_hybrid_refuses_a_norm_type_qk_norm_refuses(norm_type, reason):
    # HybridNorm's q, k and v norms are norm_type's: the same causality and identity rules as qk_norm's
    with pytest.raises(BabyGPTError, match=f"norm_placement hybrid .*norm_type '{norm_type}': .*{reason}"):
        tiny_config(norm_placement="hybrid", norm_type=norm_type)


@pytest.mark.parametrize("overrides", [dict(qk_norm=True), dict(norm_placement="hybrid")])
def test_a_learned_qk_scale_needs_a_norm_that_fixes_each_vectors_size(overrides):
    # DyT squashes each entry but leaves each vector's size free: q.k is then no cosine
    with pytest.raises(BabyGPTError, match="qk_scale learned multiplies the cosine .* norm_type 'dyt' does not give"):
        tiny_config(norm_type="dyt", qk_scale="learned", **overrides)
    tiny_config(norm_type="layernorm", qk_scale="learned", **overrides)  # LayerNorm does


# ------------------------------------------------------------------ Admin


def reference_admin_omegas(model, idx):
    """Transformer-Clinic's profiling by hand: a running ratio from 1; before each sublayer i the
    ratio is omega_i, and the next is sqrt(Var[omega_i x] + Var[f_i(x)]), each variance over the
    whole tensor."""
    x = model.tok_emb(idx) * model.emb_scale + model.pos_emb(torch.arange(idx.shape[1]))
    ratio, omegas = 1.0, []
    for block in model.blocks:
        for f, norm in ((block.sa, block.ln1), (block.ffwd, block.ln2)):
            omegas.append(ratio)
            fx = f(x)
            nxt = math.sqrt(torch.var(ratio * x).item() + torch.var(fx).item())
            x = norm(ratio * x + fx)
            ratio = nxt
    return omegas


@pytest.mark.parametrize("init", ["xavier", "gpt2"])
def test_admin_profiling_sets_each_omega_by_the_recursion(init):
    """Under Xavier init (the paper's, unit-RMS embeddings) omega grows with depth; under GPT-2 init
    the embeddings' variance is tiny, so omega_2 comes out below 1: the recursion measures the stream."""
    torch.manual_seed(0)
    model = GPT(tiny_config(norm_placement="admin", norm_type="layernorm", n_layer=3, init=init))
    idx = torch.randint(29, (4, 16))
    with torch.no_grad():
        expected = reference_admin_omegas(model, idx)
    assert all(torch.equal(b.omega_attn.weight, torch.ones(32)) for b in model.blocks)  # plain Post-LN until profiled
    assert model.profile_init(idx)
    measured = [w for b in model.blocks for w in (b.omega_attn.weight, b.omega_ffwd.weight)]
    for weight, omega in zip(measured, expected):
        assert_close(weight, torch.full((32,), omega))
    assert expected[0] == 1.0
    if init == "xavier":
        assert all(a < b for a, b in zip(expected[1:], expected[2:]))  # the shortcut is up-weighted with depth
    else:
        assert expected[1] < 0.1


def test_admin_block_weights_the_residual_per_channel_and_is_not_decayed():
    model = GPT(tiny_config(norm_placement="admin", norm_type="layernorm"))
    _randomize_norms(model)
    block = model.blocks[0]
    with torch.no_grad():
        block.omega_attn.weight.copy_(torch.linspace(0.5, 2.0, 32))
        block.omega_ffwd.weight.copy_(torch.linspace(2.0, 0.5, 32))
    x = torch.randn(2, 6, 32)
    h = block.ln1(block.omega_attn.weight * x + block.sa(x))
    assert_close(block(x), block.ln2(block.omega_ffwd.weight * h + block.ffwd(h)))
    optimizer = model.configure_optimizers(0.1, 1e-3)
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert all(id(b.omega_attn.weight) in no_decay and id(b.omega_ffwd.weight) in no_decay for b in model.blocks)


def test_profiling_is_a_no_op_without_admin():
    model = GPT(tiny_config())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not model.profile_init(torch.randint(29, (2, 16)))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ------------------------------------------------------------------ SkipInit


def test_skipinit_gives_each_sublayer_its_own_scalar_from_zero():
    block = GPT(tiny_config(norm_type="none", residual_gate="skipinit")).blocks[0]
    x = torch.randn(2, 5, 32)
    assert_close(block(x), x)  # every branch starts at 0
    assert block.gate_attn is not block.gate_ffwd and block.gate_attn.weight.shape == ()
    with torch.no_grad():
        block.gate_attn.weight.fill_(0.5)
        block.gate_ffwd.weight.fill_(-2.0)
    h = x + 0.5 * block.sa(x)  # ln1, ln2: the identity under norm_type none
    assert_close(block(x), h - 2.0 * block.ffwd(h))


# ------------------------------------------------------------------ QK-norm's logit scale


def normalized_qk(sa, x, H):
    q, k, v = (split_heads(t, H) for t in sa.qkv(x).split(x.shape[-1], dim=2))
    return sa.q_norm(q), sa.k_norm(k), v


def cosine(q, k):
    """cos(q_t, k_s) for every pair, (B, H, T, T)."""
    return torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(k, dim=-1).transpose(-2, -1)


def test_learned_qk_scale_is_g_times_the_cosine_from_henrys_g0():
    """Henry et al.: logits = g cos(q, k), g0 = log2(T^2 - T); with a gain-less norm q.k / D is the
    cosine up to the norm's eps (x is large, so eps is negligible)."""
    cfg = tiny_config(qk_norm=True, qk_scale="learned", norm_type="rmsnorm_noparam", block_size=16)
    sa = GPT(cfg).blocks[0].sa
    assert sa.qk_scale.weight.shape == () and sa.qk_scale.weight.item() == pytest.approx(math.log2(16 ** 2 - 16))
    with torch.no_grad():
        sa.qk_scale.weight.fill_(7.0)
    x = 30 * torch.randn(2, 6, cfg.n_embd)
    q, k, v = normalized_qk(sa, x, cfg.n_head)
    T = 6
    expected = (7.0 * cosine(q, k)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    assert_close(sa.attention_logits(x), expected, atol=1e-4, rtol=1e-4)
    y = causal_attention(q, k, v, 7.0 / (cfg.n_embd // cfg.n_head))
    assert_close(sa(x), sa.proj(merge_heads(y)))


def test_per_head_qk_scale_is_swin_v2s_capped_temperature():
    """tau_h = exp(min(s_h, log 100)), s_h from log 10: a temperature per head times the cosine."""
    cfg = tiny_config(qk_norm=True, qk_scale="per_head", norm_type="rmsnorm_noparam")
    sa = GPT(cfg).blocks[0].sa
    assert_close(sa.qk_scale.weight, torch.full((cfg.n_head,), math.log(10.0)))
    with torch.no_grad():
        sa.qk_scale.weight.copy_(torch.tensor([math.log(3.0), 10.0]))  # the second is capped at 100
    x = 30 * torch.randn(2, 6, cfg.n_embd)
    q, k, v = normalized_qk(sa, x, cfg.n_head)
    tau = torch.tensor([3.0, 100.0]).view(-1, 1, 1)
    T = 6
    expected = (tau * cosine(q, k)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    assert_close(sa.attention_logits(x), expected, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("overrides", [dict(qk_norm=True, qk_scale="learned"), dict(qk_norm=True, qk_scale="per_head"),
                                       dict(norm_placement="hybrid"), dict(norm_placement="hybrid_star", n_layer=3),
                                       dict(norm_placement="admin")], ids=lambda o: "-".join(map(str, o.values())))
def test_new_variants_are_causal_and_kv_cache_matches(overrides):
    assert_causal_and_cache_exact(tiny_config(**overrides))


def test_qk_scales_are_not_decayed_and_fixed_is_todays_qk_norm_bit_for_bit():
    model = GPT(tiny_config(qk_norm=True, qk_scale="per_head"))
    optimizer = model.configure_optimizers(0.1, 1e-3)
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert all(id(b.sa.qk_scale.weight) in no_decay for b in model.blocks)
    assert all(b.sa.qk_scale is None for b in GPT(tiny_config(qk_norm=True)).blocks)


@pytest.mark.parametrize("scale", ["learned", "per_head"])
def test_a_learned_qk_scale_without_qk_norm_is_refused(scale):
    with pytest.raises(BabyGPTError, match=f"qk_scale {scale} multiplies the cosine of normalized queries and keys"):
        tiny_config(qk_scale=scale)


def test_an_unknown_qk_scale_is_refused_with_a_suggestion():
    with pytest.raises(BabyGPTError, match="unknown qk_scale 'learnd'.*did you mean 'learned'"):
        tiny_config(qk_norm=True, qk_scale="learnd")


# ------------------------------------------------------------------ the configs


@pytest.mark.parametrize("name,keys", [
    ("hybrid_rms", dict(norm_placement="hybrid", norm_type="rmsnorm")),
    ("hybrid_star_rms", dict(norm_placement="hybrid_star", norm_type="rmsnorm")),
    ("admin_ln", dict(norm_placement="admin", norm_type="layernorm", init="xavier")),
    ("prenorm_skipinit", dict(norm_type="none", residual_gate="skipinit")),
    ("prenorm_rms_qknorm_learned", dict(qk_norm=True, qk_scale="learned")),
    ("prenorm_rms_qknorm_perhead", dict(qk_norm=True, qk_scale="per_head")),
])
def test_literature_config_files_build_their_model(name, keys):
    path = os.path.join(ROOT, "config", f"{name}.py")
    cfg = load_config([path, "--device=cpu", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16"])
    model_cfg = cfg.model_config(vocab_size=29)
    assert {k: getattr(model_cfg, k) for k in keys} == keys
    x = torch.randint(29, (2, 16))
    assert torch.isfinite(GPT(model_cfg)(x, x)[1])


# ------------------------------------------------------------------ Admin in a run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from conftest import prepare_small_data

    return prepare_small_data(tmp_path_factory.mktemp("literature"))


def test_a_run_from_scratch_profiles_admin_once_and_a_resume_keeps_its_omega(data_dir, tmp_path):
    """The trainer profiles a run from scratch before its first step, on a batch of its own (the
    run's data order is that of an unprofiled run), and never again: a resume loads omega."""
    from babygpt.config import load_config
    from babygpt.trainer import Trainer
    from conftest import TINY_TRAIN_ARGS

    args = [*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'r'}", "--max_iters=10",
            "--norm_placement=admin", "--norm_type=layernorm", "--init=xavier"]
    trainer = Trainer(load_config(args))
    profiled = [b.omega_attn.weight.clone() for b in trainer.model.blocks]
    assert not torch.equal(profiled[1], torch.ones(32)) and torch.equal(profiled[0], torch.ones(32))
    plain = Trainer(load_config([*args[:-3], f"--out_dir={tmp_path / 'p'}", "--norm_placement=post",
                                 "--norm_type=layernorm", "--init=xavier"]))
    assert torch.equal(trainer.state.sampler.next_batch()[0], plain.state.sampler.next_batch()[0])
    trainer.train()
    trained = [b.omega_attn.weight.clone() for b in trainer.model.blocks]
    resumed = Trainer(load_config([*args, "--init_from=resume"]))
    resumed.train()  # at max_iters already: loads the checkpoint and stops
    assert all(torch.equal(a, b.omega_attn.weight) for a, b in zip(trained, resumed.model.blocks))


# ------------------------------------------------------------------ nGPT


def ngpt(**overrides):
    return GPT(tiny_config(norm_placement="ngpt", norm_type="none", **overrides))


def unit(t, dim=-1):
    return t / t.norm(dim=dim, keepdim=True)


def test_ngpt_matrices_start_and_stay_on_the_sphere_along_the_embedding_dimension():
    """The code's normalize_matrices: rows of the embedding, qkv and fc; columns of the two
    projections into the stream; at init and after every optimizer step."""
    torch.manual_seed(0)
    model = ngpt()

    def check():
        one = lambda w, dim: assert_close(w.norm(dim=dim), torch.ones(w.shape[1 - dim]))  # noqa: E731
        one(model.tok_emb.weight, 1)
        for b in model.blocks:
            one(b.sa.qkv.weight, 1), one(b.sa.proj.weight, 0), one(b.ffwd.fc.weight, 1), one(b.ffwd.proj.weight, 0)

    check()
    optimizer = model.configure_optimizers(0.0, 1e-2)
    idx = torch.randint(29, (2, 16))
    model(idx, idx)[1].backward()
    optimizer.step()
    with pytest.raises(AssertionError):
        check()  # the step moved them off
    model.after_step()
    check()


def test_ngpt_attention_is_scaled_cosine_with_sqrt_d():
    """q, k normalized per head, each times s_qk (per head and channel), logits scaled by sqrt(D)."""
    model = ngpt()
    sa = model.blocks[0].sa
    with torch.no_grad():
        sa.sqk.weight.copy_(torch.linspace(0.5, 1.5, 32) * sa.sqk.scale)  # effective s_qk = 0.5..1.5
    s_qk = torch.linspace(0.5, 1.5, 32).view(2, 1, 16)
    x = unit(torch.randn(2, 6, 32))
    q, k, v = (split_heads(t, 2) for t in sa.qkv(x).split(32, dim=2))
    y = causal_attention(unit(q) * s_qk, unit(k) * s_qk, v, math.sqrt(16))
    assert_close(sa(x), sa.proj(merge_heads(y)))


def test_ngpt_mlp_logits_and_embedding_follow_the_paper():
    """The MLP's pre-activation times s_u sqrt(C); logits times s_z; the embedding on the sphere."""
    model = ngpt()
    block = model.blocks[0]
    with torch.no_grad():
        block.ffwd.su.weight.copy_(torch.linspace(0.5, 2.0, 128))
        model.logit_scale.weight.copy_(torch.linspace(1.0, 3.0, 29) * model.logit_scale.scale)
    x = unit(torch.randn(2, 6, 32))
    hidden = block.ffwd.fc(x) * torch.linspace(0.5, 2.0, 128) * math.sqrt(32)
    assert_close(block.ffwd(x), block.ffwd.proj(torch.nn.functional.gelu(hidden)))
    idx = torch.randint(29, (2, 6))
    assert_close(model.embed(idx).norm(dim=-1), torch.ones(2, 6))
    assert_close(model(idx)[0], model.lm_head(model.hidden(idx)) * torch.linspace(1.0, 3.0, 29))


def test_ngpt_eigen_learning_rates_start_at_0_05_and_no_scale_is_decayed():
    model = ngpt()
    for b in model.blocks:
        assert_close(b.alpha_attn.value(), torch.full((32,), 0.05))
        assert_close(b.alpha_mlp.value(), torch.full((32,), 0.05))
    optimizer = model.configure_optimizers(0.1, 1e-3)
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    scales = [model.logit_scale.weight] + [w for b in model.blocks for w in
                                           (b.alpha_attn.weight, b.alpha_mlp.weight, b.sa.sqk.weight, b.ffwd.su.weight)]
    assert all(id(w) in no_decay for w in scales)


@pytest.mark.parametrize("overrides,message", [
    (dict(norm_type="rmsnorm"), "it has no norm layers"), (dict(bias=True), "it has no biases"),
    (dict(dropout=0.1), "set dropout 0"), (dict(qk_scale="learned"), "set qk_norm false and qk_scale fixed")])
def test_ngpt_refuses_what_it_does_not_have(overrides, message):
    values = dict(norm_placement="ngpt", norm_type="none", bias=False)
    with pytest.raises(BabyGPTError, match=message):
        tiny_config(**{**values, **overrides})


def test_ngpt_refuses_weight_decay_its_renormalization_would_undo():
    from babygpt.config import load_config

    with pytest.raises(BabyGPTError, match="norm_placement ngpt renormalizes its matrices .* set weight_decay 0"):
        load_config(["--norm_placement=ngpt", "--norm_type=none", "--bias=false", "--weight_decay=0.1"])
    assert load_config([os.path.join(ROOT, "config", "ngpt.py")]).weight_decay == 0


def test_ngpt_trains_and_its_config_file_builds_it(data_dir, tmp_path):
    from babygpt.trainer import Trainer
    from conftest import TINY_TRAIN_ARGS

    path = os.path.join(ROOT, "config", "ngpt.py")
    cfg = load_config([path, *TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'n'}",
                       "--max_iters=30", "--learning_rate=1e-2"])
    shipped = load_config([path])
    assert (shipped.weight_decay, shipped.warmup_iters, shipped.model.bias) == (0.0, 0, False)
    summary = Trainer(cfg).train()
    first = float(open(tmp_path / "n" / "metrics.jsonl").readline().split('"val_loss": ')[1].rstrip("}\n"))
    assert summary["status"] == "finished" and summary["val_loss_full"] < first - 0.5


def test_an_experiment_says_when_its_budget_overrides_a_config_files_own_key():
    import sys

    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import _common
    from babygpt.sweep import Run

    runs = [Run({}, 0, os.path.join(ROOT, "config", name)) for name in ("ngpt.py", "prenorm_rms.py")]
    lines = _common.budget_over_config(dict(_common.DEFAULT_BUDGET), runs)
    assert len(lines) == 1 and "ngpt.py sets warmup_iters = 0" in lines[0] and "warmup_iters=50" in lines[0]
