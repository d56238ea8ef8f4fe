"""Experiment 5: is RMSNorm really faster? Norm layers timed alone and inside a training step.

RMSNorm skips LayerNorm's mean subtraction and bias, and is often said to be faster for it
(Zhang & Sennrich 2019 report 7-64% less time on their models). Here:
  1. Isolated: forward and forward+backward time of every norm in babygpt.norms.NORMS (our
     from-scratch classes) and of PyTorch's own kernels (nn.LayerNorm -> F.layer_norm,
     nn.RMSNorm -> F.rms_norm), eager and under torch.compile, over widths 128..4096 and the
     token count of one batch of our configs, in float32 and bfloat16 (and float16 on CUDA),
     on the CPU and on CUDA when present.
  2. End to end: training tokens/s of the default model (TrainConfig defaults) with each
     norm_type, through babygpt.bench's training bench, and the share of a step the norms take.

    python experiments/exp5_norm_speed.py [--quick] [--out DIR] [--data_dir DIR]
                                          [--compile_widths W,W,...] [--set KEY=VALUE ...]

Writes norm_speed.csv, end_to_end.csv, norm_speed.png (CPU; norm_speed_cuda.png on a GPU)
and report.md. Timings are medians of repeated timed blocks after warm-up; figures from a
machine that runs other work at the same time carry that noise (the report gives the spread).
"""

import csv
import math
import os
import platform
import statistics
import tempfile
import time

import _common
import torch
import torch.nn as nn

from babygpt.bench import bench_training, sync
from babygpt.config import TrainConfig, load_config, read_config_file
from babygpt.errors import BabyGPTError
from babygpt.model import GPTConfig
from babygpt.norms import NORMS, build_norm
from babygpt.plot import new_figure, save
from babygpt.runtime import DTYPES, autocast, native_cuda_bf16
from babygpt.trainer import Trainer

NAME = "exp5_norm_speed"
GPU_CONFIG = os.path.join(_common.ROOT, "config", "shakespeare_char_gpu.py")
WIDTHS, QUICK_WIDTHS = [128, 256, 512, 1024, 2048, 4096], [128, 512]
# torch.compile builds (and, on the CPU, runs gcc for) a kernel per shape and dtype: a second or
# more each, so the full run compiles three widths that span the range, not all six.
COMPILE_WIDTHS = [128, 1024, 4096]
QUICK_TOKENS = 256
PASSES = {"fwd": "forward", "fwdbwd": "forward+backward"}
# Every norm gets the model's default options, so the classes time what the model would build.
EPS, BIAS = GPTConfig.norm_eps, GPTConfig.bias


# ---------------------------------------------------------------- the implementations

class Formula(nn.Module):
    """A norm's written-out ``formula`` as the module's forward: for the classes whose forward
    calls a fused kernel instead (LayerNorm), this times the from-scratch version."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm.formula(x)


def implementations() -> dict:
    """label -> (source, factory(width) -> module): the registry, read now, the from-scratch
    formula of classes that call a fused kernel, then PyTorch's own modules."""
    impls = {name: ("ours", lambda w, name=name: build_norm(name, w, eps=EPS, bias=BIAS)) for name in NORMS}
    for name, cls in NORMS.items():
        if hasattr(cls, "formula"):
            impls[f"{name} formula"] = ("ours", lambda w, name=name: Formula(build_norm(name, w, eps=EPS, bias=BIAS)))
    impls["F.layer_norm"] = ("torch", lambda w: nn.LayerNorm(w, eps=EPS, bias=BIAS))
    impls["F.rms_norm"] = ("torch", lambda w: nn.RMSNorm(w, eps=EPS))
    return impls


def is_identity(factory) -> bool:
    """A "norm" that returns its input unchanged (norm_type none): the floor of the timings,
    left out when picking the fastest normalization."""
    x = torch.randn(2, 8)
    return factory(8)(x) is x


