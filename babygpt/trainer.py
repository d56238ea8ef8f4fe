"""The training loop: AdamW, warmup + cosine schedule, clipping, evals, metrics, checkpoints.

A run directory (``out_dir``) holds:
  config.json    the resolved TrainConfig, the command line, and each resume
  metrics.jsonl  one JSON object per logged iteration (eval rows add train_loss/val_loss)
  ckpt.pt        the latest state, for --init_from=resume (written at each eval and on interrupt)
  best.pt        the state with the lowest val loss so far, for sampling
  summary.json   how the run ended: finished | diverged | interrupted, losses, iterations, time

Every file is replaced atomically, so a kill at any moment leaves a loadable checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import math
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from . import distributed
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, to_dict, with_resolved_dtype
from .data import BatchSampler, CharTokenizer, load_dataset
from .diagnostics import LayerDiagnostics
from .errors import BabyGPTError
from .files import atomic_open, write_atomic
from .model import GPT, GPTConfig
from .runtime import autocast, check_dtype, resolve_device



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
def estimate_loss(model: GPT, splits: dict, cfg: TrainConfig, device: torch.device, seed: int) -> dict:
    """Mean loss over eval_iters batches of each split, with dropout off. A fresh sampler
    from ``seed`` makes every eval of a run use the same windows."""
    was_training = model.training
    model.eval()
    out = {}
    for split, data in splits.items():
        sampler = BatchSampler(data, cfg.block_size, cfg.batch_size, seed, device, split)
        losses = torch.zeros(cfg.eval_iters)
        for k in range(cfg.eval_iters):
            x, y = sampler.next_batch()
            with autocast(device, cfg.dtype):
                losses[k] = model(x, y)[1].item()
        out[split] = losses.mean().item()
    model.train(was_training)
    return out


MODEL_FIELDS = [f.name for f in dataclasses.fields(GPTConfig)]
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig)}


def _check_resume_compatible(ckpt: dict, model_cfg: GPTConfig, tok: CharTokenizer, path: str) -> None:
    # A field added to GPTConfig after the checkpoint was written has its default there.
    saved = {**MODEL_DEFAULTS, **ckpt.get("model_config", {})}
    diffs = [f"{k}={saved.get(k)!r} there, {getattr(model_cfg, k)!r} here"
             for k in MODEL_FIELDS if saved.get(k) != getattr(model_cfg, k)]
    if diffs:
        raise BabyGPTError(f"{path} was trained with a different architecture ({'; '.join(diffs)}); "
                           f"resume with the run's own config, or start a new --out_dir")
    if ckpt.get("vocab") != tok.chars:
        raise BabyGPTError(f"{path} was trained on a different vocabulary than the {tok.vocab_size} characters "
                           f"in this data_dir; point --data_dir at the run's data")


def _check_out_dir(cfg: TrainConfig) -> None:
    """Refuse, before anything is written, an out_dir that would lose data or cannot work."""
    if not cfg.out_dir.strip():
        raise BabyGPTError("out_dir is empty; pass --out_dir=DIR")
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise BabyGPTError(f"out_dir '{cfg.out_dir}' is a file, not a directory; choose another --out_dir")
    ancestor = os.path.abspath(cfg.out_dir)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise BabyGPTError(f"out_dir '{cfg.out_dir}' cannot be created: '{ancestor}' is a file; "
                           f"choose another --out_dir")
    ckpt = os.path.join(cfg.out_dir, "ckpt.pt")
    # A run that wrote any checkpoint or summary is kept; a directory with only the logs of a
    # run killed before its first checkpoint may be reused.
    if cfg.init_from == "scratch" and any(os.path.exists(os.path.join(cfg.out_dir, name))
                                          for name in ("ckpt.pt", "best.pt", "summary.json")):
        raise BabyGPTError(f"out_dir '{cfg.out_dir}' already holds a run; continue it with "
                           f"--init_from=resume, or choose another --out_dir (nothing was overwritten)")
    if cfg.init_from == "resume" and not os.path.exists(ckpt):
        raise BabyGPTError(f"cannot resume: no checkpoint at {ckpt}; train from scratch first "
                           f"(drop --init_from=resume) or point --out_dir at an existing run")


def _write_json(path: str, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _rewrite_metrics(path: str, last_iter: int) -> None:
    """Keep only the metrics rows up to ``last_iter`` (the checkpoint resumed from): rows
    after it will be logged again. A row cut short by a kill is dropped too."""
    rows = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if row["iter"] <= last_iter:
                    rows.append(line if line.endswith("\n") else line + "\n")
    with atomic_open(path) as f:
        f.write("".join(rows).encode())


def _rng_state(device: torch.device) -> dict:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
        # This process's GPU only: asking for every GPU's state would open a context on each.
        "cuda": [torch.cuda.get_rng_state(device)] if device.type == "cuda" else [],
    }


def _set_rng_state(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"][0], device)


class _StopSignals:
    """While active, SIGINT and SIGTERM only set ``signum``; the loop checks it between
    iterations, so a checkpoint is never taken in the middle of an optimizer step.
    A second signal gets the default behaviour at once (for a run that must die now)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._previous = {}

    def _handle(self, signum, frame):
        self.signum = signum
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = {s: signal.getsignal(s) for s in self.SIGNALS}
            for s in self.SIGNALS:
                signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _compile_or_fall_back(model: GPT, cfg: TrainConfig, device: torch.device):
    """torch.compile compiles lazily, so a missing compiler shows up only at the first call.
    Make one call now (eval mode, no grad: it draws no random numbers) and fall back to the
    eager model, with a warning, if compiling fails."""
    compiled = torch.compile(model)
    model.eval()
    try:
        with torch.no_grad(), autocast(device, cfg.dtype):
            compiled(torch.zeros(cfg.batch_size, cfg.block_size, dtype=torch.long, device=device))
    except Exception as e:  # e.g. no C++ compiler for the inductor backend
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"warning: torch.compile failed ({type(e).__name__}: {first_line}); training eagerly",
              file=sys.stderr)
        return model
    finally:
        model.train()
    return compiled


