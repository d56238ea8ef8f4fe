"""The training loop: AdamW, warmup + cosine schedule, clipping, evals, metrics, checkpoints.

A run directory (``out_dir``) holds:
  config.json    the resolved TrainConfig, the command line, and each resume
  metrics.jsonl  one JSON object per logged iteration (eval rows add train_loss/val_loss)
  ckpt.pt        the latest state, for --init_from=resume
  best.pt        the state with the lowest val loss so far, for sampling
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

import torch
from tqdm import tqdm

from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, to_dict
from .data import BatchSampler, CharTokenizer, load_dataset
from .errors import BabyGPTError
from .files import atomic_open
from .model import GPT, GPTConfig
from .runtime import autocast, check_dtype, resolve_device

EVAL_SEED_OFFSET = 1  # eval batches come from seed + 1: the same windows at every eval, in every run


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
def estimate_loss(model: GPT, splits: dict, cfg: TrainConfig, device: torch.device) -> dict:
    """Mean loss over eval_iters batches of each split, with dropout off."""
    was_training = model.training
    model.eval()
    out = {}
    for split, data in splits.items():
        sampler = BatchSampler(data, cfg.block_size, cfg.batch_size, cfg.seed + EVAL_SEED_OFFSET, device, split)
        losses = torch.zeros(cfg.eval_iters)
        for k in range(cfg.eval_iters):
            x, y = sampler.next_batch()
            with autocast(device, cfg.dtype):
                losses[k] = model(x, y)[1].item()
        out[split] = losses.mean().item()
    model.train(was_training)
    return out


MODEL_FIELDS = [f.name for f in dataclasses.fields(GPTConfig)]


def _check_resume_compatible(ckpt: dict, model_cfg: GPTConfig, tok: CharTokenizer, path: str) -> None:
    saved = ckpt.get("model_config", {})
    diffs = [f"{k}={saved.get(k)!r} there, {getattr(model_cfg, k)!r} here"
             for k in MODEL_FIELDS if saved.get(k) != getattr(model_cfg, k)]
    if diffs:
        raise BabyGPTError(f"{path} was trained with a different architecture ({'; '.join(diffs)}); "
                           f"resume with the run's own config, or start a new --out_dir")
    if ckpt.get("vocab") != tok.chars:
        raise BabyGPTError(f"{path} was trained on a different vocabulary than {tok.vocab_size} characters "
                           f"in this data_dir; point --data_dir at the run's data")


def _prepare_out_dir(cfg: TrainConfig) -> None:
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise BabyGPTError(f"out_dir '{cfg.out_dir}' is a file, not a directory; choose another --out_dir")
    ckpt = os.path.join(cfg.out_dir, "ckpt.pt")
    if cfg.init_from == "scratch" and os.path.exists(ckpt):
        raise BabyGPTError(f"out_dir '{cfg.out_dir}' already holds a run; continue it with "
                           f"--init_from=resume, or choose another --out_dir (nothing was overwritten)")
    if cfg.init_from == "resume" and not os.path.exists(ckpt):
        raise BabyGPTError(f"cannot resume: no checkpoint at {ckpt}; train from scratch first "
                           f"(drop --init_from=resume) or point --out_dir at an existing run")
    os.makedirs(cfg.out_dir, exist_ok=True)


def _write_json(path: str, obj) -> None:
    with atomic_open(path) as f:
        f.write((json.dumps(obj, indent=2) + "\n").encode())


def _truncate_metrics(path: str, last_iter: int) -> None:
    """Drop metrics rows logged after the checkpoint we resume from; they will be logged again."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        rows = [line for line in f if line.strip() and json.loads(line)["iter"] <= last_iter]
    with atomic_open(path) as f:
        f.write("".join(rows).encode())


