"""Data-parallel training across processes, launched by torchrun.

    torchrun --standalone --nproc_per_node=N train.py CONFIG.py [--key=value ...]

torchrun starts N copies of train.py and tells each who it is through the environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Every copy (a *rank*) holds the
whole model, trains on its own batches, and DistributedDataParallel averages the gradients
during backward, so all ranks take the same optimizer step: AdamW's, or Muon's (optim.py), whose
Newton-Schulz iteration then runs on the same averaged gradient on every rank (each rank computes
the whole update; nothing is sharded). QK-Clip's per-head maxima are the one thing a rank sees alone:
step.py takes their MAX over the ranks (``Dist.max``) before clipping. Without those variables
BabyGPT runs as one plain process and nothing here is used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import BabyGPTError

ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class Dist:
    """Where this process sits in the job. The default is the single-process case."""

    rank: int = 0  # 0 .. world_size - 1 across all nodes; rank 0 writes every file
    local_rank: int = 0  # index on this node: the GPU this process drives
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def train_seed(self, seed: int) -> int:
        """Each rank draws its own training batches (and dropout masks): seed + 2 * rank. The step
        of 2 is kept from when eval batches took the odd offsets, so that existing runs resume the
        same batches."""
        return seed + 2 * self.rank

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over ranks (in place, returned); the identity for one process."""
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise maximum of ``t`` over ranks (in place, returned)."""
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """Average ``t`` over ranks. (ReduceOp.AVG exists for NCCL only, so sum and divide.)"""
        return self.sum(t) / self.world_size if self.enabled else t

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable plain data), in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        """Give every rank rank 0's buffers (BatchNorm's running statistics, the only buffers
        a BabyGPT model has), so that all ranks evaluate the model that rank 0 checkpoints."""
        if self.enabled:
            for b in module.buffers():
                dist.broadcast(b, src=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def from_env() -> Dist:
    """The Dist torchrun describes in the environment, or the single-process default."""
    present = [v for v in ENV_VARS if v in os.environ]
    if not present:
        return Dist()
    if len(present) < len(ENV_VARS):
        missing = ", ".join(v for v in ENV_VARS if v not in os.environ)
        raise BabyGPTError(f"{', '.join(present)} set but {missing} not; launch with torchrun, "
                           f"or unset them to train in one process")
    try:
        rank, local_rank, world = (int(os.environ[v]) for v in ENV_VARS)
    except ValueError:
        raise BabyGPTError(f"RANK, LOCAL_RANK and WORLD_SIZE must be integers, got "
                           f"{', '.join(os.environ[v] for v in ENV_VARS)}; launch with torchrun") from None
    if not (world >= 1 and 0 <= rank < world and 0 <= local_rank <= rank):
        raise BabyGPTError(f"inconsistent torchrun environment (RANK={rank}, LOCAL_RANK={local_rank}, "
                           f"WORLD_SIZE={world}); launch with torchrun")
    return Dist(rank, local_rank, world)


def setup(d: Dist, device: torch.device) -> tuple[torch.device, bool]:
    """Join the process group (nccl for CUDA, one GPU per local rank; gloo for CPU).
    Returns this rank's device and whether this call created the group (and must end it)."""
    if not d.enabled:
        return device, False
    if device.type == "cuda":
        if d.local_rank >= torch.cuda.device_count():
            raise BabyGPTError(f"local rank {d.local_rank} has no GPU ({torch.cuda.device_count()} visible); "
                               f"use --nproc_per_node={torch.cuda.device_count()} or fewer")
        device = torch.device("cuda", d.local_rank)
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise BabyGPTError(f"distributed training supports cuda and cpu, not {device.type}; use --device=cpu")
    if dist.is_initialized():  # the caller (e.g. a test harness) owns the group
        return device, False
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device, True


def shutdown() -> None:
    """Leave the process group. The barrier first: a rank that tears its connections down while
    another is still finishing its last collective can make gloo abort the process."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
