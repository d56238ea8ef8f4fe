"""Experiment 13: what each piece of the 2026 stack costs. Training tokens/s of the default model with
one piece switched on at a time (RoPE, SwiGLU, ReLU², split q/k/v, zero-initialised projections, the
residual lambdas, the soft-caps, QK-Clip's logit tracking, Derf, unit-offset gains, Pre+post-main
norm, the parallel block, Muon with its Newton-Schulz iterations in bfloat16 (torch's) and in
float32) and of the two modern configs, each against the default (Pre-LN
RMSNorm) timed in the same sitting; and sampling: KV-cached generation with learned positions and
with RoPE against nanoGPT's way of generating (each new token recomputes the whole context, cut to
the last block_size tokens), at nanoGPT's GPU-sized shape (6 layers x 384, ctx 256).

The timed windows are interleaved (each round times one window of every piece, in alternating order),
so that a slow spell of a shared machine does not land on one piece only; ms/iter is the median of a
piece's windows, and the table gives the fastest and slowest window beside it. Writes
stack_speed.csv, sampling.csv, stack_speed.png and report.md.

    python experiments/exp13_stack_speed.py [--quick] [--out DIR] [--data_dir DIR] [--sample_tokens N]
"""

import os
import statistics
import time
from dataclasses import dataclass

import _common
import torch

from babygpt import files
from babygpt.bench import time_steps, time_training
from babygpt.config import load_config
from babygpt.model import GPT, GPTConfig
from babygpt.options import option
from babygpt.plot import new_figure, save

NAME = "exp13_stack_speed"
CONFIG = os.path.join(_common.ROOT, "config")
# One piece at a time, on the default model (train.py's defaults: Pre-LN RMSNorm, 4 x 128, ctx 64).
PIECES = {
    "default": [],
    "pos rope": ["--pos=rope"],
    "mlp swiglu": ["--mlp=swiglu"],
    "mlp relu2": ["--mlp=relu2"],
    "split_qkv": ["--split_qkv=true"],
    "zero_init_proj": ["--zero_init_proj"],
    "residual_lambdas": ["--residual_lambdas"],
    "logit_softcap 15": ["--logit_softcap=15"],
    "attn_softcap 50": ["--attn_softcap=50"],
    "qk_norm": ["--qk_norm"],
    "qk_norm width": ["--qk_norm", "--qk_norm_scope=width"],
    "qk_clip_tau 100": ["--qk_clip_tau=100"],
    "norm_type derf": ["--norm_type=derf"],
    "norm_gain_offset": ["--norm_gain_offset"],
    "placement prepost": ["--norm_placement=prepost"],
    "placement parallel": ["--norm_placement=parallel"],
    "optimizer muon": ["--optimizer=muon"],
    "optimizer muon, ns float32": ["--optimizer=muon", "--muon_ns_dtype=float32"],
    "modern_rms.py": [os.path.join(CONFIG, "modern_rms.py")],
    "modern_rms_adamw.py": [os.path.join(CONFIG, "modern_rms_adamw.py")],
}
SAMPLING_SHAPE = {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256}
QUICK_SAMPLING_SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16}


@dataclass
class Exp13Options(_common.Options):
    data_dir: str = option(os.path.join(_common.ROOT, "data", "shakespeare_char"), "prepared data directory")
    sample_tokens: int = option(500, "new tokens per sampling measurement (quick: 40)")

    def problems(self) -> list[str]:
        return [] if self.sample_tokens > 0 else ["--sample_tokens must be positive"]


def training(args) -> list[dict]:
    """Training speed of every piece. The windows are interleaved: each round times one window of
    every piece, in alternating order, so that a slow spell of a shared machine is spread over all of
    them; a piece's ms/iter is the median of its windows, and the default's own spread (the fastest
    and slowest of its windows) shows how far apart two identical models can be timed."""
    shape = ("n_layer", "n_head", "n_embd", "block_size", "batch_size")
    quick = [f"--{k}={_common.QUICK_BUDGET[k]}" for k in shape] if args.quick else []
    rounds, window_iters = (2, 2) if args.quick else (8, 5)
    trainers = {}
    for name, argv in PIECES.items():
        config = [a for a in argv if a.endswith(".py")]  # a config file comes first, the keys after it
        keys = [a for a in argv if not a.endswith(".py")]
        cfg = load_config([*config, f"--data_dir={args.data_dir}", "--device=cpu", *quick, *keys])
        trainers[name] = time_training(cfg, 1, 1)[1]  # built and warmed up
    windows = {name: [] for name in trainers}
    for r in range(rounds):
        for name in (list(trainers) if r % 2 == 0 else reversed(trainers)):
            windows[name] += time_steps(trainers[name], 1, window_iters)["ms_per_iter_windows"]
    base = statistics.median(windows["default"])
    rows = []
    for name, trainer in trainers.items():
        c, ms = trainer.cfg, statistics.median(windows[name])
        tokens = c.batch_size * c.model.block_size * c.gradient_accumulation_steps
        rows.append({"piece": name, "params": trainer.model.num_params(), "ms_per_iter": ms,
                     "ms_min": min(windows[name]), "ms_max": max(windows[name]), "tokens_per_s": tokens / (ms / 1e3),
                     "speed_vs_default": base / ms, "windows_ms": windows[name]})
    return rows


