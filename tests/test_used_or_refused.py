"""Every model option is used or refused (docs/reliability.md): over the registries, an option set to
another value than its default either changes the model (its parameters, or what it computes) or is
refused with a message that names it. An option that is accepted and changes nothing would let a
run claim an ablation it is not. A new GPTConfig field fails here by name until it has a value below."""

import dataclasses

import pytest
import torch

from babygpt.errors import BabyGPTError
from babygpt.model import GPT, GPTConfig
from babygpt.norms import NORMS, norm_class
from babygpt.options import options_of
from babygpt.placements import DEFAULT as DEFAULT_PLACEMENT, PLACEMENTS

# The grid's axes and the model's shape: what every configuration below sets itself.
STRUCTURAL = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "norm_type", "norm_placement")
# Values other than the defaults, each valid on its own; the first that differs from the base is used.
# Each is large enough to act on a model at init (a soft-cap the small initial logits reach, an eps
# above the initial stream's size), so that "changes nothing" means the option is not read.
VALUES = {
    "dropout": [0.1], "bias": [False, True], "norm_eps": [1.0], "final_norm": [], "qk_norm": [True],
    "qk_scale": ["learned"], "dyt_alpha_init": [0.9], "dyt_alpha_init_attn": [0.9], "emb_scale_learnable": [True],
    "mixln_alpha": [0.5], "ln_scaling": [True], "residual_gate": ["layerscale"], "layerscale_init": [0.5],
    "emb_norm": [True], "norm_gain_offset": [True], "derf_alpha_init": [0.9], "derf_shift_init": [0.3],
    "pos": ["rope"], "rope_base": [100.0], "qk_norm_scope": ["width"], "qk_norm_order": ["rope_norm"],
    "mlp": ["swiglu"], "split_qkv": [True], "zero_init_proj": [True], "residual_lambdas": [True],
    "logit_softcap": [1e-6], "attn_softcap": [1e-6], "init": ["xavier"], "init_linear": ["xavier"],
    "init_embedding": ["unit"], "init_depth_factor": [False, True],
}
OPTIONS = [name for name in options_of(GPTConfig) if name not in STRUCTURAL]
SHAPE = dict(vocab_size=11, block_size=8, n_layer=4, n_head=2, n_embd=16)
# A placement whose own rules a plain configuration breaks (nGPT: no biases, no norm layers) gets
# the first of these that it accepts as its base.
BASE_FIXES = [{}, {"bias": False}, {"bias": False, "norm_type": "none"}]


def base_config(placement: str, norm_type: str) -> GPTConfig | None:
    for fix in BASE_FIXES:
        try:
            return GPTConfig(**SHAPE, **{"norm_placement": placement, "norm_type": norm_type, **fix})
        except BabyGPTError:
            continue
    return None


def outputs(cfg: GPTConfig) -> tuple[dict, torch.Tensor]:
    """The model's state at init and its logits in training mode on a fixed batch, seeded alike."""
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=torch.Generator().manual_seed(1))
    model.profile_init(idx)
    model.train()
    torch.manual_seed(2)  # (dropout's masks)
    logits, _ = model(idx, idx)
    return model.state_dict(), logits.detach()


def same_model(a: GPTConfig, b: GPTConfig) -> bool:
    (state_a, logits_a), (state_b, logits_b) = outputs(a), outputs(b)
    same_state = state_a.keys() == state_b.keys() and all(
        state_a[k].shape == state_b[k].shape and torch.equal(state_a[k], state_b[k]) for k in state_a)
    return same_state and logits_a.shape == logits_b.shape and torch.equal(logits_a, logits_b)


# The fast loop runs every option on the default model; the other placements' and norms' cases run in
# the whole suite.
CASES = [pytest.param(p, "rmsnorm", o, marks=() if p == DEFAULT_PLACEMENT else pytest.mark.slow)
         for p in PLACEMENTS for o in OPTIONS] + \
        [pytest.param(DEFAULT_PLACEMENT, n, o, marks=pytest.mark.slow) for n in NORMS if n != "rmsnorm" for o in OPTIONS]


def test_every_model_option_has_a_value_here():
    assert [o for o in OPTIONS if o not in VALUES] == [], "add a non-default value for these options to VALUES"


