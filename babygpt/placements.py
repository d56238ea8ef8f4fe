"""Norm placements: where a Block's norms sit and how its two residual branches are wired.

Each placement is one declared object, a ``Placement`` subclass registered in ``PLACEMENTS``: it
says whether the model needs a final norm (``final_norm``), what ``ln1`` is (``make_ln1``), what
else a block owns besides ``ln1`` and ``ln2`` (``build``), wires the block's forward (``forward``),
and draws its residual path in its docstring. A placement that varies with depth (Mix-LN,
HybridNorm*) gives each block the placement it gets (``for_block``). A placement that sets its
init from a forward pass (Admin) does it in ``profile``. One that keeps the stream on the unit
sphere (nGPT) declares ``on_sphere``, which attention, the MLP and GPT read.

Residual dropout (``block.drop``, p = dropout) acts on exactly what a sublayer branch adds to the
stream, the last thing before each (+) in the diagrams. Dropout scales the values it keeps by
1 / (1 - p) so that the branch keeps its eval-mode mean; a norm applied after it would rescale the
dropped vector and undo that, so it never comes before a norm on the same branch.

To add a placement: a subclass here with its diagram, one line in ``PLACEMENTS``, and its formula
in tests/test_model.py's ``test_block_residual_paths``; the placement x norm grid of the tests
picks it up. What the rest of the model needs to know about a placement is declared on its class
(``final_norm``, ``normalizes_qkv``, ``on_sphere``, ``uses_norm_type``, ``profiles``,
``gates_sublayers``, ``owns_depth_init``), never read from its name; it checks what it cannot be
combined with (``config_problems``) and draws its own init where it has one (``init_block``).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn as nn

from .norms import NORMS, Norm, build_norm, norm_class


def make_norm(cfg, dim: int, norm_type: str | None = None, **overrides) -> Norm:
    """The configured norm (or ``norm_type``) for width ``dim``, with NormOptions ``overrides``:
    every norm in the model is built here."""
    return build_norm(cfg.norm_type if norm_type is None else norm_type, dim, cfg.norm_options(), **overrides)


class Gate(nn.Module):
    """A learnable scale on a sublayer's output (or on the stream), ``weight * y`` (y: (B, T, C)).
    ReZero (Bachlechner et al. 2020, arXiv:2003.04887; code majumderb/rezero,
    rezero/transformer/rztx.py ``resweight``): a scalar starting at 0, so every block starts as the
    identity and no norm is needed. SkipInit (De & Smith 2020, arXiv:2002.10444): the same, one
    scalar per residual branch; the paper released no code (the same authors' NF-ResNets,
    deepmind/deepmind-research nfnets, start their ``skip_gain`` at 0 the same way). LayerScale
    (Touvron et al. 2021, CaiT, arXiv:2103.17239; code facebookresearch/deit cait_models.py
    ``LayerScale_Block``, gamma_1 and gamma_2): a per-channel vector starting at a small epsilon.
    Admin's omega (Liu et al. 2020) is a per-channel vector on the stream. Being 0-d or 1-d, all
    stay out of weight decay (``GPT.configure_optimizers``). That is where Admin differs from its
    code, whose fairseq runs decay every parameter (``--weight-decay 0.0001``)."""

    def __init__(self, shape: tuple[int, ...], init: float):
        super().__init__()
        self.weight = nn.Parameter(torch.full(shape, init))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.weight * y


class Scale(nn.Module):
    """A learnable scaling vector as nGPT parametrizes every one of them (Loshchilov et al. 2024,
    arXiv:2410.01131, §2.5; code NVIDIA/ngpt model.py, e.g. ``attn_alpha`` with
    ``attn_alpha_init_value`` and ``attn_alpha_init_scaling``): the parameter is stored at ``scale``
    and read as ``weight * (init / scale)``, so the effective value starts at ``init`` while Adam
    moves it by about lr * init / scale per step, whatever the global learning rate suits.
    Never weight-decayed (nGPT trains without weight decay)."""

    def __init__(self, shape: tuple[int, ...], init: float, scale: float):
        super().__init__()
        self.init, self.scale = init, scale
        self.weight = nn.Parameter(torch.full(shape, scale))

    def value(self) -> torch.Tensor:
        return self.weight * (self.init / self.scale)


def residual_gate(cfg) -> nn.Module:
    """The gate of one sublayer by ``cfg.residual_gate``: a scalar at 0 (ReZero, SkipInit),
    LayerScale's vector at layerscale_init, or the identity."""
    if cfg.residual_gate in ("rezero", "skipinit"):
        return Gate((), 0.0)
    if cfg.residual_gate == "layerscale":
        return Gate((cfg.n_embd,), cfg.layerscale_init)
    return nn.Identity()