def pair(impls: dict, a: str, b: str) -> tuple[str, str] | None:
    """(a, b) when both are measured; the registry may lack either."""
    return (a, b) if a in impls and b in impls else None


# ---------------------------------------------------------------- timing

def median_time(fn, device: torch.device, repeats: int, block_s: float) -> dict:
    """Seconds per call of ``fn``: the median over ``repeats`` timed blocks of ``inner`` calls,
    ``inner`` chosen so that a block lasts about ``block_s`` (a single small call is shorter
    than the timer's and the launch's overheads). Call it after warm-up."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    inner = max(1, min(1000, round(block_s / max(time.perf_counter() - t, 1e-7))))
    samples = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        sync(device)
        samples.append((time.perf_counter() - t) / inner)
    med = statistics.median(samples)
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [med, med, med]
    return {"s": med, "spread": (q[2] - q[0]) / med if med > 0 else 0.0, "inner": inner}


def pass_functions(module: nn.Module, fn, x: torch.Tensor) -> dict:
    """The two timed passes. Forward runs without autograd (inference cost); forward+backward
    takes the gradients of the input and of the parameters with torch.autograd.grad, which
    returns them instead of adding them into .grad, so every call does the same work."""
    xg = x.detach().requires_grad_(True)
    inputs = [xg] + [p for p in module.parameters() if p.requires_grad]
    g = torch.randn_like(x)

    def forward():
        with torch.no_grad():
            return fn(x)

    def forward_backward():
        return torch.autograd.grad(fn(xg), inputs, g)

    return {"fwd": forward, "fwdbwd": forward_backward}


def time_norm(factory, width: int, tokens: int, device: torch.device, dtype: torch.dtype,
              compiled: bool, repeats: int, block_s: float) -> dict:
    """Both passes of one implementation at one shape; with ``compiled``, the seconds each
    pass's first call took (the compilation) too. Input and parameters are in ``dtype``."""
    module = factory(width).to(device=device, dtype=dtype).train()
    x = torch.randn(tokens, width, device=device, dtype=dtype, generator=torch.Generator(device).manual_seed(0))
    fn = module
    if compiled:
        # A fresh start for every shape: dynamo caches compiled code per code object, and all the
        # widths of one class share it; past its recompile limit it would silently run eagerly.
        torch._dynamo.reset()
        fn = torch.compile(module, dynamic=False)
    out = {}
    for pass_, call in pass_functions(module, fn, x).items():
        sync(device)
        t = time.perf_counter()
        call()  # under compile, this call compiles
        sync(device)
        first = time.perf_counter() - t
        call()  # warm-up: allocator, caches
        out[pass_] = {**median_time(call, device, repeats, block_s), "compile_s": first if compiled else None}
    return out


def isolated_timings(impls: dict, devices: dict, widths: list[int], compile_widths: list[int],
                     repeats: int, block_s: float) -> list[dict]:
    rows = []
    for device, (tokens, dtypes) in devices.items():
        for dtype in dtypes:
            for label, (source, factory) in impls.items():
                compile_error = None  # once compiling an implementation fails, the other shapes would too
                for width in widths:
                    modes = ["eager"] + (["compiled"] if width in compile_widths else [])
                    for mode in modes:
                        base = {"device": device.type, "dtype": dtype, "impl": label, "source": source,
                                "mode": mode, "width": width, "tokens": tokens}
                        if mode == "compiled" and compile_error:
                            rows += [{**base, "pass": p, "status": compile_error} for p in PASSES]
                            continue
                        try:
                            res = time_norm(factory, width, tokens, device, DTYPES[dtype], mode == "compiled",
                                            repeats, block_s)
                        except Exception as e:  # e.g. no C++ compiler, or an op inductor cannot lower
                            if mode == "eager":
                                raise
                            first_line = (str(e).strip().splitlines() or [""])[0][:120]
                            compile_error = f"compile unavailable ({type(e).__name__}: {first_line})"
                            print(f"warning: torch.compile of {label} failed: {compile_error}")
                            rows += [{**base, "pass": p, "status": compile_error} for p in PASSES]
                            continue
                        for p, r in res.items():
                            rows.append({**base, "pass": p, "status": "ok", "us": 1e6 * r["s"],
                                         "spread": r["spread"], "inner": r["inner"], "repeats": repeats,
                                         "compile_s": r["compile_s"]})
                print(f"timed {label:>16} on {device.type} in {dtype}")
    return rows


