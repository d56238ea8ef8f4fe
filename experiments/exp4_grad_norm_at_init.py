"""Experiment 4: at initialisation, Xiong et al.'s gradient norms and Liu et al.'s amplification, under both inits.

1. Xiong et al. 2020 (arXiv:2002.04745, Figure 3 and Theorem 1): under Xavier init, the expected
   gradient of each layer's FFN weights grows with the layer index in Post-LN, while in Pre-LN it
   is about flat and the last layer's shrinks as 1/sqrt(L) with the depth L. Measured here: the
   norm of E[dL/dW] of each layer's FFN weights (fc and proj together), the expectation taken
   over many batches before the norm, for depths 2 ... 24.
2. Liu et al. 2020 (arXiv:2004.08249, section 4): how much one small update of every weight
   changes the model's output grows with depth in Post-LN (O(N)) but stays bounded in Pre-LN
   (O(log N)); DeepNorm (Wang et al. 2022) is designed to bound it. Measured here, forward only:
   every weight matrix and vector moves by lr * (random sign), the shape of an Adam step, and
   the change of the final hidden state (what the LM head reads) is E|F(x, W*) - F(x, W)|^2 per
   element, averaged over draws.

Both under this project's GPT-2 init and under Xavier init (GPTConfig.init), LayerNorm, seed 0.

    python experiments/exp4_grad_norm_at_init.py [--quick] [--depths 2,4,6,12,24] [--inits gpt2,xavier]
        [--placements pre,post,deepnorm] [--out DIR] [--data_dir DIR]

Writes grad_norm_at_init.csv, grad_norm_at_init.png, amplification.png and report.md.
"""

import math
import os
from dataclasses import dataclass
from typing import Optional

import _common
import torch

from babygpt.data import BatchSampler, load_dataset
from babygpt.files import write_csv
from babygpt.memory import num_params_lower_bound, training_bytes
from babygpt.model import GPT, INITS, GPTConfig
from babygpt.options import option
from babygpt.plot import new_figure, save

PROBE_LR = 1e-3  # the size of the probe's update: an Adam step at a typical learning rate
PROBE_DRAWS = 4  # random update directions averaged per model


@dataclass
class Shape:
    """What every model and batch of the experiment shares."""

    width: int
    batches: int
    batch_size: int
    block_size: int


SHAPES = {"quick": Shape(32, 4, 8, 16), "default": Shape(128, 32, 32, 64)}


def model_config(n_layer: int, shape: Shape, vocab: int, **keys) -> GPTConfig:
    return GPTConfig(vocab_size=vocab, block_size=shape.block_size, n_layer=n_layer, n_head=4, n_embd=shape.width,
                     **keys)


def model_bytes(n_layer: int, shape: Shape, vocab: int) -> int:
    """A lower bound on one measured model's memory: training's (babygpt.memory) less AdamW's two
    moments (8 bytes a parameter), which nothing here allocates."""
    m = model_config(n_layer, shape, vocab)
    return training_bytes(m, shape.batch_size) - 8 * num_params_lower_bound(n_layer, shape.width, shape.block_size,
                                                                            vocab)


def seconds(placements, inits, depths: list[int], shape: Shape, data, vocab: int, probe_idx) -> float:
    """The estimated time of every model: each placement timed at 1 and 2 blocks now with the first init
    (built, profiled, its gradients and its output change measured, as main does), the others' inits
    taken to cost the same (an init draws the same matrices; timing each would cost as much as a short
    list of depths itself)."""
    def measured(placement, init, n):
        model = model_at_init(placement, init, n, shape, vocab, probe_idx)
        ffn_grad_norms(model, data, shape)
        output_change(model, probe_idx)

    total = 0.0
    for placement in placements:
        fixed, per_block = _common.seconds_by_depth(lambda n: measured(placement, inits[0], n))
        total += len(inits) * sum(fixed + per_block * d for d in depths)
    return total


def model_at_init(placement: str, init: str, n_layer: int, shape: Shape, vocab: int, profile_idx: torch.Tensor,
                  seed: int = 0) -> GPT:
    """The model as training starts: built, then profiled on ``profile_idx`` (B, T) where its placement
    sets its init from a forward pass (Admin's omega), as a run from scratch is."""
    torch.manual_seed(seed)
    model = GPT(model_config(n_layer, shape, vocab, norm_type="layernorm", norm_placement=placement, init=init))
    model.profile_init(profile_idx)
    return model


