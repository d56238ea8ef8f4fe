"""Experiment 5: is RMSNorm really faster? Norm layers timed alone and inside a training step.

Isolated: forward and forward+backward time of every norm in babygpt.norms.NORMS, of the
from-scratch ``formula`` of the classes that have one, and of F.layer_norm and F.rms_norm, over
widths, dtypes and devices, eager and compiled. End to end: training tokens/s of the default
model with each norm_type. Writes norm_speed.csv, end_to_end.csv, norm_speed.png (and
norm_speed_cuda.png on a GPU) and report.md, which holds the measurements (docs/results.md discusses them).

    python experiments/exp5_norm_speed.py [--quick] [--out DIR] [--data_dir DIR] [--compile_widths W,W] [--set K=V]
"""

import os
import statistics
from dataclasses import dataclass
from typing import Optional

import _common
import torch
import torch.nn as nn
from torch.utils.benchmark import Timer

from babygpt import files
from babygpt.bench import time_steps, time_training
from babygpt.config import TrainConfig, load_config, read_config_file
from babygpt.errors import BabyGPTError
from babygpt.model import GPTConfig
from babygpt.norms import NORMS, build_norm, norm_class
from babygpt.options import option
from babygpt.plot import new_figure, save
from babygpt.runtime import DTYPES, native_cuda_bf16

NAME = "exp5_norm_speed"
WIDTHS, QUICK_WIDTHS = [128, 256, 512, 1024, 2048, 4096], [128, 512]
# torch.compile builds (on the CPU, with gcc) a kernel per shape and dtype, a second or more
# each, so the full run compiles three widths that span the range rather than all six.
COMPILE_WIDTHS = [128, 1024, 4096]
QUICK_TOKENS = 256
PASSES = {"fwd": "forward", "fwdbwd": "forward+backward"}
PAIRS = [("rmsnorm", "layernorm"), ("rmsnorm", "layernorm formula"), ("F.rms_norm", "F.layer_norm")]
OPTS = GPTConfig().norm_options()  # the model's defaults: the classes time what the model would build


@dataclass
class Exp5Options(_common.DataOptions):
    compile_widths: Optional[str] = option(None, "widths to time under torch.compile, e.g. 128,1024; off for "
                                                 f"none (none: {','.join(map(str, COMPILE_WIDTHS))}; quick: off)",
                                           metavar="WIDTH,...")
    set: list[str] = option([], "override a training key of the end-to-end model, e.g. --set dtype=bfloat16",
                            metavar="KEY=VALUE")

    def widths(self) -> list[int]:
        return QUICK_WIDTHS if self.quick else WIDTHS

    def compiled(self) -> list[int]:
        if self.compile_widths is None:
            return [] if self.quick else COMPILE_WIDTHS
        if self.compile_widths == "off":
            return []
        return [int(w) for w in self.compile_widths.split(",") if w.strip()]

    def problems(self) -> list[str]:
        given = [w.strip() for w in (self.compile_widths or "").split(",") if w.strip() and self.compile_widths != "off"]
        if not all(w.isdigit() for w in given) or not set(self.compiled()) <= set(self.widths()):
            return [f"--compile_widths must be among the measured widths {self.widths()}, or off, got "
                    f"{self.compile_widths}"]
        compared = [s for s in self.set if s.partition("=")[0] == "norm_type"]
        if compared:
            return [f"--set {compared[0]}: experiment 5 times every norm_type in turn, so a --set of it would be "
                    f"overridden; leave it out"]
        try:
            load_config([f"--{s}" for s in self.set])  # a bad --set fails now, not after the timings
        except BabyGPTError as e:
            return e.problems
        return []

    def set_keys(self) -> "set[str]":  # (quoted: the class body has a field named set)
        return {s.partition("=")[0] for s in self.set}


