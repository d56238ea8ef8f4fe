"""Per-layer diagnostics of a training run: where does the signal grow, where do gradients vanish?

With ``diag_interval = K`` (0, the default, turns it off and costs nothing), every K-th
optimizer step adds one row to ``metrics.jsonl`` with a value per block (layer 0 first):

  resid_rms     RMS of the residual stream leaving block l, sqrt(mean(x^2)) over (B, T, C).
                Measured by an extra forward pass, without gradients and in eval mode, on the
                step's last batch with the weights of before the step: the training pass
                itself is left alone (no hooks inside a compiled or DDP-wrapped model, no random
                numbers drawn), so a run with diagnostics trains exactly like one without.
  resid_max     the largest |x| of the residual stream leaving block l (same extra pass): what the
                next norm reads. Above 255.9, x^2 exceeds float16's largest value (65,504), so a norm
                that squared in float16 would overflow (this project's norms square in float32).
  attn_logit_max  the largest pre-softmax attention score q.k / sqrt(D) of block l over the batch,
                heads and visible positions (same extra pass). Scores that keep growing saturate
                the softmax into one-hot attention (Dehghani et al. 2023; Wortsman et al. 2023).
                With attn_softcap, the capped score the softmax reads.
  attn_logit_max_head  the same per head: one list of H values per block (layer 0 first), so a
                single runaway head (what QK-Clip rescales, Kimi K2) shows. Not in KEYS: the
                layer-by-iteration heatmaps of babygpt/plot.py draw one value per block.
  token_independence  how much of the stream leaving block l is the same at every position of a
                sequence: sum over (b, c) of T * mean_t(x)^2, divided by sum of x^2 (same extra
                pass). 1 means the stream no longer depends on which token sits where, so the
                model can predict only character frequencies; unrelated positions give about 1/T.
  tanh_saturation  the share of the inputs of block l's squashing norms (DyT) that lie on the flat
                part of the tanh, |alpha x| >= 2 (same extra pass); absent (null) in a model without
                such norms. A saturated input barely moves the output or passes a gradient.
  tanh_input_rms  the RMS of alpha x over the same inputs: far below 1, DyT is the linear map
                alpha x and rescales nothing; far above, it is a sign function.
  output_logz   one value, not per block: the mean over positions of log Z, the log of the output
                softmax's normalizer (same extra pass). Cross-entropy does not pin it, and its drift
                is the output-logit divergence that the z-loss prevents (Wortsman et al. 2023).
  angular_distance  how far block l turns the stream: arccos of the cosine between the stream
                entering and leaving the block, over pi, averaged over the (B, T) positions (same
                extra pass). 0: the block is the identity up to scale; 0.5: orthogonal. Gromov et
                al. 2024 (arXiv 2403.17887, their released-code analogue ``block_influence`` in the
                Mix-LN and LayerNorm-Scaling repositories) use it to find blocks that can be pruned;
                they take the last position only, here every position counts.
  removal_loss_delta  the loss increase when block l is skipped (its output replaced by its
                input) on the same batch, next-token cross-entropy over its first T-1 positions:
                how much the trained model needs the block (Sun et al. 2025, arXiv 2502.05795,
                Fig. 1: the drop in performance when a layer is removed). Near 0 for a block that
                a Pre-LN stack has left near the identity. One more forward pass per block.
  grad_norm     L2 norm of the gradient of all of block l's parameters, before clipping.
  update_ratio  ||new - old|| / ||old|| over block l's parameters for this step: how far the
                optimizer moved the block relative to its size (about 1e-3 is typical of Adam
                at a healthy learning rate; much larger means the block is being thrown around).

``python -m babygpt.plot RUN_DIR --diag`` draws them as layer-by-iteration heatmaps.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import log_partition
from .norms import Norm

KEYS = ("resid_rms", "resid_max", "attn_logit_max", "token_independence", "tanh_saturation", "tanh_input_rms", "output_logz",
        "angular_distance", "removal_loss_delta", "grad_norm", "update_ratio")
SINGLE_VALUE = ("output_logz",)  # one value per measured step, not one per block
SHARES = ("tanh_saturation", "angular_distance")  # fractions in [0, 1], where 0 is an ordinary value
SIGNED = ("removal_loss_delta",)  # may be negative: drawn on a linear scale
PER_HEAD = ("attn_logit_max_head",)  # one list of per-head values per block


class StepHook:
    """What an optimizer step tells an observer, in the order it happens (step.OptimizerStep
    calls each once per step); this base class ignores it all, so an unobserved step costs nothing."""

    def after_backward(self, idx: torch.Tensor) -> None:
        """Gradients are accumulated; ``idx`` (B, T) is the step's last micro-batch."""

    def after_unscale(self) -> None:
        """Gradients are the true ones (a float16 loss scale divided out), before clipping."""

    def before_update(self) -> None:
        """The step will be taken (it was not skipped); the weights are still the old ones."""

    def after_update(self) -> None:
        """The optimizer has updated the weights."""