def ffn_grad_norms(model: GPT, data, shape: Shape) -> list[float]:
    """||E[dL/dW_ffn]|| for each layer of ``model``, over ``shape.batches`` fixed batches."""
    sampler = BatchSampler(data, shape.block_size, shape.batch_size, seed=1234)  # the same batches for every model
    for _ in range(shape.batches):
        x, y = sampler.next_batch()
        (model(x, y)[1] / shape.batches).backward()  # gradients accumulate into their mean
    return [torch.cat([b.ffwd.fc.weight.grad.flatten(), b.ffwd.proj.weight.grad.flatten()]).norm().item()
            for b in model.blocks]


@torch.no_grad()
def output_change(model: GPT, idx: torch.Tensor, lr: float = PROBE_LR, draws: int = PROBE_DRAWS) -> float:
    """Mean over ``draws`` of E|F(W + lr * s) - F(W)|^2 per element, s a random sign per weight."""
    model.eval()
    before = model.hidden(idx)
    params = list(model.parameters())
    saved = [p.clone() for p in params]
    generator = torch.Generator().manual_seed(0)
    changes = []
    for _ in range(draws):
        for p in params:
            signs = torch.randint(0, 2, p.shape, generator=generator).to(p.dtype) * 2 - 1
            p.add_(lr * signs)
        changes.append((model.hidden(idx) - before).pow(2).mean().item())
        for p, s in zip(params, saved):
            p.copy_(s)
    return sum(changes) / len(changes)


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x: the exponent of a power law y ~ x^slope."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


@dataclass
class Exp4Options(_common.DataOptions):
    placements: str = _common.placements_option("pre,post,deepnorm")
    depths: Optional[str] = option(None, "comma-separated n_layer values (none: 2,4,6,12,24; quick 2,4)",
                                    metavar="N,...")
    inits: str = option(",".join(INITS), "comma-separated inits among " + ",".join(INITS), metavar="INIT,...")

    def problems(self) -> list[str]:
        problems = _common.placement_problems(self.placements)
        if self.depths and not all(d.strip().isdigit() and int(d) > 0 for d in self.depths.split(",")):
            problems.append(f"--depths takes comma-separated positive integers, got {self.depths!r}")
        elif self.depths:
            problems += _common.repeated_entries("--depths", [int(d) for d in self.depths.split(",")])
        bad = [i for i in self.inits.split(",") if i not in INITS]
        if bad:
            problems.append(_common.unknown_choice("init", bad[0], INITS))
        return problems + _common.repeated_entries("--inits", self.inits.split(","))


def depth_ticks(ax, depths) -> None:
    """Label a log-scaled depth axis with the depths themselves."""
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()


def colours(placements) -> list[str]:
    """One colour per placement (an init is a line style), from matplotlib's cycle: C0..C9, then again."""
    return [f"C{i % 10}" for i in range(len(placements))]


def plot_gradients(norms: dict, inits, placements, depths, path: str) -> None:
    """Per init: each layer's FFN gradient norm at the largest depth; then the last layer's against depth."""
    fig, axes = new_figure(1, len(inits) + 1, figsize=(5.2 * (len(inits) + 1), 4.2), squeeze=False)
    deepest = depths[-1]
    for ax, init in zip(axes[0], inits):
        for pl in placements:
            ax.plot(range(1, deepest + 1), norms[init, pl, deepest], "o-", markersize=3, label=pl)
        ax.set(xlabel="layer", ylabel="||E[dL/dW_ffn]||", yscale="log",
               title=f"FFN gradient per layer, {deepest} layers, {init} init")
    ax = axes[0][-1]
    for init, style in zip(inits, ("o--", "s-")):
        for colour, pl in zip(colours(placements), placements):
            ax.plot(depths, [norms[init, pl, d][-1] for d in depths], style, color=colour, label=f"{pl}, {init}")
    anchor = norms[inits[-1], placements[0], depths[0]][-1]
    ax.plot(depths, [anchor * math.sqrt(depths[0] / d) for d in depths], ":", color="grey", label="∝ 1/sqrt(L)")
    ax.set(xlabel="number of layers L", ylabel="||E[dL/dW_ffn]|| of the last layer", xscale="log", yscale="log",
           title="last layer vs depth")
    depth_ticks(ax, depths)
    for a in axes[0]:
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    save(fig, path)