# ---------------------------------------------------------------- end to end

def norm_inputs(trainer, cls: type, dtype: str) -> list[tuple[tuple, torch.dtype]]:
    """(shape, dtype) of the input of every ``cls`` module of the model in one training forward
    under ``dtype`` autocast: what the norms of a step actually process."""
    seen, hooks = [], []
    for m in trainer.model.modules():
        if type(m) is cls:
            hooks.append(m.register_forward_pre_hook(lambda mod, args: seen.append((tuple(args[0].shape),
                                                                                     args[0].dtype))))
    x, y = trainer.sampler.next_batch()
    try:
        with torch.no_grad(), autocast(trainer.device, dtype):
            trainer.model(x, y)
    finally:
        for h in hooks:
            h.remove()
    return seen


def isolated_step_ms(factory, inputs: list, device: torch.device, repeats: int, block_s: float) -> float:
    """Estimated norm time per training step: the isolated eager forward+backward time of each
    norm call of a step, at its own shape and dtype, summed."""
    total, cache = 0.0, {}
    for shape, dtype in inputs:
        key = (shape, dtype)
        if key not in cache:
            width, tokens = shape[-1], math.prod(shape[:-1])
            cache[key] = time_norm(factory, width, tokens, device, dtype, False, repeats, block_s)["fwdbwd"]["s"]
        total += cache[key]
    return 1e3 * total


def end_to_end(args, impls: dict, quick: bool) -> tuple[list[dict], dict]:
    """Training speed of the default model with each norm_type. Each trainer is benched in
    ``rounds`` rounds, the order reversed every other round, so that a slow spell of the
    machine does not land on one norm only; ms/iter is the median over all windows."""
    shape = ("n_layer", "n_head", "n_embd", "block_size", "batch_size")
    extra = [f"--{k}={_common.QUICK_BUDGET[k]}" for k in shape] if quick else []
    # Step-time differences between norms are a few percent: many short windows, interleaved.
    rounds, windows, window_iters = (1, 2, 2) if quick else (4, 4, 10)
    repeats, block_s = (3, 1e-3) if quick else (11, 5e-3)
    rows, trainers, info = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in NORMS:
            # The norm and the run directory come last: a --set cannot override what is compared.
            argv = [f"--data_dir={args.data_dir}", *extra, *[f"--{s}" for s in args.set], f"--norm_type={name}",
                    f"--out_dir={os.path.join(tmp, name)}", "--init_from=scratch"]
            try:
                cfg = load_config(argv)
            except BabyGPTError as e:  # a norm the config refuses (e.g. with a --set option)
                rows[name] = {"norm_type": name, "status": "refused: " + "; ".join(e.problems)}
                continue
            trainer = Trainer(cfg, argv)
            trainers[name] = trainer
            rows[name] = {"norm_type": name, "status": "ok", "windows_ms": []}
        if not trainers:
            raise BabyGPTError(*{r["status"] for r in rows.values()})
        for r in range(rounds):
            for name in (list(trainers) if r % 2 == 0 else list(trainers)[::-1]):
                res = bench_training(trainers[name], windows, window_iters)
                rows[name]["windows_ms"] += res["ms_per_iter_windows"]
        first = next(iter(trainers.values()))
        cfg = first.cfg
        info = {"device": first.device, "dtype": cfg.dtype, "rounds": rounds, "windows": windows,
                "window_iters": window_iters, "shape": {k: getattr(cfg, k) for k in shape},
                "tokens": cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps}
        # The dtype the norms receive under bfloat16 autocast tells which dtype's isolated
        # timings apply to mixed-precision training.
        if first.device.type == "cpu" or (first.device.type == "cuda" and native_cuda_bf16()):
            cls = type(build_norm(cfg.norm_type, 8))
            info["bf16_norm_input_dtypes"] = sorted({str(d).replace("torch.", "")
                                                     for _, d in norm_inputs(first, cls, "bfloat16")})
        for name, trainer in trainers.items():
            row = rows[name]
            row["ms_per_iter"] = statistics.median(row["windows_ms"])
            q = statistics.quantiles(row["windows_ms"], n=4)
            row["window_spread"] = (q[2] - q[0]) / row["ms_per_iter"]
            row["tokens_per_s"] = info["tokens"] / (row["ms_per_iter"] / 1e3)
            row["params"] = trainer.model.num_params()
            factory = impls[name][1]
            inputs = norm_inputs(trainer, type(factory(8)), trainer.cfg.dtype)
            row["norm_calls"] = len(inputs)
            row["isolated_norm_ms"] = isolated_step_ms(factory, inputs, trainer.device, repeats, block_s)
    identity = next((n for n in trainers if is_identity(impls[n][1])), None)
    for name, row in rows.items():
        if row["status"] != "ok":
            continue
        row["isolated_share"] = row["isolated_norm_ms"] / row["ms_per_iter"]
        if identity:
            row["share_vs_identity"] = 1 - rows[identity]["ms_per_iter"] / row["ms_per_iter"]
    info["identity"] = identity
    return list(rows.values()), info


