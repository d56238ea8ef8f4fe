"""A character-level GPT whose normalization is chosen by configuration.

Reading order: GPTConfig -> KVCache (for sampling) -> QKScale -> MultiHeadAttention -> FeedForward
-> Block -> GPT. Where each placement puts the Block's norms, and how it wires its residual branches,
is declared in babygpt/placements.py.
Shapes: B batch, T time (positions), C = n_embd, H = n_head, D = C // H, V = vocab_size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import Checked, unknown_choice
from .init import init_parts, init_weights
from .norms import ALPHA_INIT_RANGE, EPS_RANGE, NORMS, Norm, NormOptions, norm_class, qk_norm_refusal
from .options import Range, option, range_problems
from .placements import DEFAULT as DEFAULT_PLACEMENT, PLACEMENTS as PLACEMENT_CLASSES
from .placements import Gate, Scale, make_norm, sphere

PLACEMENTS = tuple(PLACEMENT_CLASSES)  # norm_placement's choices (babygpt/placements.py)
GATE_OPTIONS = {"layerscale_init": "layerscale"}  # a residual gate's own option -> the gate that reads it
# norm_eps from which a norm scales activations (mean square about 1e-3 to 1) down rather than
# normalizing them: allowed (an experiment may want it), but said at the start and after a collapse.
LARGE_NORM_EPS = 1.0
RESIDUAL_GATES = ("none", "rezero", "skipinit", "layerscale")  # what scales a Pre-LN sublayer's output
QK_SCALES = ("fixed", "learned", "per_head")  # what multiplies q.k once queries and keys are normalized
INITS = ("gpt2", "xavier")  # see babygpt/init.py
INIT_LINEAR = ("normal", "xavier")
INIT_EMBEDDING = ("small", "unit")
POSITIONS = ("learned", "rope")  # how the model knows where a token is
MLPS = ("gelu", "swiglu", "relu2")  # the FeedForward's activation (swiglu: gated)
QK_NORM_SCOPES = ("head", "width")  # what one q/k norm sees: a head's D channels, or all C of the projection
QK_NORM_ORDERS = ("norm_rope", "rope_norm")  # with pos rope: queries and keys normalized before or after rotation


@dataclass
class GPTConfig(Checked):
    """The model's hyperparameters, declared only here: the training config holds one and
    reads each field's type and help text from this class."""

    vocab_size: int = option(65, "set from the data's vocabulary", valid=Range(0, low_open=True))
    block_size: int = option(64, "context length in characters", valid=Range(0, low_open=True))
    n_layer: int = option(4, "number of transformer blocks", valid=Range(0, low_open=True))
    n_head: int = option(4, "attention heads per block (must divide n_embd)",
                         valid=Range(0, low_open=True))
    n_embd: int = option(128, "model width", valid=Range(0, low_open=True))
    dropout: float = option(0.0, "dropout probability", valid=Range(0, 1, high_open=True))
    bias: bool = option(True, "biases in Linear layers, and beta in LayerNorm, DyT and BatchNorm")
    norm_type: str = option("rmsnorm", "one of: " + ", ".join(NORMS))
    norm_placement: str = option(DEFAULT_PLACEMENT, "one of: " + ", ".join(PLACEMENTS))
    norm_eps: float = option(1e-5, "epsilon inside every norm", valid=EPS_RANGE)
    final_norm: Optional[bool] = option(
        None, "norm before the LM head; none = as the placement declares it (off for post, deepnorm and admin, "
              "whose last norm already normalizes the output, and for ngpt, whose stream is on the sphere; on for "
              "the others)")
    qk_norm: bool = option(False, "normalize queries and keys with norm_type before attention (per head, or "
                                  "over the whole width: qk_norm_scope)")
    qk_scale: str = option(
        "fixed", "what multiplies the attention logits once queries and keys are normalized (qk_norm, or "
                 "norm_placement hybrid): fixed = 1/sqrt(head size) as without QK-norm; learned = one learnable "
                 "scalar g per layer times the cosine of q and k, starting at log2(T^2 - T), T = block_size "
                 "(Henry et al. 2020); per_head = a learnable temperature per head times the cosine, exp(s) "
                 "with s from log(10), capped at 100 (Swin V2's scaled cosine attention)")
    dyt_alpha_init: float = option(0.5, "initial alpha of norm_type dyt: y = gamma*tanh(alpha*x)+beta",
                                   valid=ALPHA_INIT_RANGE)
    dyt_alpha_init_attn: Optional[float] = option(
        None, "initial alpha of each block's ln1 DyT (before attention in pre/sandwich; Zhu et al.'s LLaMA "
              "recipe gives it a larger one than the other DyTs); none = dyt_alpha_init", valid=ALPHA_INIT_RANGE)
    emb_scale_learnable: bool = option(
        False, "multiply the token embeddings by a learnable scalar, initialised to sqrt(n_embd) (Zhu et al. "
               "2025's LLaMA recipe for DyT); the tied LM head reads the unscaled matrix")
    mixln_alpha: float = option(
        0.25, "norm_placement mixln: the first floor(mixln_alpha * n_layer) blocks are Post-LN, the rest "
              "Pre-LN (Li et al. 2024's alpha; 0 = all Pre-LN, 1 = all Post-LN)", valid=Range(0, 1))
    ln_scaling: bool = option(
        False, "LayerNorm Scaling (Sun et al. 2025), norm_placement pre only: block l's (1-indexed) ln1 and "
               "ln2 outputs are multiplied by 1/sqrt(l); ln_f is not scaled")
    residual_gate: str = option(
        "none", "scale each sublayer's output before the residual add (norm_placement pre): rezero = one learnable "
                "scalar per block, shared by its two sublayers, starting at 0 (Bachlechner et al. 2020; use with "
                "norm_type none); skipinit = one learnable scalar per sublayer, starting at 0 (De & Smith 2020; "
                "use with norm_type none); layerscale = a learnable per-channel vector per sublayer, starting at "
                "layerscale_init (Touvron et al. 2021)")
    layerscale_init: float = option(
        0.1, "residual_gate layerscale: the vectors' initial value (CaiT: 0.1 up to 18 blocks, 1e-5 at 24, "
             "1e-6 deeper)", valid=Range(0, 1, low_open=True))
    emb_norm: bool = option(False, "normalize the embedding output (token + position) with norm_type before "
                                   "block 0 (Peri-LN, Kim et al. 2025)")
    norm_gain_offset: bool = option(
        False, "store every norm gain as w and use 1 + w, w starting at 0 (Gemma's unit offset): weight decay "
               "then pulls the gain towards 1, not 0")
    derf_alpha_init: float = option(0.5, "initial alpha of norm_type derf: y = gamma*erf(alpha*x + s)+beta",
                                    valid=ALPHA_INIT_RANGE)
    derf_shift_init: float = option(0.0, "initial shift s of norm_type derf", valid=Range(-10, 10))
    # The block of today's open models (babygpt/model.py): each off by default, so every committed
    # table keeps the GPT-2 block it was measured on.
    pos: str = option("learned", "positions: learned = a learned embedding added to the tokens' (GPT-2); rope = "
                                 "rotary embeddings applied to queries and keys in every layer (Su et al. 2021)")
    rope_base: float = option(10000.0, "pos rope: the base of the rotation frequencies", valid=Range(1, low_open=True))
    qk_norm_scope: str = option("head", "qk_norm over each head's D channels (head), or over the whole C-wide q "
                                        "and k projections before they are split into heads (width, OLMo 2)")
    qk_norm_order: str = option("norm_rope", "pos rope with qk_norm: normalize queries and keys before the "
                                             "rotation (norm_rope, Qwen3/OLMo 2) or after it (rope_norm, nanochat)")
    mlp: str = option("gelu", "the MLP: gelu = C -> 4C -> GELU -> C; relu2 = the same with ReLU squared; swiglu "
                              "= gated SiLU with hidden width sized to keep the parameter count (see FeedForward)")
    split_qkv: Optional[bool] = option(
        None, "q, k and v as three Linear layers instead of one fused one (same initial values); none = split "
              "under optimizer muon, which orthogonalizes each matrix on its own, fused otherwise")
    zero_init_proj: bool = option(False, "start the two projections that write into the stream (sa.proj, "
                                         "ffwd.proj) at zero, so every block starts as the identity")
    residual_lambdas: bool = option(
        False, "before each block, x = lambda_resid * x + lambda_x0 * x0 with two learnable scalars per block "
               "(x0 the embedding output), starting at 1 and 0 (modded-nanogpt; nanochat)")
    logit_softcap: float = option(0.0, "cap the output logits smoothly at +-this: cap * tanh(logits / cap) "
                                       "(Gemma 2: 30, nanochat: 15); 0 = off", valid=Range(0))
    attn_softcap: float = option(0.0, "cap the attention logits the same way (Gemma 2: 50); 0 = off",
                                 valid=Range(0))
    init: str = option(
        "gpt2", "weight init: gpt2 = N(0, 0.02), residual projections / sqrt(2 n_layer), stream RMS about "
                "0.03; xavier = Xavier-uniform Linear weights, embeddings N(0, 1/n_embd) times sqrt(n_embd), "
                "stream RMS about 1 (Vaswani et al. 2017, Xiong et al. 2020); DeepNorm: its own beta gains")
    # The three parts that ``init`` bundles, each settable on its own (babygpt/init.py): an arm of an
    # ablation changes one of them; none = the part as ``init`` has it.
    init_linear: Optional[str] = option(None, "Linear weights: normal = N(0, 0.02), xavier = Xavier-uniform; "
                                              "none = as init has them")
    init_embedding: Optional[str] = option(None, "embeddings: small = N(0, 0.02) (stream RMS about 0.03), unit = "
                                                 "N(0, 1/n_embd) times sqrt(n_embd) (RMS about 1); none = as init")
    init_depth_factor: Optional[bool] = option(None, "residual projections (sa.proj, ffwd.proj) divided by "
                                                     "sqrt(2 n_layer); none = as init (gpt2 yes, xavier no)")

    def problems(self) -> list[str]:
        """Every problem with these fields, one message each, so that all are reported at once."""
        problems = range_problems(self, only=int)  # every number key's own declared range
        if (isinstance(self.n_embd, int) and isinstance(self.n_head, int) and self.n_head > 0
                and self.n_embd > 0 and self.n_embd % self.n_head != 0):
            problems.append(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        problems += range_problems(self, only=float)
        if self.norm_type not in NORMS:
            problems.append(unknown_choice("norm_type", self.norm_type, NORMS))
        if self.norm_placement not in PLACEMENTS:
            problems.append(unknown_choice("norm_placement", self.norm_placement, PLACEMENTS))
        if self.init not in INITS:
            problems.append(unknown_choice("init", self.init, INITS))
        for name, choices in (("init_linear", INIT_LINEAR), ("init_embedding", INIT_EMBEDDING)):
            if getattr(self, name) is not None and getattr(self, name) not in choices:
                problems.append(unknown_choice(name, getattr(self, name), choices))
        if self.residual_gate not in RESIDUAL_GATES:
            problems.append(unknown_choice("residual_gate", self.residual_gate, RESIDUAL_GATES))
        elif self.placement_class is not None:
            problems += self.placement_class.config_problems(self)
        # The norm options are fields here, checked above by the same declared ranges: each problem once.
        problems += [p for p in self.norm_options().problems(self.norm_type if self.norm_type in NORMS else None)
                     if p not in problems]
        return (problems + self.qk_problems() + self.sphere_problems() + self.identity_norm_problems()
                + self.unread_option_problems() + self.stack_problems())

    def warnings(self) -> list[str]:
        """Settings that are allowed but rarely meant, said as a run starts."""
        if self.norm_eps >= LARGE_NORM_EPS:  # (only a norm that reads norm_eps accepts another value)
            return [f"norm_eps={self.norm_eps:g} is large: a norm divides by sqrt(mean square + norm_eps), so "
                    f"beside activations of mean square about 1e-3 to 1 it scales them down instead of "
                    f"normalizing them (default 1e-5)"]
        return []

    def unread_option_problems(self) -> list[str]:
        """Options set away from their default that nothing in this model reads: a norm's option under
        another norm_type, a placement's under another placement (their classes declare what they
        ``reads``), a residual gate's without that gate. Used or refused: never accepted in silence."""
        if self.norm_type not in NORMS or self.placement_class is None:
            return []  # (reported by problems)
        norm = norm_class(NORMS[self.norm_type]) if self.placement_class.uses_norm_type else None
        declared = [("norm_type", {n: norm_class(c).reads for n, c in NORMS.items()}, norm.reads if norm else ()),
                    ("norm_placement", {p: c.reads for p, c in PLACEMENT_CLASSES.items()}, self.placement_class.reads),
                    ("residual_gate", {g: (o,) for o, g in GATE_OPTIONS.items()},
                     tuple(o for o, g in GATE_OPTIONS.items() if g == self.residual_gate))]
        problems = []
        for switch, reads_by_choice, read_here in declared:
            for name in sorted({o for reads in reads_by_choice.values() for o in reads}):
                default = GPTConfig.__dataclass_fields__[name].default
                if name in read_here or getattr(self, name) == default:
                    continue
                users = " or ".join(choice for choice, reads in reads_by_choice.items() if name in reads)
                where = (f" under norm_placement {self.norm_placement}, which builds no norm layers"
                         if switch == "norm_type" and norm is None else "")
                problems.append(f"{name} is read only with {switch} {users}, not with {switch} "
                                f"{getattr(self, switch)}{where}; leave {name} at its default ({default!r})")
        return problems

    def stack_problems(self) -> list[str]:
        """The modern block's switches (pos, mlp, split_qkv, the soft-caps, qk_norm_scope and order):
        unknown choices, and combinations that would change nothing or cannot be built
        (``modern_block_problems``)."""
        return modern_block_problems(self)

    def qk_clip_refusal(self) -> str | None:
        """Why QK-Clip (GPT.qk_clip, TrainConfig.qk_clip_tau) cannot act on this model, or None. It
        rescales W_q and W_k; a norm between them and the logits (qk_norm, HybridNorm, nGPT) undoes
        that, and bounds the logits itself (Kimi K2 proposes QK-Clip for MLA, where QK-norm cannot
        be applied)."""
        placement = self.placement_class
        if self.qk_norm:
            return "qk_norm normalizes queries and keys after W_q and W_k, which undoes QK-Clip's rescaling; " \
                   "set qk_norm false or qk_clip_tau 0"
        if placement is not None and (placement.normalizes_qkv or placement.on_sphere):
            return f"norm_placement {self.norm_placement} normalizes queries and keys itself, which undoes " \
                   f"QK-Clip's rescaling; set qk_clip_tau 0"
        return None

    def sphere_problems(self) -> list[str]:
        """nGPT has no norm layers, no biases and no dropout, and does its own QK normalization."""
        placement = self.placement_class
        if placement is None or not placement.on_sphere:
            return []
        why = f"norm_placement {self.norm_placement} keeps the stream and the weights on the unit sphere"
        asked = [(not placement.uses_norm_type and self.norm_type != "none",
                  f"it has no norm layers, so norm_type {self.norm_type!r} would change nothing; set norm_type none"),
                 (self.bias, "its matrices are normalized and it has no biases; set bias false"),
                 (self.dropout > 0, "it moves the stream towards each sublayer's normalized output, which "
                                    "dropout's rescaling has no meaning for; set dropout 0"),
                 (self.qk_norm or self.qk_scale != "fixed", "it normalizes and scales queries and keys itself; "
                                                            "set qk_norm false and qk_scale fixed")]
        return [f"{why}: {text}" for bad, text in asked if bad]

    def qk_problems(self) -> list[str]:
        """qk_scale needs normalized queries and keys; HybridNorm normalizes them already."""
        problems = []
        own = self.placement_class is not None and self.placement_class.normalizes_qkv
        if self.qk_norm and own:
            problems.append(f"norm_placement {self.norm_placement} already normalizes queries, keys and values; "
                            f"set qk_norm false")
        reason = qk_norm_refusal(self.norm_type) if (self.qk_norm or own) and self.norm_type in NORMS else None
        if reason is not None:  # HybridNorm's q, k and v norms are norm_type's, like qk_norm's
            who = "qk_norm" if self.qk_norm else f"norm_placement {self.norm_placement} (it normalizes q, k and v)"
            problems.append(f"{who} cannot be used with norm_type {self.norm_type!r}: {reason}; choose another "
                            f"norm_type" + (" or set qk_norm false" if self.qk_norm else ""))
        if self.qk_scale not in QK_SCALES:
            problems.append(unknown_choice("qk_scale", self.qk_scale, QK_SCALES))
        elif self.qk_scale != "fixed" and not (self.qk_norm or own):
            problems.append(f"qk_scale {self.qk_scale} multiplies the cosine of normalized queries and keys; set "
                            f"qk_norm true (or use norm_placement hybrid), or qk_scale fixed")
        elif (self.qk_scale != "fixed" and reason is None and self.norm_type in NORMS
              and not norm_class(NORMS[self.norm_type]).fixes_vector_size):
            problems.append(f"qk_scale {self.qk_scale} multiplies the cosine of queries and keys, but norm_type "
                            f"{self.norm_type!r} does not give each vector one size, so their product is no cosine; "
                            f"use norm_type rmsnorm or layernorm, or qk_scale fixed")
        elif (self.qk_scale == "learned" and isinstance(self.block_size, int) and not isinstance(self.block_size, bool)
              and self.block_size < 2):
            problems.append(f"qk_scale learned starts at log2(T^2 - T), which needs block_size >= 2, got "
                            f"{self.block_size}")
        return problems

    def identity_norm_problems(self) -> list[str]:
        """emb_norm or final_norm (true or false) switches a norm that norm_type makes the identity
        (norm_type none): the switch would change nothing, so a run would not be the ablation it claims
        to be."""
        if self.norm_type not in NORMS or not norm_class(NORMS[self.norm_type]).is_identity:
            return []
        asked = [name for name, on in (("emb_norm", self.emb_norm), ("final_norm", self.final_norm is not None)) if on]
        return [f"{name} has no effect with norm_type {self.norm_type!r}: that norm is the identity; "
                f"choose a norm_type that normalizes, or " + ("set emb_norm false" if name == "emb_norm" else
                                                              "leave final_norm unset") for name in asked]

    def norm_options(self) -> NormOptions:
        """The options every norm of the model is built with."""
        return NormOptions(eps=self.norm_eps, bias=self.bias, alpha_init=self.dyt_alpha_init,
                           gain_offset=self.norm_gain_offset, derf_alpha_init=self.derf_alpha_init,
                           derf_shift_init=self.derf_shift_init)

    @property
    def mixln_post_blocks(self) -> int:
        """How many blocks, from block 0, Mix-LN makes Post-LN: floor(mixln_alpha * n_layer) (the
        small tolerance keeps e.g. 0.29 * 100 = 28.999999999999996 at 29)."""
        return math.floor(self.mixln_alpha * self.n_layer + 1e-9)

    @property
    def placement_class(self):
        """The Placement class norm_placement names (None for an unknown name, which problems reports)."""
        return PLACEMENT_CLASSES.get(self.norm_placement)

    @property
    def use_final_norm(self) -> bool:
        if self.final_norm is None:
            return self.placement_class.final_norm
        return self.final_norm


def modern_block_problems(cfg: GPTConfig) -> list[str]:
    """GPTConfig.stack_problems: the modern block's switches, one message per problem, each naming the fix."""
    problems = []
    for name, choices in (("pos", POSITIONS), ("mlp", MLPS), ("qk_norm_scope", QK_NORM_SCOPES),
                          ("qk_norm_order", QK_NORM_ORDERS)):
        if getattr(cfg, name) not in choices:
            problems.append(unknown_choice(name, getattr(cfg, name), choices))
    placement = cfg.placement_class
    normalizes_qk = cfg.qk_norm or (placement is not None and placement.normalizes_qkv)
    if cfg.pos == "learned" and cfg.rope_base != 10000.0:
        problems.append(f"rope_base applies to pos rope only, got rope_base {cfg.rope_base:g} with pos learned; "
                        f"set pos rope or leave rope_base at 10000")
    if (cfg.pos == "rope" and isinstance(cfg.n_embd, int) and isinstance(cfg.n_head, int) and cfg.n_head > 0
            and cfg.n_embd % cfg.n_head == 0 and (cfg.n_embd // cfg.n_head) % 2):
        problems.append(f"pos rope rotates pairs of channels, so the head size n_embd / n_head must be even, got "
                        f"{cfg.n_embd // cfg.n_head}; change n_embd or n_head")
    if cfg.qk_norm_order == "rope_norm" and cfg.pos != "rope":
        problems.append("qk_norm_order rope_norm normalizes queries and keys after the rotary embedding, which "
                        "needs pos rope; set pos rope or qk_norm_order norm_rope")
    elif cfg.qk_norm_order == "rope_norm" and not normalizes_qk:
        problems.append("qk_norm_order rope_norm orders the QK-norm and the rotation, but queries and keys are "
                        "not normalized; set qk_norm true or qk_norm_order norm_rope")
    if cfg.qk_norm_scope == "width" and not cfg.qk_norm:
        problems.append("qk_norm_scope width says how qk_norm normalizes, but qk_norm is false; set qk_norm true "
                        "or qk_norm_scope head")
    elif cfg.qk_norm_scope == "width" and cfg.qk_scale != "fixed":
        problems.append(f"qk_scale {cfg.qk_scale} multiplies the cosine of each head's normalized query and key, "
                        f"but qk_norm_scope width normalizes all heads together, so a head's vectors have no "
                        f"fixed size; set qk_norm_scope head or qk_scale fixed")
    if cfg.zero_init_proj and cfg.residual_gate in ("rezero", "skipinit"):
        problems.append(f"zero_init_proj with residual_gate {cfg.residual_gate}: the gate and the projection "
                        f"behind it would both start at 0, so neither gets a gradient; choose one of them")
    if cfg.zero_init_proj and cfg.init_depth_factor is not None:
        problems.append("init_depth_factor scales sa.proj and ffwd.proj, which zero_init_proj starts at 0; "
                        "leave init_depth_factor unset")
    if placement is not None and placement.on_sphere:
        why = f"norm_placement {cfg.norm_placement} keeps the stream and the weights on the unit sphere"
        asked = [(cfg.mlp not in ("gelu", "swiglu"), "its MLP scaling (s_u, s_nu) is written for the gelu and "
                                                     f"swiglu MLPs here, not mlp {cfg.mlp}; set mlp gelu or swiglu"),
                 (cfg.zero_init_proj, "a zero matrix has no direction to put on the sphere; set "
                                       "zero_init_proj false"),
                 (cfg.residual_lambdas, "its stream moves by the alphas and stays on the sphere, which "
                                         "residual_lambdas would scale off it; set residual_lambdas false")]
        problems += [f"{why}: {text}" for bad, text in asked if bad]
    return problems


class KVCache:
    """Keys and values of the positions seen so far, one slot per layer, for fast sampling.

    Preallocated to ``block_size`` positions: a sequence never needs more, since the model
    cannot attend further back than its position embeddings reach (with pos rope: than the
    rotation tables, built for block_size positions, and the windows it was trained on). Under
    pos rope the keys are stored rotated, each at its position in the cache (0 is the first
    token of the context window).
    """

    def __init__(self, cfg: GPTConfig, batch: int, device, dtype):
        shape = (cfg.n_layer, batch, cfg.n_head, cfg.block_size, cfg.n_embd // cfg.n_head)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (L, B, H, block_size, D)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # positions filled so far (the same for every layer after a forward)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store this forward's k, v (B, H, T, D) for ``layer``; return all of them so far."""
        end = self.length + k.shape[2]
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, H, length + T, D)


class Rotary(nn.Module):
    """Rotary position embedding, RoPE (Su et al. 2021, RoFormer, arXiv:2104.09864): channel pair i
    of a query or key at position m is rotated by the angle m * theta_i, theta_i = base^(-2i/D),
    i = 0 .. D/2 - 1, so that q_m . k_n depends on the positions only through m - n (RoFormer eq. 16).

    Pairing: the half-split one, channel i with channel i + D/2 (GPT-NeoX; Hugging Face's LLaMA
    ``rotate_half``; karpathy/nanochat nanochat/gpt.py ``apply_rotary_emb``). RoFormer's paper and
    its code (ZhuiyiTechnology/roformer, on bert4keras) and Meta's LLaMA reference
    (facebookresearch/llama llama/model.py, ``view_as_complex`` on adjacent channels) pair adjacent
    channels (2i, 2i + 1) instead; the two differ by a fixed permutation of W_q's and W_k's rows
    per head, so they train the same. The rotation here is the textbook +angle (nanochat rotates by
    -angle, which its code notes is equivalent). The cos/sin tables, (block_size, D/2), are computed
    in float64 and kept as non-persistent float32 buffers (not in the state dict, rebuilt from the
    config), as nanochat's ``cos``/``sin`` buffers; nanochat keeps them in bfloat16.
    """

    def __init__(self, head_size: int, block_size: int, base: float):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)  # (D/2,)
        angles = torch.outer(torch.arange(block_size, dtype=torch.float64), inv_freq)  # (block_size, D/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x (B, H, T, D) at positions start .. start + T - 1, rotated; same shape and dtype."""
        T = x.shape[-2]
        cos, sin = self.cos[start:start + T].to(x.dtype), self.sin[start:start + T].to(x.dtype)  # (T, D/2)
        x1, x2 = x.chunk(2, dim=-1)  # 2 x (B, H, T, D/2): channel i pairs with channel i + D/2
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, H, T, D)


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap) in float32: x where |x| << cap, bounded by +-cap (Gemma 2, Gemma Team 2024,
    arXiv:2408.00118 §2: 50 on attention logits, 30 on the final ones; code google-deepmind/gemma
    gemma/modules.py and gemma/transformer.py; karpathy/nanochat nanochat/gpt.py caps the output
    logits at 15 in float32)."""
    return cap * torch.tanh(x.float() / cap)


def causal_mask(T: int, total: int, device) -> torch.Tensor:
    """(T, total) bool, True where query t (the last T of ``total`` positions) may see key s: s <= t."""
    return torch.ones(T, total, dtype=torch.bool, device=device).tril(diagonal=total - T)


class QKScale(nn.Module):
    """What multiplies the attention logits of normalized queries and keys, folded into the queries
    (B, H, T, D) so that attention runs with scale 1 and the KV cache keeps plain normalized keys.

    The configured norm leaves each D-vector with RMS about 1 (its gain times x/rms), so q.k / D is
    the cosine of q and k where the gains are 1 (for rmsnorm_noparam, up to the norm's eps).

    - ``learned``: QKNorm (Henry et al. 2020, arXiv:2010.04245; code CyndxAI/QKNorm layers.py,
      ``ScaleUp`` on the L2-normalized q.k): logits = g cos(q, k), one learnable scalar g per
      layer, shared by the heads, from g0 = log2(T^2 - T). The paper takes T as the 97.5th
      percentile of its sentence lengths; every training window here is block_size long. Henry et
      al. normalize with a plain L2 norm; here the configured norm does, with its gain.
    - ``per_head``: the scaled cosine attention of Swin Transformer V2 (Liu et al. 2022,
      arXiv:2111.09883; code microsoft/Swin-Transformer models/swin_transformer_v2.py,
      ``logit_scale``, shape (H, 1, 1)): logits = tau_h cos(q, k), a temperature per head,
      tau_h = exp(min(s_h, log 100)) with s_h from log 10. Of the QK-normed open models checked,
      Qwen3 and Gemma 3 learn a gain per channel of D shared by the heads, OLMo 2 one over the whole
      width, and Cohere's and Chameleon's gains are per head and channel (an implicit per-head
      temperature); Swin V2's is the explicit one.

    Both parameters are 0-d or 1-d, so they are never weight-decayed (GPT.configure_optimizers).
    """

    def __init__(self, kind: str, n_head: int, head_size: int, block_size: int):
        super().__init__()
        self.kind, self.head_size = kind, head_size
        if kind == "learned":
            self.weight = nn.Parameter(torch.tensor(math.log2(block_size ** 2 - block_size)))
        else:  # per_head
            self.weight = nn.Parameter(torch.full((n_head,), math.log(10.0)))

    def factor(self) -> torch.Tensor:
        """The multiplier of q.k, () or (H, 1, 1): g / D, or tau_h / D."""
        if self.kind == "learned":
            return self.weight / self.head_size
        return self.weight.clamp(max=math.log(100.0)).exp().view(-1, 1, 1) / self.head_size

    def forward(self, q: torch.Tensor) -> torch.Tensor:  # (B, H, T, D) -> (B, H, T, D)
        return q * self.factor().to(q.dtype)


class MultiHeadAttention(nn.Module):
    """Causal self-attention: a projection to q, k, v, then H heads in parallel.

    The projection is one fused Linear ``qkv`` (C -> 3C), or with ``split_qkv`` three, ``q``, ``k``
    and ``v`` (C -> C each, as nanochat's c_q, c_k, c_v), so that Muon orthogonalizes each matrix on
    its own. Split layers start from the fused layer's values for the same seed (built from a fused
    layer here, drawn as one (3C, C) matrix by babygpt/init.py), so the two are interchangeable.

    With ``qk_norm``, queries and keys are normalized by the configured norm before the dot product
    (QK-Norm: Henry et al. 2020, arXiv:2010.04245; Dehghani et al. 2023, arXiv:2302.05442). This
    bounds the attention logits, whose growth makes softmax saturate. ``qk_norm_scope`` head: one
    ``q_norm`` and one ``k_norm`` of width D per layer, shared by the heads, each D-vector on its
    own. ``qk_norm_scope`` width: OLMo 2's form (arXiv:2501.00656; allenai/OLMo-core
    src/olmo_core/nn/attention, ``q_norm``/``k_norm`` of size n_heads * head_dim unless
    ``use_head_qk_norm``): one norm of width C over the whole query projection and one over the key
    projection, all heads together, applied as if before the split into heads. With ``qk_scale``
    fixed, the 1/sqrt(D) scale stays, which caps a logit at sqrt(D) times the gains' product:
    attention cannot sharpen past that. ``qk_scale`` learned or per_head lets it (``QKScale``).
    With ``normalize_values`` (HybridNorm) the values get a norm of their own too (``v_norm``).

    With pos rope, queries and keys are rotated per head (``Rotary``) at their positions (in the
    KV cache: after the cached ones). ``qk_norm_order``: norm_rope normalizes and then rotates
    (Qwen3; OLMo 2, whose OLMo-core code norms q and k before ``rope``), rope_norm rotates and then
    normalizes (karpathy/nanochat gpt.py, with a parameter-free RMSNorm). nanochat issue 743 asked
    whether nanochat's order is a bug and concluded that for an RMSNorm without gain the two orders
    are the same (the rotation keeps the RMS), which tests/test_modern_block.py checks; allenai/OLMo
    issue 806 gives OLMo's reason for norm first. With a per-channel gain they differ: a gain after
    the rotation weights the two channels of a rotated pair unequally, so q.k no longer depends on
    the offset alone; norm-then-rotate keeps the relative-position property.

    ``attn_softcap``: the logits are capped, cap * tanh(logits / cap), before the mask and softmax
    (Gemma 2), which needs the explicit path ``attend``; without it the fused kernel
    (F.scaled_dot_product_attention) runs. ``track_max_logit`` (QK-Clip, ``clip_qk``) records each
    head's largest logit of the training forwards, an extra q.k^T without gradients.

    ``dropout`` here is on the attention probabilities only; the dropout of what the
    sublayer writes into the stream is the Block's, since where it belongs depends on
    the placement.
    """

    def __init__(self, cfg: GPTConfig, normalize_values: bool = False, on_sphere: bool = False):
        super().__init__()
        C = cfg.n_embd
        self.n_head = cfg.n_head
        self.head_size = C // cfg.n_head  # D
        self.dropout = cfg.dropout
        self.split = bool(cfg.split_qkv)  # None (not resolved by a TrainConfig) = fused
        if self.split:  # drawn as the fused layer draws, then copied: the same random numbers used
            fused = nn.Linear(C, 3 * C, bias=cfg.bias)
            self.q, self.k, self.v = (nn.utils.skip_init(nn.Linear, C, C, bias=cfg.bias) for _ in range(3))
            with torch.no_grad():
                for i, part in enumerate((self.q, self.k, self.v)):
                    part.weight.copy_(fused.weight[i * C:(i + 1) * C])
                    if cfg.bias:
                        part.bias.copy_(fused.bias[i * C:(i + 1) * C])
        else:
            self.qkv = nn.Linear(C, 3 * C, bias=cfg.bias)
        self.proj = nn.Linear(C, C, bias=cfg.bias)  # writes into the residual stream
        head_size = self.head_size
        self.qk_norm = cfg.qk_norm or normalize_values
        self.width_norm = cfg.qk_norm and cfg.qk_norm_scope == "width"
        if self.qk_norm:
            self.q_norm = make_norm(cfg, C if self.width_norm else head_size)  # over D, or over C
            self.k_norm = make_norm(cfg, C if self.width_norm else head_size)
        self.v_norm = make_norm(cfg, head_size) if normalize_values else None
        self.qk_scale = QKScale(cfg.qk_scale, cfg.n_head, head_size, cfg.block_size) \
            if cfg.qk_scale != "fixed" else None
        # nGPT: q and k on the unit sphere per head, times s_qk (one per head and channel, effective
        # init 1, scale 1/sqrt(C), as the code's sqk), and sqrt(D) as the softmax scale.
        self.sqk = Scale((C,), 1.0, C ** -0.5) if on_sphere else None  # read as (H, 1, D)
        self.rotary = Rotary(head_size, cfg.block_size, cfg.rope_base) if cfg.pos == "rope" else None
        self.rope_first = self.rotary is not None and cfg.qk_norm_order == "rope_norm"
        self.softcap = cfg.attn_softcap
        self.track_max_logit = False  # QK-Clip: set by GPT.track_max_logits
        self.max_logit: torch.Tensor | None = None  # (H,), float32, the largest tracked logit per head

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x (B, T, C): 3 x (B, T, C), from the fused or the split layers."""
        if self.split:
            return self.q(x), self.k(x), self.v(x)
        return self.qkv(x).split(x.shape[-1], dim=2)

    def normalize(self, norm: nn.Module, t: torch.Tensor) -> torch.Tensor:
        """QK-norm of t (B, H, T, D): per head (width D), or (width scope) over the C channels of a
        position, all heads together, as if before the head split."""
        if not self.width_norm:
            return norm(t)
        B, H, T, D = t.shape
        return norm(t.transpose(1, 2).reshape(B, T, H * D)).view(B, T, H, D).transpose(1, 2)

    def heads(self, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x`` (B, T, C) at positions start.., each (B, H, T, D); with
        ``qk_norm`` the queries and keys are normalized (and the values with ``v_norm``), with pos rope
        rotated, in ``qk_norm_order``; with ``qk_scale`` the queries carry the logits' scale."""
        B, T, C = x.shape
        q, k, v = self.project(x)  # 3 x (B, T, C)
        # (B, T, C) -> (B, H, T, D): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.rope_first:
            q, k = self.rotary(q, start), self.rotary(k, start)
        if self.qk_norm:
            q, k = self.normalize(self.q_norm, q), self.normalize(self.k_norm, k)
        if self.rotary is not None and not self.rope_first:
            q, k = self.rotary(q, start), self.rotary(k, start)
        if self.sqk is not None:
            s_qk = self.sqk.value().view(self.n_head, 1, -1)  # (H, 1, D)
            q, k = sphere(q) * s_qk, sphere(k) * s_qk
        if self.v_norm is not None:
            v = self.v_norm(v)
        if self.qk_scale is not None:
            q = self.qk_scale(q)
        return q, k, v

    def scale(self) -> float | None:
        """What the attention kernel multiplies q.k by: 1 where the queries carry it (qk_scale),
        sqrt(D) for nGPT, else None, the kernel's own 1/sqrt(D)."""
        if self.sqk is not None:
            return math.sqrt(self.head_size)
        return 1.0 if self.qk_scale is not None else None

    def scores(self, q: torch.Tensor, k: torch.Tensor, capped: bool = True) -> torch.Tensor:
        """Pre-softmax scores of q (B, H, T, D) against k (B, H, S, D), (B, H, T, S), -inf where the
        causal mask hides a key (q being the last T of the S positions); soft-capped if ``capped``."""
        scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
        scores = scores / math.sqrt(q.shape[-1]) if self.scale() is None else scores * self.scale()
        if capped and self.softcap:
            scores = soft_cap(scores, self.softcap)  # float32
        visible = causal_mask(q.shape[2], k.shape[2], q.device)  # (T, S)
        return scores.masked_fill(~visible, float("-inf"))

    def attention_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The pre-softmax scores of ``x`` (B, T, C), as (B, H, T, T), -inf where the causal mask
        hides a position (soft-capped as the softmax reads them). Forward computes the same inside
        its fused kernel; this explicit version is for diagnostics (their growth saturates the softmax)."""
        q, k, _ = self.heads(x)
        return self.scores(q, k)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Explicit attention (B, H, T, D), for attn_softcap: softmax (in float32) of the capped scores, times v."""
        att = F.softmax(self.scores(q, k).float(), dim=-1).to(v.dtype)  # (B, H, T, S)
        att = F.dropout(att, p=self.dropout, training=self.training)
        return att @ v

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.heads(x, cache.length if cache is not None else 0)  # 3 x (B, H, T, D)
        causal = True
        if cache is not None:
            if cache.length and T != 1:
                raise ValueError("a KV cache takes either a whole prompt (empty cache) or one token")
            causal = cache.length == 0  # one new token may attend to every cached position
            k, v = cache.append(layer, k, v)  # (B, H, length + T, D); keys stored normalized and rotated
        if self.track_max_logit and self.training:
            with torch.no_grad():  # QK-Clip's S_max per head: the raw logits, before any soft-cap
                peak = self.scores(q, k, capped=False).float().amax(dim=(0, 2, 3))  # (H,)
                self.max_logit = peak if self.max_logit is None else torch.maximum(self.max_logit, peak)
        if self.softcap:
            y = self.attend(q, k, v)  # (B, H, T, D)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, dropout_p=self.dropout if self.training else 0.0, scale=self.scale()
            )  # (B, H, T, D); position t attends to positions <= t only
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.proj(y)

    def query_key_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """W_q, W_k (C, C) and their biases (C,) or None: views into the fused layer, or the split ones."""
        if self.split:
            return self.q.weight, self.k.weight, self.q.bias, self.k.bias
        C = self.proj.weight.shape[0]
        b = self.qkv.bias
        return self.qkv.weight[:C], self.qkv.weight[C:2 * C], \
            None if b is None else b[:C], None if b is None else b[C:2 * C]

    @torch.no_grad()
    def clip_qk(self, tau: float, max_logit: torch.Tensor) -> None:
        """QK-Clip of one layer: each head h whose largest logit max_logit[h] (H,) exceeds tau gets its
        query and key rows (and biases) multiplied by sqrt(tau / max_logit[h]), so its logits shrink by
        tau / max_logit[h] (the rotation and the 1/sqrt(D) are linear in q and in k)."""
        gamma = torch.where(max_logit > tau, tau / max_logit.clamp_min(1e-30), torch.ones_like(max_logit))  # (H,)
        factor = gamma.sqrt().repeat_interleave(self.head_size)  # (C,): channel c belongs to head c // D
        for t in self.query_key_weights():
            if t is not None:
                t.mul_((factor.view(-1, 1) if t.dim() == 2 else factor).to(t.dtype))


