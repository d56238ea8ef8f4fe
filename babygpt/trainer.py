"""The training loop: warmup + cosine schedule, evals, metrics, checkpoints, around the optimizer
step of step.py (AdamW or Muon with AdamW as optim.py routes them, clipping, the loss scaler).

Reading order: ``lr_at`` and ``estimate_loss``, then ``Trainer``: ``__init__`` builds the run in
memory, ``train`` -> ``_loop`` -> ``step`` trains (step.OptimizerStep), ``_evaluate_and_checkpoint``
evaluates and saves.
What lands in ``out_dir`` is described in rundir.py; the state a resume restores in state.py.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import random
import sys
import time
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from . import distributed
from .averaging import WeightAverage
from .checkpoint import FIXED_AT_START, pack_training_state, restore_rng, resume_training_state, save_checkpoint
from .config import TrainConfig, changed_settings, to_dict, with_resolved_dtype
from .errors import BabyGPTError
from .data import BatchSampler, CharTokenizer, load_dataset, tune_and_test
from .diagnostics import NO_HOOK, LayerDiagnostics, StepHook
from .model import GPT, GPTConfig
from .ngram import data_floors, is_collapsed, scheme_floors
from .optim import build_optimizer
from .rundir import RunDir, owned, run_record
from .runtime import (autocast, check_dtype, dtype_note, machine, muon_note, resolve_device, seconds_by_depth,
                      use_deterministic_kernels, uses_grad_scaler)
from .signals import StopSignals, signal_name
from .tracker import LOG_DIR as TENSORBOARD_DIR, TensorBoardTracker
from .state import TrainState, finite_or_none
from .step import OptimizerStep

# Eval windows are drawn from this one seed, so that every run on the same data, block_size and
# batch_size scores the same text; it lies outside the training seeds (seed + 2 * rank, seed < 2**32),
# so the train-split windows are never a stretch of some run's own training batches.
EVAL_SEED = 2**40 + 1


def lr_at(it: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``it`` (0-based): linear warmup to
    learning_rate over warmup_iters, then cosine decay to min_lr at decay_iters."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= cfg.decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / max(1, cfg.decay_iters - cfg.warmup_iters)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


@torch.no_grad()
def estimate_loss(model: nn.Module, splits: dict, cfg: TrainConfig, device: torch.device,
                  dist: distributed.Dist = distributed.Dist()) -> dict:
    """Mean loss over eval_iters batches of each split, with dropout off. The batches depend only
    on the data, block_size and batch_size (never on the run's seed), and under torchrun they are
    shared out among the ranks: every run, whatever its seed or world size, scores the same windows."""
    was_training = model.training
    model.eval()
    out = {}
    for split, data in splits.items():
        # Every rank draws every batch on the host (to keep the sequence) and moves only its own.
        sampler = BatchSampler(data, cfg.model.block_size, cfg.batch_size, EVAL_SEED, "cpu", split)
        total = torch.zeros(2, device=device)  # (sum of batch losses, batches) on this rank
        for k in range(cfg.eval_iters):
            x, y = sampler.next_batch()  # (B, T) each
            if k % dist.world_size == dist.rank:
                with autocast(device, cfg.dtype):
                    total[0] += model(x.to(device), y.to(device))[1].float()
                total[1] += 1
        total = dist.sum(total)
        out[split] = (total[0] / total[1]).item()
    model.train(was_training)
    return out


@torch.no_grad()
def full_split_loss(model: nn.Module, data: np.ndarray, cfg: TrainConfig, device: torch.device,
                    dist: distributed.Dist = distributed.Dist()) -> tuple[float, int]:
    """(mean loss, targets) over *every* target of ``data``: consecutive, non-overlapping
    block_size windows (the last one shorter), eval_batch windows at a time, dropout off. Unlike
    estimate_loss it samples nothing, so it is the number to compare runs by. Under torchrun the
    batches are shared out among the ranks and the sums added up."""
    was_training = model.training
    model.eval()
    T = cfg.model.block_size
    ids = torch.from_numpy(data.astype(np.int64))
    n = (len(ids) - 1) // T  # full windows
    x, y = ids[:n * T].view(n, T), ids[1:n * T + 1].view(n, T)  # (n, T) each
    b = eval_batch(cfg)
    batches = [(x[i:i + b], y[i:i + b]) for i in range(0, n, b)]
    if len(ids) - 1 > n * T:  # the rest: one shorter window
        batches.append((ids[n * T:-1].view(1, -1), ids[n * T + 1:].view(1, -1)))
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (summed token losses, targets) on this rank
    for k, (xb, yb) in enumerate(batches):
        if k % dist.world_size == dist.rank:
            with autocast(device, cfg.dtype):
                loss = model(xb.to(device), yb.to(device))[1].float()  # the mean over the batch's targets
            total += torch.stack([loss.double() * yb.numel(), torch.tensor(yb.numel(), device=device)])
    total = dist.sum(total)
    model.train(was_training)
    return (total[0] / total[1]).item(), int(total[1].item())


EVAL_TOKENS = 1024  # the fewest tokens an evaluation forward reads


def eval_batch(cfg: TrainConfig) -> int:
    """Windows per forward when scoring a whole split: batch_size, or more where batch_size windows
    hold fewer than EVAL_TOKENS tokens. A tiny model's forward costs mostly its fixed overhead, so
    the quick tiers would spend most of their time scoring a split 128 tokens at a time; every
    budget of the committed tables reads at least EVAL_TOKENS a forward and keeps its batches."""
    return max(cfg.batch_size, -(-EVAL_TOKENS // cfg.model.block_size))


def eval_stride(block_size: int) -> int:
    """The sliding evaluation's stride: half a window, so that every target after the first
    window is scored with at least block_size // 2 + 1 characters of context."""
    return max(1, block_size // 2)


def sliding_windows(length: int, block_size: int, stride: int) -> list[tuple[int, int]]:
    """(start, first scored offset) of each window of the sliding evaluation of a text of ``length``
    ids: windows start at 0, stride, 2 stride, ...; the first scores all its targets, each later one
    only its last ``stride`` (offsets block_size - stride ..), which the windows before it have not
    scored. A window reads ids[start : start + block_size] (cut at the text's end) and predicts the
    next id at each position, so every target 1 .. length - 1 is scored exactly once, the one at
    offset j with j + 1 characters of context (ngram.sliding_contexts gives the same counts)."""
    windows = [(0, 0)] if length > 1 else []
    start = stride
    while start + block_size - stride < length - 1:  # the window still has a target to score
        windows.append((start, block_size - stride))
        start += stride
    return windows


def window_batches(ids: torch.Tensor, windows: list[tuple[int, int]], block_size: int,
                   batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The windows as (x, y, first scored offset) batches: full-length windows batch_size at a time,
    (b, T), (b, T), (b,); a window cut short by the text's end on its own."""
    last = len(ids) - 1  # the last input position + 1
    full = [w for w in windows if w[0] + block_size <= last]
    batches = []
    for i in range(0, len(full), batch_size):
        chunk = torch.tensor(full[i:i + batch_size])  # (b, 2)
        at = chunk[:, :1] + torch.arange(block_size)  # (b, T) input positions
        batches.append((ids[at], ids[at + 1], chunk[:, 1]))
    for start, first in windows[len(full):]:
        batches.append((ids[start:last].view(1, -1), ids[start + 1:].view(1, -1), torch.tensor([first])))
    return batches


@torch.no_grad()
def sliding_split_loss(model: nn.Module, data: np.ndarray, cfg: TrainConfig, device: torch.device,
                       dist: distributed.Dist = distributed.Dist(), stride: int | None = None) -> tuple[float, int]:
    """(mean loss, targets) over every target of ``data``, each scored once with at least half a
    window of context after the first window (``sliding_windows``, stride ``eval_stride`` unless
    given): the number that is compared with the n-gram floors scored on the same targets with the
    same context. It costs about block_size / stride times full_split_loss. Dropout off; under
    torchrun the batches are shared out among the ranks."""
    was_training = model.training
    model.eval()
    T = cfg.model.block_size
    ids = torch.from_numpy(data.astype(np.int64))
    windows = sliding_windows(len(ids), T, eval_stride(T) if stride is None else stride)
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (summed token losses, targets) on this rank
    for k, (xb, yb, first) in enumerate(window_batches(ids, windows, T, eval_batch(cfg))):
        if k % dist.world_size == dist.rank:
            with autocast(device, cfg.dtype):
                logits = model(xb.to(device), yb.to(device))[0]  # (b, t, V); its mean loss is not the one wanted
            losses = F.cross_entropy(logits.float().flatten(0, 1), yb.to(device).flatten(), reduction="none")
            scored = torch.arange(yb.shape[1], device=device) >= first.to(device)[:, None]  # (b, t)
            total += torch.stack([(losses.view(yb.shape) * scored).sum().double(), scored.sum().double()])
    total = dist.sum(total)
    model.train(was_training)
    return (total[0] / total[1]).item(), int(total[1].item())


def final_evaluation(net: nn.Module, splits: dict, vocab_size: int, cfg: TrainConfig, device: torch.device,
                     dist: distributed.Dist) -> dict:
    """summary.json's end-of-run fields:

    * val_loss_full: the loss over the whole validation split in non-overlapping windows (the
      number every table drawn before the test split compares), with the data's n-gram floors
      (``references``, full context; see ngram.py) and what it cost;
    * tune_loss and test_loss: the sliding-window loss (``sliding_split_loss``, stride eval_stride)
      of the validation split's two parts (data.tune_and_test): LRs are chosen on the first, the
      reported numbers come from the second; ``references_test`` holds the n-gram floors scored on
      exactly the test part's targets with the same context caps, so the two compare alike.

    The floors are computed once per data and scoring scheme, then read from cfg.data_dir/floors.json."""
    started = time.perf_counter()
    loss, targets = full_split_loss(net, splits["val"], cfg, device, dist)
    seconds = round(time.perf_counter() - started, 3)
    refs = data_floors(cfg.data_dir, splits["train"], splits["val"], vocab_size)
    stride = eval_stride(cfg.model.block_size)
    started = time.perf_counter()
    tune, test = tune_and_test(splits["val"])
    tune_loss, _ = sliding_split_loss(net, tune, cfg, device, dist, stride)
    test_loss, test_targets = sliding_split_loss(net, test, cfg, device, dist, stride)
    sliding_seconds = round(time.perf_counter() - started, 3)
    scheme = f"sliding{cfg.model.block_size}s{stride}"
    return {"val_loss_full": finite_or_none(loss), "val_targets_full": targets, "val_time_full_s": seconds,
            "references": refs, "tune_loss": finite_or_none(tune_loss), "test_loss": finite_or_none(test_loss),
            "test_targets": test_targets, "eval_stride": stride, "sliding_time_s": sliding_seconds,
            "references_test": scheme_floors(cfg.data_dir, splits["train"], test, vocab_size, scheme)}


def compile_or_fall_back(model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """torch.compile compiles lazily, so a missing compiler shows up only at the first call.
    Make one call now (eval mode, no grad: it draws no random numbers) and fall back to the
    eager model, with a warning, if compiling fails."""
    compiled = torch.compile(model)
    model.eval()
    try:
        with torch.no_grad(), autocast(device, cfg.dtype):
            x = torch.zeros(cfg.batch_size, cfg.model.block_size, dtype=torch.long, device=device)
            compiled(x, x)  # the call training makes: inputs and targets
    except Exception as e:  # e.g. no C++ compiler for the inductor backend
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"warning: torch.compile failed ({type(e).__name__}: {first_line}); training eagerly",
              file=sys.stderr)
        return model
    finally:
        model.train()
    return compiled


def load_splits(cfg: TrainConfig, dist: distributed.Dist) -> tuple[dict, CharTokenizer]:
    """({"train": ids, "val": ids}, tokenizer) of cfg.data_dir, prepared first if needed (by rank 0)."""
    if not dist.is_main:
        dist.barrier()  # rank 0 prepares the data (if needed) before the others read it
    train_data, val_data, tok = load_dataset(cfg.data_dir)
    if dist.is_main:
        dist.barrier()
    BatchSampler(val_data, cfg.model.block_size, 1, 0, "cpu", "val")  # refuses a split shorter than a window
    return {"train": train_data, "val": val_data}, tok


# A model deeper than this says, before it is built, how long building it will take here: each
# block is a handful of modules whose construction and initialisation cost milliseconds, so ten
# thousand blocks take minutes before the first message (the memory check passes a narrow one).
MANY_BLOCKS = 256
SMALL_DEPTHS = (2, 10)  # the depths build_seconds times: far enough apart that a block's cost shows


def build_seconds(model_cfg: GPTConfig, clock=time.perf_counter) -> float:
    """About how long building ``model_cfg``'s GPT takes here: models of SMALL_DEPTHS blocks built and
    timed (runtime.seconds_by_depth), extended to its depth (called before any seeding: it draws
    random numbers)."""
    fixed, per_block = seconds_by_depth(lambda n: GPT(dataclasses.replace(model_cfg, n_layer=n)), SMALL_DEPTHS, clock)
    return fixed + per_block * model_cfg.n_layer


def seeded_model(model_cfg: GPTConfig, seed: int, device: torch.device, dist: distributed.Dist) -> GPT:
    """The model, initialised from ``seed`` (the same weights on every rank); the generators are then
    left at ``seed`` (one process) or at each rank's own training seed, for its own dropout masks."""
    if model_cfg.n_layer > MANY_BLOCKS and dist.is_main:
        print(f"building {model_cfg.n_layer:,} blocks takes about {build_seconds(model_cfg):,.0f} s here, before "
              f"training starts", file=sys.stderr, flush=True)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model = GPT(model_cfg).to(device)
    if dist.enabled:
        torch.manual_seed(dist.train_seed(seed))
    return model


def profile_init(model: GPT, train_data: np.ndarray, cfg: TrainConfig, device: torch.device) -> None:
    """Let the model's placements that set their init from a forward pass (Admin) see one batch of the
    training split, drawn by a sampler of its own (EVAL_SEED), so the run's data order is untouched;
    every rank draws the same batch, so every rank sets the same init."""
    sampler = BatchSampler(train_data, cfg.model.block_size, cfg.batch_size, EVAL_SEED, "cpu", "train")
    model.profile_init(sampler.next_batch()[0].to(device))


def forward_modules(model: GPT, cfg: TrainConfig, device: torch.device, dist: distributed.Dist,
                    wrap_model: Callable[[nn.Module], nn.Module] | None = None) -> tuple[nn.Module, nn.Module]:
    """(net, train_net): the module forward passes go through (the model, wrapped by ``wrap_model``,
    compiled if asked) and the one training calls, which under torchrun adds DDP's gradient averaging."""
    net = wrap_model(model) if wrap_model else model
    if cfg.compile:
        net = compile_or_fall_back(net, cfg, device)
    if not dist.enabled:
        return net, net
    return net, DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)


def resume_changes(run_dir: RunDir, cfg: TrainConfig) -> str | None:
    """The warning for a resume whose settings differ from the run's last start ("learning_rate
    0.002 -> 0.0055, ..."), None where none do. A resume takes its settings from the command line
    and the defaults, not the checkpoint, so a default changed since (or a forgotten --key) would
    otherwise change the run halfway without a word; extending max_iters is named the same way."""
    had = run_dir.last_settings()
    changes = changed_settings(had, to_dict(with_resolved_dtype(cfg)), ignore=("out_dir", "init_from")) if had else []
    if not changes:
        return None
    shown = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in changes)
    return (f"this resume changes settings from the run's last start: {shown}; the run continues with "
            f"the new values (give the earlier ones as --key=value to keep them)")


def announce(cfg: TrainConfig, device: torch.device, dist: distributed.Dist, num_params: int,
             resumed_at: int | None, changes: str | None, ckpt: str) -> None:
    """What rank 0 prints as a run starts: the schedule's warnings, where a resume starts and what
    it changed, the dtype's warning, then one line with device, dtype, size and out_dir."""
    for warning in cfg.schedule_warnings() + cfg.model.warnings():
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if resumed_at is not None:
        print(f"resuming from iteration {resumed_at} of {cfg.max_iters} ({ckpt})", flush=True)
    if changes:
        print(f"warning: {changes}", file=sys.stderr, flush=True)
    ranks = f" x {dist.world_size} processes" if dist.enabled else ""
    native, warning = dtype_note(device, cfg.dtype)
    for note in (warning, muon_note(device, cfg.muon_ns_dtype) if cfg.optimizer == "muon" else None):
        if note:
            print(f"warning: {note}", file=sys.stderr, flush=True)
    print(f"training on {device}{ranks} in {cfg.dtype}{native}, {num_params / 1e6:.2f}M parameters, "
          f"into {cfg.out_dir}", flush=True)


WALL_CLOCK_FIELDS = ("tokens_per_s", "elapsed_s")  # metrics fields that differ between otherwise identical runs


class LossWindow:
    """The per-step losses since the last metrics row, left on the device: reading them is a
    host-device sync, made once per row instead of once per step."""

    def __init__(self, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step  # over all ranks
        self.losses: list[torch.Tensor] = []
        self.started = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        self.losses.append(loss)

    def restart_clock(self) -> None:
        self.started = time.perf_counter()

    def drain(self, dist: distributed.Dist, state: TrainState) -> list[float]:
        """The losses on the host (emptied here), noting the first non-finite one in ``state``.
        Under DDP they are averaged over ranks first: the logged loss is the global batch's,
        and a NaN on any rank is seen by all."""
        losses = dist.mean(torch.stack(self.losses)).tolist() if self.losses else []
        first_bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if first_bad is not None and state.first_nonfinite is None:
            state.first_nonfinite = state.iter - len(losses) + 1 + first_bad
        self.losses.clear()
        return losses

    def row(self, dist: distributed.Dist, state: TrainState, lr: float) -> dict:
        """The metrics row at ``state.iter``: the last step's loss, lr, throughput, skip counters."""
        n = len(self.losses)
        losses = self.drain(dist, state)
        seconds = time.perf_counter() - self.started  # after the sync: the steps have really run
        row = {"iter": state.iter, "loss": finite_or_none(losses[-1]), "lr": lr,
               "tokens_per_s": n * self.tokens_per_step / seconds}
        if state.skipped_steps or state.scaler_skipped_steps:
            row.update(skipped_steps=state.skipped_steps, scaler_skipped_steps=state.scaler_skipped_steps)
        return row


class Trainer:
    """Owns the model, optimizer, data and state of one training run.

    The constructor builds everything in memory and writes nothing in out_dir (only the data is
    prepared, if it is missing); ``train()`` checks and fills the run directory. (bench.py builds
    a Trainer only to time ``step``.)

    Under torchrun (see distributed.py) there is one Trainer per rank: each draws its own
    batches, DistributedDataParallel averages the gradients, and only rank 0 writes files
    or prints. Every decision that ends the run is taken on values all ranks share (the
    averaged losses, an agreed signal), so the ranks always stop at the same iteration."""

    def __init__(self, cfg: TrainConfig, argv: list[str] | None = None, *,
                 wrap_model: Callable[[nn.Module], nn.Module] | None = None):
        """``wrap_model`` sees the model before compile and DDP; every forward pass, in training and
        in eval, goes through what it returns (tests use it to inject a NaN loss)."""
        self.argv = list(argv or [])
        self.dist = distributed.from_env()
        self.main = self.dist.is_main  # rank 0, or the only process: the one that writes and prints
        device = resolve_device(cfg.device)
        check_dtype(device, cfg.dtype)
        self.cfg = cfg = with_resolved_dtype(cfg)  # from here on cfg (and config.json) hold the dtype used
        self.run_dir = RunDir(cfg.out_dir, writes=self.main)
        if cfg.deterministic:  # before the first GPU matmul, which fixes cuBLAS's workspace
            use_deterministic_kernels()
        self.device, self._owns_group = distributed.setup(self.dist, device)
        if self.device.type == "cuda":
            # TF32 tensor cores for float32 matmuls (10-bit mantissa, float32 range): the usual
            # trade for training, several times faster on Ampere and later GPUs.
            torch.set_float32_matmul_precision("high")
        self.splits, self.tok = load_splits(cfg, self.dist)
        self.model_cfg = cfg.model_config(self.tok.vocab_size)
        self.state = TrainState(BatchSampler(self.splits["train"], cfg.model.block_size, cfg.batch_size,
                                             self.dist.train_seed(cfg.seed), self.device))
        self.model = seeded_model(self.model_cfg, cfg.seed, self.device, self.dist)
        if cfg.init_from == "scratch":  # a resume restores what profiling set
            profile_init(self.model, self.splits["train"], cfg, self.device)
        self.optimizer = build_optimizer(self.model, cfg, fused=self.device.type == "cuda")
        self.average = WeightAverage(self.model, cfg.ema_decay) if cfg.ema_decay > 0 else None
        if cfg.qk_clip_tau > 0:  # QK-Clip reads each head's largest logit of the step's training forwards
            self.model.track_max_logits(True)
        # Loss scaling is needed only for float16 (its narrow exponent range underflows small gradients).
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=uses_grad_scaler(cfg.dtype))
        # net: what forward passes go through; the step's train_net adds DDP's gradient averaging.
        self.net, train_net = forward_modules(self.model, cfg, self.device, self.dist, wrap_model)
        self._step = OptimizerStep(cfg, self.model, train_net, self.optimizer, self.scaler, self.state, self.dist,
                                   self.device)
        # Measured on rank 0 only: it alone writes metrics.
        self.diagnostics = LayerDiagnostics(self.model) if cfg.diag_interval and self.main else None
        self._clock = 0.0  # perf_counter() at which this run's elapsed time would have been 0

    # ------------------------------------------------------------- checkpoints

    def _elapsed(self) -> float:
        return time.perf_counter() - self._clock

    def _save(self, *paths: str) -> None:
        self.state.elapsed_s = self._elapsed()
        ckpt = pack_training_state(self.model, self.optimizer, self.scaler, self.state, self.dist, self.device,
                                   config=to_dict(self.cfg), model_config=dataclasses.asdict(self.model_cfg),
                                   vocab=self.tok.chars,  # on every rank (it may gather); written by rank 0
                                   **({"ema": self.average.state_dict()} if self.average else {}))
        if self.main:
            for path in paths:
                save_checkpoint(ckpt, path)

    # ------------------------------------------------------------- the loop

    def train(self) -> dict:
        """Run until max_iters, a non-finite loss (nonfinite=stop) or SIGINT/SIGTERM, owning
        out_dir all along (a second process is refused). Writes summary.json and returns it."""
        with owned(self.run_dir.path, self.dist, self.device):
            try:
                summary = self._train()
            finally:
                if self.run_dir.mirror is not None:
                    self.run_dir.mirror.close()
        # Only on this normal path: after an exception the other ranks may be inside another
        # collective, and torchrun ends the job when this process exits.
        if self.dist.enabled:
            # DDP's reducer holds communication state in reference cycles: free it now, while the
            # group and the interpreter are alive, rather than at interpreter exit after the group
            # is gone (where gloo can abort the process). Whoever owns the group: a caller that
            # ends the group itself (tests/ddp_worker.py) needs it freed just the same.
            self._step.train_net = self.net
            gc.collect()
        if self._owns_group:
            distributed.shutdown()
        return summary

    def _train(self) -> dict:
        cfg = self.cfg
        self.run_dir.check(cfg.init_from)  # before anything is written, and under the lock
        board = os.path.join(self.run_dir.path, TENSORBOARD_DIR)
        if cfg.tensorboard and os.path.lexists(board) and not os.path.isdir(board):
            raise BabyGPTError(f"'{board}' is where tensorboard = True writes its event files, but it is not a "
                               f"directory; move it aside (nothing was changed)")
        if cfg.init_from == "resume":
            resume_training_state(self.run_dir.ckpt, self.model_cfg, self.tok.chars, self.model, self.optimizer,
                                  self.scaler, self.state, self.dist, {k: getattr(cfg, k) for k in FIXED_AT_START},
                                  self.average)
            if self.state.iter >= cfg.max_iters or self._reached_target():  # e.g. killed after its last checkpoint
                return self._complete()
        resumed_at = self.state.iter if cfg.init_from == "resume" else None
        # read before start() records this resume; only the rank that prints needs it
        changes = resume_changes(self.run_dir, cfg) if resumed_at is not None and self.main else None
        self.run_dir.start(run_record(to_dict(cfg), self.argv, self.device, self.model.num_params(),
                                      self.dist.world_size), resumed_at)
        if cfg.tensorboard and self.main:
            self.run_dir.mirror = TensorBoardTracker(self.run_dir.path, resumed_at)
        if self.main:
            announce(cfg, self.device, self.dist, self.model.num_params(), resumed_at, changes, self.run_dir.ckpt)
        self._clock = time.perf_counter() - self.state.elapsed_s
        if self.state.pending_rng is not None:  # after everything that draws random numbers
            restore_rng(self.state.pending_rng, self.device)
            self.state.pending_rng = None
        self._step.train_net.train()
        with StopSignals() as stop:
            status, signum = self._loop(stop)
            self.state.elapsed_s = self._elapsed()
            # (still under the handlers: a SIGINT/SIGTERM during the final evaluation is noted, the
            # summary of the finished training is written, and the signal is named, not lost)
            summary = self._write_summary(status, signum)
        if status == "finished" and stop.signum is not None and self.main:
            print(f"{signal_name(stop.signum)} arrived as training ended (its last step or final evaluation): the "
                  f"run wrote its summary first (status {summary['status']})", file=sys.stderr, flush=True)
        return summary

    def _write_summary(self, status: str, signum: int | None) -> dict:
        """summary.json; a run that reached its end is first scored on the whole validation split,
        and called "skipped_out" if it has no finite result or most of its steps were skipped,
        "collapsed" if it is no better than the unigram model of the data (state.STATUSES)."""
        final = {}
        if status == "finished":
            final = final_evaluation(self.net, self.splits, self.tok.vocab_size, self.cfg, self.device, self.dist)
            if self.average is not None:
                final.update(self._averaged_evaluation())
            if self.state.skipped_out(final["val_loss_full"]):
                status = "skipped_out"
            elif is_collapsed(final["val_loss_full"], final["references"]):
                status = "collapsed"
        summary = {**self.state.summary(status, self.cfg.max_iters, signum), **final,
                   "machine": machine(self.device)}
        if self.cfg.target_val_loss:
            summary["target_reached_at"] = self.state.last_eval["iter"] if self._reached_target() else None
        if self.dist.enabled:
            summary["world_size"] = self.dist.world_size
        self.run_dir.write_summary(summary)
        return summary

    def _averaged_evaluation(self) -> dict:
        """The final evaluation's losses of the weights' average (ema_decay), as ``<name>_ema``."""
        with self.average.swapped_in(self.model):
            final = final_evaluation(self.net, self.splits, self.tok.vocab_size, self.cfg, self.device, self.dist)
        return {f"{k}_ema": final[k] for k in ("val_loss_full", "tune_loss", "test_loss")}

    def _complete(self) -> dict:
        """A resume with nothing left to train: the finished run's files stay as they are (only a
        run killed between its last checkpoint and its summary gets the summary it lacks)."""
        if self.main and self.state.iter >= self.cfg.max_iters:
            print(f"{self.run_dir.ckpt} is already at iteration {self.state.iter} (max_iters {self.cfg.max_iters}): "
                  f"nothing to train; pass a larger --max_iters to continue", file=sys.stderr)
        elif self.main:
            print(f"{self.run_dir.ckpt} already reached target_val_loss {self.cfg.target_val_loss:g} (val loss "
                  f"{self.state.last_eval['val_loss']:.4f}): nothing to train; pass a lower --target_val_loss "
                  f"to continue", file=sys.stderr)
        summary = self.run_dir.finished_summary(self.state.iter)
        self.dist.barrier()  # every rank has read it before rank 0 may write it
        return summary or self._write_summary("finished", None)

    def _loop(self, stop: StopSignals) -> tuple[str, int | None]:
        """Train until done; returns (status, the signal stopped on)."""
        cfg, state = self.cfg, self.state
        if cfg.init_from == "scratch":
            if not self._evaluate_and_checkpoint({"iter": 0, "loss": None, "lr": lr_at(0, cfg), "tokens_per_s": None}):
                return "diverged", None
        window = LossWindow(cfg.batch_size * cfg.model.block_size * cfg.gradient_accumulation_steps
                            * self.dist.world_size)
        with tqdm(total=cfg.max_iters, initial=state.iter, disable=None if self.main else True,
                  dynamic_ncols=True, leave=False) as bar:
            while state.iter < cfg.max_iters:
                signum = stop.agreed(self.dist, state.iter % cfg.log_interval == 0, self.device)
                if signum is not None:
                    window.drain(self.dist, state)
                    if cfg.nonfinite == "stop" and state.first_nonfinite is not None:
                        return "diverged", None  # do not checkpoint a state that has already gone bad
                    self._save(self.run_dir.ckpt)
                    return "interrupted", signum
                lr = lr_at(state.iter, cfg)
                measured = self.diagnostics is not None and (state.iter + 1) % cfg.diag_interval == 0
                window.add(self.step(lr, self.diagnostics if measured else NO_HOOK))
                state.iter += 1
                if measured:
                    self.run_dir.log(self.diagnostics.row(state.iter))
                bar.update(1)
                is_eval = state.iter % cfg.eval_interval == 0 or state.iter == cfg.max_iters
                if state.iter % cfg.log_interval and not is_eval:
                    continue
                row = window.row(self.dist, state, lr)
                if cfg.qk_clip_tau > 0:  # the sync is the row's, already made
                    row["qk_clipped_heads"] = int(self._step.clipped_heads.item())
                if cfg.nonfinite == "stop" and state.first_nonfinite is not None:
                    self.run_dir.log({**row, "diverged_at": state.first_nonfinite}, sync=True)
                    return "diverged", None  # ckpt.pt and best.pt still hold the last good state
                bar.set_postfix(loss=f"{math.nan if row['loss'] is None else row['loss']:.3f}", lr=f"{lr:.1e}",
                                tok_s=f"{row['tokens_per_s'] / 1e3:.1f}k")
                if not is_eval:
                    self.run_dir.log(row)
                elif not self._evaluate_and_checkpoint(row):
                    return "diverged", None
                elif self._reached_target():
                    return "finished", None
                window.restart_clock()  # eval time is not training throughput
        return "finished", None

    def _reached_target(self) -> bool:
        """The last finite evaluation is at or below target_val_loss (when one is set)."""
        target, last = self.cfg.target_val_loss, self.state.last_eval
        return target > 0 and "val_loss" in last and last["val_loss"] <= target

    def step(self, lr: float, hook: StepHook = NO_HOOK) -> torch.Tensor:
        """One optimizer step at ``lr`` (step.OptimizerStep); returns the step's mean loss, detached
        and left on the device. bench.py times this."""
        loss = self._step(lr, hook)
        if self.average is not None:
            self.average.update(self.model)
        return loss

    def _evaluate_and_checkpoint(self, row: dict) -> bool:
        """Evaluate, log ``row`` with the eval losses, then checkpoint. Returns False if the
        run must stop: a non-finite eval loss with nonfinite=stop. A non-finite eval never
        overwrites the checkpoints, which keep the last good state."""
        state = self.state
        self.dist.broadcast_buffers(self.model)
        losses = estimate_loss(self.net, self.splits, self.cfg, self.device, self.dist)
        # elapsed_s: wall time since the run started (compile and every eval so far included), as of this
        # eval's losses; the time to a target loss, as nanoGPT's "val 1.4697 in 3 minutes" counts it
        row.update(elapsed_s=round(self._elapsed(), 3), train_loss=finite_or_none(losses["train"]), val_loss=finite_or_none(losses["val"]))
        speed = f" | {row['tokens_per_s'] / 1e3:.1f}k tok/s" if row["tokens_per_s"] else ""
        if self.main:
            tqdm.write(f"step {state.iter} | train {losses['train']:.4f} | val {losses['val']:.4f} | "
                       f"lr {row['lr']:.1e}{speed}")
            sys.stdout.flush()  # eval lines show up promptly when stdout is a file or a pipe
        if row["train_loss"] is None or row["val_loss"] is None:
            if state.first_nonfinite is None:
                state.first_nonfinite = state.iter
            if self.cfg.nonfinite == "stop":
                row["diverged_at"] = state.first_nonfinite
            self.run_dir.log(row, sync=True)
            return self.cfg.nonfinite != "stop"
        state.last_eval = {"iter": state.iter, "train_loss": row["train_loss"], "val_loss": row["val_loss"]}
        self.run_dir.log(row, sync=True)
        best = row["val_loss"] < state.best_val_loss
        if best:
            state.best_val_loss = row["val_loss"]
        # best.pt first: a failure between the two writes then leaves ckpt.pt at the previous eval,
        # so the resume evaluates again and writes best.pt, instead of finding nothing to do.
        self._save(*([self.run_dir.best] if best else []), self.run_dir.ckpt)
        return True


def train(cfg: TrainConfig, argv: list[str] | None = None) -> dict:
    """Train per ``cfg``; returns the run's summary (also written to out_dir/summary.json).
    The run directory is checked first, so a refused run writes nothing (not even prepared data)."""
    run_dir = RunDir(cfg.out_dir)
    run_dir.check_not_in_use()
    run_dir.check(cfg.init_from)
    return Trainer(cfg, argv).train()
