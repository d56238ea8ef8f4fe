"""One optimizer step of a training run: forward and backward over the gradient-accumulation
micro-batches, the loss scaler, clipping, the non-finite policy, the update (AdamW, or Muon with
AdamW: optim.py), nGPT's renormalization and QK-Clip.

Trainer (trainer.py) builds one OptimizerStep and calls it once an iteration; bench.py times it.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from . import distributed
from .config import TrainConfig
from .diagnostics import NO_HOOK, StepHook
from .model import GPT, log_partition
from .optim import Optimizer
from .runtime import autocast
from .state import TrainState


class OptimizerStep:
    """The Trainer's step, over the Trainer's own objects (nothing is copied): ``train_net`` is the
    module the training forward goes through (DDP around the model under torchrun), ``state``
    supplies the batches and counts the skipped steps, so that a checkpoint carries them."""

    def __init__(self, cfg: TrainConfig, model: GPT, train_net: nn.Module, optimizer: Optimizer,
                 scaler: torch.amp.GradScaler, state: TrainState, dist: distributed.Dist, device: torch.device):
        self.cfg, self.model, self.train_net = cfg, model, train_net
        self.optimizer, self.scaler, self.state = optimizer, scaler, state
        self.dist, self.device = dist, device
        self.clipped_heads = torch.zeros((), dtype=torch.long, device=device)  # QK-Clip's count at the last step

    def __call__(self, lr: float, hook: StepHook = NO_HOOK) -> torch.Tensor:
        """One step at ``lr`` (the schedule's value: each param group runs at ``lr`` times its
        ``lr_scale``, so Muon's follows muon_lr on the same warmup and cosine); returns the step's mean
        loss, detached and left on the device so that no host-device sync happens here. ``hook``
        observes the step's moments (per-layer diagnostics)."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        step_loss = torch.zeros((), device=self.device)
        for micro in range(cfg.gradient_accumulation_steps):
            x, y = self.state.sampler.next_batch()  # (B, T) each
            # DDP averages gradients across ranks during backward; accumulate locally and
            # communicate once, on the last micro-step.
            last = micro == cfg.gradient_accumulation_steps - 1
            with contextlib.nullcontext() if last or not self.dist.enabled else self.train_net.no_sync():
                with autocast(self.device, cfg.dtype):
                    logits, loss = self.train_net(x, y)
                objective = loss + cfg.z_loss * log_partition(logits).pow(2).mean() if cfg.z_loss else loss
                step_loss += loss.detach() / cfg.gradient_accumulation_steps  # cross-entropy only
                self.scaler.scale(objective / cfg.gradient_accumulation_steps).backward()
        hook.after_backward(x)
        self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the loss-scaled ones
        hook.after_unscale()
        grad_norm = torch.zeros((), device=self.device)
        if cfg.grad_clip > 0 or cfg.nonfinite == "skip":
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        # With a GradScaler, inf gradients are routine (the scale is too high) and the scaler
        # skips those steps itself; nonfinite=skip then acts on the loss alone.
        check = step_loss if self.scaler.is_enabled() else step_loss + grad_norm
        # The loss is per rank: summed over ranks, every rank takes the same decision.
        if cfg.nonfinite == "skip" and not torch.isfinite(self.dist.sum(check.clone())):  # syncs: skip mode only
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()
            self.state.skipped_steps += 1
            return step_loss
        hook.before_update()
        if self.scaler.is_enabled():
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.state.scaler_skipped_steps += int(self.scaler.get_scale() < scale)  # the scale drops on a skip
        else:
            self.optimizer.step()
        self.model.after_step()  # nGPT puts its matrices back on the sphere; nothing for the others
        if cfg.qk_clip_tau > 0:
            self.clip_attention_logits()
        hook.after_update()
        self.optimizer.zero_grad(set_to_none=True)
        return step_loss

    def clip_attention_logits(self) -> None:
        """QK-Clip (Kimi K2, arXiv:2507.20534 §2.1): every head whose largest attention logit in this
        step's training forwards exceeded qk_clip_tau gets its W_q and W_k rows scaled back
        (GPT.qk_clip), so that logit would have been tau. Under torchrun each rank saw its own
        batches: the maxima are all-reduced with MAX first, so every rank clips the same heads by the
        same factors and the ranks' weights stay identical.

        It runs last, after the optimizer step and after model.after_step: it bounds the weights the
        next step starts from, so nothing may rescale them after it (a placement that renormalizes
        W_q and W_k, nGPT, would undo it; config refuses that pair, GPTConfig.qk_clip_refusal). Keeps
        the number of heads clipped, on the device, for the metrics row."""
        tau = self.cfg.qk_clip_tau
        max_logits = self.dist.max(self.model.tracked_max_logits())  # (n_layer, n_head), float32
        self.model.qk_clip(tau, max_logits)
        self.clipped_heads = (max_logits > tau).sum()
