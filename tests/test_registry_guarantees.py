"""Two guarantees that every registered norm placement and every registered norm type must keep,
read from the registries (``placements.PLACEMENTS``, ``norms.NORMS``) so that a new entry is tested
without a test edit:

(a) greedy sampling with the KV cache gives the same tokens as recomputing the whole context
    window at every step, also past block_size (where the window jumps and the cache is rebuilt),
    and each step's logits agree within float32 rounding;
(b) K training steps in one go end with the same weights (and optimizer state and logged losses),
    bit for bit, as K/2 steps, a checkpoint and a resume to K.

Which placement x norm_type pairs exist is the library's own decision: every pair is built, and a
pair the config validation refuses is skipped with the library's message as the reason (never a
hand-written list of exceptions). The library declares no placement or norm that cannot sample
with the KV cache (BatchNorm, ``mixes_positions``, mixes positions in training only; sampling
runs in eval mode, where it normalizes each position with its running statistics), so the cache is
checked for every pair the config accepts. The same checks run on the switches that change
attention (QK-norm and its scales and scope, RoPE and its order and base, the attention soft-cap,
split q/k/v), for the default placement with every norm type and for every placement with RoPE.
"""

import itertools
import json
import os

import pytest
import torch
from torch.testing import assert_close

from babygpt.config import load_config
from babygpt.errors import BabyGPTError
from babygpt.model import GPT, GPTConfig
from babygpt.norms import NORMS
from babygpt.placements import DEFAULT as DEFAULT_PLACEMENT, PLACEMENTS
from babygpt.trainer import WALL_CLOCK_FIELDS, train
from conftest import DEFAULT_MODEL, TINY_TRAIN_ARGS, once, tiny_config

# Mix-LN makes floor(mixln_alpha * n_layer) blocks Post-LN: with the default 0.25 a 2-layer model
# would have none and be plain Pre-LN; 0.5 gives it one of each. Set wherever the library accepts it
# (``with_depth_options``): the placements that do not read it may refuse it.
DEPTH_OPTIONS = dict(mixln_alpha=0.5)


def with_depth_options(build, overrides):
    """``build(overrides)`` with DEPTH_OPTIONS added where the library accepts them; without them where
    it refuses them, so that a refused pair is skipped with the message of the pair itself."""
    try:
        return build({**DEPTH_OPTIONS, **overrides})
    except BabyGPTError:
        return build(overrides)


def params(pairs, valid):
    """pytest params for ``pairs`` of (placement, norm_type, overrides, id); a pair the library
    refuses (``valid`` raises BabyGPTError) is skipped with the library's own message."""
    out = []
    for placement, norm, overrides, ident in pairs:
        try:
            valid(placement, norm, overrides)
            marks = ()
        except BabyGPTError as e:
            marks = pytest.mark.skip(reason=f"refused by the library: {'; '.join(e.problems)}")
        out.append(pytest.param(placement, norm, overrides, id=ident, marks=marks))
    return out


# ------------------------------------------------------------------ (a) KV cache == recomputation

def model_config(placement, norm, overrides):
    """The tiny model (conftest.tiny_config: 2 layers, width 32, block_size 16, 29 tokens) of one
    configuration; GPTConfig's validation raises BabyGPTError for a combination it refuses."""
    return with_depth_options(lambda o: tiny_config(norm_placement=placement, norm_type=norm, **o), overrides)


GRID = params(((p, n, {}, f"{p}-{n}") for p, n in itertools.product(PLACEMENTS, NORMS)), model_config)

