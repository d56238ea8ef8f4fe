"""The GPT over the whole placement x norm_type grid, on tiny models."""

import dataclasses
import functools
import math
import typing

import pytest
import torch
from torch.testing import assert_close

from babygpt.errors import BabyGPTError
from babygpt.model import GPT, INITS, PLACEMENTS, Block, GPTConfig, KVCache
from babygpt.norms import NORMS, LayerNorm, NoNorm, Norm, NormOptions, RMSNorm, norm_class
from conftest import DROPOUT_PLACEMENTS, GRID, GRID_IDS, INIT_PLACEMENTS, NORMED_PLACEMENTS, tiny_config

# A norm that mixes positions (BatchNorm's training statistics span the whole sequence) is not
# causal by design, and test_placements.py shows exactly that instead.
CAUSAL_GRID = [(p, n) for p, n in GRID if not norm_class(NORMS[n]).mixes_positions]
CAUSAL_IDS = [f"{p}-{n}" for p, n in CAUSAL_GRID]


@pytest.mark.parametrize("placement,norm", GRID, ids=GRID_IDS)


def test_initial_loss_is_uniform_guess(placement, norm):
    """At init the logits are near zero, so the loss is close to ln(vocab_size)."""
    cfg = tiny_config(norm_placement=placement, norm_type=norm)
    model = GPT(cfg)
    x = torch.randint(cfg.vocab_size, (32, cfg.block_size))
    y = torch.randint(cfg.vocab_size, (32, cfg.block_size))
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1


@pytest.mark.parametrize("placement,norm", CAUSAL_GRID, ids=CAUSAL_IDS)


def test_causality(placement, norm):
    """Changing token t+1 never changes the logits at positions <= t."""
    cfg = tiny_config(norm_placement=placement, norm_type=norm)
    model = GPT(cfg).eval()
    x = torch.randint(cfg.vocab_size, (2, cfg.block_size))
    base = model(x)[0]
    for t in (0, 5, cfg.block_size - 2):
        x2 = x.clone()
        x2[:, t + 1] = (x2[:, t + 1] + 1) % cfg.vocab_size
        out = model(x2)[0]
        assert_close(out[:, : t + 1], base[:, : t + 1])
        assert not torch.allclose(out[:, t + 1], base[:, t + 1])  # the change itself is seen


@pytest.mark.slow  # 28 trainings of a few seconds: the full suite runs them, the fast loop does not
@pytest.mark.parametrize("placement,norm", GRID, ids=GRID_IDS)
def test_overfits_one_batch(placement, norm):
    # Post-LN with DyT and no final norm: tanh(0.5 x) ~ 0.5 x halves the small stream at each of the
    # 2 * n_layer norms, so the logits start tiny and 60 steps are not enough at the default alpha;
    # the same holds for Admin (Post-LN) and HybridNorm (whose FFN is Post-Norm and whose q, k, v pass
    # through DyTs too). Derf (erf(0.5 x) ~ 0.56 x) and Pre + post-main norm (two norms on the stream per
    # block) are in the same position.
    squash = norm_class(NORMS[norm]).squashes
    alpha = 1.0 if squash and placement in ("post", "admin", "hybrid", "prepost") else 0.5
    reads = norm_class(NORMS[norm]).reads  # (an alpha the norm does not read is refused)
    cfg = tiny_config(norm_placement=placement, norm_type=norm,
                      **{key: alpha for key in ("dyt_alpha_init", "derf_alpha_init") if key in reads})
    model = GPT(cfg)
    opt = model.configure_optimizers(weight_decay=0.0, learning_rate=1e-2)
    x = torch.randint(cfg.vocab_size, (4, cfg.block_size))
    y = torch.randint(cfg.vocab_size, (4, cfg.block_size))
    first = model(x, y)[1].item()
    for _ in range(60):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.after_step()  # nGPT back on the sphere; nothing for the others
    assert loss.item() < 0.3 * first, (first, loss.item())


@pytest.mark.parametrize("placement", ["pre", "post"])


