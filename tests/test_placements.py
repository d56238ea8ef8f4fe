"""The norm placements and residual gates inside the model (babygpt/placements.py and the blocks
of babygpt/model.py), each against its formula written out by hand: Sandwich-LN, DeepNorm, QK-norm
and its logit scales, BatchNorm's non-causality, DyT's alpha, Mix-LN, LayerNorm Scaling, OLMo 2's
output norm, the pre + post-main norm, the parallel residual, HybridNorm, Admin, nGPT, and the
ReZero, LayerScale and SkipInit gates; the config files that build them and the combinations
that are refused.

The placement x norm_type grid tests (initial loss, causality, overfitting, KV cache) in
test_model.py cover every placement too; these tests check what is specific to each one.
"""

import math
import os

import pytest
import torch
from torch.testing import assert_close

from babygpt.config import load_config
from babygpt.errors import BabyGPTError
from babygpt.model import GPT, PLACEMENTS, Block, GPTConfig, KVCache
from babygpt.norms import NORMS, DyT, NoNorm, Norm, RMSNorm, qk_norm_refusal
from babygpt.placements import PLACEMENTS as PLACEMENT_CLASSES
from conftest import GRID, ROOT, once, tiny_config

# Which norms can serve as query/key norms is read from their classes (norms.qk_norm_refusal).
QK_NORMS = [n for n in NORMS if qk_norm_refusal(n) is None]
QK_REFUSED = [n for n in NORMS if qk_norm_refusal(n) is not None]


def _is_norm(module) -> bool:
    return isinstance(module, Norm)


# ------------------------------------------------------------------ Sandwich-LN


def test_sandwich_has_four_norms_per_block_and_a_final_norm():
    model = GPT(tiny_config(norm_placement="sandwich", norm_type="rmsnorm"))
    for block in model.blocks:
        norms = [name for name, m in block.named_children() if _is_norm(m)]
        assert norms == ["ln1", "ln2", "ln1_out", "ln2_out"]
    assert isinstance(model.ln_f, RMSNorm)
    d, n_norms = 32, 4 * 2 + 1
    assert model.num_params() - GPT(tiny_config(norm_type="none")).num_params() == n_norms * d


def record_calls(block, names):
    """Forward hooks on ``block``'s submodules ``names``: the order they run in (a list), and what
    each read and returned ({name: (input, output)}), filled as the block runs."""
    calls, seen = [], {}

    def hook(name):
        def record(module, args, output):
            calls.append(name)
            seen[name] = (args[0], output)
        return record

    for name in names:
        getattr(block, name).register_forward_hook(hook(name))
    return calls, seen


def test_sandwich_applies_each_norm_where_stated():
    """Hooks record the call order and what flows between modules: ln1 -> sa -> ln1_out -> add,
    then ln2 -> ffwd -> ln2_out -> add."""
    cfg = tiny_config(norm_placement="sandwich", norm_type="layernorm")
    block = GPT(cfg).blocks[0]
    calls, seen = record_calls(block, ("ln1", "sa", "ln1_out", "ln2", "ffwd", "ln2_out"))
    x = torch.randn(2, 5, cfg.n_embd)
    out = block(x)
    assert calls == ["ln1", "sa", "ln1_out", "ln2", "ffwd", "ln2_out"]
    assert torch.equal(seen["ln1"][0], x)
    assert torch.equal(seen["sa"][0], seen["ln1"][1])  # attention reads the normalized input
    assert torch.equal(seen["ln1_out"][0], seen["sa"][1])  # its output is normalized again
    h = x + seen["ln1_out"][1]  # before being added to the untouched stream
    assert torch.equal(seen["ln2"][0], h)
    assert torch.equal(seen["ffwd"][0], seen["ln2"][1])
    assert torch.equal(seen["ln2_out"][0], seen["ffwd"][1])
    assert_close(out, h + seen["ln2_out"][1])


def test_only_sandwich_has_output_norms():
    for placement in ("pre", "post", "deepnorm", "mixln", "output"):
        block = GPT(tiny_config(norm_placement=placement)).blocks[0]
        assert not hasattr(block, "ln1_out") and not hasattr(block, "ln2_out")


# ------------------------------------------------------------------ DeepNorm


@pytest.mark.parametrize("n_layer", [2, 8])
def test_deepnorm_residual_scale(n_layer):
    model = GPT(tiny_config(norm_placement="deepnorm", norm_type="layernorm", n_layer=n_layer))
    assert all(b.residual_scale == pytest.approx((2 * n_layer) ** 0.25) for b in model.blocks)
    assert all(b.residual_scale == 1.0 for b in GPT(tiny_config(norm_placement="post", n_layer=n_layer)).blocks)
    assert isinstance(model.ln_f, NoNorm)  # final norm off by default, as for post