# The GPTConfig keys that change what attention computes (dropout changes nothing in eval mode, and
# n_head is the tiny model's 2 everywhere). QK-norm normalizes with norm_type, so its variants run with
# every norm type; the others with one.
QK_VARIANTS = {
    "qk_norm": dict(qk_norm=True),
    "qk_norm-learned": dict(qk_norm=True, qk_scale="learned"),
    "qk_norm-per_head": dict(qk_norm=True, qk_scale="per_head"),
    "qk_norm-width": dict(qk_norm=True, qk_norm_scope="width"),
    "rope-qk_norm-rope_norm": dict(pos="rope", qk_norm=True, qk_norm_order="rope_norm"),
    # today's open-model block (QK-norm before RoPE), with the switches outside attention that touch
    # the stream and the logits
    "modern": dict(pos="rope", qk_norm=True, split_qkv=True, attn_softcap=20.0, mlp="swiglu",
                   residual_lambdas=True, logit_softcap=3.0),
}
ATTENTION_VARIANTS = {
    "rope": dict(pos="rope"),
    "rope-base100": dict(pos="rope", rope_base=100.0),
    "rope-qk_norm-width-rope_norm": dict(pos="rope", qk_norm=True, qk_norm_scope="width", qk_norm_order="rope_norm"),
    "attn_softcap": dict(attn_softcap=2.0),
    "split_qkv": dict(split_qkv=True),
}


def accepted_norm(placement, overrides) -> str:
    """The norm type to pair with ``placement`` where one is enough: GPTConfig's default norm_type if
    the library accepts the pair, else the first registered one it accepts (nGPT: none), else the
    default (then the pair is skipped with the library's reason)."""
    default = GPTConfig.__dataclass_fields__["norm_type"].default
    for norm in sorted(NORMS, key=lambda n: n != default):
        try:
            model_config(placement, norm, overrides)
            return norm
        except BabyGPTError:
            pass
    return default


def one_norm(placement, name, overrides):
    norm = accepted_norm(placement, overrides)
    return placement, norm, overrides, f"{placement}-{norm}-{name}"


def fast_with_the_default_norm_only(grid):
    """``grid`` with its cases of other norm types marked slow: the fast loop runs each variant once,
    with GPTConfig's default norm type; the whole suite runs them all."""
    return [p if p.values[1] == DEFAULT_MODEL.norm_type
            else pytest.param(*p.values, id=p.id, marks=(*p.marks, pytest.mark.slow)) for p in grid]


DEFAULT_PLACEMENT_VARIANTS = fast_with_the_default_norm_only(params(
    [(DEFAULT_PLACEMENT, n, v, f"{DEFAULT_PLACEMENT}-{n}-{name}")
     for (name, v), n in itertools.product(QK_VARIANTS.items(), NORMS)]
    + [one_norm(DEFAULT_PLACEMENT, name, v) for name, v in ATTENTION_VARIANTS.items()], model_config))
# Every placement with RoPE (the cached keys are stored rotated, and the window restarts at
# position 0 after each jump), with one norm type it accepts.
ROPE_GRID = params([one_norm(p, "rope", dict(pos="rope")) for p in PLACEMENTS], model_config)


