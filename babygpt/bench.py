"""How fast is a configuration? ``python bench.py [CONFIG.py] [--key=value ...] [--json=PATH]``.

Measures, for the model and batch the config describes:
  - training: tokens/s and ms per optimizer step (median of several timed windows, after
    warm-up), through the exact step that train.py runs;
  - peak memory: the process's max RSS, and CUDA max allocated when on a GPU;
  - model FLOP/s and MFU: 6 * params + attention FLOPs per token, against a matmul peak
    measured here for the same device and dtype;
  - the matmul peak of every dtype (float32, bfloat16, float16): whether this machine computes the
    half dtypes natively or emulates them tens of times slower;
  - sampling tokens/s at batch 1, with and without the KV cache.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch

from .config import TrainConfig, build_config, parse_train_args
from .errors import BabyGPTError
from .files import output_file_problems
from .options import option, options_of
from .rundir import write_json
from .runtime import DTYPES, EMULATED_SLOWDOWN, autocast

USAGE = "python bench.py [CONFIG.py] [--key=value ...] [--json=PATH] [--windows=N] [--window_iters=N]"
# Training keys that bench.py has no use for: it writes no run directory, and times steps at the
# peak learning_rate for its own --windows x --window_iters, with no schedule, evaluation or
# logging. A config file may set them (it describes a run); on the command line they are refused,
# since a value asked for there would otherwise be silently ignored.
NOT_USED = ("out_dir", "init_from", "max_iters", "warmup_iters", "lr_decay_iters", "min_lr", "eval_interval",
            "eval_iters", "log_interval", "diag_interval")


@dataclass
class BenchOptions:
    """bench.py's own options; every other --key=value is a training config key."""

    json: Optional[str] = option(None, "also write the figures to this JSON file")
    windows: int = option(5, "timed windows (the median is reported)")
    window_iters: int = option(10, "optimizer steps per timed window")
    sample_tokens: int = option(500, "new tokens in the sampling benchmark")

    def problems(self) -> list[str]:
        problems = output_file_problems(self.json, "--json", ("json",)) if self.json is not None else []
        if min(self.windows, self.window_iters, self.sample_tokens) <= 0:
            problems.append("--windows, --window_iters and --sample_tokens must be positive")
        return problems


def sync(device: torch.device) -> None:
    """Wait for the device to finish queued work, so that a timer measures the work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device, dtype: str, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n matmul in ``dtype`` on ``device``: the ceiling MFU is measured against."""
    a = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
    b = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


def matmul_peaks_by_dtype(device: torch.device) -> dict[str, float]:
    """matmul_peak for every dtype a run can choose: where a half dtype is emulated (many CPUs) it is
    tens of times below float32. The size is smaller on a CPU, where an emulated 2048 x 2048 matmul
    takes tens of seconds, and large enough on a GPU to fill it."""
    n = 2048 if device.type == "cuda" else 512
    return {dtype: matmul_peak(device, dtype, n=n) for dtype in DTYPES}


def flops_per_token(model) -> float:
    """Training FLOPs per token: 6 per parameter (forward 2, backward 4) for the matmuls, plus
    attention's scores and weighted sum, 12 * n_layer * n_embd * T (Kaplan et al. 2020, sec. 2.1)."""
    cfg = model.config  # a GPTConfig
    lookups = model.pos_emb.weight.numel() if model.pos_emb is not None else 0  # none under pos rope
    n_params = model.num_params() - lookups  # lookups are not matmuls
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def time_steps(trainer, windows: int, window_iters: int) -> dict:
    """ms per optimizer step and tokens/s of ``trainer.step`` (the exact step train.py runs):
    the median over ``windows`` timed windows of ``window_iters`` steps, after 3 warm-up steps."""
    cfg, device = trainer.cfg, trainer.device
    for _ in range(3):  # warm-up: allocator, compile, caches
        trainer.step(cfg.learning_rate)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(windows):
        t = time.perf_counter()
        for _ in range(window_iters):
            loss = trainer.step(cfg.learning_rate)
        loss.item()  # wait for the last step, as a real logging step would
        sync(device)
        times.append((time.perf_counter() - t) / window_iters)
    step = statistics.median(times)
    tokens = cfg.batch_size * cfg.model.block_size * cfg.gradient_accumulation_steps
    return {"ms_per_iter": 1e3 * step, "tokens_per_s": tokens / step,
            "ms_per_iter_windows": [round(1e3 * t, 3) for t in times]}


def time_training(cfg: TrainConfig, windows: int = 5, window_iters: int = 10):
    """Build the run ``cfg`` describes in memory (out_dir is neither checked nor written) and
    time its training step; returns (figures, the Trainer)."""
    from .trainer import Trainer

    trainer = Trainer(cfg)
    trainer.net.train()
    return time_steps(trainer, windows, window_iters), trainer


def bench_sampling(model, device: torch.device, dtype: str, new_tokens: int, use_cache: bool) -> float:
    model.eval()
    idx = torch.zeros(1, 1, dtype=torch.long, device=device)
    gen = lambda n: model.generate(idx, n, temperature=1.0, use_cache=use_cache,  # noqa: E731
                                   generator=torch.Generator(device=device).manual_seed(0))
    with autocast(device, dtype):
        gen(min(20, new_tokens))  # warm-up
        sync(device)
        t = time.perf_counter()
        gen(new_tokens)
        sync(device)
    return new_tokens / (time.perf_counter() - t)