def test_param_counts_grow_with_norm_parameters(placement):
    # (without norms every placement that only moves them is Pre-LN's model, and is refused as itself)
    counts = {n: GPT(tiny_config(norm_placement="pre" if n == "none" else placement, norm_type=n)).num_params()
              for n in NORMS}
    assert counts["none"] < counts["rmsnorm"] < counts["layernorm"]
    d, n_norms = 32, 2 * 2 + (1 if placement == "pre" else 0)  # ln1, ln2 per block (+ ln_f for pre)
    assert counts["rmsnorm"] - counts["none"] == n_norms * d  # one gain vector per norm
    assert counts["layernorm"] - counts["none"] == n_norms * 2 * d  # gain + bias


def test_num_params_counts_tied_embedding_once():
    model = GPT(tiny_config())
    assert model.lm_head.weight is model.tok_emb.weight
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.num_params() == sum(unique.values())
    assert model.num_params() < sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))


def test_postln_layernorm_block_outputs_are_normalized():
    cfg = tiny_config(norm_placement="post", norm_type="layernorm")
    model = GPT(cfg)
    x = model.tok_emb(torch.randint(cfg.vocab_size, (3, cfg.block_size))) + model.pos_emb.weight
    for block in model.blocks:
        x = block(x)  # (B, T, C)
        assert_close(x.mean(-1), torch.zeros(x.shape[:2]), atol=1e-5, rtol=0)
        assert_close(x.var(-1, correction=0), torch.ones(x.shape[:2]), atol=1e-3, rtol=0)


@pytest.mark.parametrize("placement,expected",
                         [("pre", RMSNorm), ("post", NoNorm), ("sandwich", RMSNorm), ("deepnorm", NoNorm),
                          ("mixln", RMSNorm), ("output", RMSNorm), ("hybrid", RMSNorm), ("hybrid_star", RMSNorm),
                          ("admin", NoNorm), ("ngpt", NoNorm), ("prepost", NoNorm), ("parallel", RMSNorm)])


def test_final_norm_auto(placement, expected):
    norm = "rmsnorm" if placement in NORMED_PLACEMENTS else "none"  # nGPT has no norm layers
    assert isinstance(GPT(tiny_config(norm_placement=placement, norm_type=norm)).ln_f, expected)


@pytest.mark.parametrize("final_norm,expected", [(True, LayerNorm), (False, NoNorm)])


def test_final_norm_forced(final_norm, expected):
    cfg = tiny_config(norm_placement="post", norm_type="layernorm", final_norm=final_norm)
    assert isinstance(GPT(cfg).ln_f, expected)
    for placement in NORMED_PLACEMENTS:
        cfg = tiny_config(norm_placement=placement, norm_type="layernorm", final_norm=final_norm)
        assert isinstance(GPT(cfg).ln_f, expected)


@pytest.mark.parametrize("placement", PLACEMENTS)


def test_block_residual_paths(placement):
    """The Block computes exactly the documented formula for its placement (Mix-LN's block 0, of 4:
    Post-LN; HybridNorm*'s block 0: Pre-LN around both sublayers)."""
    norm = "layernorm" if placement in NORMED_PLACEMENTS else "none"
    cfg = tiny_config(norm_placement=placement, norm_type=norm, n_layer=4)
    block = Block(cfg)
    for p in block.parameters():  # random gains and biases, so a swapped norm cannot pass
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.3)
    x = torch.randn(2, 5, cfg.n_embd)
    a = (2 * cfg.n_layer) ** 0.25  # DeepNorm's residual weight
    if placement == "pre":
        h = x + block.sa(block.ln1(x))
        expected = h + block.ffwd(block.ln2(h))
    elif placement in ("post", "mixln"):
        h = block.ln1(x + block.sa(x))
        expected = block.ln2(h + block.ffwd(h))
    elif placement == "output":
        h = x + block.ln1(block.sa(x))
        expected = h + block.ln2(block.ffwd(h))
    elif placement == "sandwich":
        h = x + block.ln1_out(block.sa(block.ln1(x)))
        expected = h + block.ln2_out(block.ffwd(block.ln2(h)))
    elif placement == "hybrid":  # ln1 is the identity; sa normalizes q, k, v itself
        h = block.ln2(x + block.sa(x))
        expected = h + block.ffwd(h)
    elif placement == "hybrid_star":
        h = x + block.sa(block.ln1(x))
        expected = h + block.ffwd(block.ln2(h))
    elif placement == "ngpt":  # on the sphere: h <- |h + |alpha| (|f(h)| - h)|, |x| = x / ||x||
        unit = lambda t: t / t.norm(dim=-1, keepdim=True)  # noqa: E731
        x = unit(x)
        h = unit(x + block.alpha_attn.value().abs() * (unit(block.sa(x)) - x))
        expected = unit(h + block.alpha_mlp.value().abs() * (unit(block.ffwd(h)) - h))
    elif placement == "prepost":  # norm(x + f(norm(x))): a pre and a post-main norm per sublayer
        h = block.ln1_post(x + block.sa(block.ln1(x)))
        expected = block.ln2_post(h + block.ffwd(block.ln2(h)))
    elif placement == "parallel":  # both sublayers read x, one add
        expected = x + block.sa(block.ln1(x)) + block.ffwd(block.ln2(x))
    elif placement == "admin":  # omega: a vector per sublayer (random here, like the gains)
        h = block.ln1(block.omega_attn.weight * x + block.sa(x))
        expected = block.ln2(block.omega_ffwd.weight * h + block.ffwd(h))
    else:  # deepnorm
        h = block.ln1(a * x + block.sa(x))
        expected = block.ln2(a * h + block.ffwd(h))
    assert_close(block(x), expected)