NO_HOOK = StepHook()


def token_independence(x: torch.Tensor) -> torch.Tensor:
    """Share of the mean square of ``x`` (B, T, C) carried by its mean over positions (a scalar):
    1 when every position of a sequence holds the same vector."""
    x = x.float()
    T = x.shape[1]
    return T * x.mean(dim=1).pow(2).sum() / x.pow(2).sum().clamp_min(1e-30)


def angular_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """arccos(cos(a_t, b_t)) / pi averaged over the positions of ``a`` and ``b`` (B, T, C): a scalar in [0, 1]."""
    # float64: arccos is steep near cos = +-1, where float32 rounding would show as a turn of 1e-4
    cos = F.cosine_similarity(a.double(), b.double(), dim=-1, eps=1e-12).clamp(-1.0, 1.0)  # (B, T)
    return (torch.arccos(cos).mean() / math.pi).float()


@torch.no_grad()
def removal_loss_deltas(model: nn.Module, idx: torch.Tensor) -> list[float]:
    """For each block of ``model`` (a GPT), the next-token loss on ``idx`` (B, T) with that block
    skipped, minus the loss with every block: what removing the block costs, without retraining."""
    def loss() -> float:
        logits = model(idx)[0][:, :-1]  # (B, T-1, V): position t predicts token t+1
        return F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten()).item()

    full, deltas = loss(), []
    for block in model.blocks:
        hook = block.register_forward_hook(lambda module, inputs, out: inputs[0])  # the block as identity
        try:
            deltas.append(loss() - full)
        finally:
            hook.remove()
    return deltas


def _flat_norm(tensors) -> torch.Tensor:
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors]))


