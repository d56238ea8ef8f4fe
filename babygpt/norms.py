"""Normalization layers, written from scratch, behind one explicit registry.

Every norm acts over the last dimension (the model width d = n_embd) and keeps
one set of statistics per position, so it never mixes information across
positions or sequences.

Each class computes in (at least) float32 and casts the result back to the input dtype:
under float16 the squares inside a norm overflow long before the activations
themselves do (300.0 ** 2 = 90000 > 65504, the largest float16).

To add a variant: write an ``nn.Module`` with the signature
``Cls(dim, *, eps, bias)`` (ignore what it does not use) and add one line to
``NORMS``. ``build_norm`` is the only way the model constructs a norm.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from .errors import unknown_choice


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32, or the input's dtype if that is wider (float64 stays float64)."""
    return torch.promote_types(x.dtype, torch.float32)


class LayerNorm(nn.Module):
    """Layer normalization (Ba, Kiros & Hinton 2016, arXiv:1607.06450).

    y = (x - mean) / sqrt(var + eps) * weight + bias

    ``var`` is the *biased* variance (divided by d, not d - 1), as in the paper
    and in ``F.layer_norm``. ``weight`` (gamma) starts at 1 and ``bias`` (beta)
    at 0; ``bias=False`` drops beta.
    """

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        mean = xf.mean(dim=-1, keepdim=True)  # (..., 1)
        var = (xf - mean).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), biased
        y = (xf - mean) * torch.rsqrt(var + self.eps) * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """Root mean square normalization (Zhang & Sennrich 2019, arXiv:1910.07467).

    y = x * rsqrt(mean(x^2) + eps) * weight

    No mean subtraction and no bias: only re-scaling, which the paper argues is
    what makes LayerNorm work. ``weight`` starts at 1.
    """

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = False):
        super().__init__()
        del bias  # RMSNorm has no bias by definition; accepted for a uniform signature.
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        xf = x.to(_compute_dtype(x))
        ms = xf.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        return (xf * torch.rsqrt(ms + self.eps) * self.weight).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class NoNorm(nn.Module):
    """The identity: a block with this "norm" has no normalization at all."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = False):
        super().__init__()
        del dim, eps, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


# name -> constructor(dim, eps=..., bias=...). The single list of valid norm_type values.
NORMS: dict[str, Callable[..., nn.Module]] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "none": NoNorm,
}


def build_norm(name: str, dim: int, **kwargs) -> nn.Module:
    """Construct the norm registered under ``name`` for width ``dim``."""
    if name not in NORMS:
        raise ValueError(unknown_choice("norm_type", name, NORMS))
    return NORMS[name](dim, **kwargs)