def implementations() -> dict:
    """label -> (factory(width) -> module, the method to time, None for the module's forward)."""
    impls = {name: (lambda w, name=name: build_norm(name, w, OPTS), None) for name in NORMS}
    impls.update({f"{name} formula": (impls[name][0], "formula")
                  for name, entry in NORMS.items() if hasattr(norm_class(entry), "formula")})
    impls["F.layer_norm"] = (lambda w: nn.LayerNorm(w, eps=OPTS.eps, bias=OPTS.bias), None)
    impls["F.rms_norm"] = (lambda w: nn.RMSNorm(w, eps=OPTS.eps), None)
    return impls


def time_norm(factory, method, width: int, tokens: int, device: str, dtype: str, compiled: bool, quick: bool):
    """pass -> (median, IQR) seconds per call on a (tokens, width) input. Forward runs under no_grad
    (the inference cost); forward+backward returns the gradients of the input and parameters with
    torch.autograd.grad, which adds nothing into .grad, so every call does the same work."""
    module = factory(width).to(device=device, dtype=DTYPES[dtype]).train()
    fn = getattr(module, method) if method else module
    if compiled:
        # A fresh dynamo cache per shape: every width of a class shares one code object, and past
        # dynamo's recompile limit the calls would silently run eagerly.
        torch._dynamo.reset()
        fn = torch.compile(fn, dynamic=False)
    x = torch.randn(tokens, width, device=device, dtype=DTYPES[dtype])
    xg = x.clone().requires_grad_(True)
    inputs, g = [xg, *(p for p in module.parameters() if p.requires_grad)], torch.randn_like(x)
    calls = {"fwd": torch.no_grad()(lambda: fn(x)), "fwdbwd": lambda: torch.autograd.grad(fn(xg), inputs, g)}
    out = {}
    for pass_, call in calls.items():
        call()  # warm-up; under torch.compile, this call compiles
        # Timer synchronizes CUDA itself; its default of one thread is not what training uses.
        timer = Timer("call()", globals={"call": call}, num_threads=torch.get_num_threads())
        # --quick only checks the pipeline: 10 calls instead of blocks filling at least 0.2 s.
        m = timer.timeit(10) if quick else timer.blocked_autorange(min_run_time=0.2)
        out[pass_] = (m.median, m.iqr)
    return out


def isolated(impls: dict, devices: dict, args) -> list[dict]:
    cases = [(d, dt, label, w, mode) for d, (_, dts) in devices.items() for dt in dts for label in impls
             for w in args.widths() for mode in ["eager"] + ["compiled"] * (w in args.compiled())]
    rows = []
    for device, dtype, label, width, mode in cases:
        if (width, mode) == (args.widths()[0], "eager"):
            print(f"timing {label} on {device} in {dtype}")
        base = dict(device=device, dtype=dtype, mode=mode, width=width, impl=label, tokens=devices[device][0])
        try:
            res = time_norm(*impls[label], width, base["tokens"], device, dtype, mode == "compiled", args.quick)
        except Exception as e:  # compiling can fail: no C++ compiler, an op inductor cannot lower
            if mode == "eager":
                raise
            rows += [{**base, "pass": p, "status": f"compile failed ({type(e).__name__})"} for p in PASSES]
            continue
        rows += [{**base, "pass": p, "status": "ok", "us": 1e6 * med, "iqr_us": 1e6 * iqr}
                 for p, (med, iqr) in res.items()]
    return rows


