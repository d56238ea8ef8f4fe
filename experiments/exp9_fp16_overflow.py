"""Experiment 9: float16's overflow in a real run's residual stream, and why the norms square in float32.

float16's largest finite value is 65,504, so any |x| > 255.9 has x^2 beyond it. A norm that computes
mean(x^2) (RMSNorm) or the variance (LayerNorm) in float16 then gets inf; rsqrt(inf) = 0 turns the
whole row into zeros, and the next layer reads nothing (NaN where x itself is inf). This project's norms
upcast to float32 to square and cast the result back (babygpt/norms.py), which is what this checks on a
real stream rather than on a tensor of 300.0s.

Pre-LN RMSNorm (config/prenorm_rms.py) is trained at each --lrs with per-layer diagnostics, whose
``resid_max`` is the largest |x| of the stream leaving each block. The experiment finds the first measured
iteration where it exceeds 255.9, trains the same run again up to exactly that iteration (same seed and
LR schedule, so the same weights: the report checks that the diagnostics agree), and on that checkpoint,
with every weight cast to float16 (a pure cast, no autocast), scores a fixed slice of the validation
split three ways: in float32, in float16 with this project's norms, and in float16 with a naive RMSNorm
that squares in float16 (defined here, not in the library's registry). A run whose stream never
crosses 255.9 is scored on its last checkpoint instead.

    python experiments/exp9_fp16_overflow.py [--quick | --full] [--jobs N] [--lrs 1e-2,3e-2] [--out DIR]

Writes results.csv, fp16_overflow.png and report.md.
"""

import math
import os
from dataclasses import dataclass
from typing import Optional

import _common
import torch

from babygpt.verdicts import run_loss
from babygpt.data import load_dataset
from babygpt.files import write_csv
from babygpt.norms import RMSNorm
from babygpt.options import option
from babygpt.plot import load_run, new_figure, save
from babygpt.sampling import load_model
from babygpt.sweep import Run
from _common import EXP2_BUDGET, config_path, floats, lr_overrides

NAME = "exp9_fp16_overflow"
FP16_SQUARE_LIMIT = math.sqrt(torch.finfo(torch.float16).max)  # 255.9: beyond it x^2 is inf in float16
LRS = {"quick": "3e-2", "default": "1e-2,3e-2"}  # 1e-2: experiment 2's tuned LR for prenorm_rms
EVAL_WINDOWS = {"quick": 4, "default": 32}
CONFIG = "prenorm_rms"


@dataclass
class Exp9Options(_common.TrainingOptions):
    lrs: Optional[str] = option(None, f"learning rates (none: {LRS['default']}; quick {LRS['quick']})",
                                metavar="LR,...")
    seed: int = option(1, "the seed of every run")
    diag_interval: Optional[int] = option(None, "iterations between diagnostics (none: 25; quick 2)")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.lrs is not None:
            try:
                if not all(v > 0 and math.isfinite(v) for v in floats(self.lrs)):
                    problems.append(f"--lrs must be positive numbers, got {self.lrs!r}")
            except ValueError:
                problems.append(f"--lrs must be a comma-separated list of numbers, got {self.lrs!r}")
        if self.diag_interval is not None and self.diag_interval < 1:
            problems.append(f"--diag_interval must be at least 1, got {self.diag_interval}")
        return problems