def attention_norm_alpha(cfg) -> float:
    """DyT's alpha for ln1 (Zhu et al.'s LLaMA recipe gives the norm before attention its own)."""
    return cfg.dyt_alpha_init if cfg.dyt_alpha_init_attn is None else cfg.dyt_alpha_init_attn


class Placement:
    """Where a block's norms sit. The Block builds ``ln1`` (``make_ln1``), ``sa``, ``ln2`` and
    ``ffwd``; ``build`` adds what else the placement needs; ``forward`` maps the stream (B, T, C)
    to (B, T, C)."""

    name: ClassVar[str]
    final_norm: ClassVar[bool] = True  # is ln_f on by default (the stream reaches the head un-normalized)
    normalizes_qkv: ClassVar[bool] = False  # does attention normalize q, k and v itself (HybridNorm)
    on_sphere: ClassVar[bool] = False  # is the stream kept on the unit sphere (nGPT): see NGPT
    uses_norm_type: ClassVar[bool] = True  # does it build norm layers of norm_type (nGPT has none)
    profiles: ClassVar[bool] = False  # does it set its init from a forward pass (Admin's omega): see profile
    # Pre-LN's forms that residual_gate and ln_scaling scale (a sublayer's addition, the input norms)
    gates_sublayers: ClassVar[bool] = False
    owns_depth_init: ClassVar[bool] = False  # does it scale its init with depth itself (init_block)
    # The GPTConfig options only this placement reads (Mix-LN's mixln_alpha): set away from their
    # default under another placement, they are refused (GPTConfig.unread_option_problems).
    reads: ClassVar[tuple[str, ...]] = ()
    # Why a norm_type that is the identity (none) leaves this placement meaningless, or "" if it does
    # not (Admin profiles omega from the variance its norms take away: without them omega collapses).
    needs_a_norm: ClassVar[str] = ""
    # Does it differ from Pre-LN only in where its norms sit? Then with a norm_type that is the identity
    # it is Pre-LN's model exactly (same parameters, same outputs), and a run of it would claim a
    # placement it does not have: refused (tests/test_used_or_refused.py checks both directions).
    only_moves_norms: ClassVar[bool] = False
    # Is ln1 the identity whatever norm_type (HybridNorm: its attention normalizes q, k and v instead)?
    ln1_is_identity: ClassVar[bool] = False

    def for_block(self, cfg, index: int) -> "Placement":
        """The placement block ``index`` (0 first) gets; itself unless it varies with depth."""
        return self

    def make_ln1(self, cfg) -> Norm:
        if self.ln1_is_identity:
            return make_norm(cfg, cfg.n_embd, "none")
        return make_norm(cfg, cfg.n_embd, alpha_init=attention_norm_alpha(cfg))  # alpha_init: DyT only

    def build(self, block: nn.Module, cfg, index: int) -> None:
        """The norms and scales this placement adds to block ``index`` besides ln1 and ln2."""

    def forward(self, block: nn.Module, x: torch.Tensor, cache, layer: int) -> torch.Tensor:
        raise NotImplementedError

    def profile(self, block: nn.Module, x: torch.Tensor, omega: float) -> tuple[torch.Tensor, float]:
        """A profiling forward (Admin): (output, the running omega for the next block). Others
        only run the block."""
        return block(x), omega

    def init_block(self, linear: str, n_layer: int, attn: dict, ffn: tuple) -> bool:
        """Draw a block's matrices this placement's own way after init.py's first pass (``linear``:
        "gpt2" or "xavier"; ``attn``: {"q", "k", "v", "o"} weights, ``ffn``: the MLP's weights).
        False: it has no way of its own, and init.py's depth rule applies."""
        return False

    def config_problems(self, cfg) -> list[str]:
        """What this placement cannot be combined with in ``cfg`` (a GPTConfig)."""
        problems = []
        if not self.gates_sublayers and cfg.residual_gate != "none":
            problems.append(f"residual_gate {cfg.residual_gate} applies to norm_placement pre only (it scales what "
                            f"a sublayer adds to the stream), got {cfg.norm_placement!r}")
        if not self.gates_sublayers and cfg.ln_scaling:
            problems.append(f"ln_scaling applies to norm_placement pre only (LayerNorm Scaling scales the "
                            f"Pre-LN norms), got norm_placement {cfg.norm_placement!r}; set ln_scaling false")
        if self.needs_a_norm and cfg.norm_type in NORMS and norm_class(NORMS[cfg.norm_type]).is_identity:
            problems.append(f"norm_placement {cfg.norm_placement} with norm_type {cfg.norm_type}: "
                            f"{self.needs_a_norm}; choose a norm_type that normalizes")
        if self.only_moves_norms and cfg.norm_type in NORMS and norm_class(NORMS[cfg.norm_type]).is_identity:
            problems.append(f"norm_placement {cfg.norm_placement} with norm_type {cfg.norm_type} is norm_placement "
                            f"pre's model exactly (the placement only moves norms, and these are the identity); "
                            f"use norm_placement pre, or a norm_type that normalizes")
        if cfg.dyt_alpha_init_attn is not None and all(self.for_block(cfg, i).ln1_is_identity
                                                       for i in range(max(cfg.n_layer, 1))):
            problems.append(f"dyt_alpha_init_attn sets the alpha of ln1, the norm before attention, which is the "
                            f"identity under norm_placement {cfg.norm_placement} (its attention normalizes q, k "
                            f"and v itself); leave dyt_alpha_init_attn unset")
        if self.owns_depth_init and cfg.init_depth_factor is not None:
            problems.append(f"init_depth_factor does not apply to norm_placement {cfg.norm_placement} (its own "
                            f"init scales with depth); leave init_depth_factor unset")
        return problems


