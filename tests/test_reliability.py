"""Runs that survive: kills, exact resume, signals, divergence, untrusted checkpoints."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from babygpt import cli, launcher
from babygpt.checkpoint import load_checkpoint, save_checkpoint
from babygpt.config import load_config
from babygpt.errors import BabyGPTError
from babygpt.state import COMPLETED
from babygpt.trainer import WALL_CLOCK_FIELDS, Trainer, train
from conftest import NaNAfter, ROOT, TINY_TRAIN_ARGS, assert_user_error, once, prepare_small_data

pytestmark = pytest.mark.slow  # not in the fast loop: each test trains runs: resumes, signals, non-finite losses


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("rel"))


def rows(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def comparable(metrics):
    """Metrics rows without the wall-clock fields, which differ from run to run."""
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS} for r in metrics]


def summary(out_dir):
    with open(os.path.join(out_dir, "summary.json")) as f:
        return json.load(f)


def start_training(out_dir, data_dir, *extra):
    return subprocess.Popen(once(sys.executable, os.path.join(ROOT, "train.py"), f"--data_dir={data_dir}",
                             f"--out_dir={out_dir}", *TINY_TRAIN_ARGS, *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def fork_training(out_dir, data_dir, *extra):
    """A run started as a sweep starts its CPU runs: a fork of the server that has imported torch
    (babygpt/launcher.py; test_launcher shows it trains as a new train.py process, to the bit),
    its output appended to ``out_dir``.log. Returns the run (poll, send_signal, wait)."""
    argv = once(f"--data_dir={data_dir}", f"--out_dir={out_dir}", *TINY_TRAIN_ARGS, *extra)
    return launcher.PreloadedLauncher().start(argv, f"{out_dir}.log", dict(os.environ))


def logged_iter(out_dir) -> int:
    """The last iteration metrics.jsonl shows (0 before the first row); a row being written is skipped."""
    last = 0
    try:
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            for line in f:
                try:
                    last = json.loads(line)["iter"]
                except ValueError:
                    pass
    except OSError:
        pass
    return last


def wait_for_iter(out_dir, proc, it, timeout=120) -> bool:
    """Until the run has logged iteration ``it`` or later: progress observed, not time slept,
    so a loaded machine only makes the test slower. False if the process ended first."""
    deadline = time.monotonic() + timeout
    while logged_iter(out_dir) < it:
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"the run never reached iteration {it}"
        time.sleep(0.005)
    return True


def wait_for_checkpoint_write(out_dir, proc, until_iter) -> None:
    """Until a file is being written atomically in the run directory (a ``.tmp-`` file: the
    checkpoint after an eval), or the run has logged ``until_iter``, or it has ended. Polls without
    sleeping: the write takes milliseconds."""
    while proc.poll() is None and logged_iter(out_dir) < until_iter:
        if any(f.startswith(".tmp-") for f in os.listdir(out_dir)):
            return


def wait_for_run_start(out_dir, proc, resumes, timeout=60):
    """Until config.json records this process (its setup is done: training starts next)."""
    path = os.path.join(out_dir, "config.json")
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, "the run never started"
        try:
            with open(path) as f:
                if len(json.load(f)["resumes"]) == resumes:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


# ------------------------------------------------------------------ exact resume

@pytest.mark.parametrize("optimizer", [["--optimizer=adamw"], ["--optimizer=muon"],
                                       ["--optimizer=muon", "--muon_ns_dtype=float32"]],
                         ids=["adamw", "muon", "muon_ns32"])
def test_resume_is_bit_identical(data_dir, tmp_path, optimizer):
    """2N iterations in one go == N iterations, then a resume to 2N (losses compared with ==); under
    muon the checkpoint carries Muon's momentum buffers and AdamW's moments (optim.MuonWithAdamW),
    with torch's Muon or optim.MuonNS."""
    n = 12
    common = once(f"--data_dir={data_dir}", *TINY_TRAIN_ARGS, "--log_interval=1", f"--eval_interval={n}",
                  "--dropout=0.1", f"--lr_decay_iters={2 * n}",  # dropout: the torch RNG state must resume too
                  *optimizer)
    train(load_config([*common, f"--out_dir={tmp_path / 'full'}", f"--max_iters={2 * n}"]))
    train(load_config([*common, f"--out_dir={tmp_path / 'half'}", f"--max_iters={n}"]))
    train(load_config([*common, f"--out_dir={tmp_path / 'half'}", f"--max_iters={2 * n}",
                       "--init_from=resume"]))
    full, resumed = rows(tmp_path / "full"), rows(tmp_path / "half")
    losses = lambda rs: [(r["iter"], r["loss"]) for r in rs if r["iter"] > n]  # noqa: E731
    assert len(losses(full)) == n
    assert losses(resumed) == losses(full)
    assert comparable(resumed) == comparable(full)