def end_to_end(args) -> list[dict]:
    """Training speed of the default model with each norm_type. Every trainer is timed twice, the
    second time in reverse order, so that a slow spell of a shared machine does not land on one
    norm only; ms/iter is the median over the windows of both."""
    shape = ("n_layer", "n_head", "n_embd", "block_size", "batch_size")
    # the quick shape, less the keys --set gives (train.py takes each key once)
    quick = [f"--{k}={_common.QUICK_BUDGET[k]}" for k in shape if k not in args.set_keys()] if args.quick else []
    windows, window_iters = (2, 2) if args.quick else (5, 10)
    rows, trainers = {}, {}
    for name in NORMS:  # (--set norm_type is refused: it would be overridden here)
        argv = [f"--data_dir={args.data_dir}", *quick, *[f"--{s}" for s in args.set], f"--norm_type={name}"]
        try:
            cfg = load_config(argv)
        except BabyGPTError as e:  # a norm the rest of the config refuses, e.g. none with qk_norm
            rows[name] = {"norm_type": name, "status": "refused: " + "; ".join(e.problems)}
            continue
        figures, trainers[name] = time_training(cfg, windows, window_iters)
        rows[name] = {"norm_type": name, "status": "ok", "windows_ms": figures["ms_per_iter_windows"]}
    for name in reversed(trainers):
        rows[name]["windows_ms"] += time_steps(trainers[name], windows, window_iters)["ms_per_iter_windows"]
    for name, trainer in trainers.items():
        c, ms = trainer.cfg, statistics.median(rows[name]["windows_ms"])
        tokens = c.batch_size * c.model.block_size * c.gradient_accumulation_steps
        rows[name].update(model=f"{c.model.n_layer} x {c.model.n_embd}, ctx {c.model.block_size}, batch "
                          f"{c.batch_size}", device=trainer.device.type, dtype=c.dtype,
                          params=trainer.model.num_params(), ms_per_iter=ms, tokens_per_s=tokens / (ms / 1e3))
    identity = next((n for n in trainers if norm_class(NORMS[n]).is_identity), None)
    if identity:  # the norms' share of a step: 1 - step time without norms / with them
        for name in trainers:
            rows[name][f"share_vs_{identity}"] = 1 - rows[identity]["ms_per_iter"] / rows[name]["ms_per_iter"]
    return list(rows.values())


def write_csv(path: str, rows: list[dict]) -> None:
    files.write_csv(path, list(dict.fromkeys(k for r in rows for k in r)), rows)


