"""Experiment 6: why Post-LN collapses to the unigram loss at lr 3e-3 under GPT-2 init.

In experiment 2, Post-LN with LayerNorm and 4 layers learns at lr 1e-3 but ends at the unigram loss
(it predicts only character frequencies) at 3e-3 and above; nanoGPT's own model turned Post-LN does
the same (docs/experiments.md, "How configurations are compared"). Each arm changes one thing in that setup, a hypothesis for the cause:

  bias=False      no biases in Linear layers and no LayerNorm beta: a collapse that lives in the
                  biases (the model learning a fixed output) would need them.
  adam_eps=1e-15  at this LR block 0's per-element gradient becomes about 1e-8, the size of AdamW's
                  eps (1e-8): eps then damps the updates of the early blocks, which stop learning.
  init=xavier     the paper's init instead of GPT-2's. It bundles three changes, so each is also
                  an arm of its own (babygpt/init.py's parts):
  xavier weights     init_linear=xavier: Xavier-uniform Linear weights instead of N(0, 0.02);
  unit embeddings    init_embedding=unit: embeddings N(0, 1/C) times sqrt(C), a stream that starts
                     at RMS about 1 instead of 0.03;
  no depth factor    init_depth_factor=False: sa.proj and ffwd.proj without GPT-2's 1/sqrt(2N).

Every arm runs at experiment 2's default-tier budget and schedule, at lr 3e-3 (where the baseline
collapses) and 1e-2 (past it), min_lr = lr/10, with per-layer diagnostics (babygpt/diagnostics.py)
every --diag_interval iterations; Pre-LN at the same LR is the reference that trains. A hypothesis
holds at an LR when its change prevents the collapse in every seed there.

    python experiments/exp6_postln_collapse.py [--quick | --full] [--jobs N] [--seeds 3] [--lrs 3e-3,1e-2] [--out DIR]

Writes results.csv, collapse_diagnostics.png (at the first LR: 3e-3) and report.md.
"""

import os
from dataclasses import dataclass

import _common

from babygpt.verdicts import run_loss
from babygpt.config import MODEL_FIELDS
from babygpt.model import GPT, GPTConfig
from babygpt.options import option
from babygpt.plot import load_run, new_figure, save
from babygpt.runstore import run_info
from babygpt.sweep import Run
from _common import EXP2_BUDGET, floats, lr_list_problems

LRS = "3e-3,1e-2"  # where the baseline collapses, and past it
SETUP = {"norm_placement": "post", "norm_type": "layernorm"}
# arm -> (what it changes, overrides on top of SETUP); the first is the collapsing setup itself.
ARMS = {
    "baseline": ("Post-LN as in experiment 2 (GPT-2 init, biases, adam_eps 1e-8)", {}),
    "bias=False": ("no biases, no LayerNorm beta", {"bias": False}),
    "adam_eps=1e-15": ("AdamW eps 1e-15 instead of 1e-8", {"adam_eps": 1e-15}),
    "init=xavier": ("Xavier init: all three parts below", {"init": "xavier"}),
    "xavier weights": ("Xavier-uniform Linear weights only", {"init_linear": "xavier"}),
    "unit embeddings": ("embeddings N(0, 1/C) x sqrt(C) only (stream RMS about 1)", {"init_embedding": "unit"}),
    "no depth factor": ("no 1/sqrt(2N) on the residual projections only", {"init_depth_factor": False}),
    "Pre-LN (reference)": ("Pre-LN, everything else as the baseline", {"norm_placement": "pre"}),
}
HYPOTHESES = ("bias=False", "adam_eps=1e-15", "init=xavier", "xavier weights", "unit embeddings", "no depth factor")


@dataclass
class Exp6Options(_common.TrainingOptions):
    seeds: int = option(3, "seeds per arm and LR, 0..N-1")
    diag_interval: int = option(10, "iterations between per-layer diagnostics")
    lrs: str = option(LRS, "the LRs every arm runs at, comma-separated; the diagnostics are read at the first",
                     metavar="LR,...")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.seeds < 1:
            problems.append(f"--seeds must be at least 1, got {self.seeds}")
        if self.diag_interval < 1:
            problems.append(f"--diag_interval must be at least 1, got {self.diag_interval}")
        return problems + lr_list_problems(self.lrs)


def lr_setup(lr: float) -> dict:
    return {**SETUP, "learning_rate": lr, "min_lr": lr / 10}


