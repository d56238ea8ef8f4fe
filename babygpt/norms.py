"""Normalization layers, written from scratch, behind one explicit registry.

Every norm acts over the last dimension (the width d: n_embd in a block, the head
size D for the query/key norms). All but ``BatchNorm`` keep one set of statistics
per position, so they never mix information across positions or sequences;
``BatchNorm`` is here to show what goes wrong when a norm does.

Each class computes in (at least) float32 and casts the result back to the input dtype:
under float16 the squares inside a norm overflow long before the activations
themselves do (300.0 ** 2 = 90000 > 65504, the largest float16).

The contract
------------
- Every class derives from ``Norm`` and is built as ``Cls(dim, options, **overrides)``:
  ``options`` is a ``NormOptions`` (eps, bias, alpha_init, gain_offset, derf_alpha_init,
  derf_shift_init), ``overrides`` replace some of
  its fields (``LayerNorm(64, eps=1e-6)``), and a misspelt override is a TypeError. A class
  reads only the options it has a use for.
- What a norm *does*, as far as the rest of the code needs to know, is declared by the
  class attributes of ``Norm`` (``mixes_positions``, ``is_identity``, ``fixes_vector_size``, ``squashes``,
  ``has_gain``), which a class overrides where it differs. Nothing reads behaviour from a norm's registry name:
  ``qk_norm_refusal``, ``gain_offset_refusal`` and the tests ask the class, through ``norm_class``.
- ``NORMS`` maps each valid ``norm_type`` to a class, or to a ``functools.partial`` of one
  whose keywords fix some options (they take precedence over the options ``build_norm``
  passes). ``build_norm`` is the only way the model constructs a norm.

To add a variant: write a ``Norm`` subclass here with that constructor (apply the overrides
first, ``options = options.with_overrides(overrides)``; set ``mixes_positions`` / ``is_identity`` /
``has_gain`` / ... if they differ from the defaults; build a gain with ``_gain_parameter`` and read it
with ``gamma``, so that ``gain_offset`` reaches it) and add one line to ``NORMS``. If it needs a new
option, add a field to ``NormOptions`` (with its check in ``NormOptions.problems``), the matching field to
``model.GPTConfig`` and one line to ``GPTConfig.norm_options``; nothing else changes. The
placement x norm_type grid of the tests (tests/conftest.py) reads ``NORMS``, so a new entry
is covered by them without a test edit.

Unit-offset gains (``gain_offset``, GPTConfig's ``norm_gain_offset``)
---------------------------------------------------------------------
Every gain a norm has is stored as w and used as gamma = g0 + w, w starting at 0, where g0 is the gain's
plain init (1 for the per-channel gains, sqrt(d) for ScaleNorm's scalar g). This is Gemma's RMSNorm
(google-deepmind/gemma, gemma/gm/nn/_layers.py ``RMSNorm``: a ``scale`` initialised to zeros, used as
``1 + scale``) and x-transformers' ``unit_offset`` (lucidrains/x-transformers, x_transformers.py: LayerNorm,
RMSNorm, ScaleNorm, DynamicTanh, Derf; its ``norm_add_unit_offset`` turns it on for every norm by
default, with the comment that the gammas can then be weight-decayed safely). At init the output is the
plain norm's, and Adam moves w exactly as it would move gamma (same gradient); what changes is what
weight decay pulls towards: decaying w pulls gamma to g0, decaying gamma pulls it to 0 and fights the
normalization. Two consequences here: (1) ``GPT.configure_optimizers`` never decays a norm parameter,
so under AdamW the option changes nothing but float rounding (gamma = g0 + w is rounded where gamma
itself would be stored), and it matters once something decays norm parameters; (2) only the gain is
offset. Where this differs from x-transformers: its ScaleNorm and RMSNorm multiply a fixed sqrt(d) by
(1 + w) (here ScaleNorm's g = sqrt(d) + w, so that Adam moves g exactly as without the offset), and its
DynamicTanh and Derf also offset alpha (DyT by alpha's init, Derf by 1); here alpha is never offset. A
norm without a gain (``rmsnorm_noparam``, ``none``: ``has_gain = False``) ignores the option, and
``NormOptions.problems(norm_type)`` refuses it for such a norm_type.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import unknown_choice
from .options import Range

# The values of the norm options a user sets (GPTConfig's norm_eps and dyt_alpha_init), declared once:
# GPTConfig's fields and NormOptions.problems both check these.
EPS_RANGE = Range(0, low_open=True)
ALPHA_INIT_RANGE = Range(0, low_open=True)
SHIFT_INIT_RANGE = Range(-10, 10)  # Derf's s: erf is flat (|erf'| < 1e-40) far beyond +-10


@dataclasses.dataclass(frozen=True)
class NormOptions:
    """The options a norm may read; each class reads only those it has a use for.

    - ``eps``: added to the variance / mean square before the square root (LayerNorm,
      RMSNorm, RMSNormNoParam, BatchNorm); a floor on the L2 norm for ScaleNorm; unused by DyT.
    - ``bias``: whether the norm has an additive beta (LayerNorm, DyT, BatchNorm); the
      others have none whatever its value.
    - ``alpha_init``: the initial value of DyT's learnable scalar alpha (0.5 is the paper's default).
    - ``gain_offset``: store each gain as w, used as g0 + w with w starting at 0 (see the module
      docstring); read by every class with ``has_gain``.
    - ``derf_alpha_init``, ``derf_shift_init``: the initial alpha and s of Derf, erf(alpha x + s).

    Frozen, so that one instance can be the shared default of every constructor.
    """

    eps: float = 1e-5
    bias: bool = True
    alpha_init: float = 0.5
    gain_offset: bool = False
    derf_alpha_init: float = 0.5
    derf_shift_init: float = 0.0

    def with_overrides(self, overrides: dict) -> "NormOptions":
        """These options with ``overrides`` applied (a norm's ``**overrides``, or a partial's
        keywords); an unknown name is a TypeError, so a misspelt option never goes unnoticed."""
        return dataclasses.replace(self, **overrides)

    def problems(self, norm_type: str | None = None) -> list[str]:
        """Every invalid option, one message each; with ``norm_type`` (a registered name), also the
        options that registered norm cannot honour. The messages name GPTConfig's fields (norm_eps,
        dyt_alpha_init, ...), since those are what a user sets."""
        problems = [EPS_RANGE.problem("norm_eps", self.eps),
                    ALPHA_INIT_RANGE.problem("dyt_alpha_init", self.alpha_init),
                    ALPHA_INIT_RANGE.problem("derf_alpha_init", self.derf_alpha_init),
                    SHIFT_INIT_RANGE.problem("derf_shift_init", self.derf_shift_init)]
        if norm_type is not None and self.gain_offset:
            why = gain_offset_refusal(norm_type)
            if why:
                problems.append(f"norm_gain_offset has no effect with norm_type {norm_type}: {why}; "
                                "set norm_gain_offset false")
        return [p for p in problems if p]


class Norm(nn.Module):
    """The base of every registered norm, declaring what a norm does as class attributes.

    A subclass overrides an attribute only where it differs from these defaults. The model
    and the config checks read these, never a norm's registry name.
    """

    # The output at one position depends on other positions or sequences (BatchNorm's training
    # statistics over batch and time): the model is then not causal, and q/k norms could look ahead.
    mixes_positions = False
    # The output is the input, unchanged (NoNorm): as a query/key norm it would do nothing.
    is_identity = False
    # Every output vector has one size, set by the gain alone (LayerNorm, RMSNorm, ScaleNorm): the dot
    # product of two normalized vectors is then a scaled cosine, which qk_scale learned/per_head assume.
    fixes_vector_size = False
    # The output flattens out for large inputs (DyT's tanh). Such a class defines ``squash_input(x)``,
    # what goes into its squashing function, and ``saturation``, the size of that input from which on
    # the curve counts as flat; the diagnostics measure both.
    squashes = False
    # The norm has a learnable gain (a per-channel gamma, or ScaleNorm's scalar g), built with
    # ``_gain_parameter`` and read with ``gamma``, which gain_offset re-parametrizes as g0 + w.
    has_gain = False
    # What the gain's parameter stores beyond the gain itself: 0.0, or g0 under gain_offset (set by
    # _gain_parameter; a class without a gain keeps 0.0).
    gain_offset = 0.0
    gain_name = "weight"  # the attribute that holds the gain's parameter (ScaleNorm: "gain")
    # The GPTConfig norm options this class reads (norm_eps, dyt_alpha_init, ...): another class's
    # option set away from its default is refused (GPTConfig.unread_option_problems), never ignored.
    reads: tuple[str, ...] = ()

    def _gain_parameter(self, shape: tuple[int, ...], init: float, offset: bool) -> nn.Parameter:
        """The gain's parameter: ``init`` everywhere, or, with ``offset``, 0 everywhere and read as
        ``init`` + w (``gamma``). Store it under ``gain_name``."""
        self.gain_offset = float(init) if offset else 0.0
        return nn.Parameter(torch.full(shape, 0.0 if offset else float(init)))

    def gamma(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The gain the norm multiplies by (g0 + w under gain_offset), cast to ``dtype`` first so that
        the offset is added in the compute dtype, not in a low-precision parameter's."""
        w = getattr(self, self.gain_name)
        w = w if dtype is None else w.to(dtype)
        return w + self.gain_offset if self.gain_offset else w


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32, or the input's dtype if that is wider (float64 stays float64)."""
    return torch.promote_types(x.dtype, torch.float32)