class Trainer:
    """Owns the model, optimizer, data samplers and run directory of one training run.

    Under torchrun (see distributed.py) there is one Trainer per rank: each draws its own
    batches, DistributedDataParallel averages the gradients, and only rank 0 writes files
    or prints. Every decision that ends the run is taken on values all ranks share (the
    averaged losses, an agreed signal), so the ranks always stop at the same iteration."""

    def __init__(self, cfg: TrainConfig, argv: list[str] | None = None):
        self.cfg, self.argv = cfg, list(argv or [])
        self.dist = distributed.from_env()
        self.main = self.dist.is_main  # rank 0, or the only process: the one that writes and prints
        # Every check comes before the first write, so a refused run leaves the disk as it was.
        device = resolve_device(cfg.device)
        check_dtype(device, cfg.dtype)
        self.cfg = cfg = with_resolved_dtype(cfg)  # from here on cfg (and config.json) hold the dtype used
        _check_out_dir(cfg)
        self.device, self._owns_group = distributed.setup(self.dist, device)
        if self.device.type == "cuda":
            # TF32 tensor cores for float32 matmuls (10-bit mantissa, float32 range): the usual
            # trade for training, several times faster on Ampere and later GPUs.
            torch.set_float32_matmul_precision("high")
        if not self.main:
            self.dist.barrier()  # rank 0 prepares the data (if needed) before the others read it
        train_data, val_data, self.tok = load_dataset(cfg.data_dir)
        if self.main:
            self.dist.barrier()
        self.splits = {"train": train_data, "val": val_data}
        self.model_cfg = cfg.model_config(self.tok.vocab_size)
        self.sampler = BatchSampler(train_data, cfg.block_size, cfg.batch_size,
                                    self.dist.train_seed(cfg.seed), self.device)
        BatchSampler(val_data, cfg.block_size, cfg.batch_size, cfg.seed, self.device, "val")  # size check

        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = GPT(self.model_cfg).to(self.device)
        if self.dist.enabled:
            torch.manual_seed(self.dist.train_seed(cfg.seed))  # but each rank its own dropout masks
        self.optimizer = self.model.configure_optimizers(
            cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), fused=self.device.type == "cuda")
        # Loss scaling is needed only for float16 (its narrow exponent range underflows small gradients).
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=self.device.type == "cuda" and cfg.dtype == "float16")
        self.iter, self.best_val_loss, self.elapsed_before = 0, float("inf"), 0.0
        self.last_eval: dict = {}
        self.first_nonfinite: int | None = None
        self.skipped_steps = 0  # steps dropped by nonfinite=skip
        self.scaler_skipped_steps = 0  # steps the float16 GradScaler dropped (inf/NaN gradients)
        self._resume_rng = None

        self.ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
        self.metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
        config_path = os.path.join(cfg.out_dir, "config.json")
        run_info = {"config": to_dict(cfg), "argv": self.argv, "device": str(self.device),
                    "torch": torch.__version__, "num_params": self.model.num_params(), "resumes": []}
        if self.dist.enabled:
            run_info["world_size"] = self.dist.world_size
        if self.main:
            ranks = f" x {self.dist.world_size} processes" if self.dist.enabled else ""
            print(f"training on {self.device}{ranks} in {cfg.dtype}, {self.model.num_params() / 1e6:.2f}M "
                  f"parameters, into {cfg.out_dir}", flush=True)
        if cfg.init_from == "resume":
            # Every rank reads the checkpoint: across nodes, out_dir must be on a shared filesystem.
            self._load(load_checkpoint(self.ckpt_path, map_location="cpu"))
            if os.path.exists(config_path):
                with open(config_path, encoding="utf-8") as f:
                    run_info = json.load(f)
            run_info.setdefault("resumes", []).append({"iter": self.iter, "argv": self.argv,
                                                       "config": to_dict(cfg)})
        if self.main:
            os.makedirs(cfg.out_dir, exist_ok=True)
            for stale in glob.glob(os.path.join(cfg.out_dir, ".tmp-*")):  # left by a kill mid-write
                os.remove(stale)
            _rewrite_metrics(self.metrics_path, self.iter if cfg.init_from == "resume" else -1)
            _write_json(config_path, run_info)

        # eval_model: the (compiled) model itself; forward_model adds DDP's gradient averaging.
        self.eval_model = self.model
        if cfg.compile:
            self.eval_model = _compile_or_fall_back(self.model, cfg, self.device)
        # Measured on rank 0 only: it alone writes metrics.
        self.diagnostics = LayerDiagnostics(self.model) if cfg.diag_interval and self.main else None
        self.forward_model = self.eval_model
        if self.dist.enabled:
            self.forward_model = DistributedDataParallel(
                self.eval_model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # ------------------------------------------------------------- checkpoints

    def _state(self) -> dict:
        """Everything a resume needs. Under DDP a collective: each rank's sampler and RNG
        state are gathered so that every rank resumes exactly where it stopped."""
        rank_state = {"sampler": self.sampler.state_dict(), "rng": _rng_state(self.device)}
        return {
            "model": self.model.state_dict(),  # the uncompiled module: no _orig_mod. prefixes
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            **rank_state,  # rank 0's (the whole state of a single-process run)
            "world_size": self.dist.world_size,
            "ranks": self.dist.gather(rank_state) if self.dist.enabled else [],
            "config": to_dict(self.cfg),
            "model_config": dataclasses.asdict(self.model_cfg),
            "vocab": self.tok.chars,
            "iter": self.iter,
            "best_val_loss": self.best_val_loss,
            "last_eval": self.last_eval,
            "elapsed_s": self.elapsed_before + time.perf_counter() - self.t_start,
            "counters": {"first_nonfinite": self.first_nonfinite, "skipped_steps": self.skipped_steps,
                         "scaler_skipped_steps": self.scaler_skipped_steps},
        }

    def _save(self, *paths: str) -> None:
        state = self._state()  # on every rank (it may gather); written by rank 0 only
        if self.main:
            for path in paths:
                save_checkpoint(state, path)

    def _load(self, ckpt: dict) -> None:
        _check_resume_compatible(ckpt, self.model_cfg, self.tok, self.ckpt_path)
        saved_world = ckpt.get("world_size", 1)
        if saved_world != self.dist.world_size:
            raise BabyGPTError(f"{self.ckpt_path} was written by {saved_world} process(es), this run has "
                               f"{self.dist.world_size}; resume with the same number (torchrun "
                               f"--nproc_per_node), or start a new --out_dir")
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            if ckpt["scaler"]:  # empty when the checkpointed run did not use float16
                self.scaler.load_state_dict(ckpt["scaler"])
            own = ckpt["ranks"][self.dist.rank] if self.dist.enabled else ckpt
            self.sampler.load_state_dict(own["sampler"])
            rng = own["rng"]
            counters = ckpt["counters"]
        except (KeyError, IndexError, RuntimeError, ValueError, TypeError) as e:
            raise BabyGPTError(f"{self.ckpt_path} is damaged or from an incompatible version "
                               f"({type(e).__name__}); start a new --out_dir") from None
        self.iter, self.best_val_loss = ckpt["iter"], ckpt["best_val_loss"]
        self.last_eval, self.elapsed_before = ckpt["last_eval"], ckpt["elapsed_s"]
        self.first_nonfinite = counters["first_nonfinite"]
        self.skipped_steps, self.scaler_skipped_steps = counters["skipped_steps"], counters["scaler_skipped_steps"]
        self._resume_rng = rng  # applied when training starts, after everything that draws random numbers

    # ------------------------------------------------------------- the loop

    def _log(self, row: dict, sync: bool = False) -> None:
        if not self.main:
            return
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            if sync:  # eval rows reach the disk before the checkpoint that follows them
                f.flush()
                os.fsync(f.fileno())

    def _evaluate_and_checkpoint(self, row: dict) -> bool:
        """Evaluate, log ``row`` with the eval losses, then checkpoint. Returns False if the
        run must stop: a non-finite eval loss with nonfinite=stop. A non-finite eval never
        overwrites the checkpoints, which keep the last good state."""
        self.dist.broadcast_buffers(self.model)
        local = estimate_loss(self.eval_model, self.splits, self.cfg, self.device,
                              self.dist.eval_seed(self.cfg.seed))
        # Each rank evaluated its own windows: the average is the loss over all of them.
        mean = self.dist.mean(torch.tensor([local["train"], local["val"]], device=self.device)).tolist()
        losses = {"train": mean[0], "val": mean[1]}
        row.update(train_loss=_finite_or_none(losses["train"]), val_loss=_finite_or_none(losses["val"]))
        speed = f" | {row['tokens_per_s'] / 1e3:.1f}k tok/s" if row["tokens_per_s"] else ""
        if self.main:
            tqdm.write(f"step {self.iter} | train {losses['train']:.4f} | val {losses['val']:.4f} | "
                       f"lr {row['lr']:.1e}{speed}")
            sys.stdout.flush()  # eval lines show up promptly when stdout is a file or a pipe
        if row["train_loss"] is None or row["val_loss"] is None:
            if self.first_nonfinite is None:
                self.first_nonfinite = self.iter
            if self.cfg.nonfinite == "stop":
                row["diverged_at"] = self.first_nonfinite
            self._log(row, sync=True)
            return self.cfg.nonfinite != "stop"
        self.last_eval = {"iter": self.iter, "train_loss": row["train_loss"], "val_loss": row["val_loss"]}
        self._log(row, sync=True)
        best = row["val_loss"] < self.best_val_loss
        if best:
            self.best_val_loss = row["val_loss"]
        self._save(self.ckpt_path, *([os.path.join(self.cfg.out_dir, "best.pt")] if best else []))
        return True

    def _drain(self, window: list) -> list[float]:
        """Move the per-step losses since the last metrics row to the host (one sync) and
        note the first non-finite one. Under DDP the losses are averaged over ranks first:
        the logged loss is the global batch's, and a NaN on any rank is seen by all."""
        losses = self.dist.mean(torch.stack(window)).tolist() if window else []
        first_bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if first_bad is not None and self.first_nonfinite is None:
            self.first_nonfinite = self.iter - len(losses) + 1 + first_bad
        window.clear()
        return losses

    def step(self, lr: float, diag: LayerDiagnostics | None = None) -> torch.Tensor:
        """One optimizer step (with gradient accumulation); returns the step's mean loss,
        detached and left on the device so that no host-device sync happens here.
        With ``diag``, also measures the step layer by layer (this syncs; diag steps only)."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        step_loss = torch.zeros((), device=self.device)
        for micro in range(cfg.gradient_accumulation_steps):
            x, y = self.sampler.next_batch()  # (B, T) each
            # DDP averages gradients across ranks during backward; accumulate locally and
            # communicate once, on the last micro-step.
            last = micro == cfg.gradient_accumulation_steps - 1
            with contextlib.nullcontext() if last or not self.dist.enabled else self.forward_model.no_sync():
                with autocast(self.device, cfg.dtype):
                    _, loss = self.forward_model(x, y)
                loss = loss / cfg.gradient_accumulation_steps
                step_loss += loss.detach()
                self.scaler.scale(loss).backward()
        if diag is not None:
            diag.stream(x)
        self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the loss-scaled ones
        if diag is not None:
            diag.grads()
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
            self.skipped_steps += 1
            return step_loss
        if diag is not None:
            diag.before_update()
        if self.scaler.is_enabled():
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scaler_skipped_steps += int(self.scaler.get_scale() < scale)  # the scale drops on a skip
        else:
            self.optimizer.step()
        if diag is not None:
            diag.after_update()
        self.optimizer.zero_grad(set_to_none=True)
        return step_loss

    def train(self) -> dict:
        """Run until max_iters, a non-finite loss (nonfinite=stop) or SIGINT/SIGTERM.
        Writes summary.json and returns it."""
        self.t_start = time.perf_counter()
        if self._resume_rng is not None:
            _set_rng_state(self._resume_rng, self.device)
        self.forward_model.train()
        self.stop_signal = None  # the signal all ranks agreed to stop on
        with _StopSignals() as stop:
            status = self._loop(stop)
        summary = self._write_summary(status, self.stop_signal if status == "interrupted" else None)
        # Only on this normal path: after an exception the other ranks may be inside another
        # collective, and torchrun ends the job when this process exits.
        if self._owns_group:
            distributed.shutdown()
        return summary

    def _agreed_signal(self, stop: _StopSignals) -> int | None:
        """The signal to stop on, if any. One process checks at every iteration; under DDP
        the ranks compare at each metrics row (one small all-reduce there), because a signal
        reaches each rank at a slightly different moment and they must stop together."""
        if not self.dist.enabled:
            return stop.signum
        if self.iter % self.cfg.log_interval:
            return None
        flag = self.dist.max(torch.tensor([float(stop.signum or 0)], device=self.device))
        return int(flag.item()) or None

    def _loop(self, stop: _StopSignals) -> str:
        cfg = self.cfg
        stops_on_nonfinite = cfg.nonfinite == "stop"
        if cfg.init_from == "scratch":
            row = {"iter": 0, "loss": None, "lr": lr_at(0, cfg), "tokens_per_s": None}
            if not self._evaluate_and_checkpoint(row):
                return "diverged"
        elif self.iter >= cfg.max_iters:  # e.g. killed after its last checkpoint: it is complete
            if self.main:
                print(f"{self.ckpt_path} is already at iteration {self.iter} (max_iters {cfg.max_iters}): "
                      f"nothing to train; pass a larger --max_iters to continue", file=sys.stderr)
            return "finished"
        tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps * self.dist.world_size
        window: list[torch.Tensor] = []  # per-step losses since the last metrics row, on device
        t_last = time.perf_counter()
        with tqdm(total=cfg.max_iters, initial=self.iter, disable=None if self.main else True,
                  dynamic_ncols=True, leave=False) as bar:
            while self.iter < cfg.max_iters:
                self.stop_signal = self._agreed_signal(stop)
                if self.stop_signal is not None:
                    self._drain(window)
                    if stops_on_nonfinite and self.first_nonfinite is not None:
                        return "diverged"  # do not checkpoint a state that has already gone bad
                    self._save(self.ckpt_path)
                    return "interrupted"
                lr = lr_at(self.iter, cfg)
                diag = self.diagnostics if cfg.diag_interval and (self.iter + 1) % cfg.diag_interval == 0 else None
                window.append(self.step(lr, diag))
                self.iter += 1
                if diag is not None:
                    self._log(diag.row(self.iter))
                bar.update(1)
                is_eval = self.iter % cfg.eval_interval == 0 or self.iter == cfg.max_iters
                if self.iter % cfg.log_interval and not is_eval:
                    continue
                n = len(window)
                losses = self._drain(window)  # the only host-device sync, once per metrics row
                row = {"iter": self.iter, "loss": _finite_or_none(losses[-1]), "lr": lr,
                       "tokens_per_s": n * tokens_per_iter / (time.perf_counter() - t_last)}
                if self.skipped_steps or self.scaler_skipped_steps:
                    row.update(skipped_steps=self.skipped_steps, scaler_skipped_steps=self.scaler_skipped_steps)
                if stops_on_nonfinite and self.first_nonfinite is not None:
                    row["diverged_at"] = self.first_nonfinite
                    self._log(row, sync=True)
                    return "diverged"  # ckpt.pt and best.pt still hold the last good state
                bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr:.1e}",
                                tok_s=f"{row['tokens_per_s'] / 1e3:.1f}k")
                if is_eval:
                    if not self._evaluate_and_checkpoint(row):
                        return "diverged"
                else:
                    self._log(row)
                t_last = time.perf_counter()  # eval time is not training throughput
        return "finished"

    def _write_summary(self, status: str, signum: int | None) -> dict:
        summary = {
            "status": status,
            "iter": self.iter,
            "max_iters": self.cfg.max_iters,
            "diverged_at": self.first_nonfinite if status == "diverged" else None,
            "first_nonfinite_at": self.first_nonfinite,
            "skipped_steps": self.skipped_steps,
            "scaler_skipped_steps": self.scaler_skipped_steps,
            "final_train_loss": self.last_eval.get("train_loss"),
            "final_val_loss": self.last_eval.get("val_loss"),
            "final_eval_iter": self.last_eval.get("iter"),
            "best_val_loss": _finite_or_none(self.best_val_loss),
            "wall_time_s": round(self.elapsed_before + time.perf_counter() - self.t_start, 3),
            "signal": signal.Signals(signum).name if signum else None,
        }
        if self.dist.enabled:
            summary["world_size"] = self.dist.world_size
        if self.main:
            _write_json(os.path.join(self.cfg.out_dir, "summary.json"), summary)
        return summary


def train(cfg: TrainConfig, argv: list[str] | None = None) -> dict:
    """Train per ``cfg``; returns the run's summary (also written to out_dir/summary.json)."""
    return Trainer(cfg, argv).train()
