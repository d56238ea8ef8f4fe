"""Experiment 6: why Post-LN collapses to the unigram loss at lr 3e-3 under GPT-2 init.

In experiment 2, Post-LN with LayerNorm and 4 layers learns at lr 1e-3 but ends at the unigram loss
(it predicts only character frequencies) at 3e-3 and above; nanoGPT's own model turned Post-LN does
the same (GUIDE §6). Each arm changes one thing in that setup, a hypothesis for the cause:

  bias=False      no biases in Linear layers and no LayerNorm beta: a collapse that lives in the
                  biases (the model learning a fixed output) would need them.
  adam_eps=1e-15  at this LR block 0's per-element gradient becomes about 1e-8, the size of AdamW's
                  eps (1e-8): eps then damps the updates of the early blocks, which stop learning.
  init=xavier     the paper's init (unit-RMS stream, no depth factor) instead of GPT-2's, whose
                  stream starts at RMS 0.03.

Every arm runs at experiment 2's default-tier budget and schedule (lr 3e-3, min_lr 3e-4), with
per-layer diagnostics (babygpt/diagnostics.py) every --diag_interval iterations; Pre-LN at the same
LR is the reference that trains. A hypothesis holds when its change prevents the collapse in every
seed. Seed 0's baseline is experiment 2's collapsed grid run.

    python experiments/exp6_postln_collapse.py [--quick | --full] [--jobs N] [--seeds 2] [--out DIR]

Writes results.csv, collapse_diagnostics.png and report.md.
"""

import os
import time
from dataclasses import dataclass

import _common

from babygpt.compare import run_loss
from babygpt.checkpoint import load_checkpoint
from babygpt.options import option
from babygpt.plot import load_run, new_figure, save
from babygpt.sweep import Run
from exp2_norm_comparison import EXP2_BUDGET

LR = 3e-3
SETUP = {"norm_placement": "post", "norm_type": "layernorm", "learning_rate": LR, "min_lr": LR / 10}
# arm -> (what it changes, overrides on top of SETUP); the first is the collapsing setup itself.
ARMS = {
    "baseline": ("Post-LN as in experiment 2 (GPT-2 init, biases, adam_eps 1e-8)", {}),
    "bias=False": ("no biases, no LayerNorm beta", {"bias": False}),
    "adam_eps=1e-15": ("AdamW eps 1e-15 instead of 1e-8", {"adam_eps": 1e-15}),
    "init=xavier": ("Xavier init, unit-RMS stream", {"init": "xavier"}),
    "Pre-LN (reference)": ("Pre-LN, everything else as the baseline", {"norm_placement": "pre"}),
}
HYPOTHESES = ("bias=False", "adam_eps=1e-15", "init=xavier")


@dataclass
class Exp6Options(_common.TrainingOptions):
    seeds: int = option(2, "seeds per arm, 0..N-1")
    diag_interval: int = option(10, "iterations between per-layer diagnostics")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.seeds < 1:
            problems.append(f"--seeds must be at least 1, got {self.seeds}")
        if self.diag_interval < 1:
            problems.append(f"--diag_interval must be at least 1, got {self.diag_interval}")
        return problems


def arm_runs(seeds: int, diag_interval: int) -> dict[str, list[Run]]:
    return {arm: [Run({**SETUP, **overrides, "diag_interval": diag_interval}, seed, label=arm)
                  for seed in range(seeds)] for arm, (_, overrides) in ARMS.items()}


def verdict(rows: list[dict]) -> str:
    collapsed = sum(r["status"] != "finished" for r in rows)
    if collapsed == 0:
        return f"prevents the collapse ({len(rows)} of {len(rows)} seeds train)"
    if collapsed == len(rows):
        return f"does not prevent it ({collapsed} of {len(rows)} seeds collapse)"
    return f"partly ({len(rows) - collapsed} of {len(rows)} seeds train)"


def diag_at(run: dict, it: int) -> dict | None:
    """The diagnostics row of ``run`` at iteration ``it``, or the last one before it."""
    rows = [r for r in run["metrics"] if r.get("resid_rms") is not None and r["iter"] <= it]
    return rows[-1] if rows else None


def block0_size(run_dir: str) -> int:
    """Parameters in block 0 of a finished run, read from its checkpoint (for per-element gradients)."""
    state = load_checkpoint(os.path.join(run_dir, "ckpt.pt"))["model"]
    return sum(t.numel() for name, t in state.items() if name.startswith("blocks.0."))


def fmt(v, spec=".3g") -> str:
    return "—" if v is None else format(v, spec)


