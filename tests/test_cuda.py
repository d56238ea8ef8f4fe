"""CUDA paths (float16 + GradScaler, bfloat16, fused AdamW, compile, deterministic kernels), under both
optimizers (AdamW; Muon for the blocks' matrices with AdamW for the rest). Skipped without a GPU."""

import os

import pytest
import torch

from babygpt.config import load_config
from babygpt.model import GPT
from babygpt.state import COMPLETED
from babygpt.trainer import train
from conftest import TINY_TRAIN_ARGS, assert_same_weights, prepare_small_data, tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA_ARGS = [a for a in TINY_TRAIN_ARGS if not a.startswith("--device")] + ["--device=cuda"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("cuda"))


OPTIMIZERS = ["adamw", "muon"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_training_on_cuda(data_dir, tmp_path, dtype, optimizer):
    if dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bfloat16 on this GPU")
    s = train(load_config([f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *CUDA_ARGS,
                           f"--dtype={dtype}", "--max_iters=30", f"--optimizer={optimizer}"]))
    assert s["status"] in COMPLETED
    assert s["final_val_loss"] < 3.3  # learned something: ln(vocab_size) is about 3.4
    assert isinstance(s["scaler_skipped_steps"], int)  # counted (float16) or 0 (no scaler)
    if dtype != "float16":
        assert s["scaler_skipped_steps"] == 0
    ckpt = torch.load(os.path.join(tmp_path, "ckpt.pt"), weights_only=True)
    assert ckpt["scaler"] if dtype == "float16" else not ckpt["scaler"]  # scaler state saved for resume


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_compile_on_cuda(data_dir, tmp_path, optimizer):
    s = train(load_config([f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *CUDA_ARGS,
                           "--dtype=bfloat16", "--compile=true", "--max_iters=20", f"--optimizer={optimizer}"]))
    assert s["status"] in COMPLETED
    keys = torch.load(os.path.join(tmp_path, "ckpt.pt"), weights_only=True)["model"].keys()
    assert not any(k.startswith("_orig_mod.") for k in keys)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
def test_float16_autocast_model_is_finite_and_close_to_float32(name):
    model = GPT(tiny_config(norm_type=name)).cuda()
    x = torch.randint(29, (4, 16), device="cuda")
    ref = model(x, x)[1]
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x, x)[1]
    assert torch.isfinite(loss) and abs(loss.item() - ref.item()) < 1e-2


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_resume_on_cuda_is_bit_identical(data_dir, tmp_path, dtype, optimizer, deterministic_mode_restored):
    """RNG states are CPU tensors even for a CUDA run; resume must restore them, and (with deterministic
    kernels) the optimizer's state too: 20 steps + a resume to 30 equal 30 straight steps bit for bit."""
    args = [f"--data_dir={data_dir}", *CUDA_ARGS, f"--dtype={dtype}", "--lr_decay_iters=30",
            f"--optimizer={optimizer}", "--deterministic=true"]
    train(load_config([*args, f"--out_dir={tmp_path / 'half'}", "--max_iters=20"]))
    s = train(load_config([*args, f"--out_dir={tmp_path / 'half'}", "--max_iters=30", "--init_from=resume"]))
    assert s["status"] in COMPLETED and s["iter"] == 30
    train(load_config([*args, f"--out_dir={tmp_path / 'full'}", "--max_iters=30"]))
    assert_same_weights(tmp_path / "half" / "ckpt.pt", tmp_path / "full" / "ckpt.pt")


def test_auto_dtype_tf32_fused_adamw_and_batches_on_cuda(data_dir, tmp_path):
    from babygpt.trainer import Trainer

    trainer = Trainer(load_config([f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *CUDA_ARGS]))
    native_bf16 = torch.cuda.get_device_capability()[0] >= 8  # Ampere and later
    assert trainer.cfg.dtype == ("bfloat16" if native_bf16 else "float16")
    assert torch.get_float32_matmul_precision() == "high"  # TF32 matmuls
    assert all(g.get("fused") for g in trainer.optimizer.param_groups)
    muon = Trainer(load_config([f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *CUDA_ARGS, "--optimizer=muon"]))
    assert all(g.get("fused") for g in muon.optimizer.adamw.param_groups)  # Muon's own groups have no fused form
    x, y = trainer.state.sampler.next_batch()
    assert x.is_cuda and y.is_cuda


def test_deterministic_runs_repeat_bit_for_bit_on_cuda(data_dir, tmp_path, deterministic_mode_restored):
    """Without the switch the same seed ends a few thousandths apart on a GPU (docs/campaign.md)."""
    for k in range(2):
        s = train(load_config([f"--data_dir={data_dir}", f"--out_dir={tmp_path / str(k)}", *CUDA_ARGS,
                               "--max_iters=30", "--deterministic=true"]))
        assert s["status"] in COMPLETED
    assert_same_weights(tmp_path / "0" / "ckpt.pt", tmp_path / "1" / "ckpt.pt")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_with_nccl_on_two_gpus(data_dir, tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           os.path.join(ROOT, "train.py"), f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'r'}",
                           *CUDA_ARGS, "--max_iters=20"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "x 2 processes" in proc.stdout
