"""What happens around a run: one owner per run directory, sweeps that own their children,
experiment results never replaced by accident, and filesystem or memory failures reported
as one error line (exit 2) instead of a traceback."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from babygpt import cli, distributed
from babygpt import sweep as sweep_module
from babygpt.config import load_config
from babygpt.errors import BabyGPTError, Interrupted
from babygpt.files import write_atomic
from babygpt.rundir import RunDir, RunLock, owned
from babygpt.sweep import MAX_NAME, Run, Sweep
from babygpt.trainer import train
from conftest import ROOT, TINY_TRAIN_ARGS, assert_refused_in_process, once, prepare_small_data

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import _common  # noqa: E402


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("collisions"))


def files_of(directory):
    """Every file under ``directory`` with its bytes: what a refused command must leave alone."""
    out = {}
    for dirpath, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.join(dirpath, name)] = f.read()
    return out


def wait_until(condition, proc, what, timeout=120):
    """Poll ``condition`` (progress observed, not time slept) while ``proc`` runs."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the process ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.01)


def train_argv(data_dir, out_dir, *extra):
    return once(sys.executable, os.path.join(ROOT, "train.py"), f"--data_dir={data_dir}", f"--out_dir={out_dir}",
            *TINY_TRAIN_ARGS, *extra)


# ------------------------------------------------------------------ one owner per run directory

def test_lock_is_exclusive_and_names_its_holder(tmp_path):
    first, second = RunLock(str(tmp_path / "run")), RunLock(str(tmp_path / "run"))
    assert first.acquire() is None and first.holder() == os.getpid()
    assert second.acquire() == os.getpid()  # flock is per open file: refused even in one process
    first.release()
    assert first.holder() is None and second.acquire() is None
    second.release()


def test_owned_refuses_a_held_directory_and_releases_on_error(tmp_path):
    out = str(tmp_path / "run")
    with owned(out, distributed.Dist(), "cpu"):
        with pytest.raises(BabyGPTError, match=f"in use by process {os.getpid()}"):
            with owned(out, distributed.Dist(), "cpu"):
                pass
    with pytest.raises(RuntimeError):
        with owned(out, distributed.Dist(), "cpu"):
            raise RuntimeError("boom")
    assert RunLock(out).holder() is None  # released on the way out of an exception


class SimulatedRank(distributed.Dist):
    """One rank of a 2-process job whose all-reduce adds what the other rank sends."""

    def __init__(self, rank, other):
        super().__init__(rank=rank, local_rank=rank, world_size=2)
        object.__setattr__(self, "other", other)

    def sum(self, t):
        return t + self.other


@pytest.mark.parametrize("rank", [0, 1])
def test_under_torchrun_every_rank_refuses_a_held_directory(rank, tmp_path):
    """Rank 0 alone takes the lock; it shares (holder pid + 1) so that rank 1 refuses with it."""
    out = str(tmp_path / "run")
    holder = RunLock(out)
    assert holder.acquire() is None
    other = os.getpid() + 1 if rank == 1 else 0  # what the other rank sends: rank 0 saw the holder
    with pytest.raises(BabyGPTError, match=f"in use by process {os.getpid()}"):
        with owned(out, SimulatedRank(rank, other), "cpu"):
            pass
    holder.release()
    with owned(out, SimulatedRank(rank, 0), "cpu"):  # free: both ranks go on
        assert RunLock(out).holder() == (os.getpid() if rank == 0 else None)


