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
from .options import Range, float_problems, option
from .placements import PLACEMENTS as PLACEMENT_CLASSES
from .placements import Gate, Scale, make_norm, sphere

PLACEMENTS = tuple(PLACEMENT_CLASSES)  # norm_placement's choices (babygpt/placements.py)
RESIDUAL_GATES = ("none", "rezero", "skipinit", "layerscale")  # what scales a Pre-LN sublayer's output
QK_SCALES = ("fixed", "learned", "per_head")  # what multiplies q.k once queries and keys are normalized
INITS = ("gpt2", "xavier")  # see babygpt/init.py
INIT_LINEAR = ("normal", "xavier")
INIT_EMBEDDING = ("small", "unit")


@dataclass
class GPTConfig(Checked):
    """The model's hyperparameters, declared only here: the training config holds one and
    reads each field's type and help text from this class."""

    vocab_size: int = option(65, "set from the data's vocabulary")
    block_size: int = option(64, "context length in characters")
    n_layer: int = option(4, "number of transformer blocks")
    n_head: int = option(4, "attention heads per block (must divide n_embd)")
    n_embd: int = option(128, "model width")
    dropout: float = option(0.0, "dropout probability", valid=Range(0, 1, high_open=True))
    bias: bool = option(True, "biases in Linear layers, and beta in LayerNorm, DyT and BatchNorm")
    norm_type: str = option("rmsnorm", "one of: " + ", ".join(NORMS))
    norm_placement: str = option("pre", "one of: " + ", ".join(PLACEMENTS))
    norm_eps: float = option(1e-5, "epsilon inside every norm", valid=EPS_RANGE)
    final_norm: Optional[bool] = option(
        None, "norm before the LM head; none = as the placement declares it (off for post, deepnorm and admin, "
              "whose last norm already normalizes the output, and for ngpt, whose stream is on the sphere; on for "
              "the others)")
    qk_norm: bool = option(False, "normalize queries and keys per head with norm_type before attention")
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
        problems = []
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if (isinstance(self.n_embd, int) and isinstance(self.n_head, int) and self.n_head > 0
                and self.n_embd > 0 and self.n_embd % self.n_head != 0):
            problems.append(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        problems += float_problems(self)
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
        elif self.residual_gate != "none" and self.norm_placement != "pre":
            problems.append(f"residual_gate {self.residual_gate} applies to norm_placement pre only (it scales what "
                            f"a sublayer adds to the stream), got {self.norm_placement!r}")
        if self.ln_scaling and self.norm_placement != "pre":
            problems.append(f"ln_scaling applies to norm_placement pre only (LayerNorm Scaling scales the "
                            f"Pre-LN norms), got norm_placement {self.norm_placement!r}; set ln_scaling false")
        if self.init_depth_factor is not None and self.norm_placement == "deepnorm":
            problems.append("init_depth_factor does not apply to norm_placement deepnorm (its beta gains are its "
                            "depth scaling); leave init_depth_factor unset")
        # The norm options are fields here, checked above by the same declared ranges: each problem once.
        problems += [p for p in self.norm_options().problems() if p not in problems]
        return problems + self.qk_problems() + self.sphere_problems() + self.identity_norm_problems()

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
        """emb_norm (or final_norm=true) asks for a norm that norm_type makes the identity (norm_type
        none): the switch would change nothing, so a run would not be the ablation it claims to be."""
        if self.norm_type not in NORMS or not norm_class(NORMS[self.norm_type]).is_identity:
            return []
        asked = [name for name, on in (("emb_norm", self.emb_norm), ("final_norm", self.final_norm is True)) if on]
        return [f"{name} has no effect with norm_type {self.norm_type!r}: that norm is the identity; "
                f"choose a norm_type that normalizes, or set {name} false" for name in asked]

    def norm_options(self) -> NormOptions:
        """The options every norm of the model is built with."""
        return NormOptions(eps=self.norm_eps, bias=self.bias, alpha_init=self.dyt_alpha_init)

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


class KVCache:
    """Keys and values of the positions seen so far, one slot per layer, for fast sampling.

    Preallocated to ``block_size`` positions: a sequence never needs more, since the model
    cannot attend further back than its position embeddings reach.
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
    """Causal self-attention: one fused projection to q, k, v, then H heads in parallel.

    With ``qk_norm``, queries and keys are normalized per head, over the head size D,
    by the configured norm before the dot product (QK-Norm: Henry et al. 2020,
    arXiv:2010.04245; Dehghani et al. 2023, arXiv:2302.05442). This bounds the
    attention logits, whose growth makes softmax saturate. One ``q_norm`` and one
    ``k_norm`` per layer, shared by all heads. With ``qk_scale`` fixed, the 1/sqrt(D) scale
    stays, which caps a logit at sqrt(D) times the gains' product: attention cannot sharpen
    past that. ``qk_scale`` learned or per_head lets it (``QKScale``). With
    ``normalize_values`` (HybridNorm) the values get a norm of their own too (``v_norm``).

    ``dropout`` here is on the attention probabilities only; the dropout of what the
    sublayer writes into the stream is the Block's, since where it belongs depends on
    the placement.
    """

    def __init__(self, cfg: GPTConfig, normalize_values: bool = False, on_sphere: bool = False):
        super().__init__()
        self.n_head = cfg.n_head
        self.head_size = cfg.n_embd // cfg.n_head  # D
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)  # writes into the residual stream
        head_size = self.head_size
        self.qk_norm = cfg.qk_norm or normalize_values
        if self.qk_norm:
            self.q_norm = make_norm(cfg, head_size)  # over D
            self.k_norm = make_norm(cfg, head_size)
        self.v_norm = make_norm(cfg, head_size) if normalize_values else None
        self.qk_scale = QKScale(cfg.qk_scale, cfg.n_head, head_size, cfg.block_size) \
            if cfg.qk_scale != "fixed" else None
        # nGPT: q and k on the unit sphere per head, times s_qk (one per head and channel, effective
        # init 1, scale 1/sqrt(C), as the code's sqk), and sqrt(D) as the softmax scale.
        self.sqk = Scale((cfg.n_embd,), 1.0, cfg.n_embd ** -0.5) if on_sphere else None  # read as (H, 1, D)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x`` (B, T, C), each (B, H, T, D); with ``qk_norm`` the
        queries and keys are normalized, each D-vector on its own (and the values with ``v_norm``);
        with ``qk_scale`` the queries carry the logits' scale."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        # (B, T, C) -> (B, H, T, D): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
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

    def attention_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The pre-softmax scores of ``x`` (B, T, C), as (B, H, T, T), -inf where the causal mask
        hides a position. Forward computes the same inside its fused kernel; this explicit
        version is for diagnostics (their growth saturates the softmax)."""
        q, k, _ = self.heads(x)
        T = x.shape[1]
        scores = q @ k.transpose(-2, -1)  # (B, H, T, T)
        scores = scores / math.sqrt(q.shape[-1]) if self.scale() is None else scores * self.scale()
        visible = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        return scores.masked_fill(~visible, float("-inf"))

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.heads(x)  # 3 x (B, H, T, D)
        causal = True
        if cache is not None:
            if cache.length and T != 1:
                raise ValueError("a KV cache takes either a whole prompt (empty cache) or one token")
            causal = cache.length == 0  # one new token may attend to every cached position
            k, v = cache.append(layer, k, v)  # (B, H, length + T, D); keys stored normalized
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, dropout_p=self.dropout if self.training else 0.0, scale=self.scale()
        )  # (B, H, T, D); position t attends to positions <= t only
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.proj(y)