def read_args(argv: list[str]) -> tuple[TrainConfig, BenchOptions]:
    """The training config and bench.py's own options, every problem reported together."""
    values, extra, problems = parse_train_args(argv, options_of(BenchOptions), USAGE, unused=NOT_USED)
    problems += unused_key_problems(argv)
    cfg, more = build_config(values)
    opts = BenchOptions(**extra)
    problems += opts.problems()
    if problems + more:
        raise BabyGPTError(*problems, *more)
    return cfg, opts


def unused_key_problems(argv: list[str]) -> list[str]:
    """One problem per NOT_USED key that ``argv`` sets (``--key=value`` or ``--key value``: a value
    never starts with --, so every such key is an argument that does)."""
    given = dict.fromkeys(arg[2:].partition("=")[0] for arg in argv if arg.startswith("--"))
    return [f"--{key}: bench.py does not use it (it writes no run and times steps at the peak learning_rate, "
            f"with no schedule or evaluation); leave it out" for key in given if key in NOT_USED]


def run_bench(cfg: TrainConfig, opts: BenchOptions) -> dict:
    train, trainer = time_training(cfg, opts.windows, opts.window_iters)
    cfg, device, model = trainer.cfg, trainer.device, trainer.model  # cfg with dtype=auto resolved
    peaks = matmul_peaks_by_dtype(device)
    # An emulated dtype has no hardware peak: its software matmul is not even the path the model's
    # Linear layers take (their FLOP/s can exceed it), so it gets no MFU, and no slow 2048 x 2048 probe.
    emulated = peaks["float32"] / peaks[cfg.dtype] >= EMULATED_SLOWDOWN
    peak = peaks[cfg.dtype] if emulated else matmul_peak(device, cfg.dtype)
    fpt = flops_per_token(model)
    keys = ("n_layer", "n_head", "n_embd", "block_size", "norm_type", "norm_placement")
    result = {
        "config": {**{k: getattr(cfg.model, k) for k in keys}, "batch_size": cfg.batch_size,
                   "dtype": cfg.dtype, "compile": cfg.compile},
        "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "params": model.num_params(),
        **train,
        "model_flops_per_s": fpt * train["tokens_per_s"],
        "matmul_peak_flops_per_s": peak,
        "matmul_peak_by_dtype": peaks,
        "mfu": None if emulated else fpt * train["tokens_per_s"] / peak,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cuda_max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
        "sample_tokens": opts.sample_tokens,
        "sample_tokens_per_s_cached": bench_sampling(model, device, cfg.dtype, opts.sample_tokens, True),
        "sample_tokens_per_s_uncached": bench_sampling(model, device, cfg.dtype, opts.sample_tokens, False),
    }
    result["kv_cache_speedup"] = result["sample_tokens_per_s_cached"] / result["sample_tokens_per_s_uncached"]
    return result


def by_dtype_note(peaks: dict[str, float]) -> str:
    """' (bfloat16 85x slower than float32: emulated)' for each half dtype this machine emulates."""
    slow = [f"{d} {peaks['float32'] / f:.0f}x slower than float32" for d, f in peaks.items()
            if peaks["float32"] / f >= EMULATED_SLOWDOWN]
    return f" ({'; '.join(slow)}: emulated)" if slow else ""


def format_table(r: dict) -> str:
    c = r["config"]
    rows = [
        ("model", f"{c['n_layer']} layers x {c['n_embd']} wide, {c['n_head']} heads, ctx {c['block_size']}, "
                  f"batch {c['batch_size']}, {c['norm_placement']}-{c['norm_type']}, {r['params'] / 1e6:.2f} M params"),
        ("device / dtype", f"{r['device']} / {c['dtype']}{' + compile' if c['compile'] else ''}, "
                           f"{r['threads']} threads, torch {r['torch']}"),
        ("train tokens/s", f"{r['tokens_per_s']:,.0f}"),
        ("train ms/iter", f"{r['ms_per_iter']:.1f} (median of windows {r['ms_per_iter_windows']})"),
        ("model FLOP/s", f"{r['model_flops_per_s'] / 1e9:.1f} GFLOP/s"),
        ("matmul peak", f"{r['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s ({c['dtype']})"),
        ("matmul peak by dtype", ", ".join(f"{d} {f / 1e9:.1f}" for d, f in r["matmul_peak_by_dtype"].items())
                                 + f" GFLOP/s{by_dtype_note(r['matmul_peak_by_dtype'])}"),
        ("MFU", f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None
         else f"— ({c['dtype']} is emulated on this machine: no hardware peak to measure against)"),
        ("peak RSS", f"{r['peak_rss_mb']:.0f} MB"),
    ]
    if r["cuda_max_allocated_mb"] is not None:
        rows.append(("CUDA max allocated", f"{r['cuda_max_allocated_mb']:.0f} MB"))
    rows += [
        (f"sample tokens/s ({r['sample_tokens']} new)", f"{r['sample_tokens_per_s_cached']:,.0f} with KV cache, "
                                                        f"{r['sample_tokens_per_s_uncached']:,.0f} without "
                                                        f"({r['kv_cache_speedup']:.1f}x)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str]) -> int:
    cfg, opts = read_args(argv)
    result = run_bench(cfg, opts)
    print(format_table(result))
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        write_json(opts.json, result)
        print(f"wrote {opts.json}")
    return 0 if math.isfinite(result["tokens_per_s"]) else 1


if __name__ == "__main__":
    from .cli import run

    sys.exit(run(main, sys.argv[1:]))