def random_model(cfg, seed: int = 0) -> GPT:
    """A model of ``cfg`` in eval mode whose every parameter is drawn at random at unit scale: matrices
    N(0, 1/fan_in), every vector and scalar (gains, biases, alphas, gates, scales) jittered around its
    init, so that every norm's gain and every gate shows in the output. (Under the init's small
    weights most greedy samples are one repeated token; at unit scale more of them vary, while the
    models without norms stay well-conditioned enough for float32 rounding to stay ~1e-6. Some
    samples still settle on one token: the logits compared at every step are the finer check.)
    Then, generically: a placement that keeps its matrices normalized puts them back
    (GPT.after_step), norms with running statistics see a few training batches, and a placement
    that profiles its init (Admin) does."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5)
            else:
                p.mul_(1 + 0.3 * torch.randn(p.shape, generator=g)).add_(0.1 * torch.randn(p.shape, generator=g))
        model.after_step()
        model.train()
        for _ in range(2):  # BatchNorm's running mean and variance away from (0, 1)
            model(torch.randint(cfg.vocab_size, (4, cfg.block_size), generator=g))
    model.eval()
    model.profile_init(torch.randint(cfg.vocab_size, (4, cfg.block_size), generator=g))
    return model


def greedy(model: GPT, prompt: torch.Tensor, new: int, use_cache: bool):
    """(tokens (B, T + new), each step's next-token logits (B, new, V), what each step's forward
    read: (its input length, the cache's length after it, or None without a cache))."""
    logits, calls = [], []

    def record(module, args, kwargs, output):
        cache = kwargs.get("cache")
        calls.append((args[0].shape[1], None if cache is None else cache.length))
        logits.append(output[0][:, -1, :].float().clone())

    handle = model.register_forward_hook(record, with_kwargs=True)
    try:
        tokens = model.generate(prompt, new, temperature=0, use_cache=use_cache)
    finally:
        handle.remove()
    return tokens, torch.stack(logits, dim=1), calls


PROMPT_LEN, NEW = 3, 26  # up to 28 tokens read: past block_size 16 the window jumps 6 times (by 2)


def assert_cache_is_recomputation(cfg) -> None:
    model = random_model(cfg)
    prompt = torch.randint(cfg.vocab_size, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(2))
    cached, cached_logits, cached_calls = greedy(model, prompt, NEW, use_cache=True)
    full, full_logits, full_calls = greedy(model, prompt, NEW, use_cache=False)
    assert len(cached_calls) == len(full_calls) == NEW
    # The recomputation reads the whole window, at most block_size tokens, and goes past block_size.
    windows = [length for length, _ in full_calls]
    assert max(windows) == cfg.block_size and PROMPT_LEN + NEW > cfg.block_size
    # The cache was really used (one-token steps), and after every step it holds exactly the window
    # the recomputation read at that step: rebuilt where the window jumps, never longer.
    assert any(length == 1 for length, _ in cached_calls)
    assert [held for _, held in cached_calls] == windows
    for step, ((length, _), window) in enumerate(zip(cached_calls, windows)):
        assert length == 1 or length == window, (step, length, window)
    # Logits step by step (each path fed its own tokens, which are the same while the samples agree).
    top2 = full_logits.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).min().item()
    assert_close(cached_logits, full_logits, rtol=1e-5, atol=1e-5,
                 msg=lambda m: f"{m}\n(smallest top-1/top-2 logit gap of the recomputation: {margin:.2e})")
    assert torch.equal(cached, full), f"greedy tokens differ (smallest top-1/top-2 gap {margin:.2e}):\n{cached}\n{full}"


@pytest.mark.parametrize("placement,norm,overrides", GRID)
def test_kv_cache_greedy_samples_and_logits_equal_recomputation(placement, norm, overrides):
    assert_cache_is_recomputation(model_config(placement, norm, overrides))


@pytest.mark.parametrize("placement,norm,overrides", DEFAULT_PLACEMENT_VARIANTS)
def test_kv_cache_equals_recomputation_with_the_attention_switches(placement, norm, overrides):
    assert_cache_is_recomputation(model_config(placement, norm, overrides))


@pytest.mark.parametrize("placement,norm,overrides", ROPE_GRID)
def test_kv_cache_equals_recomputation_with_rope_for_every_placement(placement, norm, overrides):
    assert_cache_is_recomputation(model_config(placement, norm, overrides))


def test_the_grids_cover_every_registered_placement_and_norm():
    """Each registry entry has at least one configuration the library accepts, so a new placement or
    norm that every check refuses (all skipped) would fail here instead of passing unseen."""
    for grid in (GRID, RESUME_GRID):
        accepted = [p.values[:2] for p in grid if not any(m.name == "skip" for m in p.marks)]
        assert {p for p, _ in accepted} == set(PLACEMENTS)
        assert {n for _, n in accepted} == set(NORMS)
    assert not any(m.name == "skip" for p in ROPE_GRID for m in p.marks)
    for key, value in DEPTH_OPTIONS.items():  # accepted where it is read, so it is not dead weight
        assert any(getattr(model_config(p, accepted_norm(p, {}), {}), key) == value for p in PLACEMENTS), key


# ------------------------------------------------------------------ (b) exact resume

K = 8  # steps in all; the interrupted run stops and checkpoints at K // 2


def train_args(placement, norm, overrides, data_dir, out_dir) -> list[str]:
    """A tiny run (width 16, block_size 8, batch 4) of one configuration, evaluated and checkpointed at
    K // 2 and K, its schedule fixed by lr_decay_iters so that a run stopped at K // 2 has the same
    learning rates. With residual dropout, so the checkpoint must carry the dropout RNG; a placement
    that keeps the stream on the sphere (nGPT) declares that it takes no dropout, no biases and no
    weight decay (as conftest.tiny_config and DROPOUT_PLACEMENTS read it)."""
    sphere = PLACEMENTS[placement].on_sphere
    args = once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--n_embd=16", "--block_size=8",
            "--batch_size=4", "--eval_iters=1", "--log_interval=1", f"--eval_interval={K // 2}", "--warmup_iters=2",
            f"--lr_decay_iters={K}", f"--norm_placement={placement}", f"--norm_type={norm}",
            *(f"--{k}={v}" for k, v in overrides.items()))
    return once(*args, *(["--bias=false", "--dropout=0", "--weight_decay=0"] if sphere else ["--dropout=0.1"]))