def test_deepnorm_init_scales_exactly_the_ffn_value_and_output_weights():
    N, C = 8, 64
    model = GPT(tiny_config(norm_placement="deepnorm", norm_type="layernorm", n_layer=N, n_embd=C, n_head=4))
    beta = (8 * N) ** -0.25

    def std(tensors):
        return torch.cat([t.detach().flatten() for t in tensors]).std().item()

    blocks = model.blocks
    scaled = {
        "ffwd.fc": [b.ffwd.fc.weight for b in blocks],
        "ffwd.proj": [b.ffwd.proj.weight for b in blocks],
        "sa.proj": [b.sa.proj.weight for b in blocks],
        "value rows of sa.qkv": [b.sa.qkv.weight[2 * C:] for b in blocks],
    }
    for name, ws in scaled.items():  # 0.02 * beta = 0.0071; with GPT-2's 1/sqrt(2N) too it would be 0.0018
        assert abs(std(ws) - 0.02 * beta) < 3e-4, name
    unscaled = {
        "query rows of sa.qkv": [b.sa.qkv.weight[:C] for b in blocks],
        "key rows of sa.qkv": [b.sa.qkv.weight[C:2 * C] for b in blocks],
        "tok_emb": [model.tok_emb.weight], "pos_emb": [model.pos_emb.weight],
    }
    for name, ws in unscaled.items():
        assert abs(std(ws) - 0.02) < 1e-3, name
    assert torch.equal(blocks[0].sa.qkv.bias, torch.zeros(3 * C))


# ------------------------------------------------------------------ QK-norm


def test_qk_norm_modules_exist_only_when_asked():
    sa = GPT(tiny_config(qk_norm=True, norm_type="layernorm")).blocks[0].sa
    D = 32 // 2
    assert sa.q_norm.weight.shape == (D,) and sa.k_norm.weight.shape == (D,)  # over the head size
    sa = GPT(tiny_config(qk_norm=False)).blocks[0].sa
    assert not hasattr(sa, "q_norm") and not hasattr(sa, "k_norm")


