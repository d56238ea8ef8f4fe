"""Experiment 1: vanishing activations and gradients in a deep plain network, with and without norms.

A stack of 10 blocks ``Linear -> norm -> activation`` (PyTorch's default Linear init, no residual
connections) maps Gaussian inputs to a scalar loss. For each norm (none, LayerNorm, RMSNorm, our
from-scratch classes) we record, averaged over seeds:
  - the standard deviation of each block's output in the forward pass;
  - the norm of each Linear weight's gradient in the backward pass.

    python experiments/exp1_gradient_vanishing.py [--quick] [--activation tanh|relu|gelu] [--out DIR]

Writes gradient_vanishing.csv, gradient_vanishing.png and report.md.
"""

import os
import statistics
from dataclasses import dataclass
from typing import Literal

import _common
import torch
import torch.nn as nn

from babygpt.files import write_csv
from babygpt.norms import build_norm
from babygpt.options import option
from babygpt.plot import new_figure, save

NORMS = ["none", "layernorm", "rmsnorm"]
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


@dataclass
class Exp1Options(_common.Options):
    activation: Literal[tuple(ACTIVATIONS)] = option("tanh", "the activation after each norm")
    depth: int = option(10, "number of Linear -> norm -> activation blocks")

    def problems(self) -> list[str]:
        return [f"--depth must be at least 1, got {self.depth}"] if self.depth < 1 else []


def plain_network(depth: int, width: int, norm: str, activation: str) -> nn.Sequential:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), build_norm(norm, width), ACTIVATIONS[activation]()]
    return nn.Sequential(*layers)


def measure(depth: int, width: int, batch: int, norm: str, activation: str, seed: int):
    """Per block: output std (forward) and gradient norm of its Linear weight (backward)."""
    torch.manual_seed(seed)
    net = plain_network(depth, width, norm, activation)
    x = torch.randn(batch, width)  # (N, width)
    layers = list(net)  # (indexing an nn.Sequential walks it: quadratic in depth)
    stds, h = [], x
    for i in range(depth):
        h = layers[3 * i + 2](layers[3 * i + 1](layers[3 * i](h)))  # Linear -> norm -> activation
        stds.append(h.std().item())
    # A regression loss against a fixed random target: every layer's weights get a gradient.
    target = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + 1000))
    loss = (h - target).pow(2).mean()
    loss.backward()
    grads = [layers[3 * i].weight.grad.norm().item() for i in range(depth)]
    return stds, grads


def seconds(depth: int, width: int, batch: int, activation: str) -> float:
    """The estimated time of one seed's networks (one per norm), timed at 1 and 2 blocks now."""
    total = 0.0
    for norm in NORMS:
        fixed, per_block = _common.seconds_by_depth(lambda n: measure(n, width, batch, norm, activation, 0))
        total += fixed + per_block * depth
    return total


def memory_bytes(depth: int, width: int, batch: int) -> int:
    """One measured network: each block's float32 weight and its gradient (2 x width^2), and the three
    (batch, width) activations per block (Linear, norm, activation) kept for the backward pass."""
    return 4 * depth * (2 * width * width + 3 * batch * width)


def main(argv):
    exp = _common.begin(Exp1Options, argv, "exp1_gradient_vanishing", __doc__)
    args = exp.args
    width, batch, seeds = (64, 64, 2) if args.quick else (256, 1024, 10)
    _common.check_size(f"experiment 1 at --depth={args.depth} (width {width}, batch {batch})",
                       memory_bytes(args.depth, width, batch),
                       lambda: seconds(args.depth, width, batch, args.activation) * seeds, "lower --depth")
    out = exp.claim()

    results = {}
    for norm in NORMS:
        runs = [measure(args.depth, width, batch, norm, args.activation, s) for s in range(seeds)]
        results[norm] = {
            "std": [statistics.mean(r[0][i] for r in runs) for i in range(args.depth)],
            "grad": [statistics.mean(r[1][i] for r in runs) for i in range(args.depth)],
        }

    header = ["layer"] + [f"act_std_{n}" for n in NORMS] + [f"grad_norm_{n}" for n in NORMS]
    write_csv(os.path.join(out, "gradient_vanishing.csv"), header,
              [dict(zip(header, [i + 1] + [results[n]["std"][i] for n in NORMS] + [results[n]["grad"][i] for n in NORMS]))
               for i in range(args.depth)])

    fig, (a1, a2) = new_figure(1, 2, figsize=(11, 4.2))
    for n in NORMS:
        layers = range(1, args.depth + 1)
        a1.semilogy(layers, results[n]["std"], "o-", label=n)
        a2.semilogy(layers, results[n]["grad"], "o-", label=n)
    a1.set(xlabel="layer", ylabel="activation std (forward)", title=f"{args.depth} x (Linear, norm, {args.activation})")
    a2.set(xlabel="layer", ylabel="||dL/dW|| (backward)", title="gradient norm per layer")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend()
    save(fig, os.path.join(out, "gradient_vanishing.png"))

    header = ["layer"] + [f"act std: {n}" for n in NORMS] + [f"grad norm: {n}" for n in NORMS]
    rows = [[i + 1] + [f"{results[n]['std'][i]:.2e}" for n in NORMS] + [f"{results[n]['grad'][i]:.2e}" for n in NORMS]
            for i in range(args.depth)]
    ratio = {n: results[n]["grad"][0] / results[n]["grad"][-1] for n in NORMS}
    body = (f"Width {width}, batch {batch}, {seeds} seeds (means), activation {args.activation}, "
            f"PyTorch default Linear init.\n\n" + _common.markdown_table(header, rows) + "\n\n" +
            "Gradient norm, first layer / last layer: " +
            ", ".join(f"{n} {ratio[n]:.2g}" for n in NORMS) + "\n\n![](gradient_vanishing.png)")
    exp.write_report("Gradient vanishing in a plain deep network", body)
    return 0


if __name__ == "__main__":
    _common.main(main)