@pytest.mark.parametrize("placement, norm_type, name", CASES, ids=lambda v: str(v))
def test_an_option_is_used_or_refused(placement, norm_type, name):
    base = base_config(placement, norm_type)
    if base is None:
        pytest.skip(f"{placement} with {norm_type} is refused as a whole")
    candidates = [not base.use_final_norm] if name == "final_norm" else VALUES[name]  # (None: the placement's own)
    value = next((v for v in candidates if v != getattr(base, name)), None)
    if value is None:
        pytest.skip(f"the base configuration already sets {name} to every value tried")
    try:
        changed = dataclasses.replace(base, **{name: value})
    except BabyGPTError as e:  # (a GPTConfig checks itself when made)
        assert any(name in p for p in e.problems), f"{name}={value!r} refused without naming it: {e.problems}"
        return
    problems = changed.problems()
    if problems:
        assert any(name in p for p in problems), f"{name}={value!r} refused without naming it: {problems}"
        return
    assert not same_model(base, changed), \
        f"{name}={value!r} is accepted with norm_placement {placement}, norm_type {norm_type} but changes nothing"


@pytest.mark.parametrize("placement", [p for p, cls in PLACEMENTS.items() if cls.needs_a_norm])
@pytest.mark.parametrize("norm_type", [n for n in NORMS if norm_class(NORMS[n]).is_identity])
def test_a_placement_that_needs_a_norm_refuses_one_that_is_the_identity(placement, norm_type):
    with pytest.raises(BabyGPTError, match=f"norm_placement {placement} with norm_type {norm_type}: .*choose a "
                                           f"norm_type that normalizes"):
        GPTConfig(**SHAPE, norm_placement=placement, norm_type=norm_type)


def _pre_without_norms_equals(placement: str, norm_type: str, monkeypatch) -> bool:
    """Whether ``placement`` with ``norm_type`` (the identity) builds Pre-LN's model with it, its own
    refusal lifted for the comparison."""
    monkeypatch.setattr(PLACEMENTS[placement], "only_moves_norms", False)
    cfg = base_config(placement, norm_type)
    return cfg is not None and same_model(cfg, GPTConfig(**SHAPE, norm_placement=DEFAULT_PLACEMENT,
                                                          norm_type=norm_type, bias=cfg.bias))


@pytest.mark.parametrize("placement", [p for p, cls in PLACEMENTS.items() if cls.only_moves_norms])
@pytest.mark.parametrize("norm_type", [n for n in NORMS if norm_class(NORMS[n]).is_identity])
def test_a_placement_that_only_moves_norms_is_refused_without_one_and_is_pre_ln_there(placement, norm_type,
                                                                                      monkeypatch):
    with pytest.raises(BabyGPTError, match=f"norm_placement {placement} with norm_type {norm_type} is "
                                           f"norm_placement pre's model exactly.*use norm_placement pre"):
        GPTConfig(**SHAPE, norm_placement=placement, norm_type=norm_type)
    assert _pre_without_norms_equals(placement, norm_type, monkeypatch)


@pytest.mark.parametrize("placement", [p for p, cls in PLACEMENTS.items()
                                       if not cls.only_moves_norms and p != DEFAULT_PLACEMENT])
@pytest.mark.parametrize("norm_type", [n for n in NORMS if norm_class(NORMS[n]).is_identity])
def test_a_placement_that_does_more_than_move_norms_is_another_model_without_them(placement, norm_type,
                                                                                  monkeypatch):
    """The declaration is exact: a placement that keeps something of its own without norms (DeepNorm's
    residual weight, the parallel block's wiring) is not Pre-LN's model there, or is refused as a whole."""
    assert not _pre_without_norms_equals(placement, norm_type, monkeypatch)


# Norm-specific options over every placement that builds that norm (the grid above tries them under
# norm_placement pre only; norm_eps is tried under every placement there): an option of the norm before
# attention, say, is read only where ln1 is a real norm.
NORM_OPTION_CASES = [(p, n, o) for p, cls in PLACEMENTS.items() if cls.uses_norm_type
                     for n in NORMS for o in norm_class(NORMS[n]).reads
                     if o in VALUES and o != "norm_eps" and p != DEFAULT_PLACEMENT]


@pytest.mark.parametrize("placement, norm_type, name", NORM_OPTION_CASES, ids=lambda v: str(v))
def test_a_norm_option_is_used_or_refused_under_every_placement(placement, norm_type, name):
    test_an_option_is_used_or_refused(placement, norm_type, name)