class PreLN(Placement):
    """Pre-LN (GPT-2; Xiong et al. 2020, arXiv:2002.04745) normalizes each sublayer's *input*; the
    residual stream itself is never normalized on its way through, so the model needs ``ln_f``::

        x ──┬──────────────────────────► (+) ──┬───────────────────────────────► (+) ──►
            └─► ln1 ─► sa ─► drop ───────┘     └─► ln2 ─► ffwd ─► drop ──────────┘

    LayerNorm Scaling (``ln_scaling``; "The Curse of Depth", Sun et al. 2025, arXiv:2502.05795,
    code lmsdss/LayerNorm-Scaling peft_pretraining/modeling_llama.py, NORM_TYPE=LNS) multiplies
    both norm outputs of block l (1-indexed: block 0 has l = 1) by ``ln_scale`` = 1/sqrt(l), which
    curbs the growth of the stream's variance with depth; ``ln_f`` is not scaled (as in the code).
    The paper also drops the depth-scaled init; here the init stays the configured one
    (``--init_depth_factor=false`` gives theirs, N(0, 0.02))::

        x ──┬─────────────────────────────────► (+) ──┬─────────────────────────────────────► (+) ──►
            └─► ln1 ─► ×1/√l ─► sa ─► drop ─────┘     └─► ln2 ─► ×1/√l ─► ffwd ─► drop ─────┘

    Residual gates (``residual_gate``) scale what each sublayer adds: ReZero's one scalar α per
    block, shared by its two sublayers as in the authors' code, starting at 0; SkipInit's one
    scalar per sublayer, starting at 0 (with ``norm_type none`` ln1 and ln2 are the identity and
    either is a model without norms); or LayerScale's per-channel diag(λ), one per sublayer,
    starting at ``layerscale_init`` (``Gate``)::

        x ──┬──────────────────────────────────► (+) ──┬───────────────────────────────────► (+) ──►
            └─► ln1 ─► sa ─► ×α|diag(λ₁) ─► drop ─┘     └─► ln2 ─► ffwd ─► ×α|diag(λ₂) ─► drop ─┘
    """

    name = "pre"
    gates_sublayers = True

    def build(self, block, cfg, index):
        # LayerNorm Scaling's factor on ln1's and ln2's outputs: 1/sqrt(l), l = index + 1; 1 otherwise.
        block.ln_scale = 1 / math.sqrt(index + 1) if cfg.ln_scaling else 1.0
        # The identity unless residual_gate; ReZero's one scalar serves both sublayers.
        block.gate_attn = residual_gate(cfg)
        block.gate_ffwd = block.gate_attn if cfg.residual_gate == "rezero" else residual_gate(cfg)

    def forward(self, block, x, cache, layer):
        x = x + block.drop(block.gate_attn(block.sa(scaled(block, block.ln1(x)), cache, layer)))
        return x + block.drop(block.gate_ffwd(block.ffwd(scaled(block, block.ln2(x)))))