class _Zeros(torch.nn.Module):
    """Stands in for a sublayer: writes nothing, so the block's output is x plus the other branch."""

    def forward(self, x, *args):
        return torch.zeros_like(x)


@pytest.mark.parametrize("placement", ["pre", "sandwich"])


def test_residual_dropout_keeps_the_branch_unbiased(placement):
    """Averaged over training-mode forwards, what the FFN branch adds to the stream equals what it
    adds in eval. For sandwich this needs the dropout after ln2_out: dropout before a norm is
    rescaled by it, and the branch came out at ~0.89 of its eval value at p = 0.2."""
    cfg = tiny_config(norm_placement=placement, norm_type="rmsnorm", dropout=0.2)
    block = Block(cfg)
    block.sa = _Zeros()  # no attention branch: x + 0 reaches the FFN unchanged
    x = torch.randn(2, 5, cfg.n_embd)
    with torch.no_grad():
        expected = block.eval()(x) - x  # (B, T, C): the branch in eval
        block.train()
        mean = torch.stack([block(x) - x for _ in range(200)]).mean(0)
        assert not torch.equal(block(x) - x, expected)  # dropout is on in training
    ratio = (mean.norm() / expected.norm()).item()
    assert abs(ratio - 1) < 0.03, ratio
    assert torch.nn.functional.cosine_similarity(mean.flatten(), expected.flatten(), dim=0) > 0.98


@pytest.mark.parametrize("placement", DROPOUT_PLACEMENTS)


def test_residual_dropout_acts_on_what_each_branch_writes(placement):
    """The Block's dropout receives each branch's last output (the projection, or the output
    norm for sandwich), and what it returns is what reaches the add."""
    cfg = tiny_config(norm_placement=placement, norm_type="layernorm", dropout=0.3)
    block = Block(cfg).train()
    seen = {}

    def hook(name):
        def record(module, args, output):
            seen.setdefault(name, []).append((args[0], output))
        return record

    last = {"sandwich": ("ln1_out", "ln2_out"), "output": ("ln1", "ln2")}.get(placement, ("sa", "ffwd"))
    for name in (*last, "drop", "ln1", "ln2"):
        getattr(block, name).register_forward_hook(hook(name))
    x = torch.randn(2, 5, cfg.n_embd)
    out = block(x)
    (d1_in, d1_out), (d2_in, d2_out) = seen["drop"]
    assert torch.equal(d1_in, seen[last[0]][0][1]) and torch.equal(d2_in, seen[last[1]][0][1])
    assert not torch.equal(d1_out, d1_in)  # it drops (p = 0.3 over 320 values)
    kind = block.placement.name  # a Mix-LN block is "pre" or "post"
    if kind in ("pre", "sandwich", "output", "hybrid_first"):
        h = x + d1_out
        assert_close(out, h + d2_out)
    elif kind == "hybrid":  # the FFN adds to the normalized stream
        assert_close(seen["ln2"][0][0], x + d1_out)
        assert_close(out, seen["ln2"][0][1] + d2_out)
    elif kind == "prepost":  # the post-main norms sit after each add
        h = block.ln1_post(x + d1_out)
        assert_close(seen["ln2"][0][0], h)
        assert_close(out, block.ln2_post(h + d2_out))
    elif kind == "parallel":  # both branches read x and are added at once
        assert_close(seen["ln2"][0][0], x)
        assert_close(out, x + d1_out + d2_out)
    elif kind == "admin":
        ln1_in, h = seen["ln1"][0]
        assert_close(ln1_in, block.omega_attn.weight * x + d1_out)
        assert_close(seen["ln2"][0][0], block.omega_ffwd.weight * h + d2_out)
    else:
        a = block.residual_scale
        ln1_in, h = seen["ln1"][0]
        assert_close(ln1_in, a * x + d1_out)
        assert_close(seen["ln2"][0][0], a * h + d2_out)
        assert torch.equal(out, seen["ln2"][0][1])


