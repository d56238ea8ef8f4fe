"""An exponential moving average (EMA) of a model's weights, scored beside the weights themselves.

The last weights of a run carry the noise of its last steps; an average over the steps before
removes part of it (Polyak & Juditsky 1992, "Acceleration of stochastic approximation by
averaging", SIAM J. Control Optim. 30(4), in its running-mean form; the exponential form, as
language-model training uses it, is written out in Block & Zhang 2025, arXiv:2508.00180, §1:
ema <- (1 - beta_t) * ema + beta_t * theta after each optimizer step). Here the weight of the
newest step is 1 - ema_decay, fixed, and the average starts at the initial weights: with
ema_decay d it remembers about 1 / (1 - d) steps. Not the bias-corrected form (BEMA) of that
paper, nor a schedule of decays.

Every floating-point entry of the model's state (parameters and float buffers, such as
BatchNorm's running statistics) is averaged; integer buffers (BatchNorm's step count) are
copied. The average never feeds back into training: a run with an average trains the same
weights as one without, bit for bit (tests/test_averaging.py).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn


class WeightAverage:
    """The EMA of ``model``'s state, updated after each optimizer step (``update``), saved and
    restored with the checkpoint (``state_dict`` / ``load_state_dict``), and put in the model's
    place for an evaluation (``swapped_in``)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.average = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self._floats = [k for k, v in self.average.items() if v.is_floating_point()]  # averaged; the rest copied
        self._others = [k for k in self.average if k not in self._floats]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        state = model.state_dict()
        # lerp: a + w (b - a) = decay * a + (1 - decay) * b for w = 1 - decay
        torch._foreach_lerp_([self.average[k] for k in self._floats], [state[k].detach() for k in self._floats],
                             1.0 - self.decay)
        for k in self._others:
            self.average[k].copy_(state[k])

    def state_dict(self) -> dict:
        return {k: v.detach().cpu().clone() for k, v in self.average.items()}

    def load_state_dict(self, saved: dict) -> None:
        """Take a checkpoint's average; a saved state whose keys or shapes differ is a KeyError or
        ValueError, which the checkpoint's reader reports as damaged."""
        if set(saved) != set(self.average):
            raise KeyError("the average's entries differ from the model's")
        for k, v in self.average.items():
            if saved[k].shape != v.shape:
                raise ValueError(f"the average's {k} has shape {tuple(saved[k].shape)}, the model's {tuple(v.shape)}")
            v.copy_(saved[k])

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module):
        """The model holds the average inside the block, and its own weights again after it."""
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.average)
        try:
            yield model
        finally:
            model.load_state_dict(own)