class NaiveHalfRMSNorm(torch.nn.Module):
    """RMSNorm computed in its input's dtype, as a norm without the float32 upcast would be: in
    float16, mean(x^2) is inf once any |x| of the row exceeds 255.9, and the row becomes zeros."""

    def __init__(self, norm: RMSNorm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d), all in x.dtype
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def with_naive_norms(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every RMSNorm replaced by NaiveHalfRMSNorm (same weights), in place."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, RMSNorm):
                setattr(module, name, NaiveHalfRMSNorm(child))
    return model


def val_windows(data_dir: str, block_size: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` consecutive block_size windows of the validation split: (x, y), each (n, T)."""
    val = torch.as_tensor(load_dataset(data_dir)[1][: n * block_size + 1].astype("int64"))
    x = val[:-1].view(n, block_size)
    y = val[1:].view(n, block_size)
    return x, y


@torch.no_grad()
def score(ckpt: str, dtype: str, x: torch.Tensor, y: torch.Tensor, naive: bool = False) -> dict:
    """Loss of the checkpoint's model on (x, y) with its weights in ``dtype``; with ``naive``, its
    RMSNorms square in that dtype. Also the share of norm input rows whose mean square is not finite
    when computed in ``dtype``: the rows a naive norm loses."""
    model, _ = load_model(ckpt, torch.device("cpu"), dtype)
    if naive:
        with_naive_norms(model)
    overflowing, rows = [0], [0]

    def count(module, inputs, out):  # inputs[0]: (B, T, C), what the norm reads, in ``dtype``
        ms = inputs[0].pow(2).mean(dim=-1)  # (B, T), squared in the input's dtype
        overflowing[0] += int((~torch.isfinite(ms)).sum())
        rows[0] += ms.numel()

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (RMSNorm, NaiveHalfRMSNorm))]
    loss = model(x, y)[1].item()
    for h in hooks:
        h.remove()
    return {"loss": loss, "overflowing_rows": overflowing[0] / max(rows[0], 1)}


def diag_rows(run: dict) -> list[dict]:
    return [r for r in run["metrics"] if r.get("resid_max") is not None]


def first_crossing(run: dict) -> Optional[int]:
    """The first measured iteration at which some block's max |x| exceeds 255.9, or None."""
    return next((r["iter"] for r in diag_rows(run) if max(v for v in r["resid_max"] if v is not None)
                 > FP16_SQUARE_LIMIT), None)


def plot(loaded: dict, results: list[dict], path: str) -> None:
    fig, axes = new_figure(1, 2, figsize=(11, 4), squeeze=False)
    ax = axes[0, 0]
    for lr, run in loaded.items():
        rows = diag_rows(run)
        line, = ax.plot([r["iter"] for r in rows], [max(r["resid_max"]) for r in rows], label=f"lr {lr:g}")
        crossing = first_crossing(run)
        if crossing is not None:
            ax.axvline(crossing, color=line.get_color(), linestyle=":", linewidth=1)
    ax.axhline(FP16_SQUARE_LIMIT, color="red", linestyle="--", linewidth=1, label="255.9: x² > 65,504")
    ax.set(yscale="log", xlabel="iteration", ylabel="max |x| of the stream (over blocks)",
           title="Pre-LN RMSNorm: the residual stream's largest value")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    kinds = [("loss_fp32", "float32"), ("loss_fp16", "float16, norms square in float32"),
             ("loss_fp16_naive", "float16, naive norm squares in float16")]
    width = 0.8 / len(kinds)
    for k, (key, label) in enumerate(kinds):
        values = [r[key] if math.isfinite(r[key]) else 0.0 for r in results]
        bars = ax.bar([i + k * width for i in range(len(results))], values, width, label=label)
        for bar, r in zip(bars, results):
            if not math.isfinite(r[key]):
                ax.annotate("NaN", (bar.get_x() + bar.get_width() / 2, 0.05), ha="center", fontsize=8, color="red")
    ax.set_xticks([i + width for i in range(len(results))],
                  [f"lr {r['lr']:g}, iter {r['checkpoint_iter']}" for r in results])
    ax.set(ylabel="validation loss on the checkpoint (nats)", title="The same checkpoint, weights cast to half")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    save(fig, path)


def fmt(v: float) -> str:
    return f"{v:.4f}" if math.isfinite(v) else str(v)


def main(argv):
    exp = _common.begin(Exp9Options, argv, NAME, __doc__)
    args, tier = exp.args, exp.tier
    diag_interval = args.diag_interval or (2 if tier == "quick" else 25)
    lrs = floats(args.lrs or LRS["quick" if tier == "quick" else "default"])
    budget = {**(EXP2_BUDGET if tier == "default" else {})}
    max_iters = exp.budget(budget).get("max_iters", 2400)
    for s in args.set:  # a --set max_iters=... is the run's length, and so the schedule's
        key, _, value = s.partition("=")
        max_iters = int(value) if key == "max_iters" else max_iters
    # The schedule is pinned to the long run's length, so a run stopped early follows the same LRs.
    common = {"diag_interval": diag_interval, "lr_decay_iters": max_iters}
    runs = {lr: Run({**lr_overrides(lr), **common}, args.seed, config_path(CONFIG)) for lr in lrs}
    sweep, rows = exp.train(list(runs.values()), budget, last=False)
    loaded = {lr: load_run(sweep.out_dir(run)) for lr, run in runs.items()}
    crossings = {lr: first_crossing(run) for lr, run in loaded.items()}
    # The same runs, stopped at the crossing: their ckpt.pt holds the weights of that iteration.
    stops = {lr: Run({**lr_overrides(lr), **common, "max_iters": c}, args.seed, config_path(CONFIG))
             for lr, c in crossings.items() if c is not None}
    stopped_sweep = exp.sweep(list(stops.values()), budget, out=os.path.join(exp.out, "at_crossing"))
    stopped_rows = _common.finished_rows(stopped_sweep)
    block_size = int(loaded[lrs[0]]["info"]["config"]["block_size"])
    x, y = val_windows(args.data_dir, block_size, EVAL_WINDOWS["quick" if tier == "quick" else "default"])
    results = []
    for lr in lrs:
        stopped = stops.get(lr)
        run_dir = stopped_sweep.out_dir(stopped) if stopped else sweep.out_dir(runs[lr])
        ckpt = os.path.join(run_dir, "ckpt.pt")
        at = diag_rows(load_run(run_dir))[-1]
        same = stopped is None or at["resid_max"] == next(r for r in diag_rows(loaded[lr]) if r["iter"] == at["iter"])["resid_max"]
        fp32, fp16, naive = score(ckpt, "float32", x, y), score(ckpt, "float16", x, y), score(ckpt, "float16", x, y, True)
        results.append({"lr": lr, "final_loss": run_loss(rows[runs[lr].name]), "status": rows[runs[lr].name]["status"],
                        "first_crossing": crossings[lr], "checkpoint_iter": at["iter"],
                        "max_abs_at_checkpoint": max(at["resid_max"]), "same_as_long_run": same,
                        "loss_fp32": fp32["loss"], "loss_fp16": fp16["loss"], "loss_fp16_naive": naive["loss"],
                        "overflowing_rows_fp16": fp16["overflowing_rows"]})
    write_csv(os.path.join(exp.out, "results.csv"), list(results[0]), results)
    plot(loaded, results, os.path.join(exp.out, "fp16_overflow.png"))
    crossing_table = _common.markdown_table(
        ["LR", "final loss (whole val split)", "max \\|x\\| of the stream, per block, at the end",
         "first measured iteration with max \\|x\\| > 255.9"],
        [[f"{r['lr']:g}", f"{r['final_loss']:.3f} {r['status']}",
          " / ".join(f"{v:.0f}" for v in diag_rows(loaded[r["lr"]])[-1]["resid_max"]),
          r["first_crossing"] if r["first_crossing"] is not None else "never"] for r in results])
    half_table = _common.markdown_table(
        ["LR", "checkpoint iteration", "max \\|x\\| there", "same weights as the long run", "loss float32",
         "loss float16, this project's norms", "loss float16, naive norm", "norm input rows whose float16 mean square is inf"],
        [[f"{r['lr']:g}", r["checkpoint_iter"], f"{r['max_abs_at_checkpoint']:.1f}", "yes" if r["same_as_long_run"] else "NO",
          fmt(r["loss_fp32"]), fmt(r["loss_fp16"]), fmt(r["loss_fp16_naive"]), f"{r['overflowing_rows_fp16']:.1%}"]
         for r in results])
    body = (f"{exp.budget_line(budget)}; {CONFIG}, seed {args.seed}, "
            f"min_lr = lr/10 with the cosine schedule of a {max_iters}-iteration run; diagnostics every "
            f"{diag_interval} iterations. The checkpoints are scored on the first {len(x)} windows of "
            f"{block_size} characters of the validation split. {_common.training_time([*rows.values(), *stopped_rows.values()])}.\n\n"
            + _common.table_section("When the stream leaves float16's range for squares", "The largest |x| of the "
                                    "residual stream leaving each block (diagnostics' resid_max); above 255.9, x² "
                                    "exceeds float16's largest value.", "crossing", crossing_table)
            + _common.table_section("The checkpoint in float16", "Weights cast to float16 (no autocast). A naive "
                                    "norm squares in float16; this project's norms square in float32 and cast back. "
                                    "The last column counts the rows (positions) of every norm's input whose mean "
                                    "square, taken in float16, is inf: the rows a naive norm turns into zeros.",
                                    "half", half_table)
            + "![](fp16_overflow.png)")
    exp.write_report("float16 overflow in the residual stream", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
