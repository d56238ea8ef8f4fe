"""Half precision on the CPU: float16 training with a GradScaler (skipped steps, scaler state in the
checkpoint, exact resume), the emulated-dtype warning, and inference with weights cast to half."""

import json

import pytest
import torch
from torch.testing import assert_close

from babygpt import runtime
from babygpt.checkpoint import load_checkpoint
from babygpt.config import load_config
from babygpt.errors import BabyGPTError
from babygpt.model import GPT
from babygpt.runtime import dtype_note, resolve_dtype
from babygpt.sampling import load_model
from babygpt.trainer import Trainer
from conftest import TINY_TRAIN_ARGS, once, prepare_small_data, run_script, tiny_config

pytestmark = pytest.mark.slow  # not in the fast loop: each test trains runs in float16 or bfloat16

FP16 = once(*TINY_TRAIN_ARGS, "--dtype=float16", "--log_interval=1")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("half"))


class _InfGradient(torch.autograd.Function):
    """The identity forward; backward turns the incoming gradient into inf/NaN."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


class InfGradAt(torch.nn.Module):
    """Wraps a model: the ``k``-th training forward's loss is finite, its gradients are not, as when
    a loss scale is too high for float16."""

    def __init__(self, model, k):
        super().__init__()
        self.model, self.k, self.calls = model, k, 0

    def forward(self, x, y):
        logits, loss = self.model(x, y)
        self.calls += self.training
        return logits, _InfGradient.apply(loss) if self.training and self.calls == self.k else loss


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_float16_on_cpu_trains_with_a_grad_scaler_that_skips_an_inf_step(data_dir, tmp_path):
    args = [*FP16, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'r'}"]
    trainer = Trainer(load_config(args), wrap_model=lambda m: InfGradAt(m, 3))
    assert trainer.cfg.dtype == "float16" and trainer.scaler.is_enabled()
    for _ in range(2):
        trainer.step(1e-3)
    before, scale, skipped = params(trainer.model), trainer.scaler.get_scale(), trainer.state.scaler_skipped_steps
    loss = trainer.step(1e-3)  # the 3rd forward: finite loss, inf gradients
    assert torch.isfinite(loss)
    for old, new in zip(before, params(trainer.model)):
        assert torch.equal(old, new)  # the step was skipped
    assert trainer.scaler.get_scale() == scale / 2 and trainer.state.scaler_skipped_steps == skipped + 1
    trainer.step(1e-3)
    assert any(not torch.equal(old, new) for old, new in zip(before, params(trainer.model)))  # and training goes on


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_float16_resume_on_cpu_is_bit_identical(data_dir, tmp_path, optimizer):
    """2N steps in one go == N steps, then a resume to 2N: the injected skip in the first half halves
    the loss scale, which the resume must restore from the checkpoint to take the same steps (under
    muon the scaler unscales and skips Muon and AdamW together, through optim.MuonWithAdamW)."""
    n = 8
    common = once(*FP16, f"--data_dir={data_dir}", f"--eval_interval={n}", f"--lr_decay_iters={2 * n}",
                  f"--optimizer={optimizer}")
    full = Trainer(load_config([*common, f"--out_dir={tmp_path / 'full'}", f"--max_iters={2 * n}"]),
                   wrap_model=lambda m: InfGradAt(m, 3)).train()
    Trainer(load_config([*common, f"--out_dir={tmp_path / 'half'}", f"--max_iters={n}"]),
            wrap_model=lambda m: InfGradAt(m, 3)).train()
    half_ckpt = load_checkpoint(str(tmp_path / "half" / "ckpt.pt"))
    assert half_ckpt["scaler"]["scale"] == 2.0 ** 15  # the skip is in the checkpoint
    resumed = Trainer(load_config([*common, f"--out_dir={tmp_path / 'half'}", f"--max_iters={2 * n}",
                                   "--init_from=resume"])).train()
    assert full["scaler_skipped_steps"] == resumed["scaler_skipped_steps"] >= 1
    rows = {name: [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")] for name in ("full", "half")}
    losses = {name: [(r["iter"], r["loss"]) for r in rs if r["iter"] > n] for name, rs in rows.items()}
    assert len(losses["full"]) == n and losses["half"] == losses["full"]
    a, b = (load_checkpoint(str(tmp_path / name / "ckpt.pt")) for name in ("full", "half"))
    assert a["scaler"] == b["scaler"]
    for name, value in a["model"].items():
        assert torch.equal(b["model"][name], value), name


@pytest.mark.slow  # starts a process
def test_float16_through_train_py_says_whether_the_cpu_has_it(data_dir, tmp_path):
    proc = run_script("train.py", *FP16, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'r'}", "--max_iters=4",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    first = next(line for line in proc.stdout.splitlines() if line.startswith("training on"))
    assert "in float16 (native on this CPU" in first or "in float16 (emulated on this CPU" in first
    assert ("emulated" in first) == ("warning: this CPU has no native float16 matmul" in proc.stderr)
    assert json.load(open(tmp_path / "r" / "summary.json"))["scaler_skipped_steps"] >= 0
    assert load_checkpoint(str(tmp_path / "r" / "ckpt.pt"))["scaler"]  # scaler state kept for a resume


@pytest.mark.parametrize("dtype,slowdown,emulated", [("bfloat16", 85.0, True), ("float16", 40.0, True),
                                                     ("bfloat16", 0.5, False), ("float16", 1.2, False)])
def test_an_emulated_dtype_gets_a_warning_with_the_measured_slowdown(monkeypatch, dtype, slowdown, emulated):
    monkeypatch.setattr(runtime, "matmul_slowdown", lambda device_type, d: slowdown)
    words, warning = dtype_note(torch.device("cpu"), dtype)
    assert ("emulated" in words) == emulated and (warning is not None) == emulated
    if emulated:
        assert f"{slowdown:.0f}x slower than float32" in warning and "--dtype=float32" in warning
        assert "\n" not in warning
    assert dtype_note(torch.device("cpu"), "float32") == ("", None)


def test_the_slowdown_probe_is_measured_once_per_process(monkeypatch):
    runtime.matmul_slowdown.cache_clear()
    calls = []
    monkeypatch.setattr(runtime, "_matmul_seconds", lambda device, dtype, n, repeats: calls.append(dtype) or 1.0)
    assert runtime.matmul_slowdown("cpu", "bfloat16") == runtime.matmul_slowdown("cpu", "bfloat16") == 1.0
    assert calls == [torch.bfloat16, torch.float32]
    runtime.matmul_slowdown.cache_clear()


def test_the_slowdown_probe_leaves_the_global_random_state_alone():
    """It runs at a run's start, after the seed: drawing from torch's generator would change the
    dropout masks of the first run in a process only (in-process resume tests saw it)."""
    runtime.matmul_slowdown.cache_clear()
    torch.manual_seed(0)
    before = torch.get_rng_state()
    runtime.matmul_slowdown("cpu", "bfloat16")
    torch.testing.assert_close(torch.get_rng_state(), before, rtol=0, atol=0)
    runtime.matmul_slowdown.cache_clear()


def test_auto_dtype_never_picks_a_half_dtype_on_the_cpu(monkeypatch):
    monkeypatch.setattr(runtime, "matmul_slowdown", lambda device_type, d: 0.5)  # even where half is fast
    assert resolve_dtype(torch.device("cpu"), "auto") == "float32"


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "scalenorm", "dyt"])
def test_half_weights_give_float32_greedy_output(name, tmp_path):
    """Weights cast to float16 (no autocast): logits close to float32's, and the greedy choice the same
    wherever float32's top two logits are not near-tied."""
    torch.manual_seed(0)
    model = GPT(tiny_config(norm_type=name, init="xavier")).eval()  # unit-scale logits: few near-ties
    idx = torch.randint(29, (2, 16))
    with torch.no_grad():
        ref = model(idx)[0]  # (B, T, V)
        half = GPT(tiny_config(norm_type=name, init="xavier")).eval()
        half.load_state_dict(model.state_dict())
        got = half.to(torch.float16)(idx)[0]
    assert got.dtype == torch.float16
    assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 0.05
    assert clear.any()
    assert torch.equal(got.float().argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.fixture(scope="module")
def checkpoint(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "r"
    Trainer(load_config(once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=20"))).train()
    return out / "best.pt"


@pytest.mark.slow  # starts processes
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_sample_py_loads_half_weights(checkpoint, tmp_path, dtype):
    model, _ = load_model(str(checkpoint), torch.device("cpu"), dtype)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    proc = run_script("sample.py", f"--ckpt={checkpoint}", "--temperature=0", "--num_samples=1",
                      "--max_new_tokens=30", "--start=To be", f"--dtype={dtype}", cwd=tmp_path)
    # (greedy agreement with float32 is tested on logits above, where near-ties are excluded)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("To be") and len(proc.stdout) > len("To be") + 30


def test_an_unknown_sampling_dtype_is_a_one_line_error(checkpoint, capsys):
    from babygpt.cli import run, sample_main

    assert run(sample_main, [f"--ckpt={checkpoint}", "--dtype=half"]) == 2
    assert capsys.readouterr().err.strip() == ("error: unknown dtype 'half'; choose one of: float32, bfloat16, "
                                               "float16")


def test_float16_on_a_device_without_a_grad_scaler_is_refused():
    with pytest.raises(BabyGPTError, match="float16 needs CUDA or the CPU"):
        runtime.check_dtype(torch.device("mps"), "float16")
