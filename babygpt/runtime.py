"""Device and dtype choices, made once and checked up front rather than deep inside torch."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import time

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


def cpu_name() -> str:
    """The CPU model, and whether it has AVX-512 bf16 instructions (they decide whether bfloat16
    is fast or emulated on a CPU); the architecture alone where /proc/cpuinfo is not readable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
    except OSError:
        return platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                platform.machine())
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return f"{name} ({'AVX-512 bf16' if 'avx512_bf16' in flags else 'no AVX-512 bf16'})"


def machine(device: torch.device) -> dict:
    """What a run was measured on, for its summary.json: losses agree across machines to the printed
    digit, times do not, so a time means nothing without the CPU (or GPU), the threads and torch."""
    record = {"cpu": cpu_name(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "device": device.type}
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(device)
    return record


def same_kind(made: dict | None, here: dict) -> bool:
    """Whether a run's machine (its summary's "machine") is the kind ``here`` is: the same device
    type and torch, and the same GPU, or the same CPU model and thread count (runs on one kind agree
    bit for bit; kinds, and thread counts, differ in the last digits or more)."""
    keys = ("device", "torch") + (("gpu",) if here.get("device") == "cuda" else ("cpu", "threads"))
    return isinstance(made, dict) and all(made.get(k) == here.get(k) for k in keys)


def machine_label(record: dict | None) -> str:
    """A run's machine (its summary.json's "machine") as a report names it: the GPU, or the CPU
    and its thread count."""
    if not isinstance(record, dict):
        return "a machine its summary.json does not name"
    if record.get("device") == "cuda":
        return str(record.get("gpu", "a CUDA GPU"))
    threads = record.get("threads")
    return f"{record.get('cpu', 'a CPU')}, {threads} thread{'' if threads == 1 else 's'}"


def native_cuda_bf16() -> bool:
    """bfloat16 in the GPU's hardware (Ampere and later). torch's own check also counts the slow
    emulation older GPUs offer."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


# What ``dtype=auto`` can mean on each kind of device (resolve_dtype picks one of these): a run made
# elsewhere is judged by its own device's meaning of auto (babygpt.sweepdir, under --collect).
AUTO_DTYPES = {"cuda": ("bfloat16", "float16"), "cpu": ("float32",), "mps": ("float32",)}


def auto_dtypes(device: str | None) -> tuple[str, ...]:
    """The dtypes ``auto`` can mean on a device of kind ``device`` ('cuda', 'cuda:1', 'cpu', ...);
    on any device when it is not known (None)."""
    if device is None:
        return tuple(sorted({d for kind in AUTO_DTYPES.values() for d in kind}))
    return AUTO_DTYPES.get(device.split(":")[0], ())


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
    """float16 trains with a GradScaler, which torch offers for CUDA and CPU; bfloat16 needs a GPU
    that has it."""
    dtype = resolve_dtype(device, dtype)
    if dtype == "float16" and device.type not in ("cuda", "cpu"):
        raise BabyGPTError(f"dtype float16 needs CUDA or the CPU (it trains with a GradScaler); on {device.type} "
                           f"use --dtype=bfloat16 or --dtype=float32")
    if dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise BabyGPTError("this GPU does not support bfloat16; use --dtype=float16 (with a GradScaler) "
                           "or --dtype=float32")


def uses_grad_scaler(dtype: str) -> bool:
    """float16's narrow exponent range underflows small gradients: its training scales the loss."""
    return dtype == "float16"


# A half-precision matmul this many times slower than float32 is emulated: native bfloat16 or
# float16 (AVX512-BF16, AMX, AVX512-FP16, a GPU) runs at least as fast as float32, while a CPU
# without them converts each element in software and is tens of times slower.
EMULATED_SLOWDOWN = 2.0


def _matmul_seconds(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    """Best wall time of one n x n matmul in ``dtype`` on ``device``. The operands come from a generator
    of their own: the probe runs once per process, after the run has seeded torch, so drawing from the
    global one would give the first run in a process other dropout masks than the next."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)
    best = math.inf
    for _ in range(repeats + 1):  # the first call warms up (allocation, kernel choice)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


@functools.lru_cache(maxsize=None)
def matmul_slowdown(device_type: str, dtype: str, n: int = 256, repeats: int = 3) -> float:
    """How many times longer a ``dtype`` matmul takes than a float32 one on this machine (a probe of
    a few milliseconds where the dtype is native, well under a second where it is emulated; measured
    once per process). Under 1 means faster than float32."""
    if dtype == "float32":
        return 1.0
    device = torch.device(device_type)
    return _matmul_seconds(device, DTYPES[dtype], n, repeats) / _matmul_seconds(device, torch.float32, n, repeats)


def dtype_note(device: torch.device, dtype: str) -> tuple[str, str | None]:
    """What to say at the start of a run about computing in ``dtype`` (resolved) on ``device``:
    (a few words for the run's first line, a warning or None). Only the CPU is probed: every CUDA
    GPU computes float16 natively, and check_dtype refuses one without bfloat16."""
    if dtype == "float32" or device.type != "cpu":
        return "", None
    slowdown = matmul_slowdown(device.type, dtype)
    if slowdown < EMULATED_SLOWDOWN:
        return f" (native on this CPU: matmul {slowdown:.1f}x the time of float32)", None
    return (f" (emulated on this CPU: matmul {slowdown:.0f}x slower than float32)",
            f"this CPU has no native {dtype} matmul: measured {slowdown:.0f}x slower than float32, so "
            f"--dtype={dtype} makes training slower, not faster; use --dtype=float32 (or --dtype=auto)")


def muon_note(device: torch.device, ns_dtype: str) -> str | None:
    """The warning for optimizer muon where its orthogonalization is slow: torch.optim.Muon runs its
    Newton-Schulz iterations in bfloat16 (torch/optim/_muon.py), which a CPU without native bfloat16
    emulates, so there one Muon step can cost several AdamW training steps (docs/performance.md).
    ``muon_ns_dtype`` float32 (optim.MuonNS) is the way out it names."""
    if device.type != "cpu" or ns_dtype != "bfloat16":
        return None
    slowdown = matmul_slowdown(device.type, "bfloat16")
    if slowdown < EMULATED_SLOWDOWN:
        return None
    return (f"optimizer muon: torch.optim.Muon orthogonalizes each update in bfloat16, which this CPU emulates "
            f"(matmul {slowdown:.0f}x slower than float32), so each step costs several times an AdamW step "
            f"here (docs/performance.md); --muon_ns_dtype=float32 runs the same iteration in float32")


# cuBLAS picks its reduction order from the workspace it is given; a fixed-size workspace makes that
# order fixed, and torch refuses deterministic mode on CUDA without it (NVIDIA's cuBLAS notes on
# results reproducibility). Read when torch first creates a cuBLAS handle, so set before any GPU matmul.
CUBLAS_WORKSPACE = ":4096:8"


def use_deterministic_kernels() -> None:
    """Make every later op in this process pick a deterministic kernel, and raise where it has none;
    for the process's life, like the TF32 switch (the Trainer turns it on for ``deterministic=True``)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)


def autocast(device: torch.device, dtype: str):
    """Mixed precision context for the forward pass; a no-op for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def seconds_by_depth(run_at, depths: tuple[int, int] = (1, 2), clock=time.perf_counter) -> tuple[float, float]:
    """(fixed seconds, seconds per block) of one unit of work, timed now: ``run_at(n)`` does that unit
    with n blocks, at each of the two ``depths``, the fastest of two runs each (the first also pays
    one-time costs); the line through the two extended. The difference is a block's whole cost: its
    matrix products and the overhead of each call into torch, which at large depths outweighs what a
    count of floating-point operations predicts (experiment 4 at 300 layers took a hundred times such a
    count's estimate). Used for the estimates that train.py and experiments 1 and 4 give before a
    long job."""
    times = []
    for n in depths:
        fastest = math.inf
        for _ in range(2):
            start = clock()
            run_at(n)
            fastest = min(fastest, clock() - start)
        times.append(fastest)
    (a, b), (ta, tb) = depths, times
    per_block = max((tb - ta) / (b - a), 0.0)
    return max(ta - per_block * a, 0.0), per_block
