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

DeepNorm (Wang et al. 2022, arXiv:2203.00555, Figure 2's pseudocode; drawn by its placement's
``init_block`` in placements.py) initialises the FFN weights
and the attention value and output projections with Xavier-normal of gain beta = (8N)^(-1/4), the
query and key projections with gain 1, and drops the depth factor (beta already is the depth
scaling). Under ``xavier`` that is done exactly; under ``gpt2``, whose base is N(0, 0.02) rather
than Xavier, the same weights get std 0.02 * beta and the query and key rows keep 0.02. (The
authors' torchscale code differs: its ``MultiheadAttention.reset_parameters`` (Xavier-uniform,
gain 1/sqrt(2), on q, k, v) is never called (microsoft/torchscale torchscale/component/
multihead_attention.py; nothing in the package calls it, and ``MultiwayNetwork`` resets only its
wrapped Linear), so q, k, v, out_proj and the FFN keep PyTorch's default Linear init,
U(-1/sqrt(fan_in), 1/sqrt(fan_in)), or N(0, 0.02) with ``bert_init``, before the decoder divides
every fc1, fc2, v_proj and out_proj weight by (8N)^(1/4) (torchscale/architecture/decoder.py); this
project follows the paper. A swiglu MLP's ``up`` counts as an FFN weight.)

The two inits differ in three parts, and an explanation that credits "the init" bundles all three
(docs/experiments.md, "How configurations are compared"). Each part is a key of its own, so that
an ablation can change one at a time; unset, a part follows ``init``:

  init_linear        normal (N(0, 0.02)) | xavier (Xavier-uniform, q/k/v apart)
  init_embedding     small (N(0, 0.02), unscaled) | unit (N(0, 1/C), token embeddings times sqrt(C))
  init_depth_factor  sa.proj and ffwd.proj divided by sqrt(2 N) | not

The presets draw their random numbers exactly as before the parts existed (so a gpt2 or xavier run
of an earlier version is reproduced bit for bit); a changed part re-draws or rescales after them.

``split_qkv``: the three (C, C) layers q, k, v are drawn as the fused (3C, C) layer is, one matrix
of random numbers cut into three, so a split model starts with the fused model's values.

``zero_init_proj`` (modded-nanogpt train_gpt.py, ``c_proj.weight.data.zero_()`` in the attention
and the MLP; karpathy/nanochat gpt.py ``init_weights`` zeroes both c_proj): after everything above,
sa.proj and ffwd.proj weights are set to 0, so every Pre-LN block starts as the identity and the
model's output at init is the embedding's through ln_f and the head. Their random draws still
happen first, so every other weight is the one the run without zero_init_proj has; the depth
factor then has nothing to scale (0 / sqrt(2N) = 0): with zero_init_proj it is moot, and setting
init_depth_factor is refused. Their biases are 0 under every init already.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class InitParts:
    """The three parts of an init (module docstring)."""

    linear: str  # "normal" | "xavier"
    embedding: str  # "small" | "unit"
    depth_factor: bool


PRESETS = {"gpt2": InitParts("normal", "small", True), "xavier": InitParts("xavier", "unit", False)}


def init_parts(config) -> InitParts:
    """The parts a GPTConfig asks for: its ``init`` preset, with any part set on its own replaced."""
    preset = PRESETS[config.init]
    return InitParts(config.init_linear or preset.linear, config.init_embedding or preset.embedding,
                     preset.depth_factor if config.init_depth_factor is None else config.init_depth_factor)


def init_weights(model: nn.Module) -> None:
    """Initialise every Linear and Embedding weight of ``model`` (a GPT) by its config's init parts."""
    _init_by_parts(model)
    if model.config.zero_init_proj:
        with torch.no_grad():
            for block in model.blocks:
                block.sa.proj.weight.zero_()
                block.ffwd.proj.weight.zero_()