class LayerDiagnostics(StepHook):
    """Measures one optimizer step of ``model`` (a GPT); a StepHook, so the trainer calls, in order:
    ``stream(x)`` after backward, ``grads()`` after un-scaling, ``before_update()`` just before
    ``optimizer.step()``, ``after_update()``; then ``row(iter)`` gives the metrics row."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.blocks = list(model.blocks)
        self.values: dict[str, list[float]] = {}
        self._old: list[list[torch.Tensor]] = []  # the weights before the step, between before/after_update

    @torch.no_grad()
    def stream(self, idx: torch.Tensor) -> None:
        """The stream's RMS, largest |x| and token independence after each block, and each block's largest
        attention logit, for token ids ``idx`` (B, T). Called first in a measured step, so it
        also clears the previous step's values (a step that is then skipped must not report an
        old update ratio)."""
        self.values = {}
        rms: list[torch.Tensor] = []
        peak: list[torch.Tensor] = []
        share: list[torch.Tensor] = []
        logit_max: list[torch.Tensor] = []
        turn: list[torch.Tensor] = []

        def after_block(module, inputs, out):  # out: (B, T, C), the stream leaving the block
            rms.append(out.float().pow(2).mean().sqrt())
            peak.append(out.float().abs().max())
            share.append(token_independence(out))
            turn.append(angular_distance(inputs[0], out))

        def after_attention(module, inputs, out):  # inputs[0]: (B, T, C), what the attention reads
            logit_max.append(module.attention_logits(inputs[0]).float().amax(dim=(0, 2, 3)))  # (H,)

        # (saturated inputs, sum of squared inputs, inputs) of each block's squashing norms
        squash = [torch.zeros(3, dtype=torch.float64) for _ in self.blocks]

        def counter(layer):
            def after_norm(module, inputs, out):  # inputs[0]: (..., d), what the norm reads
                u = module.squash_input(inputs[0]).double()  # (..., d), what its tanh squashes
                squash[layer] += torch.stack([(u.abs() >= module.saturation).sum(), u.pow(2).sum(),
                                              u.new_tensor(u.numel())]).cpu()
            return after_norm

        hooks = [b.register_forward_hook(after_block) for b in self.blocks]
        hooks += [b.sa.register_forward_hook(after_attention) for b in self.blocks]
        hooks += [m.register_forward_hook(counter(layer)) for layer, b in enumerate(self.blocks)
                  for m in b.modules() if isinstance(m, Norm) and m.squashes]
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self.model(idx)[0]  # (B, T, V)
            for h in hooks:
                h.remove()
            self.values["removal_loss_delta"] = removal_loss_deltas(self.model, idx)
        finally:
            self.model.train(was_training)
            for h in hooks:
                h.remove()
        self.values["resid_rms"] = torch.stack(rms).tolist()  # (L,)
        self.values["resid_max"] = torch.stack(peak).tolist()
        self.values["token_independence"] = torch.stack(share).tolist()
        per_head = torch.stack(logit_max)  # (L, H)
        self.values["attn_logit_max"] = per_head.amax(dim=1).tolist()
        self.values["attn_logit_max_head"] = per_head.tolist()
        self.values["angular_distance"] = torch.stack(turn).tolist()
        if any(n > 0 for _, _, n in squash):
            self.values["tanh_saturation"] = [(s / n).item() for s, _, n in squash]
            self.values["tanh_input_rms"] = [(sq / n).sqrt().item() for _, sq, n in squash]
        self.values["output_logz"] = [log_partition(logits).mean().item()]

    @torch.no_grad()
    def grads(self) -> None:
        norms = [_flat_norm([p.grad for p in b.parameters() if p.grad is not None] or [torch.zeros(1)])
                 for b in self.blocks]
        self.values["grad_norm"] = torch.stack(norms).tolist()

    @torch.no_grad()
    def before_update(self) -> None:
        self._old = [[p.detach().clone() for p in b.parameters()] for b in self.blocks]

    @torch.no_grad()
    def after_update(self) -> None:
        ratios = []
        for block, old in zip(self.blocks, self._old):
            new = list(block.parameters())
            ratios.append(_flat_norm([n - o for n, o in zip(new, old)]) / _flat_norm(old).clamp_min(1e-12))
        self.values["update_ratio"] = torch.stack(ratios).tolist()
        self._old = []

    # The StepHook moments, in the order a step reaches them.
    after_backward = stream
    after_unscale = grads

    def row(self, it: int) -> dict:
        """The metrics row of this step: {"iter": it, "resid_rms": [...], ...}, one value per block
        (output_logz: one value in a list; None where a value is not finite, as JSON has no NaN,
        and a whole None where the model has no such quantity)."""
        clean = lambda vs: None if vs is None else [v if math.isfinite(v) else None for v in vs]  # noqa: E731
        row = {"iter": it, **{k: clean(self.values.get(k)) for k in KEYS}}
        for k in PER_HEAD:
            row[k] = None if k not in self.values else [clean(vs) for vs in self.values[k]]
        return row