def arm_runs(lrs: list[float], seeds: int, diag_interval: int) -> dict[tuple, list[Run]]:
    """{(arm, lr): its runs, one per seed}."""
    return {(arm, lr): [Run({**lr_setup(lr), **overrides, "diag_interval": diag_interval}, seed, label=arm)
                        for seed in range(seeds)] for lr in lrs for arm, (_, overrides) in ARMS.items()}


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
    """Parameters in block 0 of a run (for per-element gradients), counted on the model its
    config.json describes: the committed records are enough (checkpoints are not committed, and
    --collect on a fresh clone has none)."""
    config = run_info(run_dir)["config"]
    model = GPT(GPTConfig(**{key: config[key] for key in MODEL_FIELDS if key in config}))
    return sum(p.numel() for p in model.blocks[0].parameters())


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


def plot(arms: list, loaded_by_seed: dict, lr: float, path: str) -> None:
    import math

    panels = [("token_independence", -1, "token independence, last block"),
              ("attn_logit_max", None, "max attention logit, any block"),
              ("grad_norm", 0, "gradient norm, block 0"), ("update_ratio", 0, "update ratio, block 0")]
    fig, axes = new_figure(2, 2, figsize=(11, 8))
    axes = axes.flatten()
    for ax, (key, layer, title) in zip(axes, panels):
        for i, arm in enumerate(arms):
            colour = f"C{i}"
            for seed, run in enumerate(loaded_by_seed[arm][:2]):  # two seeds: the plot stays readable
                rows = [r for r in run["metrics"] if r.get(key) is not None]
                values = [max((v for v in r[key] if v is not None), default=math.nan) if layer is None
                          else (r[key][layer] if r[key][layer] is not None else math.nan) for r in rows]
                ax.plot([r["iter"] for r in rows], values, color=colour, linestyle="-" if seed == 0 else "--",
                        label=arm if seed == 0 else None)
        ax.set(title=title, xlabel="iteration", yscale="log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Post-LN collapse diagnostics at lr {lr:g} (solid: seed 0, dashed: seed 1)")
    save(fig, path)


def main(argv):
    exp = _common.begin(Exp6Options, argv, "exp6_postln_collapse", __doc__)
    args = exp.args
    lrs = floats(args.lrs)
    runs = arm_runs(lrs, args.seeds, args.diag_interval)
    budget = EXP2_BUDGET if exp.tier == "default" else {}
    sweep, rows = exp.train([r for seeds in runs.values() for r in seeds], budget)

    first = {arm: runs[(arm, lrs[0])] for arm in ARMS}  # the diagnostics: the LR where the baseline collapses
    loaded_by_seed = {arm: [load_run(sweep.out_dir(r)) for r in rs] for arm, rs in first.items()}
    sizes = {arm: block0_size(sweep.out_dir(rs[0])) for arm, rs in first.items()}
    plot(list(ARMS), loaded_by_seed, lrs[0], os.path.join(exp.out, "collapse_diagnostics.png"))

    warmup = exp.budget(budget).get("warmup_iters", 100)
    last = rows[first["baseline"][0].name]["iter"]
    at = sorted({args.diag_interval, warmup, 2 * warmup, last})
    body = (f"{exp.budget_line(budget)}; "
            f"{', '.join(f'{k} {v}' for k, v in SETUP.items())}; learning_rate "
            f"{' and '.join(f'{lr:g}' for lr in lrs)} (min_lr = lr/10); seeds {', '.join(map(str, range(args.seeds)))}; "
            f"diagnostics every {args.diag_interval} iterations. {_common.training_time(rows.values())}.\n\n"
            + _common.table_section("Which hypothesis holds", "Each seed's final loss over the whole validation "
                                    "split; a hypothesis holds at an LR where its change makes every seed train.",
                                    "hypotheses", hypotheses_table(runs, rows))
            + _common.table_section(f"What the diagnostics show (seed 0, lr {lrs[0]:g})", "Gradient RMS per element "
                                    "= block 0's gradient norm / sqrt(its parameter count), to compare with AdamW's "
                                    "eps.", "diagnostics",
                                    diagnostics_table(first, {a: v[0] for a, v in loaded_by_seed.items()}, sizes, at))
            + _common.references_section(_common.reference_losses(args.data_dir))
            + "\n\n![](collapse_diagnostics.png)")
    exp.write_report("Why Post-LN collapses: the hypotheses, the init's parts apart", body)
    return 0


def hypotheses_table(runs: dict, rows: dict) -> str:
    table = []
    for (arm, lr), rs in runs.items():
        arm_rows = [rows[r.name] for r in rs]
        outcomes = " / ".join(f"{run_loss(r):.3f}" + ("" if r["status"] == "finished" else f" {r['status']}")
                              for r in arm_rows)
        table.append([arm, ARMS[arm][0], f"{lr:g}", outcomes, verdict(arm_rows) if arm in HYPOTHESES else "—"])
    return _common.markdown_table(["arm", "change", "lr", "final loss per seed", "hypothesis"], table)


if __name__ == "__main__":
    _common.main(main)