def test_checkpoint_older_than_a_model_field_still_resumes(data_dir, tmp_path):
    """A checkpoint written before a GPTConfig field existed resumes with that field's default."""
    out = tmp_path / "run"
    common = once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS)
    train(load_config([*common, "--max_iters=10"]))
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    for field in ("qk_norm", "dyt_alpha_init"):  # fields added after the first checkpoints
        del ckpt["model_config"][field]
    save_checkpoint(ckpt, str(out / "ckpt.pt"))
    summary = train(load_config([*common, "--max_iters=12", "--init_from=resume"]))
    assert summary["status"] in COMPLETED and summary["iter"] == 12


# ------------------------------------------------------------------ SIGKILL at random moments

@pytest.mark.slow
def test_sigkill_at_random_moments_always_resumes(data_dir, tmp_path):
    """Kill a run at points spread over its progress (mid-step, mid-eval, mid-checkpoint-write); each
    time the next run continues from what is on disk, and the final metrics equal an unkilled run's.
    Each kill waits for its target iteration to be logged, so the number of kills does not depend on
    how fast the machine is; where in the step, eval or write the SIGKILL lands is up to the moment.
    The killed runs are forks, as a sweep starts them (the signals' tests below start train.py)."""
    max_iters = 80
    args = [f"--max_iters={max_iters}", "--eval_interval=4", "--eval_iters=1", "--log_interval=2"]
    reference = tmp_path / "reference"
    train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={reference}", *TINY_TRAIN_ARGS, *args)))

    out = tmp_path / "killed"
    # One target in each quarter of the run, alternately an eval row (iter % 4 == 0: logged just
    # before its checkpoint is written; the kill waits for that write to be under way, for at most
    # two more iterations) and a plain log row (iter % 4 == 2: the kill lands in the steps, or the
    # eval, that follow). Every one is a kill: the last leaves 18 iterations, 4 checkpoints and the
    # final evaluation before the run's end.
    targets = [12, 30, 44, 62]
    kills, resumed_from, half_written = 0, [], 0
    for aim in targets:
        ckpt = out / "ckpt.pt"
        resume = ckpt.exists()
        if resume:
            resumed_from.append(load_checkpoint(str(ckpt))["iter"])  # loadable after every kill
        proc = fork_training(out, data_dir, *args, f"--init_from={'resume' if resume else 'scratch'}")
        target = max(logged_iter(out) + 1, aim)  # past what is already logged
        started = wait_for_run_start(out, proc, resumes=len(resumed_from)) and wait_for_iter(out, proc, target)
        if started and aim % 4 == 0:
            wait_for_checkpoint_write(out, proc, aim + 2)
        if not started or proc.poll() is not None:  # finished before the kill
            assert proc.wait() == 0, (tmp_path / "killed.log").read_text()
            break
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        kills += 1
        half_written += any(f.startswith(".tmp-") for f in os.listdir(out))  # killed mid-write
    print(f"kills={kills} resumed_from={resumed_from} killed_mid_write={half_written}")
    assert kills >= 4
    proc = fork_training(out, data_dir, *args, f"--init_from={'resume' if (out / 'ckpt.pt').exists() else 'scratch'}")
    assert proc.wait() == 0, (tmp_path / "killed.log").read_text()
    assert comparable(rows(out)) == comparable(rows(reference))
    assert summary(out)["status"] in COMPLETED and summary(out)["iter"] == max_iters
    assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]  # no half-written files left
    assert resumed_from == sorted(resumed_from)