def test_dropout_modules_and_state_dict_keys():
    """Residual dropout moved from the sublayers to the Block; nn.Dropout has no state, so the
    checkpoint keys are those of before."""
    cfg = tiny_config(dropout=0.1)
    model = GPT(cfg)
    dropouts = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert dropouts == {"drop", "blocks.0.drop", "blocks.1.drop"}
    assert model.blocks[0].sa.dropout == 0.1  # attention-probability dropout stays in attention
    keys = set(model.state_dict())
    assert {"blocks.0.sa.proj.weight", "blocks.0.ffwd.proj.weight", "blocks.0.ln1.weight"} <= keys
    assert not any("drop" in k for k in keys)


def test_attention_matches_manual_causal_softmax():
    cfg = tiny_config()
    sa = GPT(cfg).blocks[0].sa
    x = torch.randn(2, 6, cfg.n_embd)
    B, T, C, H = 2, 6, cfg.n_embd, cfg.n_head
    q, k, v = sa.qkv(x).split(C, dim=2)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
    att = q @ k.transpose(-2, -1) / math.sqrt(C // H)
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    assert_close(sa(x), sa.proj(y))


def test_gpt2_init_scales():
    cfg = tiny_config(n_layer=8, n_embd=64, n_head=4)
    model = GPT(cfg)
    resid = torch.cat([torch.cat([b.sa.proj.weight.flatten(), b.ffwd.proj.weight.flatten()])
                       for b in model.blocks])
    assert abs(resid.std().item() - 0.02 / math.sqrt(2 * cfg.n_layer)) < 5e-4
    assert abs(model.blocks[0].ffwd.fc.weight.std().item() - 0.02) < 1e-3
    assert torch.equal(model.blocks[0].sa.qkv.bias, torch.zeros_like(model.blocks[0].sa.qkv.bias))


def expected_weight_stds(init: str, placement: str, C: int, N: int) -> dict[str, float]:
    """The std each weight of a block should have, from the init's definition (babygpt/init.py)."""
    beta = (8 * N) ** -0.25 if placement == "deepnorm" else 1.0
    if init == "gpt2":
        resid = 0.02 * beta if placement == "deepnorm" else 0.02 / math.sqrt(2 * N)
        return {"q": 0.02, "k": 0.02, "v": 0.02 * beta, "o": resid, "fc": 0.02 * beta, "proj": resid}
    xavier = lambda fan_in, fan_out: math.sqrt(2 / (fan_in + fan_out))  # noqa: E731, for uniform and normal
    return {"q": xavier(C, C), "k": xavier(C, C), "v": beta * xavier(C, C), "o": beta * xavier(C, C),
            "fc": beta * xavier(C, 4 * C), "proj": beta * xavier(4 * C, C)}


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("placement", INIT_PLACEMENTS)
def test_init_weight_statistics(init, placement):
    """Each weight's std as its init defines it, zero biases, and the embedding stream's RMS:
    about 0.03 under GPT-2 init, about 1 under Xavier (sqrt(C) scaling)."""
    C, N = 96, 6
    model = GPT(tiny_config(n_embd=C, n_head=4, n_layer=N, norm_placement=placement, init=init))
    expected = expected_weight_stds(init, placement, C, N)
    for block in model.blocks:
        w = block.sa.qkv.weight
        weights = {"q": w[:C], "k": w[C:2 * C], "v": w[2 * C:], "o": block.sa.proj.weight,
                   "fc": block.ffwd.fc.weight, "proj": block.ffwd.proj.weight}
        measured = torch.tensor([weights[k].std().item() for k in expected])
        assert_close(measured, torch.tensor(list(expected.values())), rtol=0.05, atol=0)
        for linear in (block.sa.qkv, block.sa.proj, block.ffwd.fc, block.ffwd.proj):
            assert torch.equal(linear.bias, torch.zeros_like(linear.bias))
    idx = torch.randint(29, (8, 16))
    stream = model.tok_emb(idx) * model.emb_scale + model.pos_emb(torch.arange(16))  # (B, T, C)
    rms = stream.pow(2).mean().sqrt()
    want = math.sqrt(1 + 1 / C) if init == "xavier" else 0.02 * math.sqrt(2)
    assert_close(rms, torch.tensor(want), rtol=0.1, atol=0)
    assert model.emb_scale == (math.sqrt(C) if init == "xavier" else 1.0)


def test_xavier_init_is_uniform_and_deepnorm_normal():
    """Xavier-uniform weights stay inside the bound sqrt(6 / (fan_in + fan_out)); DeepNorm's Xavier-normal
    ones (the paper's pseudocode) do not."""
    C = 64
    fc = GPT(tiny_config(n_embd=C, n_layer=2, init="xavier")).blocks[0].ffwd.fc.weight
    assert fc.abs().max() <= math.sqrt(6 / (5 * C)) and fc.abs().max() > 0.95 * math.sqrt(6 / (5 * C))
    q = GPT(tiny_config(n_embd=C, n_layer=2, init="xavier", norm_placement="deepnorm")).blocks[0].sa.qkv.weight[:C]
    assert q.abs().max() > math.sqrt(6 / (2 * C))


def test_init_choice_is_checked():
    with pytest.raises(BabyGPTError, match="unknown init 'xavir'.*did you mean 'xavier'"):
        tiny_config(init="xavir")


def part_stds(linear: str, depth_factor: bool, C: int, N: int) -> dict[str, float]:
    """The std of each weight for one choice of the Linear part and the depth factor (pre placement)."""
    xavier = lambda fan_in, fan_out: math.sqrt(2 / (fan_in + fan_out))  # noqa: E731
    base = ({"q": 0.02, "k": 0.02, "v": 0.02, "o": 0.02, "fc": 0.02, "proj": 0.02} if linear == "normal" else
            {"q": xavier(C, C), "k": xavier(C, C), "v": xavier(C, C), "o": xavier(C, C), "fc": xavier(C, 4 * C),
             "proj": xavier(4 * C, C)})
    factor = 1 / math.sqrt(2 * N) if depth_factor else 1.0
    return {**base, "o": base["o"] * factor, "proj": base["proj"] * factor}


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("linear", [None, "normal", "xavier"])
@pytest.mark.parametrize("embedding", [None, "small", "unit"])
@pytest.mark.parametrize("depth_factor", [None, False, True])
def test_each_init_part_is_set_on_its_own(init, linear, embedding, depth_factor):
    """Every combination of the three parts over either preset: each weight's std, the stream's RMS
    and the embedding scale follow the parts, unset parts the preset."""
    C, N = 96, 6
    model = GPT(tiny_config(n_embd=C, n_head=4, n_layer=N, init=init, init_linear=linear, init_embedding=embedding,
                            init_depth_factor=depth_factor))
    want_linear = linear or ("xavier" if init == "xavier" else "normal")
    want_embedding = embedding or ("unit" if init == "xavier" else "small")
    want_depth = (init == "gpt2") if depth_factor is None else depth_factor
    expected = part_stds(want_linear, want_depth, C, N)
    block = model.blocks[-1]
    w = block.sa.qkv.weight
    weights = {"q": w[:C], "k": w[C:2 * C], "v": w[2 * C:], "o": block.sa.proj.weight,
               "fc": block.ffwd.fc.weight, "proj": block.ffwd.proj.weight}
    assert_close(torch.tensor([weights[k].std().item() for k in expected]), torch.tensor(list(expected.values())),
                 rtol=0.05, atol=0)
    idx = torch.randint(29, (8, 16))
    rms = (model.tok_emb(idx) * model.emb_scale + model.pos_emb(torch.arange(16))).pow(2).mean().sqrt()
    assert_close(rms, torch.tensor(math.sqrt(1 + 1 / C) if want_embedding == "unit" else 0.02 * math.sqrt(2)),
                 rtol=0.1, atol=0)
    assert model.emb_scale == (math.sqrt(C) if want_embedding == "unit" else 1.0)


def test_a_preset_written_as_its_parts_is_the_preset_bit_for_bit():
    for init, parts in (("gpt2", {"init_linear": "normal", "init_embedding": "small", "init_depth_factor": True}),
                        ("xavier", {"init_linear": "xavier", "init_embedding": "unit", "init_depth_factor": False})):
        torch.manual_seed(0)
        preset = GPT(tiny_config(init=init)).state_dict()
        torch.manual_seed(0)
        spelled = GPT(tiny_config(init=init, **parts)).state_dict()
        assert all(torch.equal(preset[k], spelled[k]) for k in preset)


def test_init_parts_are_checked():
    with pytest.raises(BabyGPTError) as e:
        tiny_config(init_linear="uniform", init_embedding="big", init_depth_factor=True, norm_placement="deepnorm")
    joined = "\n".join(e.value.problems)
    assert "unknown init_linear 'uniform'" in joined and "unknown init_embedding 'big'" in joined
    assert "init_depth_factor does not apply to norm_placement deepnorm" in joined


@pytest.mark.parametrize("qk_norm", [False, True])
def test_attention_logits_are_what_the_attention_softmaxes(qk_norm):
    cfg = tiny_config(qk_norm=qk_norm)
    sa = GPT(cfg).blocks[0].sa
    x = torch.randn(2, 6, cfg.n_embd)
    logits = sa.attention_logits(x)  # (B, H, T, T)
    assert logits.shape == (2, cfg.n_head, 6, 6) and torch.isneginf(logits[..., 0, 1:]).all()
    _, _, v = sa.heads(x)
    y = (logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, cfg.n_embd)
    assert_close(sa(x), sa.proj(y))


def test_generate_greedy_is_deterministic_and_shapes():
    cfg = tiny_config()
    model = GPT(cfg).eval()
    idx = torch.randint(cfg.vocab_size, (2, 3))
    a = model.generate(idx, 40, temperature=0)  # 43 > block_size: the context window slides
    b = model.generate(idx, 40, temperature=0)
    assert a.shape == (2, 43)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :3], idx)
    # greedy equals the argmax of a full forward pass over the (cropped) context
    ctx = a[:, -1 - cfg.block_size:-1]
    assert torch.equal(a[:, -1], model(ctx)[0][:, -1].argmax(-1))


