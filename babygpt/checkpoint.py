"""Checkpoints: plain dicts of tensors and Python scalars, written atomically,
read back with ``weights_only=True`` so that a file from elsewhere cannot run code."""

from __future__ import annotations

import os
import pickle

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
