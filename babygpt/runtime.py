"""Device and dtype choices, made once and checked up front rather than deep inside torch."""

from __future__ import annotations

import contextlib

import torch

from .errors import BabyGPTError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def resolve_device(name: str) -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; an explicit choice must be available."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BabyGPTError("device 'cuda' requested but no CUDA GPU is available to torch; "
                           "use --device=cpu (or --device=auto)")
    if name == "mps" and not _mps_available():
        raise BabyGPTError("device 'mps' requested but Apple MPS is not available; use --device=cpu")
    if name not in ("cpu", "cuda", "mps"):
        raise BabyGPTError(f"unknown device {name!r}; choose one of: auto, cpu, cuda, mps")
    return torch.device(name)


def native_cuda_bf16() -> bool:
    """bfloat16 in the GPU's hardware (Ampere and later). torch's own check also counts the slow
    emulation older GPUs offer."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_dtype(device: torch.device, dtype: str) -> str:
    """``auto``: bfloat16 on a CUDA GPU that supports it, float16 (with a GradScaler) on one that
    does not, float32 elsewhere. On a CPU bfloat16 pays off only where the CPU has bfloat16
    instructions (it is emulated, and slower, on many laptops), so it stays opt-in there."""
    if dtype != "auto":
        return dtype
    if device.type == "cuda":
        return "bfloat16" if native_cuda_bf16() else "float16"  # emulated bf16 is slower than fp16
    return "float32"


def check_dtype(device: torch.device, dtype: str) -> None:
    """float16 training needs a GradScaler, which BabyGPT uses on CUDA only."""
    dtype = resolve_dtype(device, dtype)
    if dtype == "float16" and device.type == "cpu":
        raise BabyGPTError("dtype float16 is not supported on CPU (CPU autocast is bfloat16); "
                           "use --dtype=bfloat16 or --dtype=float32")
    if dtype == "float16" and device.type != "cuda":
        raise BabyGPTError(f"dtype float16 needs CUDA (it trains with a GradScaler); on {device.type} "
                           f"use --dtype=bfloat16 or --dtype=float32")
    if dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise BabyGPTError("this GPU does not support bfloat16; use --dtype=float16 (with a GradScaler) "
                           "or --dtype=float32")


def autocast(device: torch.device, dtype: str):
    """Mixed precision context for the forward pass; a no-op for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])