def test_generate_sampling_respects_top_k_and_seed():
    cfg = tiny_config()
    model = GPT(cfg).eval()
    idx = torch.zeros(1, 1, dtype=torch.long)
    run = lambda: model.generate(idx, 20, temperature=1.0, top_k=1,  # noqa: E731
                                 generator=torch.Generator().manual_seed(3))
    assert torch.equal(run(), model.generate(idx, 20, temperature=0))  # top_k=1 is greedy
    sample = lambda s: model.generate(idx, 30, 1.5, None, torch.Generator().manual_seed(s))  # noqa: E731
    assert torch.equal(sample(1), sample(1))
    with pytest.raises(ValueError, match="top_k"):
        model.generate(idx, 1, top_k=cfg.vocab_size + 1)


@pytest.mark.parametrize("field,value", [
    ("n_embd", 33), ("n_layer", 0), ("n_head", -1), ("block_size", 0), ("vocab_size", 0),
    ("norm_type", "rms"), ("norm_placement", "middle"), ("dropout", 1.0), ("norm_eps", 0.0),
    ("dyt_alpha_init", 0.0),
])


def test_invalid_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value})


def test_config_problems_are_reported_together():
    with pytest.raises(BabyGPTError) as err:
        GPTConfig(n_embd=33, dropout=1.5, norm_eps=-1.0, norm_type="none", qk_norm=True)
    assert isinstance(err.value, ValueError)
    assert err.value.problems == [
        "n_embd (33) must be divisible by n_head (4)",
        "dropout must be in [0, 1), got 1.5",
        "norm_eps must be positive, got -1.0",
        "qk_norm cannot be used with norm_type 'none': the query/key norms would be the identity; "
        "choose another norm_type or set qk_norm false",
        "norm_eps is read only with norm_type layernorm or rmsnorm or rmsnorm_noparam or scalenorm or batchnorm, "
        "not with norm_type none; leave norm_eps at its default (1e-05)",
    ]
    assert GPTConfig().problems() == []