def fmt(v) -> str:
    if v is None or isinstance(v, str):
        return v or "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def plot(rows: list[dict], impls: dict, device: str, dtypes: list[str], path: str) -> None:
    fig, axes = new_figure(len(dtypes), len(PASSES), figsize=(12, 4.2 * len(dtypes)), squeeze=False)
    widths = sorted({r["width"] for r in rows})
    for ax, (dtype, (pass_, title)) in zip(axes.flat, [(d, p) for d in dtypes for p in PASSES.items()]):
        for k, label in enumerate(impls):
            for mode, style in (("eager", "o-"), ("compiled", "s--")):
                pts = [(r["width"], r["us"]) for r in rows if r["status"] == "ok" and (
                    r["device"], r["dtype"], r["pass"], r["mode"], r["impl"]) == (device, dtype, pass_, mode, label)]
                if pts:
                    ax.plot(*zip(*pts), style, color=f"C{k % 10}", markersize=4, label=f"{label} ({mode})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set(yscale="log", xlabel="width", ylabel="µs per call", title=f"{device} {dtype}: {title}")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7, ncol=2)
    save(fig, path)


def report_body(rows: list[dict], e2e: list[dict], impls: dict, devices: dict, figures: list[str]) -> str:
    us = {(r["device"], r["dtype"], r["mode"], r["width"], r["pass"], r["impl"]): r.get("us") for r in rows}
    shapes = list(dict.fromkeys((r["device"], r["dtype"], r["mode"], r["width"]) for r in rows))

    def ratio(shape, a, b):  # forward+backward time of a / of b
        ta, tb = us.get((*shape, "fwdbwd", a)), us.get((*shape, "fwdbwd", b))
        return fmt(ta / tb) if ta and tb else "—"

    pairs = [(a, b) for a, b in PAIRS if a in impls and b in impls]
    body = ["## Answer", "Time ratios, forward+backward:", _common.markdown_table(
        ["device", "dtype", "mode", "width", *(f"{a} / {b}" for a, b in pairs)],
        [[*shape, *(ratio(shape, a, b) for a, b in pairs)] for shape in shapes])]
    ok = {r["norm_type"]: r for r in e2e if r["status"] == "ok"}
    if "rmsnorm" in ok and "layernorm" in ok:
        body.append("End to end, training tokens/s, rmsnorm / layernorm: "
                    f"{ok['rmsnorm']['tokens_per_s'] / ok['layernorm']['tokens_per_s']:.3f}")
    body.append("## Isolated timings")
    for device, (tokens, dtypes) in devices.items():
        for dtype in dtypes:
            for pass_, title in PASSES.items():
                table = [[w, m, *(fmt(us.get((d, dt, m, w, pass_, i))) for i in impls)]
                         for d, dt, m, w in shapes if (d, dt) == (device, dtype)]
                body += [f"### {device}, {dtype}, {title} (µs per call, {tokens} tokens)",
                         _common.markdown_table(["width", "mode", *impls], table)]
    body += [f"![]({f})" for f in figures]
    cols = list(dict.fromkeys(k for r in e2e for k in r if k not in ("norm_type", "status", "windows_ms")))
    body += ["## End to end", _common.markdown_table(
        ["norm_type", "status", *cols], [[r["norm_type"], r["status"], *(fmt(r.get(c)) for c in cols)] for r in e2e])]
    return "\n\n".join(body)


def main(argv):
    exp = _common.begin(Exp5Options, argv, NAME, __doc__)
    args, out = exp.args, exp.claim()
    if args.quick:
        # --quick checks the pipeline, not speed. One thread keeps it a few seconds even when another
        # process holds a core: a second torch thread then waits milliseconds at every op.
        torch.set_num_threads(1)
    # The isolated timings' input: one batch (batch_size x block_size tokens) of the config meant
    # for the device, at every width.
    gpu = read_config_file(os.path.join(_common.ROOT, "config", "shakespeare_char_gpu.py"))
    tokens = {"cpu": TrainConfig().batch_size * GPTConfig().block_size, "cuda": gpu["batch_size"] * gpu["block_size"]}
    devices = {"cpu": ["float32", "bfloat16"]}
    if torch.cuda.is_available():
        devices["cuda"] = ["float32", "bfloat16" if native_cuda_bf16() else "float16"]
    devices = {d: (QUICK_TOKENS if args.quick else tokens[d], dtypes) for d, dtypes in devices.items()}
    impls = implementations()

    e2e = end_to_end(args)  # first: a problem with the data shows before the long isolated timings
    rows = isolated(impls, devices, args)
    write_csv(os.path.join(out, "norm_speed.csv"), rows)
    write_csv(os.path.join(out, "end_to_end.csv"), e2e)
    figures = {d: "norm_speed.png" if d == "cpu" else f"norm_speed_{d}.png" for d in devices}
    for d, f in figures.items():
        plot(rows, impls, d, devices[d][1], os.path.join(out, f))
    setup = (f"Isolated: µs per call, median of torch.utils.benchmark.Timer "
             f"{'.timeit(10)' if args.quick else '.blocked_autorange(min_run_time=0.2)'} after a warm-up call, "
             f"{torch.get_num_threads()} thread(s); norms with eps {OPTS.eps:g}, bias {OPTS.bias}, in training mode; "
             f"input and parameters in the dtype shown; torch.compile at widths {args.compiled() or 'none'}. "
             f"End to end: babygpt.bench.time_training, TrainConfig defaults{' in the quick shape' * args.quick}"
             f"{''.join(' --set ' + s for s in args.set)}, each norm timed twice, ms/iter the median over the windows.")
    exp.write_report("Is RMSNorm really faster?",
                     setup + "\n\n" + report_body(rows, e2e, impls, devices, list(figures.values())))
    return 0


if __name__ == "__main__":
    _common.main(main)