@pytest.mark.slow
def test_second_process_is_refused_while_a_run_trains_and_sigkill_frees_the_lock(data_dir, tmp_path, capsys):
    """A scratch start and a resume aimed at a live run are both refused, naming its pid, and
    change nothing; the live run is unaffected. A SIGKILLed owner leaves no stale lock."""
    out = tmp_path / "run"
    live = subprocess.Popen(train_argv(data_dir, out, "--max_iters=1000000", "--eval_interval=5",
                                       "--lr_decay_iters=1000"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_until(lambda: os.path.exists(out / "ckpt.pt"), live, "the first checkpoint")
    for extra in ([], ["--init_from=resume"]):  # the second process: this one, running train.py's main
        assert_refused_in_process(cli.train_main, train_argv(data_dir, out, "--max_iters=10", *extra)[2:], capsys,
                                  f"is in use by process {live.pid}")
    live.send_signal(signal.SIGTERM)
    _, err = live.communicate(timeout=120)
    assert live.returncode == 143, err  # it was never disturbed: it checkpoints and stops as asked
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted"
    iters = [json.loads(line)["iter"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert iters == sorted(set(iters))  # one writer: no row twice

    killed = subprocess.Popen(train_argv(data_dir, out, "--max_iters=1000000", "--eval_interval=5",
                                         "--lr_decay_iters=1000", "--init_from=resume"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: RunLock(str(out)).holder() == killed.pid, killed, "the resumed run taking the lock")
    killed.kill()
    killed.wait()
    assert RunLock(str(out)).holder() is None
    end = s["iter"] + 3
    assert cli.run(cli.train_main, train_argv(data_dir, out, f"--max_iters={end}", "--eval_interval=5",
                                              "--lr_decay_iters=1000", "--init_from=resume")[2:]) == 0, \
        capsys.readouterr().err


@pytest.mark.slow
def test_two_runs_started_together_never_share_a_directory(data_dir, tmp_path):
    """Whichever gets the lock first trains; the other is refused (in use, or already a run)."""
    out = tmp_path / "run"
    procs = [subprocess.Popen(train_argv(data_dir, out, "--max_iters=20", f"--seed={seed}"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    err = next(e for code, e in results if code == 2)
    # "in use by process PID", or "by another process" where the holder let go of the lock before its
    # pid could be read (the other's own brief probe of the lock can be what it saw): both are the refusal
    assert "is in use by" in err or "already holds a run" in err
    seeds = {json.loads((out / "config.json").read_text())["config"]["seed"]}
    iters = [json.loads(line)["iter"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(seeds) == 1 and iters == sorted(set(iters))


@pytest.mark.slow
def test_noop_resume_of_a_finished_run_changes_nothing(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, "--max_iters=10")
    assert cli.run(cli.train_main, argv) == 0
    before = files_of(out)
    mtimes = {p: os.stat(p).st_mtime_ns for p in before}
    assert cli.run(cli.train_main, [*argv, "--init_from=resume"]) == 0
    assert "nothing to train" in capsys.readouterr().err
    assert files_of(out) == before and {p: os.stat(p).st_mtime_ns for p in before} == mtimes


# ------------------------------------------------------------------ sweeps own their children

def sweep_args(data_dir, *extra):
    return once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", "--eval_interval=5", "--lr_decay_iters=1000", *extra)


def test_sweep_checks_every_run_before_starting_any(data_dir, tmp_path):
    (tmp_path / "yaml.py").write_text("n_layer: 2\n")
    runs = [Run({"max_iters": 5}, 0), Run({"max_iters": -1}, 0), Run({}, 0, config=str(tmp_path / "yaml.py"))]
    sweep = Sweep(str(tmp_path / "sweep"), runs, sweep_args(data_dir, "--max_iter=5"))
    with pytest.raises(BabyGPTError) as e:
        sweep.run(progress=False)
    problems = e.value.problems
    assert problems.count("unknown config key 'max_iter' (did you mean 'max_iters'?)") == 1  # once, not per run
    assert any("max_iters must be >= 0" in p for p in problems)
    assert any("sets no keys" in p for p in problems)
    assert not os.path.exists(tmp_path / "sweep")  # nothing ran, nothing was written


def test_sweep_refuses_runs_held_by_a_live_process_and_damaged_records(data_dir, tmp_path):
    runs = [Run({"learning_rate": 1e-3}, 0), Run({"learning_rate": 2e-3}, 0)]
    sweep = Sweep(str(tmp_path / "sweep"), runs, sweep_args(data_dir, "--max_iters=5"))
    orphan = RunLock(sweep.out_dir(runs[0]))  # as if a killed sweep's train.py still ran there
    assert orphan.acquire() is None
    os.makedirs(sweep.out_dir(runs[1]))
    write_atomic(os.path.join(sweep.out_dir(runs[1]), "summary.json"), b'{"status": ')
    with pytest.raises(BabyGPTError) as e:
        sweep.run(progress=False)
    orphan.release()
    text = "\n".join(e.value.problems)
    assert f"is being trained by process {os.getpid()}" in text and "summary.json is not a readable" in text


def test_a_sweep_with_other_settings_is_refused_while_the_first_still_runs(data_dir, tmp_path):
    """Run names carry only what a sweep varies: a second sweep into the same --out with another
    --set is refused from the first sweep's first write on, before it trains or waits, even though
    no run of the first sweep has a config.json yet (it is still starting them)."""
    runs = [Run({"learning_rate": 1e-3}, 0), Run({"learning_rate": 1e-3}, 1)]
    root = str(tmp_path / "sweep")
    first = Sweep(root, runs, sweep_args(data_dir, "--max_iters=5"))
    first.check()
    first.bind()  # what first.run() does before it starts its first train.py
    second = Sweep(root, runs[1:] + [Run({"learning_rate": 3e-3}, 0)], sweep_args(data_dir, "--max_iters=7"))
    before = files_of(root)
    with pytest.raises(BabyGPTError, match="holds the run learning_rate=0.001__seed=1 with other settings "
                                           r"\(max_iters=5 there, 7 now\)"):
        second.run(progress=False)
    assert files_of(root) == before  # its own new binding (lr 3e-3) was taken back; nothing trained
    assert not os.path.exists(os.path.join(root, "runs"))
    again = Sweep(root, runs, sweep_args(data_dir, "--max_iters=5"))
    again.check()
    again.bind()  # the same settings: accepted (a shard, or the same sweep run again)


def test_a_damaged_binding_is_refused_by_name(data_dir, tmp_path):
    runs = [Run({"learning_rate": 1e-3}, 0)]
    sweep = Sweep(str(tmp_path / "sweep"), runs, sweep_args(data_dir, "--max_iters=5"))
    sweep.check()
    sweep.bind()
    with open(sweep.binding(runs[0]), "w") as f:
        f.write("{")
    with pytest.raises(BabyGPTError, match=r"run_settings/learning_rate=0.001__seed=0.json is damaged"):
        sweep.run(progress=False)


@pytest.mark.skipif(sweep_module.DRAIN_SIGNAL is None, reason="SIGUSR1 is POSIX-only")
def test_sigusr1_drains_a_sweep_the_run_in_progress_ends_and_no_other_starts(data_dir, tmp_path, monkeypatch):
    """A drain reaches the sweep's own handler (sent to this process, as `timeout -s USR1` does),
    lets the run in progress end, starts no other, and holds for a later sweep of the same process
    (an experiment's next round)."""
    monkeypatch.setattr(sweep_module, "_drained_by", None)
    runs = [Run({"learning_rate": lr}, 0) for lr in (1e-3, 2e-3, 3e-3)]
    started = []

    class Drained(Sweep):
        def _spawn(self, run, gpu):  # the run in progress: receives the drain, then ends as finished
            started.append(run.name)
            os.kill(os.getpid(), sweep_module.DRAIN_SIGNAL)
            assert self.signals.wake.wait(30)  # the main thread's handler has run
            os.makedirs(self.out_dir(run), exist_ok=True)
            write_atomic(os.path.join(self.out_dir(run), "config.json"), json.dumps({"config": {}}).encode())
            write_atomic(os.path.join(self.out_dir(run), "summary.json"), json.dumps(
                {"status": "finished", "iter": 5, "val_loss_full": 3.0, "final_val_loss": 3.0,
                 "best_val_loss": 3.0}).encode())
            return 0

    before = signal.getsignal(sweep_module.DRAIN_SIGNAL)
    sweep = Drained(str(tmp_path / "sweep"), runs, sweep_args(data_dir, "--max_iters=5"))
    with pytest.raises(Interrupted, match=r"drained by SIGUSR1: the runs it had started have ended, 2 run\(s\) "
                                          r"are not done; run the same command again") as e:
        sweep.run(progress=False)
    assert e.value.signum == sweep_module.DRAIN_SIGNAL and started == [runs[0].name]
    assert sweep.status(runs[0]) == "finished" and sweep.status(runs[1]) is None
    assert signal.getsignal(sweep_module.DRAIN_SIGNAL) == before  # the handler is put back
    later = Drained(str(tmp_path / "next_round"), runs[:1], sweep_args(data_dir, "--max_iters=5"))
    with pytest.raises(Interrupted, match=r"1 run\(s\) are not done"):
        later.run(progress=False)
    assert started == [runs[0].name]


def test_long_sweep_run_names_fit_the_filesystem():
    long = Run({"norm_type": "rmsnorm" * 40}, 3)
    other = Run({"norm_type": "rmsnorm" * 40 + "x"}, 3)
    assert len(long.name.encode()) <= MAX_NAME and long.name.endswith("__seed=3")
    assert long.name != other.name
    assert Run({"norm_type": "rmsnorm"}, 3).name == "norm_type=rmsnorm__seed=3"  # short names unchanged


@pytest.mark.slow
def test_sigterm_to_a_sweep_stops_its_child_and_a_restart_resumes_it(data_dir, tmp_path, capsys):
    root = tmp_path / "sweep"
    base = [f"--set={a[2:]}" for a in sweep_args(data_dir, "--max_iters=100000")]
    argv = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), *base,
            "--grid", "learning_rate=1e-3,2e-3", "--out", str(root)]
    sweep = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = root / "runs" / "learning_rate=0.001__seed=0"
    wait_until(lambda: os.path.exists(first / "ckpt.pt"), sweep, "the first run's checkpoint")
    child = RunLock(str(first)).holder()
    assert child
    sweep.send_signal(signal.SIGTERM)
    _, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 143, err
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert RunLock(str(first)).holder() is None  # the child is gone, not orphaned
    s = json.loads((first / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["signal"] == "SIGTERM"
    assert not os.path.exists(root / "runs" / "learning_rate=0.002__seed=0")  # no new run was started

    # Restarted with a budget it can finish: the interrupted run resumes, the other starts.
    stop = s["iter"] + 5
    argv = [a.replace("--set=max_iters=100000", f"--set=max_iters={stop}") for a in argv]
    # Refused before anything runs (in this process): max_iters differs.
    assert_refused_in_process(sweep_module.main, argv[2:], capsys, "with other settings (max_iters=")
    # The budget is part of the settings: the same command resumes it.
    argv_same = [a.replace(f"--set=max_iters={stop}", "--set=max_iters=100000") for a in argv]
    resumed = subprocess.Popen(argv_same, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: json.loads((first / "config.json").read_text()).get("resumes"), resumed,
               "the interrupted run resuming")
    resumed.send_signal(signal.SIGINT)
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 130, err
    info = json.loads((first / "config.json").read_text())
    assert [r["iter"] for r in info["resumes"]][0] == s["iter"]  # resumed from its checkpoint, not restarted


# ------------------------------------------------------------------ experiment outputs

def exp_args(*argv):
    from exp1_gradient_vanishing import Exp1Options

    return _common.parse(Exp1Options, list(argv), "exp1_gradient_vanishing", "doc")


def test_each_tier_has_its_own_default_directory_under_out_unless_published():
    assert _common.output_path(exp_args(), "exp1") == os.path.join("out", "exp1")
    assert _common.output_path(exp_args("--quick"), "exp1") == os.path.join("out", "quick", "exp1")
    assert _common.output_path(exp_args("--publish"), "exp1") == os.path.join("results", "exp1")
    assert _common.output_path(exp_args("--quick", "--publish"), "exp1") == os.path.join("results", "quick", "exp1")
    assert _common.output_path(exp_args("--quick", "--out=mine"), "exp1") == "mine"
    assert "publish" not in _common.settings(exp_args("--publish"), "exp1")  # where, not what


def test_results_made_with_other_settings_are_refused_unless_overwrite(tmp_path):
    out = str(tmp_path / "exp1")
    _common.claim(out, exp_args(), "exp1")
    (tmp_path / "exp1" / "report.md").write_text("committed")
    _common.claim(out, exp_args(), "exp1")  # the same settings: kept (a re-run regenerates them)
    assert (tmp_path / "exp1" / "report.md").read_text() == "committed"
    before = files_of(out)
    with pytest.raises(BabyGPTError, match="made with other settings .quick=False there, True now.*--overwrite"):
        _common.claim(out, exp_args("--quick"), "exp1")
    assert files_of(out) == before
    _common.claim(out, exp_args("--quick", "--overwrite"), "exp1")
    assert not os.path.exists(tmp_path / "exp1" / "report.md")
    assert json.loads((tmp_path / "exp1" / "settings.json").read_text())["quick"] is True


def test_overwrite_keeps_the_old_results_until_the_new_ones_are_complete(tmp_path):
    """--overwrite writes aside, then swaps: the old results move to .NAME.replaced, whole, and go
    only when the new report is written; a command stopped before that leaves both, and running
    it again completes the swap. Other settings meanwhile are refused, naming where the old are."""
    from babygpt import experimentdir

    out = str(tmp_path / "exp1")
    _common.claim(out, exp_args(), "exp1")
    (tmp_path / "exp1" / "report.md").write_text("old report")
    old = files_of(out)
    aside = tmp_path / ".exp1.replaced"
    _common.claim(out, exp_args("--quick", "--overwrite"), "exp1")  # ... and then the command is stopped
    assert {p.replace(str(aside), out): b for p, b in files_of(aside).items()} == old
    experimentdir._PENDING.clear()  # a new process
    with pytest.raises(BabyGPTError, match="an earlier --overwrite of .* did not complete.*exp1.replaced"):
        _common.claim(out, exp_args("--overwrite"), "exp1")
    _common.claim(out, exp_args("--quick"), "exp1")  # the same command again (--overwrite or not) goes on
    assert os.path.isdir(aside)
    _common.write_report(os.path.join(out, "report.md"), "t", "cmd", "new body", 0.0)
    assert not os.path.exists(aside) and "new body" in (tmp_path / "exp1" / "report.md").read_text()


def test_a_rerun_with_the_same_settings_leaves_settings_json_alone(tmp_path):
    out = str(tmp_path / "exp1")
    _common.claim(out, exp_args(), "exp1")
    settings = tmp_path / "exp1" / "settings.json"
    os.utime(settings, ns=(1, 1))
    _common.claim(out, exp_args(), "exp1")
    assert os.stat(settings).st_mtime_ns == 1


def test_results_made_before_an_option_existed_are_the_same_settings_while_it_is_at_its_default(tmp_path):
    """A settings.json without a newer option's key (exp1's --depth here) still says these settings
    when the option is at its default, and is left alone; a non-default value is another setting."""
    out = str(tmp_path / "exp1")
    _common.claim(out, exp_args(), "exp1")
    settings = tmp_path / "exp1" / "settings.json"
    old = {k: v for k, v in json.loads(settings.read_text()).items() if k != "depth"}
    settings.write_text(json.dumps(old))
    _common.claim(out, exp_args(), "exp1")
    assert json.loads(settings.read_text()) == old
    with pytest.raises(BabyGPTError, match=r"made with other settings \(depth=None there, 3 now"):
        _common.claim(out, exp_args("--depth=3"), "exp1")


# Each training experiment with an option that only a later step used to refuse. The command
# must exit 2 and leave every file of its --out as it was: bytes and mtime.
# --collect with --overwrite can never complete: the runs it would read are the ones it would move aside.
BAD_LATE_OPTIONS = [["--jobs=0"], ["--gpus=0"], ["--collect"]]
TRAINING_EXPERIMENTS = ["exp2_norm_comparison", "exp3_prenorm_vs_postnorm", "exp6_postln_collapse",
                        "exp7_lr_sensitivity", "exp8_dyt_saturation", "exp9_fp16_overflow", "exp16_noise",
                        "exp18_qk_stability"]


@pytest.mark.parametrize("bad", BAD_LATE_OPTIONS, ids=lambda b: b[0])
@pytest.mark.parametrize("name", TRAINING_EXPERIMENTS)
@pytest.mark.slow
def test_an_error_exit_with_overwrite_changes_no_byte_and_no_mtime(name, bad, data_dir, tmp_path, capsys):
    import importlib

    if bad[0].startswith("--gpus") and __import__("torch").cuda.is_available():
        pytest.skip("--gpus=0 is valid on a machine with a GPU")
    out = tmp_path / "out"
    out.mkdir()
    (out / "settings.json").write_text('{"experiment": "other"}\n')
    (out / "report.md").write_text("committed report")
    (out / "results.csv").write_text("a,b\n")
    for path in out.iterdir():
        os.utime(path, ns=(1, 1))
    before = files_of(out)
    module = importlib.import_module(name)
    assert_refused_in_process(module.main, ["--quick", f"--out={out}", f"--data_dir={data_dir}", "--overwrite", *bad],
                              capsys, bad[0].split("=")[0][2:])
    assert files_of(out) == before and {os.stat(p).st_mtime_ns for p in before} == {1}
    assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing aside, nothing new


def test_results_of_unknown_origin_are_refused(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.md").write_text("made by hand")
    with pytest.raises(BabyGPTError, match="without a settings.json"):
        _common.claim(str(tmp_path / "old"), exp_args(), "exp1")


def test_committed_results_record_their_settings():
    """Every committed results directory says how it was made, matching its report's command."""
    for name in os.listdir(os.path.join(ROOT, "results")):
        report = os.path.join(ROOT, "results", name, "report.md")
        if not os.path.exists(report):
            continue
        with open(os.path.join(ROOT, "results", name, "settings.json")) as f:
            settings = json.load(f)
        with open(report) as f:
            command = next(line for line in f if line.startswith("Command: "))
        assert f"experiments/{settings['experiment']}.py" in command and settings["quick"] is False


@pytest.mark.slow
def test_quick_run_cannot_overwrite_committed_results(data_dir, tmp_path, monkeypatch, capsys):
    """exp1 --quick from a checkout writes to out/quick/, and --out at a default-tier directory is
    refused with exit 2 and no change."""
    script = os.path.join(ROOT, "experiments", "exp1_gradient_vanishing.py")
    committed = tmp_path / "results" / "exp1_gradient_vanishing"
    committed.mkdir(parents=True)
    _common.claim(str(committed), exp_args(), "exp1_gradient_vanishing")
    (committed / "report.md").write_text("the committed report")
    before = files_of(tmp_path / "results")
    quick = subprocess.run([sys.executable, script, "--quick"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert quick.returncode == 0, quick.stderr
    assert os.path.exists(tmp_path / "out" / "quick" / "exp1_gradient_vanishing" / "report.md")
    # The refusal comes before anything is written: the script's main, in this process.
    from exp1_gradient_vanishing import main

    monkeypatch.chdir(tmp_path)
    assert_refused_in_process(_common.noting_replaced(main), ["--quick", f"--out={committed}"], capsys,
                              "made with other settings", "--overwrite")
    assert files_of(tmp_path / "results") == before


# ------------------------------------------------------------------ filesystem and memory

def test_full_disk_during_an_atomic_write_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"previous checkpoint")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(BabyGPTError, match=r"No space left on device; free some disk space .*ckpt.pt is unchanged"):
        write_atomic(str(path), b"new checkpoint")
    assert path.read_bytes() == b"previous checkpoint" and os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.slow
def test_full_disk_mid_run_is_one_error_line_and_the_run_stays_resumable(data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real_replace = os.replace
    saves = []

    def replace(src, dst):  # the second checkpoint write finds the disk full
        saves.append(dst)
        if str(dst).endswith("ckpt.pt") and len([d for d in saves if str(d).endswith("ckpt.pt")]) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    argv = once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, "--max_iters=30")
    assert_refused_in_process(cli.train_main, argv, capsys, "No space left on device", "free some disk space",
                              "ckpt.pt is unchanged")
    monkeypatch.setattr(os, "replace", real_replace)
    assert RunLock(str(out)).holder() is None
    assert cli.run(cli.train_main, [*argv, "--init_from=resume"]) == 0  # from the first checkpoint


def test_read_only_location_for_a_write_is_one_error_line(tmp_path, monkeypatch):
    import tempfile

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(BabyGPTError, match="writing '.*summary.json' failed: Permission denied; choose a location"):
        write_atomic(str(tmp_path / "summary.json"), b"{}")


@pytest.mark.parametrize("error,fragment", [
    (OSError(errno.EROFS, "Read-only file system", "out/run"), "the filesystem is read-only"),
    (OSError(errno.ENAMETOOLONG, "File name too long", "x" * 300), "use a shorter name"),
    (MemoryError(), "out of memory"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
     "reduce batch_size"),
])
def test_cli_reports_resource_errors_without_a_traceback(error, fragment, capsys):
    def main(argv):
        raise error
    assert_refused_in_process(main, [], capsys, fragment)


@pytest.mark.parametrize("error", [OSError(errno.ECONNRESET, "Connection reset"), RuntimeError("a bug")])
def test_cli_keeps_the_traceback_of_other_errors(error):
    def main(argv):
        raise error
    with pytest.raises(type(error)):
        cli.run(main, [])


def test_memory_check_uses_this_machine(monkeypatch):
    from babygpt import memory

    cfg = load_config(["--batch_size=4"])  # the defaults fit
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**20)  # a machine with 1 MiB free
    with pytest.raises(BabyGPTError, match=r"needs at least .* more than the 0.0 GiB of memory free"):
        load_config(["--batch_size=4"])
    assert cfg.batch_size == 4


def test_run_directory_errors_leave_nothing_behind(data_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(BabyGPTError, match="longer than the filesystem's limit"):
        train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={out / ('y' * 300)}", *TINY_TRAIN_ARGS)))
    assert not os.path.exists(out)
    assert RunDir(str(out)).metrics_rows() == []


def test_sweep_refuses_set_values_that_would_be_ignored_or_are_malformed(data_dir, tmp_path):
    from babygpt.sweep import ignored_set_problems

    runs = [Run({"n_layer": 2}, 0)]
    problems = ignored_set_problems(["seed=5", "n_layer=3", "out_dir=elsewhere", "dropout=0.1"], runs)
    assert problems == ["--set seed has no effect: each run's seed is set by --seeds",
                        "--set n_layer has no effect: each run's n_layer is set by the sweep's own grid",
                        "--set out_dir has no effect: each run's out_dir is set by --out"]
    sweep = Sweep(str(tmp_path / "sweep"), runs, sweep_args(data_dir, "--help"))
    with pytest.raises(BabyGPTError, match="malformed --set 'help'"):
        sweep.check()
    # An experiment's --set meets the same check (exp3 sets n_layer per run from --depths).
    from exp3_prenorm_vs_postnorm import Exp3Options

    args = _common.parse(Exp3Options, ["--quick", "--set=n_layer=3"], "exp3", "doc")
    with pytest.raises(BabyGPTError, match="--set n_layer has no effect"):
        _common.budget_args(args, runs=runs)


def test_sweep_seeds_must_be_plain_integers():
    from babygpt.options import parse_into
    from babygpt.sweep import SWEEP_USAGE, SweepOptions

    with pytest.raises(BabyGPTError, match="--seeds must be comma-separated integers"):
        parse_into(SweepOptions, ["--grid=n_layer=2", "--seeds=\u00b2"], SWEEP_USAGE)


def test_undecodable_names_are_handled_as_bytes(tmp_path):
    from babygpt.files import path_problem

    name = os.fsdecode(b"run-\xff\xfe")  # not UTF-8: Python holds it with surrogate escapes
    assert path_problem(str(tmp_path / name)) is None
    assert Run({"norm_type": name * 100}, 0).name.endswith("__seed=0")
    with owned(str(tmp_path / name), distributed.Dist(), "cpu"):
        assert os.path.isdir(tmp_path / name)


def test_experiment_checks_its_data_before_claiming_the_output(tmp_path, monkeypatch):
    from exp4_grad_norm_at_init import Exp4Options

    args = _common.parse(Exp4Options, ["--quick", f"--data_dir={tmp_path / 'nodata'}"], "exp4", "doc")
    monkeypatch.setattr("babygpt.data.urllib.request.urlopen", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(BabyGPTError, match="could not download"):
        _common.claim(str(tmp_path / "out"), args, "exp4")
    assert not os.path.exists(tmp_path / "out")


def test_overwrite_never_deletes_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BabyGPTError, match="holds the current directory"):
        _common.claim(".", exp_args("--overwrite"), "exp1")
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("where", ["run", "claim"])
def test_a_lock_file_that_is_a_fifo_is_refused_by_name_instead_of_hanging(where, data_dir, tmp_path):
    """A FIFO opened for reading waits for a writer: the lock must not open it that way."""
    runs = [Run({"learning_rate": 1e-3}, 0)]
    sweep = Sweep(str(tmp_path / "sweep"), runs, sweep_args(data_dir, "--max_iters=5"))
    directory = sweep.out_dir(runs[0]) if where == "run" else os.path.join(sweep.root, "claims")
    os.makedirs(directory)
    fifo = os.path.join(directory, ".lock" if where == "run" else runs[0].name + ".lock")
    os.mkfifo(fifo)
    with pytest.raises(BabyGPTError, match=f"{fifo} is not a regular file; delete it"):
        sweep.run(progress=False)


ALL_EXPERIMENTS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "experiments"))
                         if f.startswith("exp") and f.endswith(".py"))


def text_options(name):
    """(experiment, option) for every option of the experiment that takes text (lists included)."""
    import dataclasses
    import importlib
    import typing

    module = importlib.import_module(name)
    cls = next(v for v in vars(module).values() if isinstance(v, type) and issubclass(v, _common.Options)
               and v.__module__ == name)
    hints = typing.get_type_hints(cls)
    return [(name, f.name) for f in dataclasses.fields(cls) if hints[f.name] in (str, typing.Optional[str])]


@pytest.mark.parametrize("name,option", [p for n in ALL_EXPERIMENTS for p in text_options(n)])
def test_an_empty_option_value_is_refused_not_read_as_absent(name, option, capsys):
    import importlib

    err = assert_refused_in_process(importlib.import_module(name).main, ["--quick", f"--{option}="], capsys)
    assert f"--{option} is empty" in err or "''" in err  # (or refused by the option's own check)


def test_a_file_where_overwrite_keeps_the_old_results_is_refused(tmp_path):
    out = str(tmp_path / "exp1")
    _common.claim(out, exp_args(), "exp1")
    (tmp_path / ".exp1.replaced").write_text("mine")
    before = files_of(tmp_path)
    with pytest.raises(BabyGPTError, match="exp1.replaced' is where --overwrite keeps .* not a directory"):
        _common.claim(out, exp_args("--quick", "--overwrite"), "exp1")
    assert files_of(tmp_path) == before