# ------------------------------------------------------------------ signals

@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_checkpoint_and_exits_cleanly(data_dir, tmp_path, sig, code):
    """Interrupt between evals, resume: the metrics equal those of a run never interrupted."""
    out = tmp_path / "run"
    fixed = ["--eval_interval=1000", "--lr_decay_iters=2000", "--log_interval=1"]
    proc = start_training(out, data_dir, "--max_iters=1000000", *fixed)
    assert wait_for_iter(out, proc, 3), proc.communicate()  # training is under way
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "resume with: python train.py" in lines[0] and "--init_from=resume" in lines[0]
    s = summary(out)
    assert s["status"] == "interrupted" and s["signal"] == sig.name and s["iter"] > 0
    assert load_checkpoint(str(out / "ckpt.pt"))["iter"] == s["iter"]
    end = s["iter"] + 5
    # The resume in this process (the interrupted one was a process of its own, signalled as a user would).
    assert cli.run(cli.train_main, once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, *fixed,
                                    f"--max_iters={end}", "--init_from=resume")) == 0
    assert summary(out)["iter"] == end
    reference = tmp_path / "reference"
    train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={reference}", *TINY_TRAIN_ARGS, *fixed,
                       f"--max_iters={end}")))
    assert comparable(rows(out)) == comparable(rows(reference))


# ------------------------------------------------------------------ divergence

def trainer_with_nan(data_dir, out_dir, k, *extra):
    cfg = load_config(once(f"--data_dir={data_dir}", f"--out_dir={out_dir}", *TINY_TRAIN_ARGS,
                       "--max_iters=40", *extra))
    return Trainer(cfg, wrap_model=lambda model: NaNAfter(model, k))


def test_nonfinite_loss_stops_the_run_and_keeps_last_good_checkpoint(data_dir, tmp_path):
    out = tmp_path / "run"
    s = trainer_with_nan(data_dir, out, k=17).train()  # forward call 17 = iteration 17
    assert s["status"] == "diverged" and s["diverged_at"] == 17 and s["iter"] == 20  # seen at the log row
    assert rows(out)[-1]["diverged_at"] == 17
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["iter"] == 10  # the last eval before the divergence
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert s["final_val_loss"] is not None and s["best_val_loss"] is not None


def test_nonfinite_skip_mode_skips_steps_and_finishes(data_dir, tmp_path):
    out = tmp_path / "run"
    trainer = trainer_with_nan(data_dir, out, 35, "--nonfinite=skip")
    s = trainer.train()
    assert s["status"] in COMPLETED and s["iter"] == 40
    assert s["first_nonfinite_at"] == 35 and s["skipped_steps"] == 6 and s["diverged_at"] is None
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert rows(out)[-1]["skipped_steps"] == 6


@pytest.mark.parametrize("k,in_eval", [(10, False), (25, True)], ids=["most-steps-skipped", "last-evals-nan"])
def test_a_run_without_a_finite_result_is_skipped_out_never_finished(k, in_eval, data_dir, tmp_path):
    """nonfinite=skip reaches max_iters whatever happens: with 31 of 40 steps skipped, or with every
    evaluation from iteration 25 on NaN, the run has no result and says so."""
    out = tmp_path / "run"
    cfg = load_config(once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, "--max_iters=40",
                       "--nonfinite=skip"))
    s = Trainer(cfg, wrap_model=lambda model: NaNAfter(model, k, in_eval)).train()
    assert s["status"] == "skipped_out" and s["iter"] == 40
    assert (s["skipped_steps"] > 20) if not in_eval else (s["val_loss_full"] is None and s["final_eval_iter"] == 20)


