"""Checkpoints: plain dicts of tensors and Python scalars, written atomically,
read back with ``weights_only=True`` so that a file from elsewhere cannot run code.

Also what an exact resume needs besides the weights: the random number generators'
states, and the check that a checkpoint fits the run that wants to continue it.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import random

import numpy as np
import torch

from .errors import BabyGPTError
from .files import atomic_open

FORMAT = "babygpt-ckpt-v1"


def save_checkpoint(state: dict, path: str) -> None:
    """Write ``state`` to ``path`` via a temporary file in the same directory,
    fsync and ``os.replace``: a crash at any moment leaves the old file or the new one."""
    with atomic_open(path) as f:
        torch.save({"format": FORMAT, **state}, f)


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Load a BabyGPT checkpoint, refusing anything that is not one."""
    if os.path.isdir(path):
        raise BabyGPTError(f"checkpoint '{path}' is a directory; give the checkpoint file in it, e.g. "
                           f"{os.path.join(path, 'best.pt')}")
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block torch.load forever
        raise BabyGPTError(f"checkpoint '{path}' is not a regular file (a pipe, socket or device); give the "
                           f"checkpoint file itself")
    if not os.path.isfile(path):
        raise BabyGPTError(f"checkpoint '{path}' not found; train first (python train.py CONFIG) "
                           f"or check the path")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses any pickled global (a class or function to call): that is how
        # a malicious file would run code. Other unpickling errors mean the bytes are no pickle.
        if "GLOBAL" in str(e):
            raise BabyGPTError(f"refusing to load '{path}': it asks to import Python objects, which "
                               f"could run code; only load checkpoints made by BabyGPT") from None
        raise BabyGPTError(f"'{path}' is not a readable checkpoint (not a torch file); "
                           f"check the path") from None
    except Exception as e:  # truncated zip, random bytes, ...
        raise BabyGPTError(f"'{path}' is not a readable checkpoint ({type(e).__name__}); "
                           f"it may be truncated or corrupt: use another checkpoint") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise BabyGPTError(f"'{path}' is not a BabyGPT checkpoint (no '{FORMAT}' marker)")
    return state


def checkpoint_vocab(ckpt: dict, vocab_size: int, path: str) -> list[str]:
    """The checkpoint's vocabulary, refused unless it is ``vocab_size`` distinct characters, one per
    row of the model's token embedding: otherwise ids the model emits (or a prompt maps to) have no
    character, or a character two ids."""
    vocab = ckpt.get("vocab")
    fix = "use another checkpoint (or the run's other one: ckpt.pt / best.pt)"
    if not isinstance(vocab, list) or not all(isinstance(c, str) and len(c) == 1 for c in vocab):
        raise BabyGPTError(f"'{path}' is damaged: its vocabulary is not a list of single characters; {fix}")
    if len(vocab) != vocab_size:
        raise BabyGPTError(f"'{path}' is damaged: its vocabulary has {len(vocab)} characters but its model's "
                           f"embedding has {vocab_size} rows (vocab_size); {fix}")
    if len(set(vocab)) != len(vocab):
        raise BabyGPTError(f"'{path}' is damaged: its vocabulary lists a character twice; {fix}")
    return vocab


# ---------------------------------------------------------------- random number generators

def capture_rng(device: torch.device) -> dict:
    """The state of every generator a training step draws from (dropout, Python, NumPy)."""
    kind, keys, *rest = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), *rest],
        "torch": torch.get_rng_state(),
        # This process's GPU only: asking for every GPU's state would open a context on each.
        "cuda": [torch.cuda.get_rng_state(device)] if device.type == "cuda" else [],
        # On Apple GPUs dropout masks come from the MPS generator, which torch's CPU state does not cover.
        "mps": [torch.mps.get_rng_state()] if device.type == "mps" else [],
    }