def run_config(placement, norm, overrides, data_dir, out_dir, *more):
    """The TrainConfig of one run (``more``: further --key=value), with DEPTH_OPTIONS where accepted;
    BabyGPTError if the library refuses the configuration."""
    return with_depth_options(lambda o: load_config([*train_args(placement, norm, o, data_dir, out_dir), *more]),
                              overrides)


def valid_run(placement, norm, overrides) -> None:
    run_config(placement, norm, overrides, "data", "out")


# The default model's pair runs in the fast loop; the others are slow (three short runs each).
RESUME_GRID = fast_with_the_default_norm_only(
    [p if p.values[0] == DEFAULT_PLACEMENT else pytest.param(*p.values, id=p.id, marks=(*p.marks, pytest.mark.slow))
     for p in params(((p, n, {}, f"{p}-{n}") for p, n in itertools.product(PLACEMENTS, NORMS)), valid_run)])
RESUME_VARIANTS = params([one_norm(DEFAULT_PLACEMENT, "modern", QK_VARIANTS["modern"])], valid_run)


def metrics(out_dir) -> list[dict]:
    """metrics.jsonl without the wall-clock fields, which differ between identical runs."""
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK_FIELDS} for line in f]


def assert_same_tensors(a, b, where: str) -> None:
    """Two nested structures of tensors and plain values (state dicts) equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert_close(a, b, rtol=0, atol=0, msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_tensors(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_resume_is_exact(placement, norm, overrides, data_dir, tmp_path) -> None:
    full, half = tmp_path / "full", tmp_path / "half"
    train(run_config(placement, norm, overrides, data_dir, full, f"--max_iters={K}"))
    train(run_config(placement, norm, overrides, data_dir, half, f"--max_iters={K // 2}"))
    stopped = torch.load(half / "ckpt.pt", weights_only=False)
    assert stopped["iter"] == K // 2
    train(run_config(placement, norm, overrides, data_dir, half, f"--max_iters={K}", "--init_from=resume"))
    a, b = (torch.load(d / "ckpt.pt", weights_only=False) for d in (full, half))
    assert a["iter"] == b["iter"] == K
    for name, w in a["model"].items():  # weights and buffers (BatchNorm's running statistics)
        assert_close(b["model"][name], w, rtol=0, atol=0, msg=name)
    assert a["model"].keys() == b["model"].keys()
    assert_same_tensors(a["optimizer"]["state"], b["optimizer"]["state"], "optimizer.state")
    # The weights really moved between the checkpoint and the end: the resume did train.
    assert any(not torch.equal(stopped["model"][k], w) for k, w in a["model"].items())
    assert metrics(half) == metrics(full)
    assert [r["iter"] for r in metrics(full) if "loss" in r and r["iter"] > K // 2] == list(range(K // 2 + 1, K + 1))


@pytest.mark.parametrize("placement,norm,overrides", RESUME_GRID)
def test_resume_is_bit_identical_for_every_placement_and_norm(placement, norm, overrides, small_data, tmp_path):
    assert_resume_is_exact(placement, norm, overrides, small_data, tmp_path)


@pytest.mark.parametrize("placement,norm,overrides", RESUME_VARIANTS)
def test_resume_is_bit_identical_with_the_modern_block(placement, norm, overrides, small_data, tmp_path):
    assert_resume_is_exact(placement, norm, overrides, small_data, tmp_path)
