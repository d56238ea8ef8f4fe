"""Launched by torchrun from test_distributed.py: train like train.py, then report whether the
ranks ended with identical parameters and the same summary (rank 0 writes ranks.json into out_dir).

With NAN_RANK=r and NAN_FROM=k in the environment, rank r alone returns a NaN loss from its
k-th training forward on: a divergence that starts on one rank only."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from babygpt.config import load_config  # noqa: E402
from babygpt.trainer import Trainer  # noqa: E402
from conftest import NaNAfter  # noqa: E402  (tests/ is this script's directory)

dist.init_process_group("gloo")  # owned here, so the Trainer leaves it open for the check below
cfg = load_config(sys.argv[1:])
nan_here = os.environ.get("NAN_RANK") == str(dist.get_rank())
poison = (lambda model: NaNAfter(model, int(os.environ["NAN_FROM"]))) if nan_here else None
trainer = Trainer(cfg, sys.argv[1:], wrap_model=poison)
summary = trainer.train()
flat = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
every = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(every, flat)
summaries = [None] * dist.get_world_size()
dist.all_gather_object(summaries, {k: summary[k] for k in ("status", "iter", "diverged_at")})
if dist.get_rank() == 0:
    with open(os.path.join(cfg.out_dir, "ranks.json"), "w") as f:
        json.dump({"world_size": dist.get_world_size(), "status": summary["status"], "summaries": summaries,
                   "max_abs_diff": max((t - every[0]).abs().max().item() for t in every),
                   "param_norm": flat.norm().item()}, f)
dist.barrier()  # see babygpt.distributed.shutdown
dist.destroy_process_group()
# End without interpreter shutdown. DDP keeps the gloo group alive past destroy_process_group
# (torch 2.13), so its worker threads are still running when the interpreter finalizes; one that
# is still releasing the last all_gather_object's buffers then needs the GIL, is killed instead,
# and the process aborts ("terminate called without an active exception") about one launch in
# ten. Every file is written and closed by now; only the standard streams need flushing.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
