"""Normalization layers, written from scratch, behind one explicit registry.

Every norm acts over the last dimension (the width d: n_embd in a block, the head
size D for the query/key norms). All but ``BatchNorm`` keep one set of statistics
per position, so they never mix information across positions or sequences;
``BatchNorm`` is here to show what goes wrong when a norm does.

Each class computes in (at least) float32 and casts the result back to the input dtype:
under float16 the squares inside a norm overflow long before the activations
themselves do (300.0 ** 2 = 90000 > 65504, the largest float16).

Every class takes the same arguments, ``Cls(dim, *, eps, bias, alpha_init)``, and
ignores (with ``del``) the options it has no use for:

- ``eps``: added to the variance / mean square (a floor on the norm for ScaleNorm);
- ``bias``: whether the norm has an additive beta (LayerNorm, DyT, BatchNorm);
- ``alpha_init``: the initial value of DyT's learnable alpha.

To add a variant: write an ``nn.Module`` with that signature and add one line to
``NORMS``. ``build_norm`` is the only way the model constructs a norm; it passes
every option to every class, so no behaviour depends on a norm's name.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import unknown_choice


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32, or the input's dtype if that is wider (float64 stays float64)."""
    return torch.promote_types(x.dtype, torch.float32)


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


class LayerNorm(nn.Module):
    """Layer normalization (Ba, Kiros & Hinton 2016, arXiv:1607.06450).

    y = (x - mean) / sqrt(var + eps) * weight + bias

    ``var`` is the *biased* variance (divided by d, not d - 1), as in the paper
    and in ``F.layer_norm``. ``weight`` (gamma) starts at 1 and ``bias`` (beta)
    at 0; ``bias=False`` drops beta.

    ``formula`` is the definition written out; ``forward`` computes the same thing
    (tested equal, values and gradients) with PyTorch's fused kernel, because that
    is 6-12x faster forward+backward on CPU at widths 128-4096 (experiments/exp5_norm_speed.py).
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.5):
        super().__init__()
        del alpha_init  # DyT only
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        weight = self.weight.to(xf.dtype)
        bias = self.bias.to(xf.dtype) if self.bias is not None else None
        return F.layer_norm(xf, weight.shape, weight, bias, self.eps).to(x.dtype)

    def formula(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        mean = xf.mean(dim=-1, keepdim=True)  # (..., 1)
        var = (xf - mean).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), biased
        return _affine((xf - mean) * torch.rsqrt(var + self.eps), self.weight, self.bias, x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """Root mean square normalization (Zhang & Sennrich 2019, arXiv:1910.07467).

    y = x * rsqrt(mean(x^2) + eps) * weight

    No mean subtraction and no bias: only re-scaling, which the paper argues is
    what makes LayerNorm work. ``weight`` starts at 1.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.5):
        super().__init__()
        del bias, alpha_init  # RMSNorm has no bias by definition, and no alpha
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        return _affine(_rms_normalize(xf, self.eps), self.weight, None, x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class RMSNormNoParam(nn.Module):
    """RMSNorm without the gain: y = x * rsqrt(mean(x^2) + eps).

    The formula of Zhang & Sennrich 2019 (arXiv:1910.07467) with ``weight`` fixed
    at 1, as in several recent small GPTs (e.g. the modded-nanoGPT speedruns):
    the Linear layer that reads the norm's output can learn any per-channel
    scale itself, so the gain adds parameters but no expressiveness there.
    It has no parameters at all.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.5):
        super().__init__()
        del dim, bias, alpha_init  # nothing learnable
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        return _rms_normalize(x.to(_compute_dtype(x)), self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears", arXiv:1910.05895).

    y = g * x / max(||x||_2, eps)

    Projects each vector onto the sphere of radius g, with one learnable scalar g
    per norm instead of a gain vector. g starts at sqrt(d), the L2 norm of a vector
    whose entries have unit RMS, so at init ScaleNorm(x) equals RMSNorm(x) up to eps.
    ``eps`` is a floor on the norm (the paper clamps it the same way), not a term
    added under a square root.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.5):
        super().__init__()
        del bias, alpha_init  # no beta and no alpha in ScaleNorm
        self.eps = eps
        self.gain = nn.Parameter(torch.tensor(math.sqrt(dim)))  # () scalar g

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)  # (..., 1)
        return (xf * (self.gain / norm.clamp_min(self.eps))).to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


class DyT(nn.Module):
    """Dynamic Tanh (Zhu, Chen, He, LeCun & Liu 2025, "Transformers without
    Normalization", arXiv:2503.10622).

    y = weight * tanh(alpha * x) + bias

    Not a normalization: no statistics are computed. The paper observes that
    trained LayerNorms map activations through an S-shaped curve, and replaces
    each norm (the final one included) by this element-wise squashing.
    ``alpha`` is one learnable scalar, initialised to ``alpha_init`` (0.5 is the
    paper's default); ``weight`` (gamma) starts at 1 and ``bias`` (beta) at 0.
    ``bias=False`` drops beta, as for LayerNorm. ``eps`` is unused.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.5):
        super().__init__()
        del eps  # nothing is divided
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))  # () scalar
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        return _affine(torch.tanh(self.alpha * xf), self.weight, self.bias, x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, bias={self.bias is not None}"


class BatchNorm(nn.Module):
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

    momentum = 0.1

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.5):
        super().__init__()
        del alpha_init  # DyT only
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
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
        return _affine((xf - mean) * torch.rsqrt(var + self.eps), self.weight, self.bias, x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, momentum={self.momentum}, bias={self.bias is not None}"


class NoNorm(nn.Module):
    """The identity: a block with this "norm" has no normalization at all."""

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True, alpha_init: float = 0.5):
        super().__init__()
        del dim, eps, bias, alpha_init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


# name -> class taking (dim, *, eps, bias, alpha_init). The single list of valid norm_type values.
NORMS: dict[str, type[nn.Module]] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "rmsnorm_noparam": RMSNormNoParam,
    "scalenorm": ScaleNorm,
    "dyt": DyT,
    "batchnorm": BatchNorm,
    "none": NoNorm,
}


def build_norm(name: str, dim: int, *, eps: float = 1e-5, bias: bool = True,
               alpha_init: float = 0.5) -> nn.Module:
    """Construct the norm registered under ``name`` for width ``dim``, passing it every option."""
    if name not in NORMS:
        raise ValueError(unknown_choice("norm_type", name, NORMS))
    return NORMS[name](dim, eps=eps, bias=bias, alpha_init=alpha_init)