def ffn_hidden(cfg: GPTConfig) -> int:
    """The MLP's hidden width: 4C, or for swiglu 2/3 of it (Shazeer 2020, arXiv:2002.05202 §2: the
    three matrices of a gated unit at 2/3 the width keep the two-matrix FFN's parameter count),
    rounded to the nearest multiple of 8 (LLaMA rounds up to a multiple of 256, too coarse at this
    width): 8C/3 = 341.3 -> 344 at C = 128, 0.8% more weights than the GELU MLP."""
    if cfg.mlp != "swiglu":
        return 4 * cfg.n_embd
    return max(8, 8 * round(8 * cfg.n_embd / 3 / 8))


class FeedForward(nn.Module):
    """Position-wise MLP, by ``mlp``; its residual dropout is the Block's.

    - gelu: C -> 4C -> GELU -> C (GPT-2), ``fc`` then ``proj``.
    - relu2: the same with ReLU(h)^2 (Primer, So et al. 2021, arXiv:2109.08668 §3; modded-nanogpt
      train_gpt.py and nanochat gpt.py ``F.relu(x).square()``).
    - swiglu: proj(SiLU(fc(x)) * up(x)) (Shazeer 2020, arXiv:2002.05202, FFN_SwiGLU with W = ``fc``,
      V = ``up``, W2 = ``proj``; LLaMA's w1, w3, w2), hidden width ``ffn_hidden``. Gate and up are two
      Linear layers, not one fused (C, 2h) one, so Muon orthogonalizes each. Shazeer and LLaMA have
      no biases; here every Linear follows ``bias`` like the rest of the model (with bias: 2h + C
      bias entries against the GELU MLP's 4C + C).

    ``fc`` (the input matrix, for swiglu the gate) and ``proj`` (the one that writes into the residual
    stream) keep their names in every variant: babygpt/init.py scales ``proj`` by depth, and nGPT
    reads both. Under nGPT (``on_sphere``; gelu or swiglu, relu2 is refused) fc's output is
    multiplied by ``su`` sqrt(C) (a ``Scale`` vector, effective init 1, scale 1): the input and fc's
    rows are unit vectors, so without it every pre-activation would be a cosine of size about
    1/sqrt(C), where GELU and SiLU are nearly linear. With swiglu, ``up``'s output is multiplied by
    ``su_up`` sqrt(C) (the same init and scale), and GPT.after_step keeps ``up``'s rows on the sphere
    like fc's::

        nGPT swiglu:  proj(SiLU(fc(x) * su sqrt(C)) * (up(x) * su_up sqrt(C)))

    nGPT §2.4.2 (Loshchilov et al. 2024, arXiv:2410.01131, eqs. 20-21; §2.6 item 5 gives s_u and
    s_ν init 1, scale 1): u <- u s_u, ν <- ν s_ν sqrt(d_model), so ``su`` is the paper's s_ν (on the
    gate ν = ``fc``) and ``su_up`` its s_u (on u = ``up``). The paper puts sqrt(d_model) on ν only;
    this follows the code (NVIDIA/ngpt model.py, ``Block.forward``: ``uv = suv * c_fc(hin)`` with
    ``suv = self.suv * (suv_init_value / suv_init_scaling) * n_embd ** 0.5``, init 1 and scaling 1,
    then ``u, v = torch.chunk(uv, 2)``, ``u * silu(v)``), whose one ``suv`` over the fused 2h input
    scales both halves by sqrt(C). The difference is the constant sqrt(C) on u, which scales the MLP's
    output as a whole; nGPT reads that output only normalized (and has no biases), so the two are the
    same function of the parameters, forward and gradients alike (up to F.normalize's eps).
    The code's hidden width is 4C per half, this project's ``ffn_hidden`` (8C/3); its gate and up are
    one fused matrix, here two (``su`` keeps its name, so GELU checkpoints load unchanged)."""

    def __init__(self, cfg: GPTConfig, on_sphere: bool = False):
        super().__init__()
        hidden = ffn_hidden(cfg)
        self.kind = cfg.mlp
        self.fc = nn.Linear(cfg.n_embd, hidden, bias=cfg.bias)
        self.up = nn.Linear(cfg.n_embd, hidden, bias=cfg.bias) if cfg.mlp == "swiglu" else None
        self.proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)  # writes into the residual stream
        self.su = Scale((hidden,), 1.0, 1.0) if on_sphere else None  # nGPT: on fc's output (for swiglu s_ν)
        # nGPT with swiglu: on up's output (the paper's s_u), as the code's suv on its half u
        self.su_up = Scale((hidden,), 1.0, 1.0) if on_sphere and self.up is not None else None
        self.width_factor = math.sqrt(cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        h = self.fc(x)  # (B, T, hidden)
        if self.su is not None:
            h = h * (self.su.value() * self.width_factor)
        if self.kind == "relu2":
            h = F.relu(h).square()
        elif self.kind == "swiglu":
            u = self.up(x)  # (B, T, hidden)
            if self.su_up is not None:
                u = u * (self.su_up.value() * self.width_factor)
            h = F.silu(h) * u
        else:
            h = F.gelu(h)
        return self.proj(h)


class Block(nn.Module):
    """One transformer block: ``ln1``, ``ln2`` around ``sa`` (attention) and ``ffwd`` (the MLP), wired
    by the block's ``placement`` (babygpt/placements.py), whose docstring draws its residual path.
    The two most common, for orientation::

        Pre-LN:  x ──┬──────────────────────────► (+) ──┬───────────────────────────────► (+) ──►
                     └─► ln1 ─► sa ─► drop ───────┘     └─► ln2 ─► ffwd ─► drop ──────────┘

        Post-LN: x ──┬──────────────────► (+) ─► ln1 ──┬───────────────────► (+) ─► ln2 ──►
                     └─► sa ─► drop ──────┘            └─► ffwd ─► drop ─────┘

    The others: Sandwich/Peri-LN (``ln1_out``, ``ln2_out`` on the sublayers' outputs), DeepNorm
    (Post-LN with the residual weighted by ``residual_scale``), Admin (Post-LN with the residual
    weighted per channel by ``omega_attn``, ``omega_ffwd``), Mix-LN (Post-LN, then Pre-LN),
    OLMo 2's output norm (``ln1``, ``ln2`` after ``sa``, ``ffwd``), HybridNorm (q, k, v normalized
    in ``sa``, the FFN Post-Norm), HybridNorm* (its block 0 Pre-LN) and nGPT (the stream on the unit
    sphere, moved towards each sublayer's normalized output by ``alpha_attn``, ``alpha_mlp``); Pre-LN's options are
    LayerNorm Scaling (``ln_scale``) and the residual gates (``gate_attn``, ``gate_ffwd``).
    """

    def __init__(self, cfg: GPTConfig, index: int = 0):
        super().__init__()
        # index: this block's position, 0 for the first (Mix-LN, HybridNorm* and LayerNorm Scaling depend on it).
        self.placement = PLACEMENT_CLASSES[cfg.norm_placement].for_block(cfg, index)
        self.ln1 = self.placement.make_ln1(cfg)
        self.sa = MultiHeadAttention(cfg, self.placement.normalizes_qkv, self.placement.on_sphere)
        self.ln2 = make_norm(cfg, cfg.n_embd)
        self.ffwd = FeedForward(cfg, self.placement.on_sphere)
        self.drop = nn.Dropout(cfg.dropout)  # residual dropout, shared by both branches (it has no state)
        self.placement.build(self, cfg, index)  # the placement's own norms and scales

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        # (B, T, C) -> (B, T, C); cache and layer are only used when sampling with a KV cache
        return self.placement.forward(self, x, cache, layer)


def log_partition(logits: torch.Tensor) -> torch.Tensor:
    """log Z = log sum_v exp(logit_v) of logits (..., V), in float32: the softmax's normalizer,
    which cross-entropy subtracts and so leaves free to drift. Its square is the z-loss (PaLM,
    Chowdhery et al. 2022; Wortsman et al. 2023, arXiv:2309.14322), which pulls log Z towards 0."""
    return torch.logsumexp(logits.float(), dim=-1)  # (...)


class QKClipMixin:
    """GPT's QK-Clip side (``TrainConfig.qk_clip_tau``): track each head's largest attention logit,
    then rescale the heads above tau. The optimizer step calls ``qk_clip`` after each update."""

    def track_max_logits(self, on: bool = True) -> None:
        """Start (or stop) recording each head's largest attention logit in training-mode forwards,
        for ``qk_clip``. It costs one explicit q.k^T per layer and forward, without gradients."""
        for block in self.blocks:
            block.sa.track_max_logit, block.sa.max_logit = on, None

    def tracked_max_logits(self) -> torch.Tensor:
        """The largest attention logit per (layer, head) since tracking began or the last ``qk_clip``,
        (L, H) float32: the raw q.k scaled as the softmax reads it, before any attn_softcap."""
        peaks = [block.sa.max_logit for block in self.blocks]
        if any(p is None for p in peaks):
            raise RuntimeError("no attention logits tracked: call track_max_logits(True) and run a training-mode "
                               "forward first")
        return torch.stack(peaks)

    @torch.no_grad()
    def qk_clip(self, tau: float, max_logits: torch.Tensor | None = None) -> torch.Tensor:
        """QK-Clip (Kimi K2, Kimi Team 2025, arXiv:2507.20534 §2.1, MuonClip; Su's blog post
        kexue.fm/archives/11126): after an optimizer step, for every head h of every layer whose
        largest logit S_max^h (``tracked_max_logits``, or ``max_logits`` (L, H), e.g. all-reduced
        with MAX across data-parallel ranks, which must all clip alike) exceeds ``tau``,
        gamma_h = tau / S_max^h and that head's rows of W_q and W_k (and their biases) are each
        multiplied by sqrt(gamma_h), so its logits on the same input become at most tau. This is the
        paper's per-head form for ordinary multi-head attention (it splits gamma as gamma^alpha on
        W_q and gamma^(1 - alpha) on W_k, alpha = 0.5 in K2); K2 itself uses MLA, where the shared
        rotary key is left alone and the per-head rotary query takes all of gamma. Heads below tau
        are untouched. Returns the (L, H) maxima used, and resets tracking (it stays on).

        The paper offers QK-Clip where QK-norm cannot be used (MLA never materializes full keys); a
        norm between W_q, W_k and the logits undoes the rescaling, so a model with qk_norm,
        HybridNorm or nGPT refuses (``GPTConfig.qk_clip_refusal``)."""
        refusal = self.config.qk_clip_refusal()
        if refusal is not None:
            raise ValueError(f"qk_clip: {refusal}")
        peaks = self.tracked_max_logits() if max_logits is None else max_logits.float()  # (L, H)
        for block, peak in zip(self.blocks, peaks):
            block.sa.clip_qk(tau, peak)
            block.sa.max_logit = None
        return peaks


class GPT(QKClipMixin, nn.Module):
    """Token (+ learned position) embeddings -> n_layer Blocks -> ln_f -> LM head tied to the token
    embedding (-> logit soft-cap). With pos rope there is no ``pos_emb``: positions enter in each
    attention layer (``Rotary``)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos == "learned" else None
        # Peri-LN's embedding norm (emb_norm); the identity otherwise, so the state dict keeps its keys.
        self.ln_emb = make_norm(cfg, cfg.n_embd, None if cfg.emb_norm else "none")
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, index) for index in range(cfg.n_layer))
        self.ln_f = make_norm(cfg, cfg.n_embd, None if cfg.use_final_norm else "none")
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        # Weight tying (Press & Wolf 2017): the output layer reuses the input embedding matrix.
        self.lm_head.weight = self.tok_emb.weight
        # Xavier init ("unit" embeddings) gives the token embeddings std 1/sqrt(C); scaling them by sqrt(C) on the
        # way in starts the stream at unit RMS (Vaswani et al. 2017), while the tied LM head reads
        # the unscaled matrix. GPT-2 init has no such factor. DyT's LLaMA recipe (Zhu et al. 2025,
        # the authors' other_tasks/LLaMA code) makes it a learnable scalar starting at sqrt(C),
        # on N(0, 0.02) embeddings: their stream starts at RMS 0.02 sqrt(C), not 0.03. Fidelity: their
        # GPT-2 port (as the issue reads the authors' code) multiplies token + position embeddings by
        # the scalar; here only the token embeddings are scaled, so that one switch means the same with
        # pos learned and pos rope, and the position embeddings keep the N(0, 0.02) scale they have in
        # every other run of this project. A run comparing against their GPT-2 numbers should note it.
        scale = math.sqrt(cfg.n_embd) if init_parts(cfg).embedding == "unit" or cfg.emb_scale_learnable else 1.0
        self.emb_scale = nn.Parameter(torch.tensor(scale)) if cfg.emb_scale_learnable else scale  # () or float
        # nGPT (babygpt/placements.py, NGPT): the stream and the matrices on the unit sphere, and the
        # logits scaled per vocabulary entry by s_z (effective init 1, scale 1/sqrt(C), as the code's sz).
        self.on_sphere = PLACEMENT_CLASSES[cfg.norm_placement].on_sphere
        self.logit_scale = Scale((cfg.vocab_size,), 1.0, cfg.n_embd ** -0.5) if self.on_sphere else None
        # residual_lambdas (modded-nanogpt train_gpt.py, Block.lambdas = [1., 0.], x = l0 x + l1 x0
        # before each block; karpathy/nanochat gpt.py resid_lambdas, x0_lambdas): one scalar pair per
        # block, the stream's weight from 1 and the embedding's from 0, as modded-nanogpt (and nanochat
        # at first) start them, so the model starts as the one without them. nanochat now starts them
        # per layer at 1.15 -> 1.05 and 0.20 -> 0.05, tuned for its depth-12+ models; not followed.
        # Vectors (L,), never weight-decayed (configure_optimizers).
        if cfg.residual_lambdas:
            self.resid_lambdas = nn.Parameter(torch.ones(cfg.n_layer))
            self.x0_lambdas = nn.Parameter(torch.zeros(cfg.n_layer))
        else:
            self.resid_lambdas = self.x0_lambdas = None
        init_weights(self)  # by cfg.init: see babygpt/init.py
        self.after_step()  # nGPT: its matrices start on the sphere, as the code normalizes them before step 0

    def num_params(self) -> int:
        """Number of distinct parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The stream block 0 reads: token + position embeddings of idx (B, T) at positions start.., (B, T, C).
        With pos rope, the token embeddings only."""
        if self.pos_emb is None:
            x = self.drop(self.ln_emb(self.tok_emb(idx) * self.emb_scale))
        else:
            pos = torch.arange(start, start + idx.shape[1], device=idx.device)  # (T,)
            x = self.drop(self.ln_emb(self.tok_emb(idx) * self.emb_scale + self.pos_emb(pos)))
        return sphere(x) if self.on_sphere else x

    @torch.no_grad()
    def after_step(self) -> None:
        """After every optimizer step (and once at init): nGPT puts each matrix back on the unit
        sphere along its embedding dimension (the code's normalize_matrices): the rows of the token
        embedding (and so of the tied LM head), of qkv (or q, k, v), of fc and (swiglu) of up, and the
        columns of the two projections that write into the stream. Nothing for the other placements."""
        if not self.on_sphere:
            return
        matrices = [(self.tok_emb.weight, 1)]
        for block in self.blocks:
            sa = block.sa
            qkv = [sa.q.weight, sa.k.weight, sa.v.weight] if sa.split else [sa.qkv.weight]  # rows: the same
            ffwd = block.ffwd
            up = [(ffwd.up.weight, 1)] if ffwd.up is not None else []  # swiglu: the code's c_fc, both halves
            matrices += [(w, 1) for w in qkv] + [(sa.proj.weight, 0), (ffwd.fc.weight, 1)] + up + \
                [(ffwd.proj.weight, 0)]
        for weight, dim in matrices:
            weight.copy_(F.normalize(weight.float(), dim=dim).to(weight.dtype))

    def hidden(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The final hidden state (B, T, C) of token ids idx (B, T): the stream after the last
        block and ln_f, which the LM head reads. With a ``cache``, idx continues the sequence
        already in it (its positions start at ``cache.length``)."""
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size {self.config.block_size}")
        x = self.embed(idx, start)  # (B, T, C)
        x0 = x  # the embedding output, which residual_lambdas mix back in before every block
        for layer, block in enumerate(self.blocks):
            if self.resid_lambdas is not None:
                x = self.resid_lambdas[layer] * x + self.x0_lambdas[layer] * x0  # (B, T, C)
            x = block(x, cache, layer)  # (B, T, C)
        if cache is not None:
            cache.length += T
        return self.ln_f(x)

    @torch.no_grad()
    def profile_init(self, idx: torch.Tensor) -> bool:
        """Let placements that set their init from a forward pass (Admin's omega) do it, on token ids
        idx (B, T), in eval mode (no dropout, no random numbers drawn); True if one did. A run from
        scratch calls this once before training."""
        if not any(b.placement.profiles for b in self.blocks):
            return False
        was_training = self.training
        self.eval()
        x = self.embed(idx)  # (B, T, C); residual_lambdas start at 1 and 0, so leaving them out changes nothing
        omega = 1.0  # the code's running ratio starts at 1
        for block in self.blocks:
            x, omega = block.placement.profile(block, x, omega)
        self.train(was_training)
        return True

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        """idx, targets: (B, T) token ids. Returns logits (B, T, V) and the mean
        cross-entropy loss (a scalar; None without targets); ``cache`` as in ``hidden``. With
        logit_softcap the logits are cap * tanh(logits / cap), in float32 (``soft_cap``)."""
        x = self.hidden(idx, cache)  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, V)
        if self.logit_scale is not None:  # nGPT's s_z
            logits = logits * self.logit_scale.value().to(logits.dtype)
        if self.config.logit_softcap:
            logits = soft_cap(logits, self.config.logit_softcap)  # (B, T, V), float32, within +-cap
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss

    def context_start(self, length: int) -> int:
        """Where the context window starts when the sequence so far has ``length`` tokens.

        Learned absolute positions mean that sliding the window by one token changes every
        position, so nothing cached survives a slide. The window therefore slides in jumps
        of block_size // 8: it keeps between 7/8 and all of block_size tokens, and the KV
        cache is rebuilt once per jump instead of once per token. Sampling with and without
        the cache follows this same rule, so both give the same tokens.

        With pos rope only relative positions matter, so a window may start anywhere: its tokens
        are rotated from position 0 again, with or without the cache. The same jumps are kept
        anyway: sliding by one would need a cache rebuilt every token (or a rolling cache whose
        keys sit at absolute angles beyond block_size, rounded differently from a fresh
        window's, so cached and uncached samples could part on a near-tie)."""
        block, jump = self.config.block_size, max(1, self.config.block_size // 8)
        if length <= block:
            return 0
        return -(-(length - block) // jump) * jump  # the first multiple of jump that fits

    @torch.inference_mode()
    def generate_iter(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                      top_k: int | None = None, generator: torch.Generator | None = None,
                      use_cache: bool = True) -> Iterator[torch.Tensor]:
        """Yield one (B, 1) tensor of new token ids per step. ``temperature`` 0 means greedy
        (argmax). With ``use_cache``, keys and values of the context are kept between steps
        (KVCache) so that each step runs the model on one new token only. inference_mode (not
        just no_grad) skips autograd's bookkeeping on every op, which is a large share of a
        one-token step on CPU; the tokens it yields are ordinary tensors once concatenated."""
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        if top_k is not None and not 1 <= top_k <= self.config.vocab_size:
            raise ValueError(f"top_k must be in 1..{self.config.vocab_size}, got {top_k}")
        # Sampling is inference: dropout off and BatchNorm on its running statistics, whatever mode the
        # model was left in (a training-mode BatchNorm would also make cached steps differ from
        # recomputation); the mode is put back when generation ends.
        was_training = self.training
        self.eval()
        try:
            yield from self._generate(idx, max_new_tokens, temperature, top_k, generator, use_cache)
        finally:
            self.train(was_training)

    def _generate(self, idx, max_new_tokens, temperature, top_k, generator, use_cache) -> Iterator[torch.Tensor]:
        cache, cache_start = None, -1
        for _ in range(max_new_tokens):
            start = self.context_start(idx.shape[1])
            if not use_cache:
                logits = self(idx[:, start:])[0]  # the whole window, recomputed
            elif start != cache_start:  # first step, or the window jumped: fill a new cache
                cache, cache_start = KVCache(self.config, idx.shape[0], idx.device, self.tok_emb.weight.dtype), start
                logits = self(idx[:, start:], cache=cache)[0]
            else:
                logits = self(idx[:, -1:], cache=cache)[0]  # only the newest token
            logits = logits[:, -1, :].float()  # (B, V), next-token logits
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                # Subtracting the max first keeps a tiny temperature from turning logits into inf - inf.
                logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
                if top_k is not None:
                    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, next_id], dim=1)
            yield next_id

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None,
                 use_cache: bool = True) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens sampled tokens; returns (B, T + max_new_tokens)."""
        new = list(self.generate_iter(idx, max_new_tokens, temperature, top_k, generator, use_cache))
        return torch.cat([idx, *new], dim=1)

    def configure_optimizers(self, weight_decay: float, learning_rate: float,
                             betas: tuple[float, float] = (0.9, 0.99), fused: bool = False,
                             eps: float = 1e-8):
        """AdamW with two groups: matrices (dim >= 2: embeddings, Linear weights) are
        decayed; vectors and scalars (norm gains and biases, ScaleNorm's g, DyT's alpha, the
        residual gates) are not, since shrinking a gain towards zero fights the normalization it belongs to (the
        learnable embedding scale, a gain too, is not decayed either)."""
        params = list(self.parameters())  # distinct tensors; the tied weight once
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        # The dim rule must agree with what the parameters are: a norm class with a matrix-shaped
        # parameter would otherwise be decayed without anyone noticing.
        expected = {id(p) for m in self.modules() if isinstance(m, Norm) for p in m.parameters()}
        expected |= {id(self.emb_scale)} if isinstance(self.emb_scale, nn.Parameter) else set()
        expected |= {id(p) for p in (self.resid_lambdas, self.x0_lambdas) if p is not None}
        # ReZero's and SkipInit's alpha, LayerScale's lambda, Admin's omega, QK-norm's learned scales
        expected |= {id(m.weight) for m in self.modules() if isinstance(m, (Gate, QKScale, Scale))}
        expected |= {id(m.bias) for m in self.modules() if isinstance(m, nn.Linear) and m.bias is not None}
        assert {id(p) for p in no_decay} == expected, "norm/bias parameters must be exactly the non-decayed group"
        assert len(decay) + len(no_decay) == len(params), "every parameter must be in exactly one optimizer group"
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=fused)