def nanogpt_generate(model: GPT, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy generation the way nanoGPT's GPT.generate does it: every step runs the model on the
    whole context, cut to the last block_size tokens, and keeps the last position's logits."""
    block = model.config.block_size
    for _ in range(new_tokens):
        logits = model(idx[:, -block:])[0][:, -1, :]  # (B, V)
        idx = torch.cat([idx, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return idx


def tokens_per_s(generate, new_tokens: int) -> float:
    """Tokens per second of generate(n) over new_tokens, after a short warm-up."""
    generate(min(8, new_tokens))
    started = time.perf_counter()
    generate(new_tokens)
    return new_tokens / (time.perf_counter() - started)


def sampling(args) -> list[dict]:
    """Greedy sampling at batch 1 from one token, KV-cached (this project's generate) against
    nanoGPT's recomputation, for learned positions and for RoPE, on untrained weights (the speed
    does not depend on them)."""
    shape = QUICK_SAMPLING_SHAPE if args.quick else SAMPLING_SHAPE
    n = 40 if args.quick else args.sample_tokens
    rows = []
    for pos in ("learned", "rope"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**shape, vocab_size=65, pos=pos)).eval()
        idx = torch.zeros(1, 1, dtype=torch.long)
        with torch.inference_mode():
            cached = tokens_per_s(lambda k: model.generate(idx, k, temperature=0), n)
            nanogpt = tokens_per_s(lambda k: nanogpt_generate(model, idx, k), n)
        rows.append({"pos": pos, **shape, "new_tokens": n, "cached_tokens_per_s": cached,
                     "nanogpt_tokens_per_s": nanogpt, "speedup": cached / nanogpt})
    return rows


def plot(rows: list[dict], path: str) -> None:
    fig, ax = new_figure(figsize=(7, 5))
    names = [r["piece"] for r in rows][::-1]
    ax.barh(names, [r["speed_vs_default"] for r in rows][::-1], color="tab:blue")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("training tokens/s relative to the default model")
    save(fig, path)


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """rows as a markdown table of ``columns``: (key, title, format spec) each."""
    return _common.markdown_table([title for _, title, _ in columns],
                                  [[format(r[key], fmt) for key, _, fmt in columns] for r in rows])


def main(argv):
    exp = _common.begin(Exp13Options, argv, NAME, __doc__)
    args, out = exp.args, exp.claim()
    if args.quick:  # --quick checks the pipeline, not speed: one thread keeps it steady on a shared machine
        torch.set_num_threads(1)
    train_rows, sample_rows = training(args), sampling(args)
    for name, rows in (("stack_speed.csv", train_rows), ("sampling.csv", sample_rows)):
        files.write_csv(os.path.join(out, name), list(dict.fromkeys(k for r in rows for k in r)), rows)
    plot(train_rows, os.path.join(out, "stack_speed.png"))
    setup = (f"Training: babygpt.bench.time_training, TrainConfig defaults{' in the quick shape' * args.quick} "
             f"on the CPU, {torch.get_num_threads()} thread(s), float32, one piece switched on at a time; "
             f"windows interleaved over the pieces, ms/iter the median of a piece's windows. Sampling: greedy, "
             f"batch 1, untrained weights, {sample_rows[0]['new_tokens']} new tokens from one.")
    body = "\n\n".join([
        setup, "## Training", table(train_rows, [("piece", "piece", ""), ("params", "parameters", ","),
                                                   ("ms_per_iter", "ms/iter", ".1f"),
                                                   ("ms_min", "fastest window", ".1f"),
                                                   ("ms_max", "slowest window", ".1f"),
                                                   ("tokens_per_s", "tokens/s", ",.0f"),
                                                   ("speed_vs_default", "× default's speed", ".2f")]),
        "![stack speed](stack_speed.png)", "## Sampling",
        table(sample_rows, [("pos", "positions", ""), ("cached_tokens_per_s", "KV-cached tokens/s", ",.0f"),
                            ("nanogpt_tokens_per_s", "nanoGPT-style tokens/s", ",.0f"),
                            ("speedup", "× nanoGPT's", ".1f")])])
    exp.write_report("What each piece of the 2026 stack costs", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