class FeedForward(nn.Module):
    """Position-wise MLP: C -> 4C -> GELU -> C. Its residual dropout is the Block's. Under nGPT
    (``on_sphere``) the hidden pre-activation is multiplied by s_u sqrt(C) (``su``, effective init 1):
    the input and fc's rows are unit vectors, so without it every pre-activation would be a cosine
    of size about 1/sqrt(C), where GELU is nearly linear (nGPT §2.4; its code scales its SwiGLU
    input, both halves, the same way)."""

    def __init__(self, cfg: GPTConfig, on_sphere: bool = False):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)  # writes into the residual stream
        self.su = Scale((4 * cfg.n_embd,), 1.0, 1.0) if on_sphere else None
        self.width_factor = math.sqrt(cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        h = self.fc(x)  # (B, T, 4C)
        if self.su is not None:
            h = h * (self.su.value() * self.width_factor)
        return self.proj(F.gelu(h))


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


class GPT(nn.Module):
    """Token + position embeddings -> n_layer Blocks -> ln_f -> LM head tied to the token embedding."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
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
        # on N(0, 0.02) embeddings: their stream starts at RMS 0.02 sqrt(C), not 0.03.
        scale = math.sqrt(cfg.n_embd) if init_parts(cfg).embedding == "unit" or cfg.emb_scale_learnable else 1.0
        self.emb_scale = nn.Parameter(torch.tensor(scale)) if cfg.emb_scale_learnable else scale  # () or float
        # nGPT (babygpt/placements.py, NGPT): the stream and the matrices on the unit sphere, and the
        # logits scaled per vocabulary entry by s_z (effective init 1, scale 1/sqrt(C), as the code's sz).
        self.on_sphere = PLACEMENT_CLASSES[cfg.norm_placement].on_sphere
        self.logit_scale = Scale((cfg.vocab_size,), 1.0, cfg.n_embd ** -0.5) if self.on_sphere else None
        init_weights(self)  # by cfg.init: see babygpt/init.py
        self.after_step()  # nGPT: its matrices start on the sphere, as the code normalizes them before step 0

    def num_params(self) -> int:
        """Number of distinct parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The stream block 0 reads: token + position embeddings of idx (B, T) at positions start.., (B, T, C)."""
        pos = torch.arange(start, start + idx.shape[1], device=idx.device)  # (T,)
        x = self.drop(self.ln_emb(self.tok_emb(idx) * self.emb_scale + self.pos_emb(pos)))
        return sphere(x) if self.on_sphere else x

    @torch.no_grad()
    def after_step(self) -> None:
        """After every optimizer step (and once at init): nGPT puts each matrix back on the unit
        sphere along its embedding dimension (the code's normalize_matrices): the rows of the token
        embedding (and so of the tied LM head), of qkv and of fc, and the columns of the two
        projections that write into the stream. Nothing for the other placements."""
        if not self.on_sphere:
            return
        matrices = [(self.tok_emb.weight, 1)]
        for block in self.blocks:
            matrices += [(block.sa.qkv.weight, 1), (block.sa.proj.weight, 0),
                         (block.ffwd.fc.weight, 1), (block.ffwd.proj.weight, 0)]
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
        for layer, block in enumerate(self.blocks):
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
        x = self.embed(idx)  # (B, T, C)
        omega = 1.0  # the code's running ratio starts at 1
        for block in self.blocks:
            x, omega = block.placement.profile(block, x, omega)
        self.train(was_training)
        return True

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        """idx, targets: (B, T) token ids. Returns logits (B, T, V) and the mean
        cross-entropy loss (a scalar; None without targets); ``cache`` as in ``hidden``."""
        x = self.hidden(idx, cache)  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, V)
        if self.logit_scale is not None:  # nGPT's s_z
            logits = logits * self.logit_scale.value().to(logits.dtype)
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
        the cache follows this same rule, so both give the same tokens."""
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