# ---------------------------------------------------------------- tables, plot, answer

def fmt_us(us) -> str:
    return "—" if us is None else f"{us:,.0f}" if us >= 100 else f"{us:.1f}" if us >= 1 else f"{us:.2f}"


def lookup(rows: list[dict]) -> dict:
    return {(r["device"], r["dtype"], r["pass"], r["mode"], r["impl"], r["width"]): r for r in rows}


def speed_table(rows: list[dict], impls: dict, device: str, dtype: str, pass_: str, tokens: int) -> str:
    """One row per width and mode (eager; compiled where measured): µs per call of every
    implementation, the fastest normalization and its lead over the next one, and the ratios
    RMSNorm / LayerNorm of ours and of PyTorch's."""
    at = lookup(rows)
    ratios = [pr for pr in (pair(impls, "rmsnorm", "layernorm formula"), pair(impls, "rmsnorm", "layernorm"),
                            pair(impls, "F.rms_norm", "F.layer_norm")) if pr]
    candidates = [label for label, (_, f) in impls.items() if not is_identity(f)]
    header = ["width", "mode"] + list(impls) + ["fastest (lead over the next)"] + \
        [f"{a} / {b}" for a, b in ratios]
    out = []
    widths = sorted({r["width"] for r in rows if r["device"] == device})
    for width in widths:
        for mode in ("eager", "compiled"):
            cells = {label: at.get((device, dtype, pass_, mode, label, width)) for label in impls}
            if not any(cells.values()):
                continue
            us = {k: c["us"] for k, c in cells.items() if c and c["status"] == "ok"}
            line = [width, mode] + [fmt_us(us[k]) if k in us else ("unavailable" if cells[k] else "—")
                                    for k in impls]
            ranked = sorted((us[k], k) for k in candidates if k in us)
            if len(ranked) >= 2:
                line.append(f"{ranked[0][1]} ({ranked[1][0] / ranked[0][0]:.2f}× faster than {ranked[1][1]})")
            else:
                line.append(ranked[0][1] if ranked else "—")
            line += [f"{us[a] / us[b]:.3g}" if a in us and b in us else "—" for a, b in ratios]
            out.append(line)
    return (f"### {device}, {dtype}, {PASSES[pass_]} (µs per call, {tokens} tokens)\n\n"
            + _common.markdown_table(header, out))