def _init_by_parts(model: nn.Module) -> None:
    parts = init_parts(model.config)
    if parts.linear == "xavier":
        _init_xavier(model)  # embeddings "unit", no depth factor
        if parts.depth_factor and not model.config.placement_class.owns_depth_init:
            _scale_residual_projections(model)
        if parts.embedding == "small":
            _init_embeddings(model, std=0.02)
    else:
        _init_gpt2(model, depth_factor=parts.depth_factor)  # embeddings "small"
        if parts.embedding == "unit":
            _init_embeddings(model, std=model.config.n_embd ** -0.5)


def _init_embeddings(model: nn.Module, std: float) -> None:
    """Token and position embeddings N(0, std^2) (the tied LM head with them; pos rope has no position embeddings)."""
    nn.init.normal_(model.tok_emb.weight, mean=0.0, std=std)
    if model.pos_emb is not None:
        nn.init.normal_(model.pos_emb.weight, mean=0.0, std=std)


def _scale_residual_projections(model: nn.Module) -> None:
    """Divide the two weights that write into the residual stream by sqrt(2 N) (GPT-2's depth factor)."""
    factor = 1 / math.sqrt(2 * model.config.n_layer)
    with torch.no_grad():
        for block in model.blocks:
            block.sa.proj.weight.mul_(factor)
            block.ffwd.proj.weight.mul_(factor)


def attention_matrices(block: nn.Module) -> dict[str, torch.Tensor]:
    """The (C, C) views of one block's W^Q, W^K, W^V (rows of the fused qkv weight, or the split
    layers' weights) and W^O."""
    sa = block.sa
    if sa.split:
        return {"q": sa.q.weight, "k": sa.k.weight, "v": sa.v.weight, "o": sa.proj.weight}
    w = sa.qkv.weight  # (3C, C)
    C = w.shape[1]
    return {"q": w[:C], "k": w[C:2 * C], "v": w[2 * C:], "o": sa.proj.weight}


def _ffn_matrices(block: nn.Module) -> list[torch.Tensor]:
    """The MLP's weights: fc, (swiglu's up,) proj."""
    ffwd = block.ffwd
    return [ffwd.fc.weight] + ([ffwd.up.weight] if ffwd.up is not None else []) + [ffwd.proj.weight]


def _each_module(model: nn.Module):
    """``model.modules()`` as the inits draw from them: a split attention's q, k, v come as one
    stand-in Linear of shape (3C, C) in their place, whose values are copied into them once the
    caller has drawn them (so a split model draws exactly the fused model's numbers)."""
    split_parts = set()
    for module in model.modules():
        if id(module) in split_parts:
            continue
        if isinstance(module, nn.Module) and getattr(module, "split", False) and hasattr(module, "q"):
            parts = (module.q, module.k, module.v)
            split_parts |= {id(p) for p in parts}
            yield module
            C = module.q.weight.shape[1]
            fused = nn.utils.skip_init(nn.Linear, C, 3 * C, bias=False, device=module.q.weight.device,
                                       dtype=module.q.weight.dtype)  # no random numbers drawn here
            yield fused
            with torch.no_grad():
                for i, part in enumerate(parts):
                    part.weight.copy_(fused.weight[i * C:(i + 1) * C])
                    if part.bias is not None:
                        part.bias.zero_()
        else:
            yield module


def _init_gpt2(model: nn.Module, depth_factor: bool = True) -> None:
    for module in _each_module(model):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    N, placement = model.config.n_layer, model.config.placement_class
    for block in model.blocks:
        if placement.init_block("gpt2", N, attention_matrices(block), _ffn_matrices(block)):
            continue
        if depth_factor:  # re-drawn, not rescaled: the preset's random numbers stay as they always were
            nn.init.normal_(block.sa.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * N))
            nn.init.normal_(block.ffwd.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * N))


def _init_xavier(model: nn.Module) -> None:
    for module in _each_module(model):
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    C, N, placement = model.config.n_embd, model.config.n_layer, model.config.placement_class
    for block in model.blocks:
        attn = attention_matrices(block)
        if not placement.init_block("xavier", N, attn, _ffn_matrices(block)):
            for w in (attn["q"], attn["k"], attn["v"]):
                nn.init.xavier_uniform_(w)
    # Last: the tied LM head, a Linear, was given Xavier above.
    _init_embeddings(model, std=C ** -0.5)