def restore_rng(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"][0], device)
    if state.get("mps") and device.type == "mps":  # absent from checkpoints written before it was saved
        torch.mps.set_rng_state(state["mps"][0])


# ---------------------------------------------------------------- a training run's checkpoint

def pack_training_state(model, optimizer, scaler, state, dist, device: torch.device, **extra) -> dict:
    """Everything a resume needs, as plain data: weights, optimizer and scaler state, the
    TrainState, and ``extra`` (config, vocabulary). Under DDP a collective: every rank's sampler
    and RNG state are gathered so that each rank resumes exactly where it stopped."""
    rank_state = state.rank_state(device)
    return {
        "model": model.state_dict(),  # the uncompiled module: no _orig_mod. prefixes
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        **state.state_dict(),
        **rank_state,  # rank 0's (the whole state of a single-process run)
        "world_size": dist.world_size,
        "ranks": dist.gather(rank_state) if dist.enabled else [],
        **extra,
    }


def resume_training_state(path: str, model_cfg, vocab: list[str], model, optimizer, scaler, state, dist,
                          fixed: dict | None = None, average=None) -> None:
    """Load the checkpoint ``path`` (written by ``pack_training_state``) into the run's objects,
    after checking that it fits them (``fixed``: the run's values of FIXED_AT_START's keys; ``average``:
    the run's averaging.WeightAverage, if it keeps one). The RNG states
    are kept in ``state.pending_rng``, applied when training starts. Under torchrun every rank reads
    the file, so across nodes it must be on a shared filesystem."""
    ckpt = load_checkpoint(path, map_location="cpu")
    if not isinstance(ckpt.get("model_config"), dict):
        raise BabyGPTError(f"{path} is damaged (its model_config is not a mapping); start a new --out_dir")
    check_same_start(ckpt, fixed or {}, path)  # first: muon also changes the architecture (split_qkv)
    check_resumable(ckpt, model_cfg, vocab, dist.world_size, path)
    try:
        model.load_state_dict(ckpt["model"])
        if average is not None:
            average.load_state_dict(ckpt["ema"])
        load_optimizer_state(optimizer, ckpt["optimizer"])
        if ckpt["scaler"]:  # empty when the checkpointed run did not use float16
            scaler.load_state_dict(ckpt["scaler"])
        state.load_state_dict(ckpt)
        state.load_rank_state(ckpt["ranks"][dist.rank] if dist.enabled else ckpt)
        state.check_types()
        # Applied for real when training starts; applied now too, so that damaged generator
        # states are refused before anything in out_dir is written (nothing draws in between).
        restore_rng(state.pending_rng, torch.device("cpu"))
    except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as e:
        raise BabyGPTError(f"{path} is damaged or from an incompatible version "
                           f"({type(e).__name__}); start a new --out_dir") from None


def load_optimizer_state(optimizer, state: dict) -> None:
    """Load a checkpoint's optimizer ``state`` (moments, momentum buffers, step counts) into
    ``optimizer`` (a torch optimizer or optim.MuonWithAdamW), keeping this run's group settings
    (lr_scale, weight_decay, betas, eps, momentum, adjust_lr_fn, ...): torch's load_state_dict takes
    them from the checkpoint, whereas a resume runs with its own config, and says so where that
    differs from the run's last start (trainer.resume_changes)."""
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, own in zip(optimizer.param_groups, settings):
        group.update(own)


# ---------------------------------------------------------------- resuming

# The training settings a resume cannot change, with what they fix and their value in a checkpoint
# written before the key existed. The optimizer's state is one optimizer's; decay_norms decides which
# parameter group each norm parameter is in, and the optimizer's state is stored group by group;
# the seed is read only at the start (init and the first data order), after which the checkpoint's
# random states take over, so a new one would be accepted and change nothing.
FIXED_AT_START = {
    "optimizer": ("its optimizer state cannot continue under another optimizer", "adamw"),
    "decay_norms": ("it decides which of the optimizer's parameter groups holds each norm parameter, and the "
                    "checkpoint's optimizer state is stored by group", False),
    "seed": ("the seed is read only when a run starts: a resume restores the random states from the "
             "checkpoint, so another seed would change nothing", None),
    "ema_decay": ("the checkpoint's average of the weights was kept at that decay (or not kept)", 0.0),
}


def check_same_start(ckpt: dict, settings: dict, path: str) -> None:
    """Refuse to continue a run with a setting of FIXED_AT_START changed (``settings``: the run's
    values of those keys), every such key named in one line. A checkpoint from before a key existed
    has the key's old value (None: not known, not checked)."""
    config = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    changed = [(key, config.get(key, old), settings[key]) for key, (_, old) in FIXED_AT_START.items()
               if key in settings and config.get(key, old) is not None and config.get(key, old) != settings[key]]
    if changed:
        said = "; ".join(f"{key} {saved!r} there, {asked!r} here: {FIXED_AT_START[key][0]}"
                         for key, saved, asked in changed)
        give = " ".join(f"--{key}={saved}" for key, saved, _ in changed)
        raise BabyGPTError(f"{path} cannot be resumed with other settings ({said}); resume with {give}, or "
                           f"start a new --out_dir")


def check_resumable(ckpt: dict, model_cfg, vocab: list[str], world_size: int, path: str) -> None:
    """Refuse a checkpoint whose architecture, vocabulary or number of processes differs from
    the run that wants to continue it. ``model_cfg`` is the run's GPTConfig."""
    # A field added to GPTConfig after the checkpoint was written has its default there.
    defaults = {f.name: f.default for f in dataclasses.fields(model_cfg)}
    saved = {**defaults, **ckpt.get("model_config", {})}
    diffs = [f"{k}={saved.get(k)!r} there, {getattr(model_cfg, k)!r} here"
             for k in defaults if saved.get(k) != getattr(model_cfg, k)]
    if diffs:
        raise BabyGPTError(f"{path} was trained with a different architecture ({'; '.join(diffs)}); "
                           f"resume with the run's own config, or start a new --out_dir")
    if ckpt.get("vocab") != vocab:
        raise BabyGPTError(f"{path} was trained on a different vocabulary than the {len(vocab)} characters "
                           f"in this data_dir; point --data_dir at the run's data")
    saved_world = ckpt.get("world_size", 1)
    if saved_world != world_size:
        raise BabyGPTError(f"{path} was written by {saved_world} process(es), this run has "
                           f"{world_size}; resume with the same number (torchrun "
                           f"--nproc_per_node), or start a new --out_dir")