def plot(rows: list[dict], impls: dict, device: str, dtypes: list[str], path: str) -> None:
    fig, axes = new_figure(len(dtypes), len(PASSES), figsize=(12, 4.2 * len(dtypes)), squeeze=False)
    at = lookup(rows)
    widths = sorted({r["width"] for r in rows if r["device"] == device})
    for i, dtype in enumerate(dtypes):
        for j, (pass_, title) in enumerate(PASSES.items()):
            ax = axes[i][j]
            for k, label in enumerate(impls):
                for mode, style in (("eager", "o-"), ("compiled", "s--")):
                    pts = [(w, at[key]["us"]) for w in widths
                           if (key := (device, dtype, pass_, mode, label, w)) in at and at[key]["status"] == "ok"]
                    if pts:
                        ax.plot(*zip(*pts), style, color=f"C{k % 10}", markersize=4,
                                label=f"{label} ({mode})")
            ax.set_xscale("log", base=2)
            ax.set_xticks(widths, [str(w) for w in widths])
            ax.minorticks_off()
            ax.set_yscale("log")
            ax.set(xlabel="width d", ylabel="µs per call", title=f"{device} {dtype}: {title}")
            ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7, ncol=2)
    save(fig, path)


def ratio_at(at: dict, device: str, dtype: str, pass_: str, mode: str, width: int, a: str, b: str):
    ra, rb = at.get((device, dtype, pass_, mode, a, width)), at.get((device, dtype, pass_, mode, b, width))
    if ra and rb and ra["status"] == "ok" and rb["status"] == "ok":
        return ra["us"] / rb["us"]
    return None