@pytest.mark.slow
def test_float16_skip_with_a_hopeless_lr_is_skipped_out(data_dir, tmp_path, capsys):
    """The case that once exited 0 as "finished": float16, nonfinite=skip, an LR at which every step
    overflows. It ends with exit 3 and status skipped_out."""
    out = tmp_path / "run"
    code = cli.run(cli.train_main, once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS,
                                    "--max_iters=30", "--dtype=float16", "--nonfinite=skip", "--learning_rate=9"))
    assert code == cli.EXIT_DIVERGED and summary(out)["status"] == "skipped_out"
    assert "skipped_out" in capsys.readouterr().err


@pytest.mark.parametrize("damaged", [{"status": "finished"}, {"status": "done", "iter": 3},
                                     {"status": "diverged", "iter": 3}, {"status": "collapsed", "iter": 3,
                                     "val_loss_full": float("nan"), "final_val_loss": 1, "best_val_loss": 1}],
                         ids=["no-losses", "unknown-status", "no-diverged-at", "nan-loss"])
def test_a_damaged_summary_is_refused_by_name_by_every_reader(damaged, data_dir, tmp_path):
    from babygpt.docfigures import check_summary
    from babygpt.rundir import RunDir, read_summary
    from babygpt.sweep import Run, Sweep

    runs = [Run({"learning_rate": 1e-3}, 0)]
    sweep = Sweep(str(tmp_path / "sweep"), runs, once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", "--max_iters=5"))
    path = os.path.join(sweep.out_dir(runs[0]), "summary.json")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump(damaged, f)
    text = open(path).read()
    for read in (lambda: read_summary(path), lambda: sweep.run(progress=False), lambda: check_summary(path, text),
                 lambda: Sweep(sweep.root, runs, sweep.base_args, collect=True).run(progress=False),
                 lambda: sweep.result(runs[0], None), lambda: RunDir(sweep.out_dir(runs[0])).finished_summary(3)):
        with pytest.raises(BabyGPTError, match=f"{path} is damaged"):
            read()


def test_interrupt_after_a_nonfinite_step_keeps_the_good_checkpoint(data_dir, tmp_path):
    """Ctrl-C right after a NaN step (before any metrics row saw it): no checkpoint of the bad state."""
    out = tmp_path / "run"

    class InterruptAfterNaN(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.inner = NaNAfter(model, 13)

        def forward(self, x, y):
            result = self.inner(x, y)
            if self.inner.calls == 13 and self.training:
                os.kill(os.getpid(), signal.SIGINT)  # lands in the handler: acted on after this step
            return result

    cfg = load_config(once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, "--max_iters=40"))
    s = Trainer(cfg, wrap_model=InterruptAfterNaN).train()
    assert s["status"] == "diverged" and s["diverged_at"] == 13
    assert load_checkpoint(str(out / "ckpt.pt"))["iter"] == 10


def test_nonfinite_eval_stops_without_overwriting_checkpoints(data_dir, tmp_path):
    out = tmp_path / "run"
    cfg = load_config(once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, "--max_iters=40"))
    s = Trainer(cfg, wrap_model=lambda model: NaNAfter(model, 15, in_eval=True)).train()
    assert s["status"] == "diverged" and s["diverged_at"] == 20 and s["final_eval_iter"] == 10
    assert load_checkpoint(str(out / "ckpt.pt"))["iter"] == 10
    assert rows(out)[-1]["diverged_at"] == 20 and rows(out)[-1]["val_loss"] is None


