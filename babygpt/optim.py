"""Which optimizer trains which parameter: ``optimizer = "adamw"`` (AdamW for everything) or
``optimizer = "muon"`` (torch.optim.Muon, or MuonNS, for the blocks' weight matrices, AdamW for the
rest).

Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/) runs SGD with Nesterov
momentum and replaces each update of a 2-D weight by its nearest semi-orthogonal matrix
(Newton-Schulz iterations: torch.optim.Muon's, or the same in float32 under ``muon_ns_dtype``,
MuonNS). That is the right geometry for a hidden linear map x -> W x, whose update should change
the output of every input direction by a similar amount, and the wrong one for

* the token and position embeddings: lookup tables, of which a step touches only the rows its
  batch used; orthogonalizing would spread the update over every row;
* the LM head: the output layer, tied to the token embedding here (one tensor, one optimizer);
* every norm gain and bias, gate, residual scale and learned QK scale: vectors and scalars, not
  linear maps (Muon refuses anything that is not 2-D).

The routing is the one the references use:

* modded-nanogpt (KellerJordan/modded-nanogpt, records/track_1_short/2025-01-16_Sub3Min):
  ``hidden_matrix_params = [p for n, p in model.blocks.named_parameters() if p.ndim >= 2 and
  "embed" not in n]`` to Muon; embeddings, scalars (``p.ndim < 2``) and ``lm_head`` to Adam.
* nanochat (karpathy/nanochat, nanochat/gpt.py ``setup_optimizers``): every parameter of
  ``transformer.h`` (the blocks; its norms have no parameters) to Muon, ``wte`` and ``lm_head``
  to AdamW; each group keeps its peak as ``initial_lr`` and the schedule multiplies it.
* OLMo-core (allenai/OLMo-core, src/olmo_core/optim/muon.py ``MuonConfig``): "Muon is only used for
  hidden weight layers. The input embedding, final output layer, and any internal gains or biases
  are optimized using AdamW"; its default ``adjust_lr`` is the RMS matching of Liu et al. 2025
  ("Muon is Scalable for LLM Training", arXiv:2502.16982), torch's ``match_rms_adamw``: the update
  of an A x B matrix is scaled by 0.2 sqrt(max(A, B)), so that its RMS is about AdamW's and Muon can
  reuse AdamW's learning rate and weight decay.

Weight decay: one ``weight_decay`` for both optimizers, decoupled and multiplied by each group's
own learning rate (torch.optim.Muon: w <- w (1 - lr wd) before the update). This is OLMo-core's
choice (one ``weight_decay`` = 0.1 for Muon's matrices and AdamW's), and the one Liu et al. 2025
show is needed at scale (without decay Muon's weights and their RMS keep growing). modded-nanogpt's
2025-01 records and the first nanochat train Muon without weight decay; later nanochat versions
(nanochat/optim.py, MuonAdamW) decay the Muon matrices, cautiously (only where update and weight agree
in sign). The rule that gains, biases and scalars are never
decayed is unchanged (GPT.configure_optimizers), so under muon only the embeddings decay in AdamW.

Where this project differs: AdamW keeps this project's betas, eps and learning_rate for every
non-Muon parameter (the references give the embeddings, the head and the scalars separate, larger
Adam rates with betas (0.8, 0.95)), and there is one Muon group at ``muon_lr`` (nanochat and
modded-nanogpt group matrices by shape only to batch Newton-Schulz). Each group's learning rate
follows the run's warmup + cosine schedule (``trainer.lr_at``) scaled by the group's ``lr_scale``
(muon_lr / learning_rate for Muon, 1 for AdamW): nanochat's ``initial_lr`` multiplier, kept as a
ratio so that an adamw run's learning rates are exactly ``lr_at``'s, as before Muon existed.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import TrainConfig
from .norms import Norm

HIDDEN_PREFIX = "blocks."  # the transformer blocks: GPT.blocks


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The parameters Muon trains: every 2-D parameter of the blocks (q/k/v, the attention output
    projection, the MLP's matrices; each (out, in)). Embeddings and the head live outside the blocks,
    and gains, biases and scalars are not 2-D."""
    return [p for name, p in model.named_parameters() if name.startswith(HIDDEN_PREFIX) and p.dim() == 2]


