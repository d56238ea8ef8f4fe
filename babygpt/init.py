"""Weight initialisation of a GPT, by ``GPTConfig.init``; norm gains and biases keep their own init.

``gpt2`` (GPT-2, Radford et al. 2019; nanoGPT): N(0, 0.02) for every Linear weight and both
embeddings, zero biases; the two projections that write into the residual stream (sa.proj,
ffwd.proj) use 0.02 / sqrt(2 * n_layer) so the stream's variance does not grow with depth. The
embeddings' RMS is about 0.03 (token plus position), so the stream starts small and the first
blocks' outputs dominate it.

``xavier`` (the original Transformer, Vaswani et al. 2017, and the setting of Xiong et al. 2020,
arXiv:2002.04745): Xavier-uniform Linear weights, std sqrt(2 / (fan_in + fan_out)), with the fused
sa.qkv (3C, C) treated as the paper's three (C, C) matrices W^Q, W^K, W^V, each initialised on its
own; zero biases; token and position embeddings N(0, 1/C), the token embeddings multiplied by
sqrt(C) in forward (``GPT.emb_scale``), so the stream starts at RMS about sqrt(1 + 1/C); no depth
factor. The embeddings follow fairseq's transformer (token and learned position embeddings
N(0, 1/C), only the token ones scaled by sqrt(C)).

DeepNorm (Wang et al. 2022, arXiv:2203.00555, Figure 2's pseudocode) initialises the FFN weights
and the attention value and output projections with Xavier-normal of gain beta = (8N)^(-1/4), the
query and key projections with gain 1, and drops the depth factor (beta already is the depth
scaling). Under ``xavier`` that is done exactly; under ``gpt2``, whose base is N(0, 0.02) rather
than Xavier, the same weights get std 0.02 * beta and the query and key rows keep 0.02. (The
authors' torchscale code differs in detail: Xavier-uniform with gain 1/sqrt(2) on q, k, v and
PyTorch's default init on the FFN before dividing fc1, fc2, v_proj and out_proj by (8N)^(1/4);
this project follows the paper.)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def init_weights(model: nn.Module) -> None:
    """Initialise every Linear and Embedding weight of ``model`` (a GPT) by ``model.config.init``."""
    if model.config.init == "xavier":
        _init_xavier(model)
    else:
        _init_gpt2(model)


def attention_matrices(block: nn.Module) -> dict[str, torch.Tensor]:
    """The (C, C) views of one block's W^Q, W^K, W^V (rows of the fused qkv weight) and W^O."""
    w = block.sa.qkv.weight  # (3C, C)
    C = w.shape[1]
    return {"q": w[:C], "k": w[C:2 * C], "v": w[2 * C:], "o": block.sa.proj.weight}


def _init_gpt2(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    N = model.config.n_layer
    for block in model.blocks:
        if model.config.norm_placement == "deepnorm":
            attn = attention_matrices(block)
            for w in (block.ffwd.fc.weight, block.ffwd.proj.weight, attn["o"], attn["v"]):
                nn.init.normal_(w, mean=0.0, std=0.02 * (8 * N) ** -0.25)
        else:
            nn.init.normal_(block.sa.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * N))
            nn.init.normal_(block.ffwd.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * N))


def _init_xavier(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    C, N = model.config.n_embd, model.config.n_layer
    for block in model.blocks:
        attn = attention_matrices(block)
        if model.config.norm_placement == "deepnorm":
            beta = (8 * N) ** -0.25
            for w in (block.ffwd.fc.weight, block.ffwd.proj.weight, attn["v"], attn["o"]):
                nn.init.xavier_normal_(w, gain=beta)
            for w in (attn["q"], attn["k"]):
                nn.init.xavier_normal_(w, gain=1.0)
        else:
            for w in (attn["q"], attn["k"], attn["v"]):
                nn.init.xavier_uniform_(w)
    # Last: the tied LM head, a Linear, was given Xavier above.
    nn.init.normal_(model.tok_emb.weight, mean=0.0, std=C ** -0.5)
    nn.init.normal_(model.pos_emb.weight, mean=0.0, std=C ** -0.5)