def answer(rows: list[dict], impls: dict, devices: dict, e2e: list[dict], info: dict) -> str:
    """The plain-language summary, every number read from the measurements."""
    at = lookup(rows)
    comparisons = [(a, b, desc) for a, b, desc in [
        ("rmsnorm", "layernorm formula", "our RMSNorm takes {r:.3g}× the time of our from-scratch LayerNorm formula"),
        ("rmsnorm", "layernorm", "our RMSNorm takes {r:.3g}× the time of our LayerNorm (F.layer_norm inside)"),
        ("F.rms_norm", "F.layer_norm", "F.rms_norm takes {r:.3g}× the time of F.layer_norm"),
        ("rmsnorm", "F.layer_norm", "our RMSNorm takes {r:.3g}× the time of F.layer_norm"),
        ("rmsnorm", "F.rms_norm", "our RMSNorm takes {r:.3g}× the time of F.rms_norm"),
    ] if a in impls and b in impls]
    candidates = [label for label, (_, f) in impls.items() if not is_identity(f)]
    lines = ["Ratios are times: below 1 means the first one is faster."]
    for device, (tokens, dtypes) in devices.items():
        d = device.type
        widths = sorted({r["width"] for r in rows if r["device"] == d})
        for dtype in dtypes:
            for width in (widths[0], widths[-1]):
                parts = [desc.format(r=r) for a, b, desc in comparisons
                         if (r := ratio_at(at, d, dtype, "fwdbwd", "eager", width, a, b)) is not None]
                lines.append(f"- {d}, {dtype}, width {width}, {tokens} tokens, forward+backward, eager: "
                             + "; ".join(parts) + ".")
            for mode in ("eager", "compiled"):
                wins, cells = {}, 0
                for pass_ in PASSES:
                    for width in widths:
                        us = {k: at[key]["us"] for k in candidates
                              if (key := (d, dtype, pass_, mode, k, width)) in at and at[key]["status"] == "ok"}
                        if us:
                            best = min(us, key=us.get)
                            wins[best] = wins.get(best, 0) + 1
                            cells += 1
                if cells:
                    top = sorted(wins.items(), key=lambda kv: -kv[1])
                    lines.append(f"- {d}, {dtype}, {mode}: the fastest normalization, counted over the {cells} "
                                 f"width × pass cells: " + ", ".join(f"{k} {n}" for k, n in top) + ".")
            if "rmsnorm" in impls:
                gains = [at[(d, dtype, "fwdbwd", "eager", "rmsnorm", w)]["us"] / r["us"] for w in widths
                         if (r := at.get((d, dtype, "fwdbwd", "compiled", "rmsnorm", w))) and r["status"] == "ok"]
                if gains:
                    span = f"{min(gains):.2f}" if len(gains) == 1 else f"{min(gains):.2f}–{max(gains):.2f}"
                    lines.append(f"- {d}, {dtype}: eager forward+backward of our RMSNorm takes {span}× the time "
                                 f"of its torch.compile'd version at the compiled widths.")
    ok = {r["norm_type"]: r for r in e2e if r["status"] == "ok"}
    if ok:
        dev = info["device"].type
        lines.append(f"- Training the model of the end-to-end table on {dev} ({info['dtype']}): "
                     + "; ".join(f"{n} {r['tokens_per_s']:,.0f} tokens/s" for n, r in ok.items()) + ".")
        if "rmsnorm" in ok and "layernorm" in ok:
            r = ok["rmsnorm"]["ms_per_iter"] / ok["layernorm"]["ms_per_iter"]
            lines.append(f"- A training step with rmsnorm takes {r:.3f}× the time of one with layernorm.")
        for n in ("layernorm", "rmsnorm"):
            if n in ok:
                r = ok[n]
                text = (f"- With {n}, the {r['norm_calls']} norm calls of a step take "
                        f"{100 * r['isolated_share']:.1f}% of it by their isolated timings summed")
                if "share_vs_identity" in r:
                    text += (f", {100 * r['share_vs_identity']:.1f}% by step time against norm_type "
                             f"{info['identity']}" + (" (negative: the step-time difference is within the noise)"
                                                      if r["share_vs_identity"] < 0 else ""))
                lines.append(text + ".")
    seen = info.get("bf16_norm_input_dtypes")
    if seen:
        lines.append(f"- Under bfloat16 autocast the model's norms receive {' and '.join(seen)} inputs"
                     + (": the residual stream is not cast, so the float32 tables are the ones that apply to "
                        "mixed-precision training of this model." if seen == ["float32"] else "."))
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def parse_widths(text: str) -> list[int]:
    try:
        return [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise BabyGPTError(f"--compile_widths takes comma-separated integers, got {text!r}") from None


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    text = f"CPU: {cpu}, {torch.get_num_threads()} torch threads"
    if torch.cuda.is_available():
        text += f"; GPU: {torch.cuda.get_device_name()}"
    return text


def setup_text(rows, devices, token_text, widths, compile_widths, repeats, block_s, args) -> str:
    """What was measured and how, with the spread of the repeats and the cost of compiling."""
    spreads = sorted(r["spread"] for r in rows if r["status"] == "ok")
    compiled = [r for r in rows if r["status"] == "ok" and r["mode"] == "compiled"]
    if compiled:
        per_shape = {}  # the first calls of both passes of one implementation, dtype and width
        for r in compiled:
            key = (r["device"], r["dtype"], r["impl"], r["width"])
            per_shape[key] = per_shape.get(key, 0.0) + r["compile_s"]
        costs = list(per_shape.values())
        compile_text = (f"torch.compile (inductor, dynamic=False, a fresh dynamo cache per shape) at widths "
                        f"{compile_widths} only, since every shape and dtype compiles on its own: {len(costs)} "
                        f"shapes compiled in {sum(costs):.0f} s in all (the first calls of both passes); the "
                        f"run's first, which loads the compiler, took {costs[0]:.1f} s, the median shape "
                        f"{statistics.median(costs):.1f} s.")
    else:
        compile_text = "torch.compile: not measured" + (" (--quick skips it; add --compile_widths=128 to "
                                                        "include one width)" if args.quick else "") + "."
    failed = sorted({f"{r['impl']} on {r['device']}: {r['status']}" for r in rows if r["status"] != "ok"})
    if failed:
        compile_text += " " + "; ".join(failed) + "."
    dtypes = "; ".join(f"{d.type}: {', '.join(dt)}" for d, (_, dt) in devices.items())
    return (f"{machine()}.\n\n"
            f"Isolated timings: every norm of babygpt.norms.NORMS ({', '.join(NORMS)}; our classes, which "
            f"compute in float32 internally) and PyTorch's nn.LayerNorm (F.layer_norm) and nn.RMSNorm "
            f"(F.rms_norm), eps {EPS:g}, bias {BIAS}, in training mode. Inputs: {'; '.join(token_text)}; widths "
            f"{widths}; dtypes {dtypes}, input and parameters both in that dtype. Forward is timed under no_grad; "
            f"forward+backward returns the gradients of the input and of the parameters (torch.autograd.grad). "
            f"Each figure is the median of {repeats} timed blocks (each about {block_s * 1e3:g} ms of repeated "
            f"calls, or one call if longer) after warm-up, time.perf_counter with torch.cuda.synchronize on CUDA. "
            f"Spread of the blocks, (q3 - q1) / median: median {100 * statistics.median(spreads):.1f}%, 90th "
            f"percentile {100 * spreads[int(0.9 * (len(spreads) - 1))]:.1f}%; differences smaller than that are "
            f"noise.\n\n{compile_text}")


def e2e_text(e2e: list[dict], info: dict) -> str:
    vs = f"share vs {info['identity']}" if info["identity"] else "share vs identity (none registered)"
    rows = []
    for r in e2e:
        if r["status"] != "ok":
            rows.append([r["norm_type"], r["status"]] + ["—"] * 6)
            continue
        rows.append([r["norm_type"], f"{r['ms_per_iter']:.1f}", f"{100 * r['window_spread']:.0f}%",
                     f"{r['tokens_per_s']:,.0f}", r["norm_calls"], f"{r['isolated_norm_ms']:.2f}",
                     f"{100 * r['isolated_share']:.1f}%",
                     f"{100 * r['share_vs_identity']:.1f}%" if "share_vs_identity" in r else "—"])
    return (f"Model {info['shape']}, {info['dtype']} on {info['device'].type}, {info['tokens']} tokens per step: "
            f"babygpt.bench.bench_training, {info['rounds']} round(s) of {info['windows']} windows of "
            f"{info['window_iters']} steps per norm (after 3 warm-up steps each), ms/iter the median over all "
            f"windows (spread: (q3 - q1) / median). 'Isolated' sums the eager forward+backward time of each norm "
            f"call of a step at its own shape and dtype; 'share vs' an identity norm is 1 - step time with the "
            f"identity / step time with this norm.\n\n"
            + _common.markdown_table(["norm_type", "ms/iter", "spread of windows", "tokens/s", "norm calls per step",
                                      "isolated norm ms/step", "isolated share", vs], rows))


def main(argv):
    p = _common.parser(NAME, __doc__.splitlines()[0])
    p.add_argument("--data_dir", default="data/shakespeare_char", help="prepared data (default: %(default)s)")
    p.add_argument("--compile_widths", default=None,
                   help="widths to time under torch.compile, e.g. 128,1024; empty for none (default: "
                        f"{','.join(map(str, COMPILE_WIDTHS))}; none with --quick)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a training key of the end-to-end model, e.g. --set dtype=bfloat16")
    args = p.parse_args(argv)
    started = time.time()
    widths = QUICK_WIDTHS if args.quick else WIDTHS
    if args.compile_widths is None:
        compile_widths = [] if args.quick else COMPILE_WIDTHS
    else:
        compile_widths = parse_widths(args.compile_widths)
        if not set(compile_widths) <= set(widths):
            raise BabyGPTError(f"--compile_widths must be among the measured widths {widths}, "
                               f"got {args.compile_widths}")
    load_config([f"--{s}" for s in args.set])  # a bad --set fails now, not after the timings
    out = _common.out_dir(args, NAME)

    # Token counts: one batch (batch_size x block_size) of the config meant for each device, the
    # same at every width; the CPU's 2048 tokens keep even width 4096 (8 M values) at a fraction
    # of a second per call, so no cap is needed.
    defaults, gpu = TrainConfig(), read_config_file(GPU_CONFIG)
    batches = {"cpu": (defaults.batch_size, defaults.block_size, "TrainConfig defaults"),
               "cuda": (gpu["batch_size"], gpu["block_size"], os.path.relpath(GPU_CONFIG, _common.ROOT))}
    device_dtypes = {"cpu": ["float32", "bfloat16"]}
    if torch.cuda.is_available():
        device_dtypes["cuda"] = ["float32"] + (["bfloat16"] if native_cuda_bf16() else []) + ["float16"]
    devices, token_text = {}, []
    for d, dts in device_dtypes.items():
        bs, ctx, source = batches[d]
        devices[torch.device(d)] = (QUICK_TOKENS if args.quick else bs * ctx, dts)
        token_text.append(f"{d}: {QUICK_TOKENS} tokens (--quick)" if args.quick else
                          f"{d}: {bs * ctx} tokens, one batch of {source} ({bs} x {ctx}), at every width")
    repeats, block_s = (3, 1e-3) if args.quick else (11, 5e-3)
    impls = implementations()

    t0 = time.time()
    rows = isolated_timings(impls, devices, widths, compile_widths, repeats, block_s)
    isolated_s = time.time() - t0
    t0 = time.time()
    e2e, info = end_to_end(args, impls, args.quick)
    e2e_s = time.time() - t0

    fields = ["device", "dtype", "pass", "mode", "impl", "source", "width", "tokens", "status", "us", "spread",
              "repeats", "inner", "compile_s"]
    with open(os.path.join(out, "norm_speed.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    e2e_fields = ["norm_type", "status", "ms_per_iter", "window_spread", "tokens_per_s", "params", "norm_calls",
                  "isolated_norm_ms", "isolated_share", "share_vs_identity", "windows_ms"]
    with open(os.path.join(out, "end_to_end.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=e2e_fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(e2e)

    figures = []
    for device, (_, dtypes) in devices.items():
        name = "norm_speed.png" if device.type == "cpu" else f"norm_speed_{device.type}.png"
        plot(rows, impls, device.type, dtypes, os.path.join(out, name))
        figures.append(name)

    body = (f"## Setup\n\n{setup_text(rows, devices, token_text, widths, compile_widths, repeats, block_s, args)}"
            f"\n\nIsolated timings took {isolated_s:.0f} s, the end-to-end part {e2e_s:.0f} s.\n\n"
            f"## Answer\n\n{answer(rows, impls, devices, e2e, info)}\n\n## Isolated timings\n\n"
            + "\n\n".join(speed_table(rows, impls, d.type, dtype, pass_, tokens)
                          for d, (tokens, dtypes) in devices.items() for dtype in dtypes for pass_ in PASSES)
            + "\n\n" + "\n\n".join(f"![]({f})" for f in figures)
            + f"\n\n## End to end: training speed\n\n{e2e_text(e2e, info)}\n")
    _common.write_report(os.path.join(out, "report.md"), "Is RMSNorm really faster?", _common.command_line(),
                         body, started)
    return 0


if __name__ == "__main__":
    _common.main(main)