def plot_amplification(change: dict, inits, placements, depths, path: str) -> None:
    fig, ax = new_figure(figsize=(6, 4.5))
    for init, style in zip(inits, ("o--", "s-")):
        for colour, pl in zip(colours(placements), placements):
            ax.plot(depths, [change[init, pl, d] for d in depths], style, color=colour, label=f"{pl}, {init}")
    ax.set(xlabel="number of layers N", ylabel="E|F(W*) - F(W)|^2 per element", xscale="log", yscale="log",
           title=f"output change after one update of size {PROBE_LR:g}")
    depth_ticks(ax, depths)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def main(argv):
    exp = _common.begin(Exp4Options, argv, "exp4_grad_norm_at_init", __doc__)
    args = exp.args
    placements, inits = args.placements.split(","), args.inits.split(",")
    depths = sorted({int(d) for d in (args.depths or ("2,4" if args.quick else "2,4,6,12,24")).split(",")})
    train, _, tok = load_dataset(args.data_dir)
    shape = SHAPES[exp.tier]
    probe_idx = BatchSampler(train, shape.block_size, shape.batch_size, seed=4321).next_batch()[0]  # (B, T)
    _common.check_size(f"experiment 4 at n_layer={depths[-1]} (width {shape.width})",
                       model_bytes(depths[-1], shape, tok.vocab_size),
                       lambda: seconds(placements, inits, depths, shape, train, tok.vocab_size, probe_idx),
                       "lower --depths")
    out = exp.claim()

    norms, change = {}, {}
    for init in inits:
        for pl in placements:
            for d in depths:
                model = model_at_init(pl, init, d, shape, tok.vocab_size, probe_idx)
                norms[init, pl, d] = ffn_grad_norms(model, train, shape)
                change[init, pl, d] = output_change(model, probe_idx)  # forward only: the gradients are unused

    header = ["init", "placement", "n_layer", "layer", "ffn_grad_norm", "output_change"]
    write_csv(os.path.join(out, "grad_norm_at_init.csv"), header,
              [dict(zip(header, [init, pl, d, layer, v, change[init, pl, d] if layer == d else ""]))
               for (init, pl, d), values in norms.items() for layer, v in enumerate(values, 1)])
    plot_gradients(norms, inits, placements, depths, os.path.join(out, "grad_norm_at_init.png"))
    plot_amplification(change, inits, placements, depths, os.path.join(out, "amplification.png"))

    deepest = depths[-1]
    shown = sorted({1, *(round(deepest * q) for q in (0.25, 0.5, 0.75)), deepest} - {0})  # every layer: the CSV
    per_layer = [[init, pl, f"{norms[init, pl, deepest][-1] / norms[init, pl, deepest][0]:.2f}",
                  *(f"{norms[init, pl, deepest][i - 1]:.2e}" for i in shown)] for init in inits for pl in placements]
    slope = len(depths) > 1
    last = [[init, pl, *(f"{norms[init, pl, d][-1]:.2e}" for d in depths)]
            + ([f"{loglog_slope(depths, [norms[init, pl, d][-1] for d in depths]):+.2f}"] if slope else [])
            for init in inits for pl in placements]
    amp = [[init, pl, *(f"{change[init, pl, d]:.2e}" for d in depths)]
           + ([f"{change[init, pl, deepest] / change[init, pl, depths[0]]:.1f}"] if slope else [])
           for init in inits for pl in placements]
    body = (f"LayerNorm, width {shape.width}, context {shape.block_size}, 4 heads; expected gradient over "
            f"{shape.batches} batches of {shape.batch_size} sequences of TinyShakespeare; seed 0.\n\n"
            + _common.table_section(
                f"1. FFN gradient norm per layer, {deepest} layers (Xiong et al. Figure 3)",
                "Selected layers; grad_norm_at_init.csv and the plot have every layer.", "per_layer",
                _common.markdown_table(["init", "placement", "last / first layer", *(f"layer {i}" for i in shown)],
                                       per_layer))
            + _common.table_section(
                "2. The last layer's FFN gradient norm against depth (Xiong et al. Theorem 1)",
                "Slope: least-squares exponent of norm ~ L^slope; Theorem 1 predicts -0.5 for Pre-LN and about 0 "
                "for Post-LN under Xavier init.", "last_layer",
                _common.markdown_table(["init", "placement", *(f"L={d}" for d in depths)] + (["slope"] if slope else []),
                                       last))
            + "![](grad_norm_at_init.png)\n\n"
            + _common.table_section(
                "3. Output change after one small update (Liu et al. 2020)",
                f"Every parameter moved by {PROBE_LR:g} x a random sign; E|F(W*) - F(W)|^2 per element of the final "
                f"hidden state, mean of {PROBE_DRAWS} draws, on one batch of {shape.batch_size} sequences.",
                "amplification",
                _common.markdown_table(["init", "placement", *(f"N={d}" for d in depths)]
                                       + ([f"N={deepest} / N={depths[0]}"] if slope else []), amp))
            + "![](amplification.png)")
    exp.write_report("Gradient norms and amplification at initialisation", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