def diagnostics_table(runs: dict, loaded: dict, sizes: dict, at: list[int]) -> str:
    """Seed 0 of every arm at the iterations ``at``: block 0's gradient per element and update ratio,
    the largest attention logit of any block, the last block's token independence and stream RMS."""
    body = []
    for arm in runs:
        run = loaded[arm]
        for it in at:
            d = diag_at(run, it)
            if d is None:
                continue
            g0 = d["grad_norm"][0]
            logits = [v for v in d["attn_logit_max"] if v is not None]
            body.append([arm, d["iter"], fmt(None if g0 is None else g0 / sizes[arm] ** 0.5),
                         fmt(d["update_ratio"][0]), fmt(max(logits) if logits else None),
                         fmt(d["token_independence"][-1]), fmt(d["resid_rms"][-1])])
    return _common.markdown_table(["arm", "iter", "block 0 gradient RMS per element", "block 0 update ratio",
                                   "max attention logit (any block)", "token independence (last block)",
                                   "stream RMS (last block)"], body)


def plot(runs: dict, loaded_by_seed: dict, path: str) -> None:
    import math

    panels = [("token_independence", -1, "token independence, last block"),
              ("attn_logit_max", None, "max attention logit, any block"),
              ("grad_norm", 0, "gradient norm, block 0"), ("update_ratio", 0, "update ratio, block 0")]
    fig, axes = new_figure(1, len(panels), figsize=(5 * len(panels), 4.2))
    for ax, (key, layer, title) in zip(axes, panels):
        for colour, arm in zip(("C0", "C1", "C2", "C3", "C7"), runs):
            for seed, run in enumerate(loaded_by_seed[arm]):
                rows = [r for r in run["metrics"] if r.get(key) is not None]
                values = [max((v for v in r[key] if v is not None), default=math.nan) if layer is None
                          else (r[key][layer] if r[key][layer] is not None else math.nan) for r in rows]
                ax.plot([r["iter"] for r in rows], values, color=colour, linestyle="-" if seed == 0 else "--",
                        label=arm if seed == 0 else None)
        ax.set(title=title, xlabel="iteration", yscale="log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save(fig, path)


def main(argv):
    args = _common.parse(Exp6Options, argv, "exp6_postln_collapse", __doc__)
    started = time.time()
    out = _common.output_path(args, "exp6_postln_collapse")
    runs = arm_runs(args.seeds, args.diag_interval)
    every_run = [r for seeds in runs.values() for r in seeds]
    budget = EXP2_BUDGET if _common.tier(args) == "default" else {}
    base_args = _common.budget_args(args, budget, runs=every_run)
    sweep = _common.sweep(out, every_run, base_args, args)
    _common.claim(out, args, "exp6_postln_collapse", sweep)
    rows = _common.finished_rows(sweep)

    loaded_by_seed = {arm: [load_run(sweep.out_dir(r)) for r in rs] for arm, rs in runs.items()}
    sizes = {arm: block0_size(sweep.out_dir(rs[0])) for arm, rs in runs.items()}
    plot(runs, loaded_by_seed, os.path.join(out, "collapse_diagnostics.png"))

    table = []
    for arm, rs in runs.items():
        arm_rows = [rows[r.name] for r in rs]
        outcomes = " / ".join(f"{run_loss(r):.3f}" + ("" if r["status"] == "finished" else f" {r['status']}")
                              for r in arm_rows)
        holds = verdict(arm_rows) if arm in HYPOTHESES else "—"
        table.append([arm, ARMS[arm][0], outcomes, holds])
    warmup = dict(_common.TIERS[_common.tier(args)], **budget).get("warmup_iters", 100)
    last = rows[runs["baseline"][0].name]["iter"]
    at = sorted({args.diag_interval, warmup, 2 * warmup, last})
    settings = {**_common.TIERS[_common.tier(args)], **budget}
    body = (f"Tier `{_common.tier(args)}`. Budget per run: {settings or 'train.py defaults'}; "
            f"{', '.join(f'{k} {v:g}' if isinstance(v, float) else f'{k} {v}' for k, v in SETUP.items())}; seeds {', '.join(map(str, range(args.seeds)))}; "
            f"diagnostics every {args.diag_interval} iterations. {_common.training_time(rows.values())}.\n\n"
            + _common.table_section("Which hypothesis holds", "Each seed's final loss over the whole validation "
                                    "split.", "hypotheses",
                                    _common.markdown_table(["arm", "change", "final loss per seed", "hypothesis"], table))
            + _common.table_section("What the diagnostics show (seed 0)", "Gradient RMS per element = block 0's "
                                    "gradient norm / sqrt(its parameter count), to compare with AdamW's eps.",
                                    "diagnostics",
                                    diagnostics_table(runs, {a: v[0] for a, v in loaded_by_seed.items()}, sizes, at))
            + _common.references_section(_common.reference_losses(args.data_dir))
            + "\n\n![](collapse_diagnostics.png)")
    _common.write_report(os.path.join(out, "report.md"), "Why Post-LN collapses: three hypotheses",
                         _common.command_line(), body, started)
    return 0


if __name__ == "__main__":
    _common.main(main)