class MuonWithAdamW:
    """torch.optim.Muon and torch.optim.AdamW stepped as one optimizer, for the Trainer, the
    checkpoint and the loss scaler.

    torch has no class that steps two optimizers as one (nanochat keeps a list and loops over it).
    This one offers what those callers use: ``param_groups`` (AdamW's, then Muon's: the same dicts,
    so setting a group's lr sets it in its optimizer), ``step``, ``zero_grad``, ``state_dict`` and
    ``load_state_dict``. torch.amp.GradScaler needs nothing more: ``unscale_`` reads the gradients
    through ``param_groups``, and ``step`` calls ``step()`` unless a gradient was not finite."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict]:
        return [*self.adamw.param_groups, *self.muon.param_groups]

    def step(self, closure=None) -> None:
        """One update of every parameter. ``closure`` (re-evaluating the loss) is not supported:
        two optimizers would evaluate it twice."""
        if closure is not None:
            raise ValueError("MuonWithAdamW.step takes no closure")
        self.adamw.step()
        self.muon.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """{"adamw": AdamW's state dict, "muon": Muon's}: plain tensors and numbers, as a checkpoint needs."""
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (KeyError if ``state`` is an AdamW's alone)."""
        self.adamw.load_state_dict(state["adamw"])
        self.muon.load_state_dict(state["muon"])


Optimizer = torch.optim.Optimizer | MuonWithAdamW


def newton_schulz(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """Muon's orthogonalization of one (A, B) update, computed in ``dtype``: the quintic Newton-Schulz
    iteration X <- a X + (b X X^T + c (X X^T)^2) X from X = G / ||G||_F, on the wide side (the
    transpose when A > B, so that X X^T is the smaller Gram matrix). Returns an (A, B) tensor in
    ``dtype`` whose singular values lie roughly in 0.5-1.5, not at 1: the coefficients buy a steep
    slope at zero at the cost of full convergence (Jordan et al. 2024). Never writes into ``update``."""
    a, b, c = coefficients
    tall = update.size(0) > update.size(1)
    x = update.to(dtype)
    if tall:
        x = x.T  # (B, A): the Gram matrix below is (B, B), the smaller one
    x = x / x.norm().clamp(min=eps)  # Frobenius >= spectral norm: every singular value <= 1. Not in place:
    # .to() returns ``update`` itself when it is already in ``dtype``, and it may be the momentum buffer
    for _ in range(steps):
        gram = x @ x.T  # (m, m), m = min(A, B)
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """How torch.optim.Muon scales its learning rate for an (A, B) matrix: ``original`` sqrt(max(1, A/B))
    (Jordan et al.), ``match_rms_adamw`` 0.2 sqrt(max(A, B)) (Liu et al. 2025)."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols))


class MuonNS(torch.optim.Muon):
    """torch.optim.Muon with its Newton-Schulz iterations computed in ``ns_dtype`` (``muon_ns_dtype``).

    The paper's update (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/) is Nesterov
    momentum, orthogonalized by five quintic Newton-Schulz steps, times a shape-dependent learning
    rate, after decoupled weight decay. The authors' code (KellerJordan/Muon, muon.py
    ``zeropower_via_newtonschulz5``), Moonlight's (Liu et al. 2025) and torch's (torch/optim/_muon.py)
    all iterate in bfloat16, chosen for speed: the iteration is stable there on a GPU. On a CPU
    without native bfloat16 every bfloat16 matmul is converted in software, and a Muon step costs
    several AdamW steps (docs/performance.md). ``ns_dtype=torch.float32`` runs the same iteration
    with float32's 24-bit significand instead of bfloat16's 8 (on a GPU, float32 matmuls follow the
    run's TF32 setting, which the Trainer turns on for CUDA). The two differ in rounding only, but
    a run in one is not bit for bit a run in the other: ``muon_ns_dtype`` is one of a run's
    settings, so a sweep's table never mixes them.

    Everything else is torch.optim.Muon's: the same param groups and hyperparameters, the same state
    (``momentum_buffer``), and with ``ns_dtype=bfloat16`` the same float32 parameters bit for bit
    (tests/test_optim.py checks that, and that float32 lands nearer a float64 iteration). Unlike
    torch's step it takes no closure and no tensor learning rate (neither is used here)."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.float32, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None) -> None:
        """One update of every parameter that has a gradient (``closure`` unsupported, as in MuonWithAdamW)."""
        if closure is not None:
            raise ValueError("MuonNS.step takes no closure")
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"],
                                       self.ns_dtype)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-lr * lr_ratio(group["adjust_lr_fn"], p.shape))


