"""Experiment 4: gradient norms at initialisation, Pre-LN vs Post-LN (Xiong et al. 2020, arXiv:2002.04745).

Xiong et al. show that at initialisation the gradient of the FFN weights in a Post-LN transformer
grows with the layer index (largest near the output), while in Pre-LN it stays about flat - and
that this is why Post-LN needs learning-rate warmup. Here, at character scale, on TinyShakespeare:
  1. for one depth, the norm of each layer's expected FFN weight gradient (fc and proj weights
     together), for Pre-LN and Post-LN with LayerNorm;
  2. the last layer's FFN gradient norm as the depth grows.
"Expected" gradient: averaged over many batches first, then the norm is taken. Our models use
GPT-2 initialisation (residual projections scaled by 1/sqrt(2 * n_layer)), not the paper's.

    python experiments/exp4_grad_norm_at_init.py [--quick] [--out DIR] [--data_dir DIR]
        [--placements pre,post,sandwich,deepnorm]

Writes grad_norm_at_init.csv, grad_norm_at_init.png and report.md.
"""

import csv
import os
import time
from dataclasses import dataclass

import _common
import torch

from babygpt.data import BatchSampler, load_dataset
from babygpt.model import GPT, GPTConfig
from babygpt.plot import new_figure, save


def ffn_grad_norms(placement: str, n_layer: int, width: int, data, vocab: int, batches: int,
                   batch_size: int, block_size: int, seed: int = 0) -> list[float]:
    """||E[dL/dW_ffn]|| for each layer of a freshly initialised model."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab, block_size=block_size, n_layer=n_layer, n_head=4, n_embd=width,
                    norm_type="layernorm", norm_placement=placement)
    model = GPT(cfg)
    sampler = BatchSampler(data, block_size, batch_size, seed=1234)  # the same batches for every model
    for _ in range(batches):
        x, y = sampler.next_batch()
        (model(x, y)[1] / batches).backward()  # gradients accumulate into their mean
    norms = []
    for block in model.blocks:
        g = torch.cat([block.ffwd.fc.weight.grad.flatten(), block.ffwd.proj.weight.grad.flatten()])
        norms.append(g.norm().item())
    return norms


@dataclass
class Exp4Options(_common.DataOptions):
    placements: str = _common.placements_option()

    def problems(self) -> list[str]:
        return _common.placement_problems(self.placements)


def main(argv):
    args = _common.parse(Exp4Options, argv, "exp4_grad_norm_at_init", __doc__)
    placements = args.placements.split(",")
    started = time.time()
    out = _common.claim(_common.output_path(args, "exp4_grad_norm_at_init"), args, "exp4_grad_norm_at_init")
    train, _, tok = load_dataset(args.data_dir)
    if args.quick:
        width, depth, depths, batches, bs, ctx = 32, 4, [2, 4], 4, 8, 16
    else:
        width, depth, depths, batches, bs, ctx = 128, 8, [2, 4, 8, 12], 32, 32, 64
    common = dict(width=width, data=train, vocab=tok.vocab_size, batches=batches, batch_size=bs, block_size=ctx)

    per_layer = {pl: ffn_grad_norms(pl, depth, **common) for pl in placements}
    last_vs_depth = {pl: [ffn_grad_norms(pl, d, **common)[-1] for d in depths] for pl in placements}

    with open(os.path.join(out, "grad_norm_at_init.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "n_layer", "layer", *placements])
        for i in range(depth):
            w.writerow(["per_layer", depth, i + 1, *(per_layer[pl][i] for pl in placements)])
        for j, d in enumerate(depths):
            w.writerow(["last_layer_vs_depth", d, d, *(last_vs_depth[pl][j] for pl in placements)])

    fig, (a1, a2) = new_figure(1, 2, figsize=(11, 4.2))
    for pl in placements:
        a1.plot(range(1, depth + 1), per_layer[pl], "o-", label=pl)
        a2.plot(depths, last_vs_depth[pl], "o-", label=pl)
    a1.set(xlabel="layer", ylabel="||E[dL/dW_ffn]||", title=f"FFN gradient norm per layer at init ({depth} layers)")
    a2.set(xlabel="number of layers", ylabel="||E[dL/dW_ffn]|| of the last layer", title="last layer vs depth")
    for a in (a1, a2):
        a.set_yscale("log")
        a.grid(alpha=0.3)
        a.legend()
    save(fig, os.path.join(out, "grad_norm_at_init.png"))

    ratio = "pre" in placements and "post" in placements  # the comparison of Xiong et al.
    rows = [[i + 1, *(f"{per_layer[pl][i]:.3e}" for pl in placements)]
            + ([f"{per_layer['post'][i] / per_layer['pre'][i]:.2f}"] if ratio else []) for i in range(depth)]
    rows2 = [[d, *(f"{last_vs_depth[pl][j]:.3e}" for pl in placements)] for j, d in enumerate(depths)]
    growth = {pl: per_layer[pl][-1] / per_layer[pl][0] for pl in placements}
    body = (f"LayerNorm, width {width}, context {ctx}; expected gradient over {batches} batches of {bs} "
            f"sequences of TinyShakespeare; GPT-2 init (DeepNorm: its own), seed 0.\n\n"
            + _common.markdown_table(["layer", *placements] + (["post/pre"] if ratio else []), rows)
            + "\n\nLast layer / first layer: " + ", ".join(f"{pl} {g:.2f}" for pl, g in growth.items()) + "\n\n"
            + _common.markdown_table(["n_layer", *(f"{pl} last layer" for pl in placements)], rows2)
            + "\n\n![](grad_norm_at_init.png)")
    _common.write_report(os.path.join(out, "report.md"), "FFN gradient norm at initialisation",
                         _common.command_line(), body, started)
    return 0


if __name__ == "__main__":
    _common.main(main)