def test_config_maps_its_fields_to_norm_options():
    assert GPTConfig(norm_eps=1e-6, bias=False).norm_options() == NormOptions(eps=1e-6, bias=False)
    assert GPTConfig(norm_type="dyt", dyt_alpha_init=0.8).norm_options() == NormOptions(alpha_init=0.8)


def test_config_fields_have_types_and_help():
    """config.py reads each field's type (with typing.get_type_hints) and help text from here."""
    hints = typing.get_type_hints(GPTConfig)
    assert hints["final_norm"] == typing.Optional[bool] and hints["norm_type"] is str
    assert hints["n_layer"] is int and hints["dropout"] is float and hints["qk_norm"] is bool
    for f in dataclasses.fields(GPTConfig):
        assert f.metadata["help"], f.name
        assert f.name in hints


def test_a_registered_partial_fixes_its_keywords_in_the_model(monkeypatch):
    """functools.partial(LayerNorm, bias=False) gives LayerNorms without beta even though
    GPTConfig.bias (which also reaches the norms) is True."""
    monkeypatch.setitem(NORMS, "layernorm_nobias", functools.partial(LayerNorm, bias=False))
    cfg = tiny_config(norm_type="layernorm_nobias", bias=True, qk_norm=True, final_norm=True)
    model = GPT(cfg)
    lns = [m for m in model.modules() if isinstance(m, LayerNorm)]
    assert len(lns) == 2 * 2 + 2 * 2 + 1  # ln1, ln2, q_norm, k_norm per block, and ln_f
    assert all(m.bias is None for m in lns)
    assert model.blocks[0].sa.qkv.bias is not None  # the Linear layers still follow cfg.bias
    model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)  # norm params recognised as Norm's