class Trainer:
    """Owns the model, optimizer, data samplers and run directory of one training run."""

    def __init__(self, cfg: TrainConfig, argv: list[str] | None = None):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        check_dtype(self.device, cfg.dtype)
        _prepare_out_dir(cfg)
        train_data, val_data, self.tok = load_dataset(cfg.data_dir)
        self.splits = {"train": train_data, "val": val_data}
        self.model_cfg = cfg.model_config(self.tok.vocab_size)

        torch.manual_seed(cfg.seed)
        self.model = GPT(self.model_cfg).to(self.device)
        self.optimizer = self.model.configure_optimizers(
            cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), fused=self.device.type == "cuda")
        # Loss scaling is needed only for float16 (its narrow exponent range underflows small gradients).
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=self.device.type == "cuda" and cfg.dtype == "float16")
        self.sampler = BatchSampler(train_data, cfg.block_size, cfg.batch_size, cfg.seed, self.device)
        BatchSampler(val_data, cfg.block_size, cfg.batch_size, cfg.seed, self.device, "val")  # size check
        self.iter, self.best_val_loss = 0, float("inf")

        self.ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
        self.metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
        config_path = os.path.join(cfg.out_dir, "config.json")
        run_info = {"config": to_dict(cfg), "argv": list(argv or []), "device": str(self.device),
                    "torch": torch.__version__, "num_params": self.model.num_params(), "resumes": []}
        if cfg.init_from == "resume":
            self._load(load_checkpoint(self.ckpt_path, map_location=self.device))
            _truncate_metrics(self.metrics_path, self.iter)
            if os.path.exists(config_path):
                with open(config_path, encoding="utf-8") as f:
                    run_info = json.load(f)
            run_info.setdefault("resumes", []).append(
                {"iter": self.iter, "argv": list(argv or []), "config": to_dict(cfg)})
        _write_json(config_path, run_info)

        self.forward_model = self.model
        if cfg.compile:
            try:
                self.forward_model = torch.compile(self.model)
            except Exception as e:  # e.g. no C++ compiler on this machine
                print(f"warning: torch.compile unavailable ({type(e).__name__}: {e}); training eagerly",
                      file=sys.stderr)

    # ------------------------------------------------------------- checkpoints

    def _state(self) -> dict:
        return {
            "model": self.model.state_dict(),  # the uncompiled module: no _orig_mod. prefixes
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "config": to_dict(self.cfg),
            "model_config": dataclasses.asdict(self.model_cfg),
            "vocab": self.tok.chars,
            "iter": self.iter,
            "best_val_loss": self.best_val_loss,
        }

    def _load(self, ckpt: dict) -> None:
        _check_resume_compatible(ckpt, self.model_cfg, self.tok, self.ckpt_path)
        if ckpt["iter"] >= self.cfg.max_iters:
            raise BabyGPTError(f"{self.ckpt_path} is already at iteration {ckpt['iter']} >= max_iters "
                               f"({self.cfg.max_iters}); pass a larger --max_iters to train further")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.sampler.load_state_dict(ckpt["sampler"])
        torch.set_rng_state(ckpt["torch_rng"])
        self.iter, self.best_val_loss = ckpt["iter"], ckpt["best_val_loss"]

    # ------------------------------------------------------------- the loop

    def _log(self, row: dict) -> None:
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def _evaluate(self, row: dict) -> None:
        losses = estimate_loss(self.forward_model, self.splits, self.cfg, self.device)
        row.update(train_loss=losses["train"], val_loss=losses["val"])
        speed = f" | {row['tokens_per_s'] / 1e3:.1f}k tok/s" if row["tokens_per_s"] else ""
        tqdm.write(f"step {self.iter} | train {losses['train']:.4f} | val {losses['val']:.4f} | "
                   f"lr {row['lr']:.1e}{speed}")
        sys.stdout.flush()  # eval lines show up promptly when stdout is a file or a pipe
        if losses["val"] < self.best_val_loss:
            self.best_val_loss = losses["val"]
            save_checkpoint(self._state(), os.path.join(self.cfg.out_dir, "best.pt"))
        save_checkpoint(self._state(), self.ckpt_path)

    def train(self) -> dict:
        """Run until max_iters; return the final eval losses."""
        cfg, model = self.cfg, self.forward_model
        tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps
        model.train()
        if self.iter == 0:
            row = {"iter": 0, "loss": None, "lr": lr_at(0, cfg), "tokens_per_s": None}
            self._evaluate(row)
            self._log(row)
        bar = tqdm(total=cfg.max_iters, initial=self.iter, disable=None, dynamic_ncols=True, leave=False)
        t_last, iters_since = time.perf_counter(), 0
        while self.iter < cfg.max_iters:
            lr = lr_at(self.iter, cfg)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            for _ in range(cfg.gradient_accumulation_steps):
                x, y = self.sampler.next_batch()  # (B, T) each
                with autocast(self.device, cfg.dtype):
                    _, loss = model(x, y)
                self.scaler.scale(loss / cfg.gradient_accumulation_steps).backward()
            if cfg.grad_clip > 0:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.iter += 1
            iters_since += 1
            bar.update(1)

            is_eval = self.iter % cfg.eval_interval == 0 or self.iter == cfg.max_iters
            if self.iter % cfg.log_interval == 0 or is_eval:
                loss_value = loss.item()  # the only host-device sync, once per logged step
                elapsed = time.perf_counter() - t_last
                row = {"iter": self.iter, "loss": loss_value, "lr": lr,
                       "tokens_per_s": iters_since * tokens_per_iter / elapsed}
                bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.1e}",
                                tok_s=f"{row['tokens_per_s'] / 1e3:.1f}k")
                if is_eval:
                    self._evaluate(row)
                self._log(row)
                t_last, iters_since = time.perf_counter(), 0  # eval time is not training throughput
        bar.close()
        return {"iter": self.iter, "best_val_loss": self.best_val_loss}


def train(cfg: TrainConfig, argv: list[str] | None = None) -> dict:
    return Trainer(cfg, argv).train()