def adamw_for_all(model: nn.Module, cfg: TrainConfig, fused: bool) -> torch.optim.AdamW:
    """optimizer adamw: GPT.configure_optimizers' AdamW (matrices decayed, the rest not), unchanged."""
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                           fused=fused, eps=cfg.adam_eps)
    if cfg.decay_norms:
        decay_norm_parameters(optimizer, model)
    for group in optimizer.param_groups:
        group["lr_scale"] = 1.0
    return optimizer


def decay_norm_parameters(optimizer: torch.optim.AdamW, model: nn.Module) -> None:
    """decay_norms: move every Norm's parameters from the not-decayed group (configure_optimizers'
    second) to the decayed one. DyT's LLaMA recipe (Zhu et al. 2025, jiachenzhu/DyT other_tasks/LLaMA)
    runs AdamW with weight decay over all parameters; Gemma's unit-offset gains (norm_gain_offset) are
    what makes decaying a gain pull it towards 1 rather than 0."""
    norm_ids = {id(p) for m in model.modules() if isinstance(m, Norm) for p in m.parameters(recurse=False)}
    decay, no_decay = optimizer.param_groups
    decay["params"] += [p for p in no_decay["params"] if id(p) in norm_ids]
    no_decay["params"] = [p for p in no_decay["params"] if id(p) not in norm_ids]


def muon_with_adamw(model: nn.Module, cfg: TrainConfig, fused: bool) -> MuonWithAdamW:
    """optimizer muon: torch.optim.Muon for ``hidden_matrices``, AdamW for the rest, whose split into
    decayed (the embeddings) and not decayed (gains, biases, scalars) is configure_optimizers',
    which also checks that split against what the parameters are."""
    hidden = hidden_matrices(model)
    muon_ids = {id(p) for p in hidden}
    checked = adamw_for_all(model, cfg, fused)  # groups: [dim >= 2, dim < 2]
    decay, no_decay = ([p for p in group["params"] if id(p) not in muon_ids] for group in checked.param_groups)
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
                               {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0}],
                              lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, fused=fused)
    groups = [{"params": hidden, "lr_scale": cfg.muon_lr / cfg.learning_rate}]
    settings = dict(lr=cfg.muon_lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum, nesterov=True,
                    adjust_lr_fn=cfg.muon_adjust_lr)
    # bfloat16 is torch's own optimizer, unchanged; float32 the same update with a wider iteration
    muon = (torch.optim.Muon(groups, **settings) if cfg.muon_ns_dtype == "bfloat16"
            else MuonNS(groups, ns_dtype=torch.float32, **settings))
    return MuonWithAdamW(muon, adamw)


def build_optimizer(model: nn.Module, cfg: TrainConfig, fused: bool = False) -> Optimizer:
    """The optimizer ``cfg.optimizer`` names, over every parameter of ``model`` (a GPT). Each param
    group carries ``lr_scale``: its learning rate is the schedule's times it (step.OptimizerStep).
    ``fused``: AdamW's fused kernels (CUDA)."""
    if cfg.optimizer == "muon":
        return muon_with_adamw(model, cfg, fused)
    return adamw_for_all(model, cfg, fused)