def test_unknown_norm_type_lists_valid_names():
    with pytest.raises(ValueError) as err:
        tiny_config(norm_type="batchnorm2")
    for name in NORMS:
        assert name in str(err.value)


def test_optimizer_takes_adam_eps():
    opt = GPT(tiny_config()).configure_optimizers(weight_decay=0.1, learning_rate=1e-3, eps=1e-15)
    assert [g["eps"] for g in opt.param_groups] == [1e-15, 1e-15]


def test_optimizer_groups():
    model = GPT(tiny_config(norm_type="layernorm"))
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert "tok_emb.weight" in decayed and "blocks.0.sa.qkv.weight" in decayed
    assert "blocks.0.ln1.weight" in not_decayed and "blocks.0.ln1.bias" in not_decayed
    assert "blocks.0.ffwd.fc.bias" in not_decayed and "ln_f.weight" in not_decayed
    assert decayed.isdisjoint(not_decayed)
    assert decayed | not_decayed == set(names.values())


def test_optimizer_groups_catch_a_matrix_shaped_norm_parameter(monkeypatch):
    """A norm with a 2-D parameter would fall into the decayed group by the dim rule: refused."""
    from babygpt import norms

    class MatrixNorm(Norm):
        def __init__(self, dim, options=NormOptions(), **overrides):
            super().__init__()
            self.mix = torch.nn.Parameter(torch.eye(dim))

        def forward(self, x):
            return x @ self.mix

    monkeypatch.setitem(norms.NORMS, "matrix", MatrixNorm)
    model = GPT(tiny_config(norm_type="matrix"))
    with pytest.raises(AssertionError, match="non-decayed"):
        model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)


