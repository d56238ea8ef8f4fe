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


KiB = 2**10
# What one Block costs besides its weights' values, whatever its width, as (built, after a training
# step): its Python modules and parameter tensors, and in training their gradients, AdamW's state
# tensors and the saved tensors of the autograd graph. On a CPU these are host objects, measured at
# about 25 KiB and 60 KiB a Block (torch 2.13, width 1, norm_type none, no biases: the smallest Block);
# on a GPU each of a Block's (at least 4) weight tensors, and in training their gradients and two AdamW
# moments, takes at least the caching allocator's 512-byte block. Rounded down: lower bounds.
BLOCK_OVERHEAD = {"cpu": (20 * KiB, 40 * KiB)}
BLOCK_OVERHEAD_GPU = (4 * 512, 4 * 4 * 512)


def num_params_lower_bound(n_layer: int, n_embd: int, block_size: int, vocab_size: int) -> int:
    """Parameters of the GPT in model.py without norms and biases: per Block the attention's qkv
    and output projections (4 C^2) and the 4x FeedForward (8 C^2); the embeddings (the LM head
    is tied to the token embedding). Plain integer arithmetic: no tensor is made, so absurd
    sizes cannot overflow or allocate anything."""
    return n_layer * 12 * n_embd**2 + (vocab_size + block_size) * n_embd


def block_overhead(device_type: str, training: bool) -> int:
    """Bytes a Block costs on ``device_type`` besides its weights (BLOCK_OVERHEAD)."""
    return BLOCK_OVERHEAD.get(device_type, BLOCK_OVERHEAD_GPU)[training]


def attention_bytes(m, batch_size: int, device_type: str) -> int:
    """A lower bound on the (B, H, T, T) attention matrices a training step keeps, at 2 bytes a value.
    On a CPU, attention with dropout takes the unfused path, which keeps every layer's attention
    weights for the backward pass (measured: torch 2.13); the fused kernels (no dropout, or a GPU)
    keep none."""
    if device_type != "cpu" or not m.dropout > 0:
        return 0
    return 2 * m.n_layer * batch_size * m.n_head * m.block_size**2


def training_bytes(m, batch_size: int, device_type: str = "cpu", diagnostics: bool = False) -> int:
    """A lower bound on the memory of training model config ``m`` (a GPTConfig) at ``batch_size``:
    float32 weights, gradients and AdamW's two moments (16 bytes a parameter) and each Block's
    overhead (BLOCK_OVERHEAD); plus, at the peak, either the activations kept for the backward pass
    at 2 bytes a value (the smallest dtype): per Block at least the qkv (3C), attention output (C),
    two residual sums (2C) and the FeedForward's hidden layer before and after GELU (8C) for every
    token, the logits, and the attention weights that the unfused attention keeps
    (attention_bytes); or, with ``diagnostics``, the one (B, H, T, T) matrix of attention logits
    that they measure a layer at a time (babygpt/diagnostics.py), after the backward pass."""
    params = num_params_lower_bound(m.n_layer, m.n_embd, m.block_size, m.vocab_size)
    tokens = batch_size * m.block_size
    activations = 2 * tokens * (m.n_layer * 14 * m.n_embd + m.vocab_size)
    activations += attention_bytes(m, batch_size, device_type)
    logits = 2 * batch_size * m.n_head * m.block_size**2 if diagnostics else 0
    return 16 * params + m.n_layer * block_overhead(device_type, training=True) + max(activations, logits)


def inference_bytes(m, device_type: str = "cpu", kv_cache: bool = False) -> int:
    """A lower bound on the memory of sampling from model config ``m``: its float32 weights and each
    Block's overhead; with ``kv_cache``, the cache of keys and values that sampling preallocates
    for block_size positions at batch 1 (2 L T C values, 2 bytes each at the least)."""
    weights = 4 * num_params_lower_bound(m.n_layer, m.n_embd, m.block_size, m.vocab_size)
    cache = 2 * 2 * m.n_layer * m.block_size * m.n_embd if kv_cache else 0
    return weights + m.n_layer * block_overhead(device_type, training=False) + cache


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


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed (MemoryError, torch's OutOfMemoryError, or a
    RuntimeError from an allocator), as opposed to a bug or damaged input."""
    text = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text.lower())