@pytest.mark.parametrize("norm", QK_NORMS)
def test_qk_norm_attention_equals_manual_computation(norm):
    """q and k are normalized per head over D (v is not), then the usual causal softmax."""
    cfg = tiny_config(qk_norm=True, norm_type=norm)
    sa = GPT(cfg).blocks[0].sa
    for m in (sa.q_norm, sa.k_norm):  # different random parameters, so a q/k mix-up cannot pass
        for p in m.parameters():
            torch.nn.init.normal_(p, 1.0, 0.5)
    B, T, C, H = 2, 6, cfg.n_embd, cfg.n_head
    x = torch.randn(B, T, C)
    q, k, v = sa.qkv(x).split(C, dim=2)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
    q_n = torch.stack([sa.q_norm(q[:, h]) for h in range(H)], dim=1)  # head by head: per-head norm
    k_n = torch.stack([sa.k_norm(k[:, h]) for h in range(H)], dim=1)
    assert not torch.allclose(q_n, q, atol=1e-2) and not torch.allclose(k_n, k, atol=1e-2)  # not the identity
    att = q_n @ k_n.transpose(-2, -1) / math.sqrt(C // H)
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    assert_close(sa(x), sa.proj(y))


def test_qk_rmsnorm_gives_unit_rms_queries_and_keys():
    cfg = tiny_config(qk_norm=True, norm_type="rmsnorm")
    sa = GPT(cfg).blocks[0].sa
    seen = {}
    sa.q_norm.register_forward_hook(lambda m, a, out: seen.update(q=out))
    sa.k_norm.register_forward_hook(lambda m, a, out: seen.update(k=out))
    sa(torch.randn(2, 6, cfg.n_embd) * 5)
    for t in (seen["q"], seen["k"]):
        assert t.shape == (2, cfg.n_head, 6, cfg.n_embd // cfg.n_head)
        assert_close(t.pow(2).mean(-1), torch.ones(t.shape[:3]), atol=1e-3, rtol=0)


def test_qk_norm_changes_the_output():
    cfg = tiny_config(norm_type="rmsnorm")
    off = GPT(cfg).eval()
    on = GPT(tiny_config(norm_type="rmsnorm", qk_norm=True)).eval()
    missing = on.load_state_dict(off.state_dict(), strict=False).missing_keys
    assert missing and all(".q_norm." in k or ".k_norm." in k for k in missing)
    x = torch.randint(cfg.vocab_size, (2, cfg.block_size))
    assert not torch.allclose(on(x)[0], off(x)[0])


@pytest.mark.parametrize("norm", QK_NORMS)
def test_qk_norm_is_causal_and_kv_cache_matches(norm):
    assert_causal_and_cache_exact(tiny_config(qk_norm=True, norm_type=norm))


def assert_causal_and_cache_exact(cfg):
    """Changing token 9 leaves the logits before it alone, and KV-cache decoding gives the full pass's logits."""
    model = GPT(cfg).eval()
    x = torch.randint(cfg.vocab_size, (2, cfg.block_size))
    full = model(x)[0]
    x2 = x.clone()
    x2[:, 9] = (x2[:, 9] + 1) % cfg.vocab_size
    assert_close(model(x2)[0][:, :9], full[:, :9])
    cache = KVCache(cfg, 2, "cpu", torch.float32)
    steps = [model(x[:, :4], cache=cache)[0]]
    steps += [model(x[:, t:t + 1], cache=cache)[0] for t in range(4, cfg.block_size)]
    assert_close(torch.cat(steps, dim=1), full)


def test_kv_cache_stores_normalized_keys():
    cfg = tiny_config(qk_norm=True, norm_type="layernorm")
    model = GPT(cfg).eval()
    seen = {}
    model.blocks[1].sa.k_norm.register_forward_hook(lambda m, a, out: seen.update(k=out))
    cache = KVCache(cfg, 2, "cpu", torch.float32)
    model(torch.randint(cfg.vocab_size, (2, 5)), cache=cache)
    assert_close(cache.k[1, :, :, :5], seen["k"])  # (B, H, T, D): mean 0 per head vector
    assert_close(cache.k[1, :, :, :5].mean(-1), torch.zeros(2, cfg.n_head, 5), atol=1e-5, rtol=0)


# ------------------------------------------------------------------ BatchNorm is not causal in training


def test_batchnorm_leaks_the_future_in_training_but_not_in_eval():
    cfg = tiny_config(norm_type="batchnorm")
    model = GPT(cfg)
    x = torch.randint(cfg.vocab_size, (4, cfg.block_size))
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % cfg.vocab_size  # change only the last position
    with torch.no_grad():
        train_out, train_out2 = model(x)[0], model(x2)[0]
        # Training mode: batch statistics include the last position, so every earlier output moves.
        assert not torch.allclose(train_out[:, :-1], train_out2[:, :-1])
        model.eval()  # running statistics: each position normalized on its own
        eval_out = model(x)[0]
        assert_close(model(x2)[0][:, :-1], eval_out[:, :-1])
    assert not torch.allclose(train_out, eval_out)  # and train and eval compute different functions


def test_batchnorm_running_stats_are_buffers_in_the_state_dict():
    model = GPT(tiny_config(norm_type="batchnorm"))
    keys = model.state_dict().keys()
    assert "blocks.0.ln1.running_mean" in keys and "ln_f.running_var" in keys
    assert not any("running" in n for n, _ in model.named_parameters())


# ------------------------------------------------------------------ DyT's alpha


def test_dyt_alpha_init_reaches_every_dyt():
    model = GPT(tiny_config(norm_type="dyt", qk_norm=True, dyt_alpha_init=1.3))
    dyts = [m for m in model.modules() if isinstance(m, DyT)]
    assert len(dyts) == 2 * 2 + 2 * 2 + 1  # ln1, ln2, q_norm, k_norm per block, and ln_f
    assert all(m.alpha.item() == pytest.approx(1.3) for m in dyts)


def test_dyt_model_output_follows_the_formula():
    cfg = tiny_config(norm_type="dyt", final_norm=True)
    model = GPT(cfg)
    with torch.no_grad():
        model.ln_f.alpha.fill_(0.7)
        model.ln_f.weight.normal_()
        model.ln_f.bias.normal_()
    h = torch.randn(2, 5, cfg.n_embd)
    assert_close(model.ln_f(h), model.ln_f.weight * torch.tanh(0.7 * h) + model.ln_f.bias)


# ------------------------------------------------------------------ parameter groups and counts


@pytest.mark.parametrize("placement,norm", [(p, n) for p, n in GRID if p in ("sandwich", "deepnorm")])
def test_optimizer_no_decay_group_is_norm_params_and_biases(placement, norm):
    qk = qk_norm_refusal(norm) is None
    model = GPT(tiny_config(norm_placement=placement, norm_type=norm, qk_norm=qk))
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)  # asserts the groups itself
    names = {id(p): n for n, p in model.named_parameters()}
    not_decayed = {names[id(p)] for p in opt.param_groups[1]["params"]}
    norm_params = {f"{m}.{p}" for m, mod in model.named_modules() if _is_norm(mod)
                   for p, _ in mod.named_parameters()}
    biases = {n for n in names.values() if n.endswith(".bias") and n not in norm_params}
    assert not_decayed == norm_params | biases
    if norm == "scalenorm":
        assert "blocks.0.ln1.gain" in not_decayed and "blocks.1.sa.k_norm.gain" in not_decayed
    if norm == "dyt":
        assert {"blocks.0.ln1.alpha", "blocks.0.sa.q_norm.alpha"} <= not_decayed
    if norm == "batchnorm":
        assert {"blocks.0.ln2.weight", "blocks.0.ln2.bias"} <= not_decayed


def test_param_counts_of_the_new_norms():
    d, n_norms = 32, 2 * 2 + 1  # pre: ln1, ln2 per block, and ln_f
    count = {n: GPT(tiny_config(norm_type=n)).num_params() for n in NORMS}
    assert count["rmsnorm_noparam"] == count["none"]
    assert count["scalenorm"] - count["none"] == n_norms  # one scalar each
    assert count["dyt"] - count["none"] == n_norms * (2 * d + 1)  # gamma, beta, alpha
    assert count["batchnorm"] - count["none"] == n_norms * 2 * d  # gamma, beta (running stats are buffers)
    qk = GPT(tiny_config(norm_type="rmsnorm", qk_norm=True)).num_params()
    assert qk - count["rmsnorm"] == 2 * 2 * (d // 2)  # q_norm and k_norm over D = 16, per block


# ------------------------------------------------------------------ refused combinations


@pytest.mark.parametrize("norm", QK_REFUSED)
def test_qk_norm_with_a_norm_that_cannot_serve_is_refused(norm):
    with pytest.raises(ValueError, match=f"qk_norm cannot be used with norm_type '{norm}'") as err:
        tiny_config(qk_norm=True, norm_type=norm)
    assert qk_norm_refusal(norm) in str(err.value)


@pytest.mark.parametrize("value", [0.0, -0.5, float("nan"), float("inf")])
def test_dyt_alpha_init_must_be_positive_and_finite(value):
    with pytest.raises(ValueError, match="dyt_alpha_init must be (positive|a finite number)"):
        GPTConfig(dyt_alpha_init=value)


def test_variant_problems_are_reported_together_from_the_command_line():
    with pytest.raises(BabyGPTError) as err:
        load_config(["--device=cpu", "--norm_type=batchnorm", "--qk_norm=true", "--dyt_alpha_init=-1",
                     "--norm_placement=sandwhich"])
    problems = err.value.problems
    assert len(problems) == 3
    joined = "\n".join(problems)
    assert "qk_norm cannot be used with norm_type 'batchnorm'" in joined
    assert "dyt_alpha_init must be positive, got -1.0" in joined
    assert "unknown norm_placement 'sandwhich'" in joined and "did you mean 'sandwich'" in joined


def test_variant_keys_reach_the_model_config():
    cfg = load_config(["--device=cpu", "--norm_placement=deepnorm", "--norm_type=dyt", "--qk_norm=true",
                       "--dyt_alpha_init=0.8"])
    model_cfg = cfg.model_config(vocab_size=29)
    assert (model_cfg.norm_placement, model_cfg.qk_norm, model_cfg.dyt_alpha_init) == ("deepnorm", True, 0.8)
    assert not model_cfg.use_final_norm


@pytest.mark.parametrize("name,placement,norm,qk", [
    ("prenorm_scale", "pre", "scalenorm", False), ("prenorm_dyt", "pre", "dyt", False),
    ("prenorm_rmsnoparam", "pre", "rmsnorm_noparam", False), ("prenorm_bn", "pre", "batchnorm", False),
    ("sandwich_rms", "sandwich", "rmsnorm", False), ("deepnorm_ln", "deepnorm", "layernorm", False),
    ("prenorm_rms_qknorm", "pre", "rmsnorm", True), ("mixln_rms", "mixln", "rmsnorm", False),
    ("prenorm_rms_lns", "pre", "rmsnorm", False), ("olmo2_rms", "output", "rmsnorm", True),
    ("prenorm_derf", "pre", "derf", False), ("prepost_rms", "prepost", "rmsnorm", False),
    ("parallel_rms", "parallel", "rmsnorm", False),
])
def test_variant_config_files_build_their_model(name, placement, norm, qk):
    path = os.path.join(ROOT, "config", f"{name}.py")
    cfg = load_config([path, "--device=cpu", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16"])
    model_cfg = cfg.model_config(vocab_size=29)
    assert (model_cfg.norm_placement, model_cfg.norm_type, model_cfg.qk_norm) == (placement, norm, qk)
    x = torch.randint(29, (2, 16))
    assert torch.isfinite(GPT(model_cfg)(x, x)[1])


# ------------------------------------------------------------------ Mix-LN, LNS, output norm


def _randomize_norms(model):
    """Random gains and biases, so that a swapped or skipped norm cannot pass a formula test."""
    for m in model.modules():
        if isinstance(m, Norm):
            for p in m.parameters():
                torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.3)


@pytest.mark.parametrize("alpha,n_layer,posts", [
    (0.25, 4, 1), (0.25, 12, 3), (0.25, 24, 6), (0.25, 2, 0), (0.0, 4, 0), (1.0, 4, 4), (0.5, 5, 2), (0.29, 100, 29),
])
def test_mixln_makes_the_first_floor_alpha_n_blocks_post_ln(alpha, n_layer, posts):
    """floor(alpha * n_layer) blocks from block 0 are Post-LN, the others Pre-LN (the code's 12- and
    24-layer scripts: POST_NUM 3 and 6)."""
    cfg = GPTConfig(n_layer=n_layer, n_embd=8, n_head=2, norm_placement="mixln", mixln_alpha=alpha)
    assert cfg.mixln_post_blocks == posts
    if n_layer <= 24:
        model = GPT(cfg)
        assert [b.placement.name for b in model.blocks] == ["post"] * posts + ["pre"] * (n_layer - posts)
        assert isinstance(model.ln_f, RMSNorm)  # the final norm exists, as in the authors' code


def test_mixln_blocks_follow_post_then_pre_formulas():
    """Block 0 of 4 (alpha 0.25): h = ln1(x + sa(x)), out = ln2(h + ffwd(h)); block 3:
    h = x + sa(ln1(x)), out = h + ffwd(ln2(h)); the model's hidden state chains them and ln_f."""
    cfg = tiny_config(norm_placement="mixln", norm_type="layernorm", n_layer=4)
    model = GPT(cfg).eval()
    _randomize_norms(model)
    x = torch.randn(2, 5, cfg.n_embd)
    first, last = model.blocks[0], model.blocks[-1]
    h = first.ln1(x + first.sa(x))
    assert_close(first(x), first.ln2(h + first.ffwd(h)))
    h = x + last.sa(last.ln1(x))
    assert_close(last(x), h + last.ffwd(last.ln2(h)))
    idx = torch.randint(cfg.vocab_size, (2, 6))
    stream = model.tok_emb(idx) + model.pos_emb(torch.arange(6))
    for i, block in enumerate(model.blocks):
        if i == 0:
            stream = block.ln1(stream + block.sa(stream))
            stream = block.ln2(stream + block.ffwd(stream))
        else:
            stream = stream + block.sa(block.ln1(stream))
            stream = stream + block.ffwd(block.ln2(stream))
    assert_close(model.hidden(idx), model.ln_f(stream))


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_mixln_alpha_is_checked(bad):
    with pytest.raises(BabyGPTError, match=r"mixln_alpha must be in \[0, 1\]"):
        tiny_config(norm_placement="mixln", mixln_alpha=bad)


def test_ln_scaling_multiplies_each_blocks_norm_outputs_by_one_over_sqrt_l():
    """Block i (0-indexed) of a Pre-LN model: out = h + ffwd(ln2(h) / sqrt(i+1)), h = x + sa(ln1(x) /
    sqrt(i+1)); ln_f is not scaled."""
    cfg = tiny_config(norm_type="layernorm", n_layer=4, ln_scaling=True)
    model = GPT(cfg).eval()
    _randomize_norms(model)
    x = torch.randn(2, 5, cfg.n_embd)
    for i, block in enumerate(model.blocks):
        s = 1 / math.sqrt(i + 1)
        assert block.ln_scale == s
        h = x + block.sa(s * block.ln1(x))
        assert_close(block(x), h + block.ffwd(s * block.ln2(h)))
    idx = torch.randint(cfg.vocab_size, (2, 6))
    stream = model.tok_emb(idx) + model.pos_emb(torch.arange(6))
    for i, block in enumerate(model.blocks):
        stream = stream + block.sa(block.ln1(stream) / math.sqrt(i + 1))
        stream = stream + block.ffwd(block.ln2(stream) / math.sqrt(i + 1))
    assert_close(model.hidden(idx), model.ln_f(stream))


def test_ln_scaling_off_is_plain_pre_ln_bit_for_bit():
    torch.manual_seed(0)
    plain = GPT(tiny_config(n_layer=3))
    torch.manual_seed(0)
    off = GPT(tiny_config(n_layer=3, ln_scaling=False))
    assert all(b.ln_scale == 1.0 for b in off.blocks)
    idx = torch.randint(29, (2, 8))
    assert torch.equal(plain(idx)[0], off(idx)[0])


@pytest.mark.parametrize("placement", [p for p in PLACEMENTS if p != "pre"])
def test_ln_scaling_is_refused_outside_pre_ln(placement):
    with pytest.raises(BabyGPTError, match="ln_scaling applies to norm_placement pre only"):
        tiny_config(norm_placement=placement, ln_scaling=True)


def test_output_norm_block_follows_the_olmo2_formula():
    """h = x + ln1(sa(x)); out = h + ln2(ffwd(h)): no norm on a sublayer's input. With qk_norm, as
    config/olmo2_rms.py has it; the model's hidden state chains the blocks and ln_f."""
    cfg = tiny_config(norm_placement="output", norm_type="rmsnorm", qk_norm=True, n_layer=3)
    model = GPT(cfg).eval()
    _randomize_norms(model)
    x = torch.randn(2, 5, cfg.n_embd)
    block = model.blocks[1]
    h = x + block.ln1(block.sa(x))
    assert_close(block(x), h + block.ln2(block.ffwd(h)))
    idx = torch.randint(cfg.vocab_size, (2, 6))
    stream = model.tok_emb(idx) + model.pos_emb(torch.arange(6))
    for block in model.blocks:
        stream = stream + block.ln1(block.sa(stream))
        stream = stream + block.ln2(block.ffwd(stream))
    assert isinstance(model.ln_f, RMSNorm)
    assert_close(model.hidden(idx), model.ln_f(stream))


def test_output_norm_sublayers_read_the_raw_stream():
    """Hooks: sa reads x itself, ln1 reads sa's output; ffwd reads h itself, ln2 reads ffwd's output."""
    cfg = tiny_config(norm_placement="output", norm_type="layernorm")
    block = GPT(cfg).blocks[0]
    calls, seen = record_calls(block, ("sa", "ln1", "ffwd", "ln2"))
    x = torch.randn(2, 5, cfg.n_embd)
    out = block(x)
    assert calls == ["sa", "ln1", "ffwd", "ln2"]
    assert torch.equal(seen["sa"][0], x) and torch.equal(seen["ln1"][0], seen["sa"][1])
    h = x + seen["ln1"][1]
    assert torch.equal(seen["ffwd"][0], h) and torch.equal(seen["ln2"][0], seen["ffwd"][1])
    assert_close(out, h + seen["ln2"][1])


@pytest.mark.parametrize("overrides", [dict(norm_placement="mixln", n_layer=4), dict(ln_scaling=True, n_layer=3)],
                         ids=["mixln-4-layers", "ln_scaling"])
def test_depth_dependent_variants_are_causal_and_kv_cache_matches(overrides):
    """The grid's tiny 2-layer Mix-LN has no Post-LN block and the grid has no ln_scaling: here with both."""
    assert_causal_and_cache_exact(tiny_config(**overrides))


# ------------------------------------------------------------------ residual gates: ReZero, LayerScale

def test_rezero_blocks_start_as_the_identity_and_share_one_scalar():
    model = GPT(tiny_config(norm_type="none", residual_gate="rezero"))
    block = model.blocks[0]
    x = torch.randn(2, 5, 32)
    assert_close(block(x), x)  # alpha = 0: the block adds nothing yet
    assert block.gate_attn is block.gate_ffwd and block.gate_attn.weight.shape == ()
    with torch.no_grad():
        block.gate_attn.weight.fill_(0.5)
    h = x + 0.5 * block.sa(block.ln1(x))  # (B, T, C); ln1 is the identity (norm_type none)
    assert_close(block(x), h + 0.5 * block.ffwd(block.ln2(h)))


def test_layerscale_scales_each_sublayer_by_its_own_vector():
    block = GPT(tiny_config(residual_gate="layerscale", layerscale_init=0.1)).blocks[0]
    assert block.gate_attn is not block.gate_ffwd
    assert_close(block.gate_attn.weight, torch.full((32,), 0.1))
    with torch.no_grad():
        block.gate_ffwd.weight.copy_(torch.linspace(0.1, 1.0, 32))
    x = torch.randn(2, 5, 32)
    h = x + block.gate_attn.weight * block.sa(block.ln1(x))
    assert_close(block(x), h + block.gate_ffwd.weight * block.ffwd(block.ln2(h)))


def test_gates_are_not_weight_decayed_and_no_gate_is_the_plain_block_bit_for_bit():
    torch.manual_seed(0)
    plain = GPT(tiny_config())
    torch.manual_seed(0)
    gated = GPT(tiny_config(residual_gate="layerscale", layerscale_init=1.0))
    idx = torch.randint(0, 29, (2, 16))
    assert torch.equal(plain(idx)[0], gated(idx)[0])  # lambda = 1 changes nothing
    optimizer = gated.configure_optimizers(0.1, 1e-3)
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert all(id(b.gate_attn.weight) in no_decay and id(b.gate_ffwd.weight) in no_decay for b in gated.blocks)


@pytest.mark.parametrize("placement", [p for p in PLACEMENTS if p != "pre"])
def test_residual_gates_are_refused_outside_pre_ln(placement):
    with pytest.raises(BabyGPTError, match="residual_gate rezero applies to norm_placement pre only"):
        tiny_config(norm_placement=placement, residual_gate="rezero")


def test_an_unknown_gate_is_refused_with_a_suggestion():
    with pytest.raises(BabyGPTError, match="unknown residual_gate 'rezro'.*did you mean 'rezero'"):
        tiny_config(residual_gate="rezro")


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


# ------------------------------------------------------------------ attention written out by hand


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

    return prepare_small_data(tmp_path_factory.mktemp("placements"))


@pytest.mark.slow
def test_a_run_from_scratch_profiles_admin_once_and_a_resume_keeps_its_omega(data_dir, tmp_path):
    """The trainer profiles a run from scratch before its first step, on a batch of its own (the
    run's data order is that of an unprofiled run), and never again: a resume loads omega."""
    from babygpt.config import load_config
    from babygpt.trainer import Trainer
    from conftest import TINY_TRAIN_ARGS

    args = once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'r'}", "--max_iters=10",
            "--norm_placement=admin", "--norm_type=layernorm", "--init=xavier")
    trainer = Trainer(load_config(args))
    profiled = [b.omega_attn.weight.clone() for b in trainer.model.blocks]
    assert not torch.equal(profiled[1], torch.ones(32)) and torch.equal(profiled[0], torch.ones(32))
    plain = Trainer(load_config(once(*args, f"--out_dir={tmp_path / 'p'}", "--norm_placement=post")))
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


def test_ngpt_swiglu_scales_both_halves_by_their_own_vector_times_sqrt_c():
    """nGPT §2.4.2 (eqs. 20-21) with the code's suv (NVIDIA/ngpt model.py): the gate nu = fc(x)
    times s_nu sqrt(C) (su), u = up(x) times s_u sqrt(C) (su_up; the paper has no sqrt(C) on u),
    both effective init 1; proj(u * SiLU(nu))."""
    model = ngpt(mlp="swiglu")
    ffwd = model.blocks[0].ffwd
    hidden = ffwd.fc.out_features
    assert (hidden, ffwd.up.out_features) == (88, 88)  # ffn_hidden: 8 * 32 / 3 -> 88
    for s in (ffwd.su, ffwd.su_up):
        assert (s.init, s.scale) == (1.0, 1.0)
        assert_close(s.value(), torch.ones(hidden))
    s_nu, s_u = torch.linspace(0.5, 2.0, hidden), torch.linspace(1.5, 0.25, hidden)
    with torch.no_grad():
        ffwd.su.weight.copy_(s_nu)
        ffwd.su_up.weight.copy_(s_u)
    x = unit(torch.randn(2, 6, 32))
    nu = x @ ffwd.fc.weight.T * s_nu * math.sqrt(32)
    u = x @ ffwd.up.weight.T * s_u * math.sqrt(32)
    assert_close(ffwd(x), (u * nu * torch.sigmoid(nu)) @ ffwd.proj.weight.T)
    # the GELU MLP's names stay what its checkpoints hold: su only
    gelu = ngpt().blocks[0].ffwd
    assert gelu.up is None and gelu.su_up is None
    assert {k for k in ngpt().state_dict() if ".ffwd." in k} == {
        f"blocks.{i}.ffwd.{n}" for i in range(2) for n in ("fc.weight", "proj.weight", "su.weight")}
    assert {k for k in model.state_dict() if ".ffwd." in k} == {
        f"blocks.{i}.ffwd.{n}" for i in range(2)
        for n in ("fc.weight", "up.weight", "proj.weight", "su.weight", "su_up.weight")}


def test_ngpt_swiglu_keeps_up_rows_on_the_sphere_and_su_up_undecayed():
    """after_step normalizes up's rows like fc's (the code's c_fc holds both halves, normalized
    along dim 1), at init and after a step; su_up is a scale like su, never weight-decayed."""
    model = ngpt(mlp="swiglu")
    ones = torch.ones(88)
    for b in model.blocks:
        assert_close(b.ffwd.up.weight.norm(dim=1), ones)
    optimizer = model.configure_optimizers(0.1, 1e-2)
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert all(id(b.ffwd.su_up.weight) in no_decay and id(b.ffwd.su.weight) in no_decay for b in model.blocks)
    idx = torch.randint(29, (2, 16))
    model(idx, idx)[1].backward()
    optimizer.step()
    assert not all(torch.allclose(b.ffwd.up.weight.norm(dim=1), ones) for b in model.blocks)  # moved off
    model.after_step()
    for b in model.blocks:
        assert_close(b.ffwd.up.weight.norm(dim=1), ones)
        assert_close(b.ffwd.fc.weight.norm(dim=1), ones)
        assert_close(b.ffwd.proj.weight.norm(dim=0), ones)  # (32, 88): its columns


def test_ngpt_accepts_swiglu_and_refuses_relu2():
    assert GPTConfig.problems(tiny_config(norm_placement="ngpt", norm_type="none", mlp="swiglu")) == []
    with pytest.raises(BabyGPTError, match="set mlp gelu or swiglu") as err:
        tiny_config(norm_placement="ngpt", norm_type="none", mlp="relu2")
    assert any("not mlp relu2" in p for p in err.value.problems)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_ngpt_swiglu_trains_a_few_steps_with_finite_falling_loss(pos):
    torch.manual_seed(0)
    model = ngpt(mlp="swiglu", pos=pos)
    optimizer = model.configure_optimizers(0.0, 1e-2)
    idx = torch.randint(29, (4, 16))
    losses = []
    for _ in range(8):
        loss = model(idx, idx)[1]
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model.after_step()
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert all(p.grad is not None for b in model.blocks for p in (b.ffwd.su.weight, b.ffwd.su_up.weight))


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


@pytest.mark.slow
def test_ngpt_trains_and_its_config_file_builds_it(data_dir, tmp_path):
    from babygpt.trainer import Trainer
    from conftest import TINY_TRAIN_ARGS

    path = os.path.join(ROOT, "config", "ngpt.py")
    cfg = load_config(once(path, *TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'n'}",
                       "--max_iters=30", "--learning_rate=1e-2"))
    shipped = load_config([path])
    assert (shipped.weight_decay, shipped.warmup_iters, shipped.model.bias) == (0.0, 0, False)
    summary = Trainer(cfg).train()
    first = float(open(tmp_path / "n" / "metrics.jsonl").readline().split('"val_loss": ')[1].rstrip("}\n"))
    assert summary["status"] == "finished" and summary["val_loss_full"] < first - 0.5


@pytest.mark.parametrize("alpha,n_layer", [(0.3, 6), (0.2, 6), (0.4, 2), (0.1, 3)])
def test_a_mixln_alpha_that_makes_the_defaults_blocks_is_refused(alpha, n_layer):
    """Used or refused: floor(alpha * n_layer) is what the model reads; a value that gives the
    default's count changes nothing (0.25 x 6 and 0.3 x 6 both make one Post-LN block)."""
    with pytest.raises(BabyGPTError, match=rf"mixln_alpha {alpha:g} makes floor\({alpha:g} x {n_layer}\) = "
                                           rf"\d+ of the {n_layer} blocks Post-LN, as the default 0.25 does"):
        tiny_config(norm_placement="mixln", mixln_alpha=alpha, n_layer=n_layer)
    tiny_config(norm_placement="mixln", n_layer=n_layer)  # the default itself is fine