def test_compile_failure_falls_back_to_eager(data_dir, tmp_path, monkeypatch, capsys):
    """torch.compile fails at the first call when no compiler works; training goes on eagerly."""
    import babygpt.trainer as trainer_module

    def broken_compile(model):
        def fails(*args, **kwargs):
            raise RuntimeError("no working C++ compiler")
        return fails
    monkeypatch.setattr(trainer_module.torch, "compile", broken_compile)
    cfg = load_config(once(f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *TINY_TRAIN_ARGS,
                       "--max_iters=10", "--compile=true"))
    trainer = Trainer(cfg)
    assert trainer.net is trainer.model  # forward passes go through the eager model
    assert "warning: torch.compile failed (RuntimeError: no working C++ compiler); training eagerly" \
        in capsys.readouterr().err
    assert trainer.train()["status"] in COMPLETED


def test_real_divergence_exits_3(data_dir, tmp_path, capsys):
    """No norm and an absurd learning rate: the loss overflows within a few steps. (train.py's main
    in this process: its return value is train.py's exit status; a diverging train.py process is
    test_experiments.py's small_sweep, exit code 3.)"""
    code = cli.run(cli.train_main, once(f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'out'}", *TINY_TRAIN_ARGS,
                                        "--norm_type=none", "--learning_rate=1e3", "--min_lr=0", "--grad_clip=0",
                                        "--weight_decay=0", "--warmup_iters=0", "--max_iters=50", "--log_interval=1"))
    err = capsys.readouterr().err
    assert code == 3, err
    assert "diverged: non-finite loss at iteration" in err
    s = summary(tmp_path / "out")
    assert s["status"] == "diverged" and s["diverged_at"] == s["iter"] < 50
    ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))
    assert ckpt["iter"] == 0 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_summary_of_a_finished_run(data_dir, tmp_path):
    s = train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={tmp_path}", *TINY_TRAIN_ARGS,
                           "--max_iters=10")))
    on_disk = summary(tmp_path)
    assert on_disk == s
    assert s["status"] in COMPLETED and s["iter"] == 10 and s["final_eval_iter"] == 10
    assert s["best_val_loss"] <= s["final_val_loss"] and s["wall_time_s"] > 0


# ------------------------------------------------------------------ untrusted files

class _Payload:
    """Unpickling this would create the file ``path``: the stand-in for malicious code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickled_code_in_a_checkpoint_never_runs(data_dir, tmp_path, capsys):
    marker = tmp_path / "PWNED"
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"format": "babygpt-ckpt-v1", "iter": 1, "model": _Payload(str(marker))}, out / "ckpt.pt")
    assert not marker.exists()

    # sample.py's and train.py's mains in this process: had either unpickled the payload, here or in a
    # process of its own, the marker would exist.
    code = cli.run(cli.sample_main, [f"--ckpt={out / 'ckpt.pt'}", "--device=cpu"])
    assert_user_error(capsys.readouterr().err, code, "refusing to load", "could run code")
    code = cli.run(cli.train_main, once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS,
                                    "--max_iters=20", "--init_from=resume"))
    assert_user_error(capsys.readouterr().err, code, "refusing to load")
    assert not marker.exists()
    with pytest.raises(BabyGPTError):
        load_checkpoint(str(out / "ckpt.pt"))
    assert not marker.exists()


def test_a_signal_during_the_final_evaluation_is_named_and_the_summary_still_written(data_dir, tmp_path, monkeypatch,
                                                                                   capsys):
    """Training has ended and its checkpoint is written; a SIGTERM while the whole split is scored is
    noted (not the default action, which ended the process with no summary and no word), the summary
    is written, and the signal is named."""
    from babygpt import trainer

    scored = trainer.final_evaluation

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return scored(*args, **kwargs)

    monkeypatch.setattr(trainer, "final_evaluation", signalled)
    out = tmp_path / "run"
    result = train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, "--max_iters=10")))
    assert result["status"] in COMPLETED and summary(out) == result
    assert "SIGTERM arrived as training ended (its last step or final evaluation): the run wrote its summary first" \
        in capsys.readouterr().err