def scaled(block: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """A Pre-LN norm's output times LayerNorm Scaling's 1/sqrt(l); untouched (no extra op on the hot
    path) without ln_scaling."""
    return h if block.ln_scale == 1.0 else block.ln_scale * h


class PostLN(Placement):
    """Post-LN (the original Transformer, Vaswani et al. 2017) normalizes the residual stream *after*
    each add. This is the intended placement, not a bug: the last block's ``ln2`` already
    normalizes the output, so the final norm is off by default::

        x ──┬──────────────────► (+) ─► ln1 ──┬───────────────────► (+) ─► ln2 ──►
            └─► sa ─► drop ──────┘            └─► ffwd ─► drop ─────┘
    """

    name = "post"
    final_norm = False
    only_moves_norms = True

    def build(self, block, cfg, index):
        block.residual_scale = self.residual_scale(cfg)

    def residual_scale(self, cfg) -> float:
        """The weight of the residual before each add (DeepNorm's alpha; 1 for plain Post-LN)."""
        return 1.0

    def forward(self, block, x, cache, layer):
        x = block.ln1(block.residual_scale * x + block.drop(block.sa(x, cache, layer)))
        return block.ln2(block.residual_scale * x + block.drop(block.ffwd(x)))


class DeepNorm(PostLN):
    """DeepNorm (DeepNet, Wang et al. 2022, arXiv:2203.00555) is Post-LN with the residual
    up-weighted by the paper's alpha (``residual_scale`` here, not to be confused with DyT's
    alpha) = (2N)^(1/4), N = n_layer (the decoder-only value), so each update is small relative to
    the stream; ``ln_f`` is off as for Post-LN, and its beta init is ``init_block`` below::

        x ──┬─► ×α ───────────────► (+) ─► ln1 ──┬─► ×α ─────────────────► (+) ─► ln2 ──►
            └─► sa ─► drop ─────────┘            └─► ffwd ─► drop ─────────┘
    """

    name = "deepnorm"
    only_moves_norms = False  # its residual weight alpha stays
    owns_depth_init = True

    def residual_scale(self, cfg) -> float:
        return (2 * cfg.n_layer) ** 0.25

    def init_block(self, linear: str, n_layer: int, attn: dict, ffn: tuple) -> bool:
        """The paper's beta = (8N)^(-1/4) on the MLP's matrices and attention's v and o (its Figure 2;
        torchscale's ``deepnorm`` init): GPT-2's N(0, 0.02^2) times beta, or Xavier normal with gain
        beta, q and k Xavier normal with gain 1."""
        beta = (8 * n_layer) ** -0.25
        if linear == "gpt2":
            for w in (*ffn, attn["o"], attn["v"]):
                nn.init.normal_(w, mean=0.0, std=0.02 * beta)
            return True
        for w in (*ffn, attn["v"], attn["o"]):
            nn.init.xavier_normal_(w, gain=beta)
        for w in (attn["q"], attn["k"]):
            nn.init.xavier_normal_(w, gain=1.0)
        return True


class Admin(PostLN):
    """Admin (Liu et al. 2020, "Understanding the Difficulty of Training Transformers",
    arXiv:2004.08249; code LiyuanLucasLiu/Transformer-Clinic, fairseq/modules/transformer_layer.py,
    ``attention_ratio_change`` / ``fc_ratio_change`` with ``--init-type adaptive``) is Post-LN whose
    residual is weighted per channel by ω before each add, ``LN(x ⊙ ω + f(x))``, with ω set by
    profiling so that early in training the output depends on each block as little as under
    Pre-LN::

        x ──┬─► ⊙ω₁ ──────────────► (+) ─► ln1 ──┬─► ⊙ω₂ ────────────────► (+) ─► ln2 ──►
            └─► sa ─► drop ─────────┘            └─► ffwd ─► drop ─────────┘

    ω₁ (``omega_attn``) and ω₂ (``omega_ffwd``) are learnable vectors, never weight-decayed. The
    paper sets ω_i = sqrt(Σ_{j<i} Var[f_j]); the code computes it as a running value over the
    sublayers in order, starting at 1: ω_{i+1} = sqrt(Var[ω_i ⊙ x_{i-1}] + Var[f_i(x_{i-1})]), each
    variance one scalar over the whole tensor of one batch (``GPT.profile_init``, run once before a
    run from scratch trains, on a fixed batch of the training split). Every entry of a vector is
    that one scalar, as in the code. Where this differs from the code: the code profiles in
    training mode (dropout on) on the first training batch and then exits; here it profiles in
    eval mode on a batch of its own, so the run's data order and dropout masks are unchanged.
    Until profiled, ω = 1 and the block is plain Post-LN.

    The variances: the code takes ``np.var``, the *biased* variance (divided by N, the tensor's
    element count); ``profile`` takes ``torch.var``, the unbiased one (divided by N - 1). Kept, and
    documented rather than changed, so that the committed Admin results stay reproducible bit for
    bit: over a profiling batch of N = B * T * C elements (tens of thousands and more) the two differ
    by a factor N / (N - 1), a relative 1/N in ω², far below anything a run can measure.
    """

    name = "admin"
    only_moves_norms = False  # its omega stays (and it needs a norm anyway)
    profiles = True
    needs_a_norm = ("Admin sets omega from the variance each residual add's norm takes away, and without a norm "
                    "the stream is never renormalized, so omega collapses towards zero")

    def build(self, block, cfg, index):
        super().build(block, cfg, index)
        block.omega_attn = Gate((cfg.n_embd,), 1.0)
        block.omega_ffwd = Gate((cfg.n_embd,), 1.0)

    def forward(self, block, x, cache, layer):
        x = block.ln1(block.omega_attn(x) + block.drop(block.sa(x, cache, layer)))
        return block.ln2(block.omega_ffwd(x) + block.drop(block.ffwd(x)))

    def profile(self, block, x, omega):
        with torch.no_grad():
            for gate, f, norm in ((block.omega_attn, block.sa, block.ln1),
                                  (block.omega_ffwd, block.ffwd, block.ln2)):
                gate.weight.fill_(omega)
                fx = block.drop(f(x))
                omega = math.sqrt(torch.var(gate(x)).item() + torch.var(fx).item())
                x = norm(gate(x) + fx)
        return x, omega


class Sandwich(Placement):
    """Sandwich-LN (CogView, Ding et al. 2021, arXiv:2105.13290) / Peri-LN (Kim et al. 2025,
    arXiv:2502.02732) is Pre-LN plus a norm on each sublayer's *output* (``ln1_out``,
    ``ln2_out``) before the add, which bounds what one sublayer can write into the stream. The
    stream is still not normalized, so ``ln_f`` is on. Peri-LN as its paper defines it also
    normalizes the embedding output before block 0 (``emb_norm``, ``GPT.ln_emb``;
    config/periln_rms.py). The dropout comes after the output norm::

        x ──┬──────────────────────────────────► (+) ──┬─────────────────────────────────────► (+) ──►
            └─► ln1 ─► sa ─► ln1_out ─► drop ────┘     └─► ln2 ─► ffwd ─► ln2_out ─► drop ─────┘
    """

    name = "sandwich"
    only_moves_norms = True

    def build(self, block, cfg, index):
        block.ln1_out = make_norm(cfg, cfg.n_embd)
        block.ln2_out = make_norm(cfg, cfg.n_embd)

    def forward(self, block, x, cache, layer):
        x = x + block.drop(block.ln1_out(block.sa(block.ln1(x), cache, layer)))
        return x + block.drop(block.ln2_out(block.ffwd(block.ln2(x))))


class OutputNorm(Placement):
    """Output norm, as OLMo 2 uses it (OLMo et al. 2025, arXiv:2501.00656; code allenai/OLMo
    olmo/model.py OLMoSequentialBlock with ``norm_after``): each sublayer reads the raw stream and
    its *output* is normalized before the add (``ln1``, ``ln2`` here sit after ``sa`` and
    ``ffwd``); the stream is never normalized, so ``ln_f`` is on. The dropout comes after the norm,
    as in the code. OLMo 2 pairs it with QK-norm (config/olmo2_rms.py), but normalizes the whole
    query and key projections (all heads together, width C) before the head split, while
    ``qk_norm`` here normalizes each head on its own (width D)::

        x ──┬──────────────────────────► (+) ──┬───────────────────────────────► (+) ──►
            └─► sa ─► ln1 ─► drop ───────┘     └─► ffwd ─► ln2 ─► drop ──────────┘
    """

    name = "output"
    only_moves_norms = True

    def forward(self, block, x, cache, layer):
        x = x + block.drop(block.ln1(block.sa(x, cache, layer)))
        return x + block.drop(block.ln2(block.ffwd(x)))


class MixLN(Placement):
    """Mix-LN (Li et al. 2024, arXiv:2412.13795; code pixeli99/MixLN
    peft_pretraining/modeling_llama.py, NORM_TYPE=post_pre) makes the first floor(mixln_alpha *
    n_layer) blocks (0-indexed blocks below that number; alpha = 0.25 by default, as in the paper
    and the code's scripts) Post-LN and the others Pre-LN; each block's ``placement`` is the one
    it gets, and its residual path is the one drawn there. The paper writes floor(alpha L); the
    code takes the count itself (env POST_NUM). As in the code, ``ln_f`` exists; its init (no depth
    factor, embeddings std sqrt(2/5)) is not copied. With P = floor(alpha N)::

        emb ─► block 0 ─► … ─► block P-1 ─► block P ─► … ─► block N-1 ─► ln_f ─► LM head
               └──────── Post-LN ────────┘  └──────── Pre-LN ─────────┘
    """

    name = "mixln"
    only_moves_norms = True
    reads = ("mixln_alpha",)

    def for_block(self, cfg, index):
        return PLACEMENTS["post"] if index < cfg.mixln_post_blocks else PLACEMENTS["pre"]

    def config_problems(self, cfg):
        """Used or refused: a mixln_alpha set away from its default whose floor(alpha * n_layer) is the
        default's makes the same model as the default, so it would be accepted and do nothing."""
        problems = super().config_problems(cfg)
        default = type(cfg).__dataclass_fields__["mixln_alpha"].default
        if (isinstance(cfg.n_layer, int) and cfg.n_layer > 0 and isinstance(cfg.mixln_alpha, (int, float))
                and 0 <= cfg.mixln_alpha <= 1
                and cfg.mixln_alpha != default and cfg.mixln_post_blocks == math.floor(default * cfg.n_layer + 1e-9)):
            problems.append(f"mixln_alpha {cfg.mixln_alpha:g} makes floor({cfg.mixln_alpha:g} x {cfg.n_layer}) = "
                            f"{cfg.mixln_post_blocks} of the {cfg.n_layer} blocks Post-LN, as the default "
                            f"{default:g} does: it would change nothing; leave it at {default:g}, or pick a value "
                            f"that changes the count")
        return problems


class HybridNorm(Placement):
    """HybridNorm (Zhuo et al. 2025, arXiv:2503.04598; code BryceZhuo/HybridNorm,
    dense_model/olmo/model.py ``OLMoSequentialBlock.forward`` with the 1.2B-dense-HybriedNorm.yaml
    settings): attention reads the raw stream and normalizes its queries, keys *and values* per
    head (``sa.q_norm``, ``sa.k_norm``, ``sa.v_norm``, each over the head size D and shared by the
    heads, as in the code); the stream is not normalized before or after attention. The FFN is
    Post-Norm in the paper's sense: the stream is normalized (``ln2``) and the FFN's output is added
    to the *normalized* stream. ``ln1`` is the identity (it has nothing to do), and ``ln_f`` is on,
    as in the code::

        x ──┬──────────────────────────────────────► (+) ─► ln2 ──┬──────────────────► (+) ──►
            └─► sa[q,k,v normalized per head] ─► drop ┘            └─► ffwd ─► drop ───┘

    The code normalizes before RoPE; this model has learned absolute positions, so there is none.
    The paper keeps 1/sqrt(D) in the softmax, as here (``qk_scale`` can change it).
    """

    name = "hybrid"
    normalizes_qkv = True
    ln1_is_identity = True

    def forward(self, block, x, cache, layer):
        x = block.ln2(x + block.drop(block.sa(block.ln1(x), cache, layer)))
        return x + block.drop(block.ffwd(x))


class HybridNormStar(HybridNorm):
    """HybridNorm* (Zhuo et al. 2025, §3; in the code, the model option ``norm_pos_special_config``
    = {0: {'attn_norm': True, 'ffn_residual': False}}; the released YAML configs do not set it):
    HybridNorm, except that block 0 is Pre-LN on
    both sublayers (its attention still normalizes q, k and v), since the embeddings reach it
    un-normalized (``HybridNormFirst``)."""

    name = "hybrid_star"

    def for_block(self, cfg, index):
        return HYBRID_FIRST if index == 0 else PLACEMENTS["hybrid"]


class HybridNormFirst(HybridNorm):
    """Block 0 of HybridNorm*: Pre-LN around attention that normalizes q, k and v, and a Pre-LN FFN::

        x ──┬─────────────────────────────────────────────► (+) ──┬────────────────────────────► (+) ──►
            └─► ln1 ─► sa[q,k,v normalized per head] ─► drop ┘     └─► ln2 ─► ffwd ─► drop ───┘
    """

    name = "hybrid_first"
    ln1_is_identity = False

    def forward(self, block, x, cache, layer):
        x = x + block.drop(block.sa(block.ln1(x), cache, layer))
        return x + block.drop(block.ffwd(block.ln2(x)))


class PrePost(Placement):
    """Pre + post-main norm: each sublayer reads a normalized stream, as under Pre-LN, and the stream
    is normalized again after the add, as under Post-LN, ``x ← norm(x + f(norm(x)))``. This is
    x-transformers' ``pre_and_post_norm`` (lucidrains/x-transformers, x_transformers.py
    ``AttentionLayers``: ``pre_branch_norm`` and ``post_main_norm`` per sublayer, and
    ``pre_norm_has_final_norm = False``; its comment credits it to the Keel paper and to looped /
    recurrent-depth language models). ``ln1`` and ``ln2`` are the pre norms, ``ln1_post`` and
    ``ln2_post`` the post-main norms (four norms per block, as Sandwich-LN, but on the stream, not
    on the sublayer's output). The last block's ``ln2_post`` already normalizes what reaches the
    head, so ``ln_f`` is off by default, as in x-transformers. The dropout comes before the add::

        x ──┬────────────────────────────► (+) ─► ln1_post ──┬─────────────────────────────► (+) ─► ln2_post ──►
            └─► ln1 ─► sa ─► drop ─────────┘                  └─► ln2 ─► ffwd ─► drop ───────┘

    Not LayerNorm-Scaling's ``NORM_TYPE=pre_post`` (lmsdss/LayerNorm-Scaling
    peft_pretraining/modeling_llama.py), which despite its name is a depth mix: its first 7 layers
    are Pre-LN and the rest Post-LN (Mix-LN the other way round), no layer has both norms.
    """

    name = "prepost"
    final_norm = False
    only_moves_norms = True

    def build(self, block, cfg, index):
        block.ln1_post = make_norm(cfg, cfg.n_embd)
        block.ln2_post = make_norm(cfg, cfg.n_embd)

    def forward(self, block, x, cache, layer):
        x = block.ln1_post(x + block.drop(block.sa(block.ln1(x), cache, layer)))
        return block.ln2_post(x + block.drop(block.ffwd(block.ln2(x))))


class Parallel(Placement):
    """Parallel residual (GPT-J, Wang & Komatsuzaki 2021, mesh-transformer-jax; GPT-NeoX-20B, Black et
    al. 2022, arXiv:2204.06745; PaLM): attention and the MLP read the same stream and both write into
    it in one add, ``x ← x + sa(ln1(x)) + ffwd(ln2(x))``, so the two sublayers can run at once.
    Each has its own pre norm, as in GPT-NeoX (EleutherAI/gpt-neox megatron/model/transformer.py
    ``ParallelTransformerLayer`` with ``gpt_j_residual: true`` and ``gpt_j_tied: false``, its default
    and what NeoX-20B and Pythia were trained with) and litgpt (Lightning-AI/litgpt litgpt/model.py
    ``Block`` with ``parallel_residual=True``, ``shared_attention_norm=False``). GPT-J itself, PaLM
    and the tied options (``gpt_j_tied: true``; litgpt's ``shared_attention_norm=True``, Falcon-7B)
    use one norm for both; this placement keeps two, so that every block has the same norms as under
    Pre-LN and the grid compares wiring only (NeoX's comment calls the untied pair a bug kept for
    compatibility; it costs d, or 2d with a bias, parameters per block). The stream is never
    normalized, so ``ln_f`` is on::

        x ──┬──────────────────────────────────► (+) ──►
            ├─► ln1 ─► sa ─► drop ───────────────┤
            └─► ln2 ─► ffwd ─► drop ─────────────┘
    """

    name = "parallel"

    def forward(self, block, x, cache, layer):
        attn = block.drop(block.sa(block.ln1(x), cache, layer))
        return x + attn + block.drop(block.ffwd(block.ln2(x)))


def sphere(x: torch.Tensor) -> torch.Tensor:
    """x / ||x|| over the last dimension (nGPT's Norm; the code's ``justnorm`` has no eps, F.normalize
    keeps 1e-12 against an exactly zero vector)."""
    return torch.nn.functional.normalize(x, dim=-1)


class NGPT(Placement):
    """nGPT, the normalized Transformer (Loshchilov et al. 2024, arXiv:2410.01131; code NVIDIA/ngpt,
    model.py ``Block.forward`` with use_nGPT=1, train.py ``normalize_matrices``): the stream h lives
    on the unit sphere, and each sublayer moves it part of the way towards its own normalized output,
    by per-channel "eigen learning rates" α_A, α_M (``alpha_attn``, ``alpha_mlp``: ``Scale`` vectors,
    effective init 0.05, scale 1/sqrt(C); the code takes their absolute value, as here)::

        h ──┬──────────────────┐
            └─► sa ─► ‖·‖ ──────┴─► h + |α_A| (· − h) ─► ‖·‖ ──► the same with ffwd and α_M ──►

        h ← ‖h + |α_A| (‖sa(h)‖ − h)‖,   h ← ‖h + |α_M| (‖ffwd(h)‖ − h)‖,   ‖x‖ = x / |x|

    There are no norm layers: ``ln1``, ``ln2`` and ``ln_f`` are the identity (norm_type must be none).
    The rest of nGPT lives where the model already has a place for it: attention normalizes q and k
    per head, scales them by s_qk and uses sqrt(D), not 1/sqrt(D), as the softmax scale
    (``MultiHeadAttention``, on_sphere; with pos rope, q and k are rotated first, then normalized and
    scaled, the code's order); the MLP's hidden pre-activation is scaled by s_u sqrt(C), with mlp
    swiglu each half by its own vector (``su``, ``su_up``; ``FeedForward``); the logits by s_z
    (``GPT.logit_scale``); the embedding is normalized before block 0; and every matrix is put back
    on the sphere along its embedding dimension at init and after every optimizer step
    (``GPT.after_step``). nGPT trains with no weight decay, no warmup and
    no dropout (config/ngpt.py; dropout is refused).

    Where this differs from the paper and code, because the model's structure stays: the MLP is
    this project's, by ``mlp``. With mlp swiglu (the paper's and the code's MLP) it is theirs: the
    gate ν = fc times s_ν sqrt(C) (``su``) and u = up times s_u sqrt(C) (``su_up``), both init 1,
    scale 1, as the code's ``suv`` (model.py ``Block.forward``) scales both halves of its fused c_fc
    output by sqrt(n_embd); the paper (§2.4.2, eqs. 20-21) puts sqrt(d_model) on ν only, a constant
    factor on the MLP's output that its normalization removes. Its hidden width is ``ffn_hidden``'s
    8C/3, not the code's 4C per half. With mlp gelu (the default) s_u scales fc's output alone;
    relu2 is refused. Positions: by default learned embeddings added before the normalization; pos
    rope rotates q and k before they are normalized and scaled by s_qk, the code's order
    (``Block.forward``: ``apply_rotary_position_embeddings``, then ``sqk * justnorm(q)``),
    with this project's ``Rotary`` (the code's tables interleave sin and cos and then split them
    in halves, so its angles are not RoFormer's). The LM head is tied to the token embedding (the
    code unties them, but normalizes both the same way, row by row, so a tied matrix is on the
    sphere for both uses); F.normalize's eps.
    """

    name = "ngpt"
    final_norm = False
    on_sphere = True
    uses_norm_type = False

    def make_ln1(self, cfg):
        return make_norm(cfg, cfg.n_embd, "none")

    def build(self, block, cfg, index):
        block.alpha_attn = Scale((cfg.n_embd,), 0.05, cfg.n_embd ** -0.5)
        block.alpha_mlp = Scale((cfg.n_embd,), 0.05, cfg.n_embd ** -0.5)

    def forward(self, block, x, cache, layer):
        x = sphere(x + block.alpha_attn.value().abs() * (sphere(block.sa(x, cache, layer)) - x))
        return sphere(x + block.alpha_mlp.value().abs() * (sphere(block.ffwd(x)) - x))


# The registry: norm_placement's choices, in the order the docs list them.
PLACEMENTS: dict[str, Placement] = {p.name: p for p in (
    PreLN(), PostLN(), Sandwich(), DeepNorm(), MixLN(), OutputNorm(), HybridNorm(), HybridNormStar(), Admin(),
    NGPT(), PrePost(), Parallel())}
DEFAULT = PreLN.name  # GPTConfig's norm_placement unless a config says otherwise
HYBRID_FIRST = HybridNormFirst()  # not a choice of its own: HybridNorm*'s block 0
