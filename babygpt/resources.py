"""Memory a model needs, checked against what the machine has before anything is allocated.

A model or batch that cannot fit fails late and badly without this check: on Linux the kernel
overcommits, so a huge allocation "succeeds" and the process is killed (no message) when the
pages are touched. The estimates here are lower bounds, so a run that is refused could never
have fitted; a run that passes may still run out (the message of cli.run covers that case).
"""

from __future__ import annotations

import os

import torch

from .errors import BabyGPTError

GiB = 2**30
FIX = "reduce batch_size, block_size, n_embd or n_layer"


def num_params_lower_bound(n_layer: int, n_embd: int, block_size: int, vocab_size: int) -> int:
    """Parameters of the GPT in model.py without norms and biases: per Block the attention's qkv
    and output projections (4 C^2) and the 4x FeedForward (8 C^2); the embeddings (the LM head
    is tied to the token embedding). Plain integer arithmetic: no tensor is made, so absurd
    sizes cannot overflow or allocate anything."""
    return n_layer * 12 * n_embd**2 + (vocab_size + block_size) * n_embd


def training_bytes(n_layer: int, n_embd: int, block_size: int, vocab_size: int, batch_size: int) -> int:
    """A lower bound on training memory: float32 weights, gradients and AdamW's two moments
    (16 bytes a parameter), plus activations kept for the backward pass at 2 bytes a value (the
    smallest dtype): per Block at least the qkv (3C), attention output (C), two residual
    sums (2C) and the FeedForward's hidden layer before and after GELU (8C) for every token,
    and the logits."""
    params = num_params_lower_bound(n_layer, n_embd, block_size, vocab_size)
    tokens = batch_size * block_size
    activations = tokens * (n_layer * 14 * n_embd + vocab_size)
    return 16 * params + 2 * activations


def inference_bytes(n_layer: int, n_embd: int, block_size: int, vocab_size: int) -> int:
    """A lower bound on the memory of a model's float32 weights."""
    return 4 * num_params_lower_bound(n_layer, n_embd, block_size, vocab_size)


def available_bytes(device: torch.device) -> int | None:
    """Memory that allocations on ``device`` can still get: on a CPU, MemAvailable plus free swap
    (Linux) or the physical memory (elsewhere); on CUDA the GPU's total memory (asking for its
    free memory would create a CUDA context on GPU 0 in every torchrun rank). None if unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        return info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, KeyError, ValueError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def memory_problem(needed: int, device: torch.device, what: str, fix: str = FIX) -> str | None:
    """A one-line problem if ``needed`` bytes cannot fit in ``device``'s free memory."""
    free = available_bytes(device)
    if free is None or needed <= free:
        return None
    return (f"{what} needs at least {needed / GiB:,.1f} GiB, more than the {free / GiB:,.1f} GiB "
            f"of memory {'on the GPU' if device.type == 'cuda' else 'free'}; {fix}")


def check_fits(needed: int, device: torch.device, what: str, fix: str = FIX) -> None:
    problem = memory_problem(needed, device, what, fix)
    if problem:
        raise BabyGPTError(problem)