def _offset_repr(norm: "Norm") -> str:
    """extra_repr's note of a unit-offset gain (nothing without one)."""
    return f", gain_offset={norm.gain_offset:g}" if norm.gain_offset else ""


def _affine(y: torch.Tensor, weight, bias, dtype: torch.dtype) -> torch.Tensor:
    """y * weight (+ bias), cast back to the input's ``dtype``: the shared tail of the norms."""
    y = y * weight
    if bias is not None:
        y = y + bias
    return y.to(dtype)


def _rms_normalize(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension; (..., d) -> (..., d)."""
    ms = xf.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
    return xf * torch.rsqrt(ms + eps)


class LayerNorm(Norm):
    """Layer normalization (Ba, Kiros & Hinton 2016, arXiv:1607.06450).

    y = (x - mean) / sqrt(var + eps) * weight + bias

    ``var`` is the *biased* variance (divided by d, not d - 1), as in the paper
    and in ``F.layer_norm``. ``weight`` (gamma) starts at 1 and ``bias`` (beta)
    at 0; ``bias=False`` drops beta. With ``gain_offset``, weight stores w and gamma = 1 + w.

    ``formula`` is the definition written out; ``forward`` computes the same thing
    (tested equal, values and gradients) with PyTorch's fused kernel, because that
    is 6-12x faster forward+backward on CPU at widths 128-4096 (experiments/exp5_norm_speed.py).
    """

    reads = ("norm_eps",)

    fixes_vector_size = True
    has_gain = True

    def __init__(self, dim: int, options: NormOptions = NormOptions(), **overrides):
        super().__init__()
        options = options.with_overrides(overrides)
        self.eps = options.eps
        self.weight = self._gain_parameter((dim,), 1.0, options.gain_offset)
        self.bias = nn.Parameter(torch.zeros(dim)) if options.bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        weight = self.gamma(xf.dtype)
        bias = self.bias.to(xf.dtype) if self.bias is not None else None
        return F.layer_norm(xf, weight.shape, weight, bias, self.eps).to(x.dtype)

    def formula(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        mean = xf.mean(dim=-1, keepdim=True)  # (..., 1)
        var = (xf - mean).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), biased
        return _affine((xf - mean) * torch.rsqrt(var + self.eps), self.gamma(xf.dtype), self.bias, x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}{_offset_repr(self)}"


class RMSNorm(Norm):
    """Root mean square normalization (Zhang & Sennrich 2019, arXiv:1910.07467).

    y = x * rsqrt(mean(x^2) + eps) * weight

    No mean subtraction and no bias: only re-scaling, which the paper argues is
    what makes LayerNorm work. ``weight`` starts at 1 (with ``gain_offset``: w starts at 0, gamma = 1 + w,
    as in Gemma).
    """

    reads = ("norm_eps",)

    fixes_vector_size = True
    has_gain = True

    def __init__(self, dim: int, options: NormOptions = NormOptions(), **overrides):
        super().__init__()
        options = options.with_overrides(overrides)
        self.eps = options.eps  # no bias by definition, whatever options.bias says
        self.weight = self._gain_parameter((dim,), 1.0, options.gain_offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        return _affine(_rms_normalize(xf, self.eps), self.gamma(xf.dtype), None, x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}{_offset_repr(self)}"


class RMSNormNoParam(Norm):
    """RMSNorm without the gain: y = x * rsqrt(mean(x^2) + eps).

    The formula of Zhang & Sennrich 2019 (arXiv:1910.07467) with ``weight`` fixed
    at 1, as in several recent small GPTs (e.g. the modded-nanoGPT speedruns):
    the Linear layer that reads the norm's output can learn any per-channel
    scale itself, so the gain adds parameters but no expressiveness there.
    It has no parameters at all, so no gain for ``gain_offset`` to offset (``has_gain`` False).
    """

    reads = ("norm_eps",)

    fixes_vector_size = True

    def __init__(self, dim: int, options: NormOptions = NormOptions(), **overrides):
        super().__init__()
        self.eps = options.with_overrides(overrides).eps  # nothing learnable, so dim is not needed

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        return _rms_normalize(x.to(_compute_dtype(x)), self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


class ScaleNorm(Norm):
    """ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears", arXiv:1910.05895).

    y = g * x / max(||x||_2, eps)

    Projects each vector onto the sphere of radius g, with one learnable scalar g
    per norm instead of a gain vector. g starts at sqrt(d), the L2 norm of a vector
    whose entries have unit RMS, so at init ScaleNorm(x) equals RMSNorm(x) up to eps.
    ``eps`` is a floor on the norm (the paper clamps it the same way), not a term
    added under a square root. With ``gain_offset``, ``gain`` stores w and g = sqrt(d) + w
    (x-transformers' ScaleNorm uses sqrt(d) * (1 + w) instead, which also multiplies Adam's step on g
    by sqrt(d); the sum keeps it as without the offset).
    """

    reads = ("norm_eps",)

    fixes_vector_size = True
    has_gain = True
    gain_name = "gain"

    def __init__(self, dim: int, options: NormOptions = NormOptions(), **overrides):
        super().__init__()
        options = options.with_overrides(overrides)
        self.eps = options.eps  # no beta in ScaleNorm
        self.gain = self._gain_parameter((), math.sqrt(dim), options.gain_offset)  # () scalar g

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)  # (..., 1)
        return (xf * (self.gamma(xf.dtype) / norm.clamp_min(self.eps))).to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}{_offset_repr(self)}"


class DyT(Norm):
    """Dynamic Tanh (Zhu, Chen, He, LeCun & Liu 2025, "Transformers without
    Normalization", arXiv:2503.10622).

    y = weight * tanh(alpha * x) + bias

    Not a normalization: no statistics are computed. The paper observes that
    trained LayerNorms map activations through an S-shaped curve, and replaces
    each norm (the final one included) by this element-wise squashing.
    ``alpha`` is one learnable scalar, initialised to ``alpha_init`` (0.5 is the
    paper's default); ``weight`` (gamma) starts at 1 and ``bias`` (beta) at 0.
    ``bias=False`` drops beta, as for LayerNorm. ``eps`` is unused. This is the
    authors' ``DynamicTanh`` (github.com/jiachenzhu/DyT, dynamic_tanh.py). Their
    language-model recipe (other_tasks/LLaMA: no beta, a larger alpha_init before
    attention, a learnable sqrt(d) scale on the embeddings) is configured in the
    model: ``bias``, ``dyt_alpha_init_attn``, ``emb_scale_learnable``.

    Where this differs from that recipe: its optimizer is AdamW over ``model.parameters()`` with
    weight_decay 0.1 (other_tasks/LLaMA/main_training_llama.py), so alpha, gamma, beta and the
    embedding scale are all decayed; here ``GPT.configure_optimizers`` decays no norm parameter (nor
    the embedding scale), as for every other norm. ``gain_offset`` offsets gamma (1 + w), not alpha.
    """

    reads = ("dyt_alpha_init", "dyt_alpha_init_attn")

    has_gain = True

    def __init__(self, dim: int, options: NormOptions = NormOptions(), **overrides):
        super().__init__()
        options = options.with_overrides(overrides)  # eps unused: nothing is divided
        self.alpha = nn.Parameter(torch.tensor(float(options.alpha_init)))  # () scalar
        self.weight = self._gain_parameter((dim,), 1.0, options.gain_offset)
        self.bias = nn.Parameter(torch.zeros(dim)) if options.bias else None

    squashes = True
    # |alpha x| from which on an input counts as saturated: tanh's slope there, 1 - tanh(2)^2 = 0.07,
    # is under a tenth of its slope at 0, so such inputs barely move the output or pass a gradient.
    saturation = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        return _affine(torch.tanh(self.alpha * xf), self.gamma(xf.dtype), self.bias, x.dtype)

    def squash_input(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d): what tanh reads
        return self.alpha * x.to(_compute_dtype(x))

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, bias={self.bias is not None}{_offset_repr(self)}"


class Derf(Norm):
    """Dynamic erf (Chen, Lu, Zhu, Sun & Liu 2025, "Stronger Normalization-Free Transformers",
    arXiv:2512.10938).

    y = weight * erf(alpha * x + shift) + bias

    DyT's successor from the same group: a search over point-wise S-shaped functions found erf, with a
    learnable shift inside, to do best. Like DyT it computes no statistics. ``alpha`` and ``shift``
    are one learnable scalar each (the paper: "alpha and s are learnable scalars"; the code:
    ``torch.ones(1) * alpha_init_value`` and ``torch.ones(1) * shift_init_value``), initialised to
    ``derf_alpha_init`` (0.5, the code's default) and ``derf_shift_init`` (0.0); ``weight`` (gamma,
    per channel) starts at 1 and ``bias`` (beta, per channel) at 0. ``eps`` is unused. This is the
    authors' ``Dynamic_erf`` (github.com/zlab-princeton/Derf: ViT/dynamic_erf.py, and the nanoGPT
    patch "language model/model_derf.patch"), with the stored scalars 0-d here instead of shape (1,).

    Where this differs from the authors' language-model patch: (1) ``bias=False`` drops beta (as for
    DyT); their ``Dynamic_erf`` always has beta, whatever nanoGPT's ``bias``; (2) one
    ``derf_alpha_init`` for every Derf, where the patch sets the attention, FFN and final norms apart
    (``attn_alpha_init_value``, ``ffn_alpha_init_value``, ``dec_alpha_init_value``, each 1.0 by
    default); (3) the patch multiplies the embedding output (token + position) by a learnable scalar
    starting at sqrt(d) (``shared_scale``); here ``emb_scale_learnable`` is the same idea but scales
    the token embedding only; (4) its nanoGPT optimizer leaves 0-d/1-d parameters undecayed, as here.
    ``gain_offset`` offsets gamma (1 + w); x-transformers' ``Derf`` also stores alpha as alpha - 1.
    """

    reads = ("derf_alpha_init", "derf_shift_init")

    has_gain = True
    squashes = True
    # |alpha x + s| from which on an input counts as saturated: where erf's slope, relative to its slope
    # at 0, is what tanh's is at DyT's saturation 2.0 (exp(-u^2) = 1 - tanh(2)^2 = 0.07, u = 1.63), so
    # that the two squashing norms' saturation shares measure the same flatness.
    saturation = math.sqrt(-math.log(1 - math.tanh(2.0) ** 2))

    def __init__(self, dim: int, options: NormOptions = NormOptions(), **overrides):
        super().__init__()
        options = options.with_overrides(overrides)  # eps unused: nothing is divided
        self.alpha = nn.Parameter(torch.tensor(float(options.derf_alpha_init)))  # () scalar
        self.shift = nn.Parameter(torch.tensor(float(options.derf_shift_init)))  # () scalar
        self.weight = self._gain_parameter((dim,), 1.0, options.gain_offset)
        self.bias = nn.Parameter(torch.zeros(dim)) if options.bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        return _affine(torch.erf(self.squash_input(xf)), self.gamma(xf.dtype), self.bias, x.dtype)

    def squash_input(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d): what erf reads
        return self.alpha * x.to(_compute_dtype(x)) + self.shift

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, bias={self.bias is not None}{_offset_repr(self)}"


class BatchNorm(Norm):
    """Batch normalization (Ioffe & Szegedy 2015, arXiv:1502.03167), over batch *and* time.

    y = (x - mean) / sqrt(var + eps) * weight + bias

    For an input (B, T, C) the statistics are per channel, over all B * T positions
    (every dimension but the last): the same as ``nn.BatchNorm1d`` on (B, C, T).
    In training, ``var`` is the biased batch variance, and the running estimates
    are updated with momentum 0.1 (``running_var`` from the *unbiased* variance,
    as ``nn.BatchNorm1d`` does). In eval, the running estimates replace the batch
    statistics, so each position is normalized on its own.

    Kept for teaching, not for use: in a causal language model the training-mode
    statistics include every later position of every sequence in the batch, so
    the output at position t depends on tokens after t. The model can read the
    future it is asked to predict in training, and behaves differently in eval.
    """

    reads = ("norm_eps",)

    mixes_positions = True  # in training: see above
    has_gain = True  # weight; with gain_offset, gamma = 1 + w
    momentum = 0.1

    def __init__(self, dim: int, options: NormOptions = NormOptions(), **overrides):
        super().__init__()
        options = options.with_overrides(overrides)
        self.eps = options.eps
        self.weight = self._gain_parameter((dim,), 1.0, options.gain_offset)
        self.bias = nn.Parameter(torch.zeros(dim)) if options.bias else None
        self.register_buffer("running_mean", torch.zeros(dim))  # (C,)
        self.register_buffer("running_var", torch.ones(dim))  # (C,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., C) -> (..., C)
        xf = x.to(_compute_dtype(x))
        if self.training:
            flat = xf.reshape(-1, xf.shape[-1])  # (N, C), N = B * T: positions and sequences mixed
            n = flat.shape[0]
            if n < 2:
                raise ValueError("batchnorm in training mode needs more than one position per channel "
                                 f"(batch * time = {n})")
            mean = flat.mean(dim=0)  # (C,)
            var = flat.var(dim=0, correction=0)  # (C,), biased: what the output is normalized with
            with torch.no_grad():
                # A batch with inf/NaN (a step the trainer may then skip) must not poison the
                # running statistics for good: its weight becomes 0, decided without a host sync.
                finite = torch.isfinite(mean).all() & torch.isfinite(var).all()
                m = self.momentum * finite.to(self.running_mean.dtype)
                unbiased = var * (n / (n - 1))
                self.running_mean.mul_(1 - m).add_(m * torch.nan_to_num(mean).to(self.running_mean.dtype))
                self.running_var.mul_(1 - m).add_(m * torch.nan_to_num(unbiased).to(self.running_var.dtype))
        else:
            mean, var = self.running_mean.to(xf.dtype), self.running_var.to(xf.dtype)  # (C,)
        return _affine((xf - mean) * torch.rsqrt(var + self.eps), self.gamma(xf.dtype), self.bias, x.dtype)

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, eps={self.eps}, momentum={self.momentum}, bias={self.bias is not None}"
                f"{_offset_repr(self)}")


class NoNorm(Norm):
    """The identity: a block with this "norm" has no normalization at all (and no gain to offset)."""

    is_identity = True

    def __init__(self, dim: int, options: NormOptions = NormOptions(), **overrides):
        super().__init__()
        options.with_overrides(overrides)  # only to refuse a misspelt override, as every norm does

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


# name -> a Norm subclass, or a functools.partial of one. The single list of valid norm_type values.
NORMS: dict[str, type[Norm] | functools.partial] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "rmsnorm_noparam": RMSNormNoParam,
    "scalenorm": ScaleNorm,
    "dyt": DyT,
    "derf": Derf,
    "batchnorm": BatchNorm,
    "none": NoNorm,
}


def norm_class(entry) -> type[Norm]:
    """The Norm subclass behind a registry entry (a class, or a functools.partial of one),
    so that its declared properties can be read without building it."""
    cls = entry
    while isinstance(cls, functools.partial):
        cls = cls.func
    if not (isinstance(cls, type) and issubclass(cls, Norm)):
        raise TypeError(f"a NORMS entry must be a Norm subclass or a functools.partial of one, got {entry!r}")
    return cls


def _entry(name: str):
    """The registry entry for ``name``; an unknown name gets the list of valid ones."""
    if name not in NORMS:
        raise ValueError(unknown_choice("norm_type", name, NORMS))
    return NORMS[name]


def qk_norm_refusal(name: str) -> str | None:
    """Why the norm registered under ``name`` cannot normalize queries and keys, or None if it can."""
    cls = norm_class(_entry(name))
    if cls.is_identity:
        return "the query/key norms would be the identity"
    if cls.mixes_positions:
        return "its statistics over batch and time would let queries and keys see later positions"
    return None


def gain_offset_refusal(name: str) -> str | None:
    """Why gain_offset would do nothing for the norm registered under ``name``, or None if it has a gain."""
    cls = norm_class(_entry(name))
    return None if cls.has_gain else "it has no gain to offset"


def build_norm(name: str, dim: int, options: NormOptions | None = None, **overrides) -> Norm:
    """Construct the norm registered under ``name`` for width ``dim``.

    Precedence, lowest first: ``options`` (default ``NormOptions()``), the keywords of a
    ``functools.partial`` entry (it was registered to fix them), then ``overrides``."""
    entry = _entry(name)
    norm_class(entry)  # refuse an entry outside the contract before building it
    return entry(dim, NormOptions() if options is None else options, **overrides)