def test_tiny_temperature_is_greedy():
    cfg = tiny_config()
    model = GPT(cfg).eval()
    idx = torch.zeros(1, 1, dtype=torch.long)
    assert torch.equal(model.generate(idx, 20, temperature=1e-45), model.generate(idx, 20, temperature=0))
    with pytest.raises(ValueError, match="temperature"):
        model.generate(idx, 1, temperature=float("nan"))


def test_sequence_longer_than_block_size_is_rejected():
    cfg = tiny_config()
    with pytest.raises(ValueError, match="block_size"):
        GPT(cfg)(torch.zeros(1, cfg.block_size + 1, dtype=torch.long))


def test_gptconfig_defaults_are_valid():
    assert GPTConfig().use_final_norm


# ------------------------------------------------------------------ KV cache


@pytest.mark.parametrize("placement,norm", GRID, ids=GRID_IDS)


def test_kv_cache_logits_match_full_forward(placement, norm):
    """Prefill a prompt, then feed one token at a time: every step's logits equal those of a
    full forward pass over the same positions."""
    cfg = tiny_config(norm_placement=placement, norm_type=norm)
    model = GPT(cfg).eval()
    x = torch.randint(cfg.vocab_size, (3, cfg.block_size))
    cache = KVCache(cfg, 3, "cpu", torch.float32)
    steps = [model(x[:, :5], cache=cache)[0]]
    steps += [model(x[:, t:t + 1], cache=cache)[0] for t in range(5, cfg.block_size)]
    assert_close(torch.cat(steps, dim=1), model(x)[0])
    assert cache.length == cfg.block_size


@pytest.mark.parametrize("prompt_len,new", [(3, 10), (3, 60), (40, 30)], ids=["short", "past-block", "long-prompt"])


@pytest.mark.slow
def test_kv_cache_sampling_equals_full_recomputation(prompt_len, new):
    """Greedy and seeded sampling give identical tokens with and without the cache, including
    prompts longer than block_size and generation far past it (the window jumps)."""
    cfg = tiny_config()
    model = GPT(cfg).eval()
    idx = torch.randint(cfg.vocab_size, (2, prompt_len))
    assert torch.equal(model.generate(idx, new, temperature=0, use_cache=True),
                       model.generate(idx, new, temperature=0, use_cache=False))
    sample = lambda cached: model.generate(idx, new, 1.0, 5, torch.Generator().manual_seed(7), cached)  # noqa: E731
    assert torch.equal(sample(True), sample(False))


def test_context_window_jumps_keep_most_of_the_block():
    model = GPT(tiny_config(block_size=16))
    starts = [model.context_start(n) for n in range(1, 60)]
    assert starts[:16] == [0] * 16  # the whole sequence while it fits
    for n, s in zip(range(1, 60), starts):
        assert 0 <= n - s <= 16 and (n <= 16 or n - s > 16 - 2)  # jumps of block_size // 8 = 2
    assert starts == sorted(starts)


def test_kv_cache_rejects_more_than_one_token_after_prefill():
    cfg = tiny_config()
    model = GPT(cfg).eval()
    cache = KVCache(cfg, 1, "cpu", torch.float32)
    model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="one token"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=cache)


def test_generation_runs_in_eval_mode_and_puts_the_mode_back():
    """A model left in training mode (as GPT() is built) samples as in eval mode: BatchNorm on its
    running statistics (so the cached steps equal recomputation, at batch 1 too) and no dropout; the
    mode is restored afterwards."""
    torch.manual_seed(0)
    model = GPT(tiny_config(norm_type="batchnorm", dropout=0.5))
    assert model.training
    idx = torch.zeros(1, 3, dtype=torch.long)
    cached = model.generate(idx, 20, temperature=0)
    assert model.training  # put back
    model.eval()
    assert torch.equal(cached, model.generate(idx, 20, temperature=0, use_cache=False))
