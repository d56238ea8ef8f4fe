"""Sweeps beyond one process: shards of one run list, claims on runs, retries of what a dead shard
left, --collect, and one GPU per job (babygpt.scaleout). The sharded experiment itself is checked
against a one-process run in test_experiments (exp2)."""

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from babygpt.config import load_config, to_dict, with_resolved_dtype
from babygpt.errors import BabyGPTError, ShardDone
from babygpt.rundir import RunLock
from babygpt.scaleout import DeviceSlots, Shard, claim, hold_shard, pinned_gpus, recorded_split, shard_state, \
    visible_gpus
from babygpt.sweep import DONE, SKIPPED, Run, Sweep, SweepOptions
from babygpt.options import parse_into
from conftest import ROOT, TINY_TRAIN_ARGS, assert_user_error, prepare_small_data
from test_collisions import wait_until

BASE = [a for a in TINY_TRAIN_ARGS if not a.startswith("--device")] + ["--device=cpu"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("scaleout"))


# ------------------------------------------------------------------ shards

@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_shards_split_the_run_list_into_disjoint_slices_that_cover_it(count):
    runs = [Run({"learning_rate": lr}, seed) for lr in (1e-3, 3e-3, 1e-2) for seed in (0, 1, 2)]
    slices = [Sweep("unused", runs, shard=Shard(k, count)).mine() for k in range(count)]
    names = [r.name for s in slices for r in s]
    assert sorted(names) == sorted(r.name for r in runs) and len(set(names)) == len(runs)
    assert max(map(len, slices)) - min(map(len, slices)) <= 1  # round-robin: balanced to one run


@pytest.mark.parametrize("text, parsed", [("0/4", Shard(0, 4)), ("3/4", Shard(3, 4)), (" 1 / 2 ", Shard(1, 2))])
def test_shard_parses_k_of_n(text, parsed):
    assert Shard.parse(text) == parsed and str(parsed) == f"{parsed.index}/{parsed.count}"


def test_bad_scale_out_options_are_reported_together():
    with pytest.raises(BabyGPTError) as e:
        parse_into(SweepOptions, ["--shard", "4/4", "--gpus", "0,a", "--grid", "norm_type=rmsnorm"], "usage")
    assert len(e.value.problems) == 2
    assert "--shard must be K/N with 0 <= K < N" in e.value.problems[0] and "got '4/4'" in e.value.problems[0]
    assert "--gpus must be comma-separated GPU indices" in e.value.problems[1]
    with pytest.raises(BabyGPTError, match="--collect trains nothing, so it takes no --shard"):
        parse_into(SweepOptions, ["--shard", "0/2", "--collect"], "usage")
    for bad in ("x", "1", "1/0", "-1/2", "2/1"):
        with pytest.raises(BabyGPTError, match="--shard must be K/N"):
            Shard.parse(bad)


@pytest.mark.parametrize("command", ["sweep", "experiment"])
def test_every_sweep_reads_its_set_options_as_it_parses_them(command):
    """experiments/sweep.py and every training experiment refuse a bad --set with their other options,
    before they look at --out: a key given twice, malformed, unknown, empty, of the wrong type or out of
    its declared range."""
    import _common

    options = SweepOptions if command == "sweep" else _common.TrainingOptions
    argv = ["--set", "max_iters=10", "--set", "max_iters=20", "--set", "help", "--set", "max_iter=3", "--set",
            "dropout=x", "--set", "data_dir=", "--set=device=tpu", "--set=beta2=1", "--jobs=0"]
    with pytest.raises(BabyGPTError) as e:
        parse_into(options, argv, "usage")
    assert e.value.problems == [
        "--jobs must be at least 1, got 0",
        "malformed --set 'help'; write --set key=value",
        "--set max_iter=3: unknown config key 'max_iter' (did you mean 'max_iters'?)",
        "--set dropout=x: dropout must be a finite number, got 'x'",
        "--set data_dir= was given an empty value; give data_dir a value, or leave that --set out",
        "--set device=tpu: unknown device 'tpu'; choose one of: auto, cpu, cuda, mps (did you mean 'cpu'?)",
        "--set beta2=1: beta2 must be in [0, 1), got 1.0",
        "--set max_iters is given 2 times (max_iters=10, max_iters=20); set each key once"]
    assert parse_into(options, ["--set", "max_iters=10", "--set=n_layer=2"], "usage").set == ["max_iters=10",
                                                                                               "n_layer=2"]


def test_shard_records_say_waiting_running_or_stopped(tmp_path):
    root, shard = str(tmp_path), Shard(1, 3)
    assert shard_state(root, shard) == "waiting" and recorded_split(root) is None
    lock = RunLock(os.path.join(root, "shards"), shard.file_name())  # as a running shard holds it
    assert lock.acquire() is None
    assert shard_state(root, shard) == "running" and recorded_split(root) == 3
    lock.release()  # as when that process exits, however it exits
    assert shard_state(root, shard) == "stopped"
    with pytest.raises(BabyGPTError, match="holds shards of another split"):
        hold_shard(root, Shard(0, 2))


def test_a_running_shard_is_not_started_twice(tmp_path):
    lock = RunLock(os.path.join(tmp_path, "shards"), Shard(0, 2).file_name())
    assert lock.acquire() is None  # (another process's record: a RunLock of our own is another open file)
    with pytest.raises(BabyGPTError, match="shard 0/2 of .* is already running"):
        hold_shard(str(tmp_path), Shard(0, 2))
    lock.release()


def test_a_claimed_run_is_skipped_and_nothing_is_started(tmp_path):
    run = Run({"learning_rate": 1e-3}, 0)
    sweep = Sweep(str(tmp_path), [run], BASE)
    held = claim(sweep.root, run.name)
    assert held.acquire() is None  # another process of the sweep trains it
    assert sweep._execute(run, DeviceSlots([], 1)) == SKIPPED
    assert not os.path.exists(os.path.join(tmp_path, "logs")) and not os.path.exists(sweep.out_dir(run))
    held.release()


@pytest.mark.parametrize("owner_state", ["waiting", "running", "stopped"])
def test_a_shard_takes_another_shards_run_only_once_that_shard_has_stopped(tmp_path, owner_state):
    """Run 1 belongs to shard 1/2. Shard 0 leaves it to shard 1 while shard 1 is yet to start or
    runs, and retries it once shard 1 has stopped without finishing it (a dead shard)."""
    runs = [Run({"learning_rate": 1e-3}, 0), Run({"learning_rate": 1e-3}, 1)]
    sweep = Sweep(str(tmp_path), runs, BASE, shard=Shard(0, 2))
    record = RunLock(os.path.join(tmp_path, "shards"), Shard(1, 2).file_name())
    if owner_state != "waiting":
        assert record.acquire() is None
    if owner_state == "stopped":
        record.release()
    assert sweep._abandoned(runs[1]) is (owner_state == "stopped")
    assert sweep._abandoned(runs[0])  # its own, free
    for run in runs:  # a claimed run is never taken, whoever owns it
        held = claim(sweep.root, run.name)
        assert held.acquire() is None
        assert not sweep._abandoned(run)
        held.release()
    record.release()


def finished(sweep, run):
    """Mark ``run`` done on disk, as another process that trained it would have left it."""
    os.makedirs(sweep.out_dir(run), exist_ok=True)
    with open(os.path.join(sweep.out_dir(run), "config.json"), "w") as f:  # the settings it was asked for
        json.dump({"config": to_dict(with_resolved_dtype(load_config(sweep._config_args(run))))}, f)
    with open(os.path.join(sweep.out_dir(run), "summary.json"), "w") as f:
        json.dump({"status": "finished", "iter": 5, "val_loss_full": 2.5, "final_val_loss": 2.5,
                   "best_val_loss": 2.5}, f)


def test_a_shard_in_a_first_phase_waits_for_the_other_shards_runs(data_dir, tmp_path):
    """Shard 0/2's own run is done; shard 1/2 is running its run. With ``wait`` (an experiment's
    first phase) shard 0 waits, training nothing, until that run is done, then returns every row;
    in the last phase it stops at once with what to do next (ShardDone)."""
    runs = [Run({"learning_rate": 1e-3}, 0), Run({"learning_rate": 1e-3}, 1)]
    sweep = Sweep(str(tmp_path), runs, BASE + [f"--data_dir={data_dir}"], shard=Shard(0, 2))
    finished(sweep, runs[0])
    other = RunLock(os.path.join(tmp_path, "shards"), Shard(1, 2).file_name())
    assert other.acquire() is None  # shard 1 runs
    waiting, result = threading.Event(), {}

    class Wake(threading.Event):
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(0.01)

    sweep.signals.wake = Wake()
    thread = threading.Thread(target=lambda: result.update(rows=sweep.run(progress=False, wait=True)))
    thread.start()
    assert waiting.wait(timeout=60) and thread.is_alive() and "rows" not in result
    finished(sweep, runs[1])  # shard 1 finishes its run
    thread.join(timeout=60)
    other.release()
    assert [r["status"] for r in result["rows"]] == ["finished", "finished"] and sweep.exit_codes == {}
    assert not os.path.exists(os.path.join(tmp_path, "logs"))  # it trained nothing

    import _common  # (experiments/, put on the path by test_collisions)
    last = Sweep(str(tmp_path), runs, BASE + [f"--data_dir={data_dir}"], shard=Shard(0, 2))
    with pytest.raises(ShardDone, match="shard 0/2: done; 2 of 2 runs"):
        _common.finished_rows(last)


# ------------------------------------------------------------------ one GPU per job

def test_job_slots_put_one_job_on_each_gpu_before_doubling_up():
    """All jobs hold their slot at once (a barrier): each GPU holds exactly jobs / GPUs of them."""
    for gpus, jobs, expected in ((["0", "1"], 2, {"0": 1, "1": 1}), (["0", "1"], 4, {"0": 2, "1": 2}),
                                 (["3"], 3, {"3": 3}), ([], 2, {None: 2})):
        slots, barrier, seen = DeviceSlots(gpus, jobs), threading.Barrier(jobs), []

        def job(_):
            with slots.take() as gpu:
                seen.append(gpu)
                barrier.wait(timeout=30)  # every job is holding its slot now

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(job, range(3 * jobs)))  # three rounds: slots are given back and reused
        assert Counter(seen) == Counter({g: 3 * n for g, n in expected.items()})


def test_gpu_indices_follow_the_schedulers_allocation(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # e.g. what Slurm's --gres=gpu:2 gave this job
    assert visible_gpus() == ["5", "7"]
    assert pinned_gpus(None, visible_gpus()) == ["5", "7"] and pinned_gpus([1, 1], visible_gpus()) == ["7", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus() == ["0", "1"]
    with pytest.raises(BabyGPTError, match=r"--gpus 2: only 2 GPU\(s\) are visible"):
        pinned_gpus([0, 2], ["0", "1"])
    with pytest.raises(BabyGPTError, match="no CUDA GPU visible; drop --gpus"):
        pinned_gpus([0], [])
    assert pinned_gpus(None, []) == []  # CPU: no pinning


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.slow
def test_each_job_runs_on_its_own_gpu(data_dir, tmp_path):
    runs = [Run({"learning_rate": lr}, 0) for lr in (1e-3, 2e-3, 3e-3, 4e-3)]
    gpus = visible_gpus()
    args = [a for a in BASE if not a.startswith("--device")] + [f"--data_dir={data_dir}", "--max_iters=5",
                                                               "--device=cuda"]
    sweep = Sweep(str(tmp_path / "sw"), runs, args, jobs=len(gpus))
    assert all(r["status"] in DONE for r in sweep.run(progress=False))
    pinned = []
    for run in runs:
        with open(os.path.join(sweep.root, "logs", run.name + ".log")) as f:
            pinned += [line.split("=", 1)[1].strip() for line in f if line.startswith("[sweep] CUDA_VISIBLE_DEVICES=")]
    assert len(pinned) == len(runs) and set(pinned) <= set(gpus)
    assert len(set(pinned)) == min(len(gpus), len(runs))


# ------------------------------------------------------------------ shards as processes

def in_process(argv, capsys):
    """experiments/sweep.py's exit code, stdout and stderr, run in this process (no second torch import)."""
    from babygpt import cli, sweep

    code = cli.run(sweep.main, argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sweep_cli(out, data_dir, *extra):
    return [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"), "--grid", "learning_rate=1e-3,3e-3",
            "--seeds", "0", "--out", str(out), *[f"--set={a[2:]}" for a in BASE], f"--set=data_dir={data_dir}",
            "--set=max_iters=100", *extra]  # (BASE evaluates every 10 iterations)


@pytest.mark.slow
def test_three_shards_then_collect_give_the_table_of_one_process(data_dir, tmp_path, monkeypatch, capsys):
    """Three shards of one sweep, started together as three processes writing into one directory,
    then --collect: the same results.csv as one process running the whole sweep, but for the
    columns of time, exit codes (unknown to --collect) and where the run lives."""
    def command(out, *extra):
        return ["--grid", "norm_type=layernorm,rmsnorm,scalenorm", "--seeds", "0", "--out", str(out),
                *[f"--set={a[2:]}" for a in BASE], f"--set=data_dir={data_dir}", "--set=max_iters=5", *extra]

    # One thread per run everywhere: the same floating-point sums in every process, and the one
    # process (this one, in the meantime) and the three shards do not thrash two cores.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    shards = [subprocess.Popen([sys.executable, os.path.join(ROOT, "experiments", "sweep.py"),
                                *command(tmp_path / "sh", "--shard", f"{k}/3")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(3)]
    assert in_process(command(tmp_path / "one"), capsys)[0] == 0
    for k, shard in enumerate(shards):
        out, err = shard.communicate(timeout=300)
        assert shard.returncode == 0 and f"shard {k}/3: done" in out, err[-2000:]
    assert not (tmp_path / "sh" / "results.csv").exists()  # the table is --collect's
    code, _, err = in_process(command(tmp_path / "sh", "--collect"), capsys)
    assert code == 0, err

    def table(path):
        with open(path, newline="") as f:
            return [{k: v for k, v in row.items() if k not in ("exit_code", "wall_time_s", "val_time_full_s", "out_dir")}
                    for row in csv.DictReader(f)]
    assert table(tmp_path / "sh" / "results.csv") == table(tmp_path / "one" / "results.csv")
    assert len(table(tmp_path / "one" / "results.csv")) == 3


@pytest.mark.slow
def test_collect_reads_dtype_auto_as_each_runs_device_meant_it_and_refuses_a_mixed_table(data_dir, tmp_path,
                                                                                         monkeypatch):
    """Runs made on a GPU (dtype=auto: bfloat16 there) are collected on a CPU, where auto means float32:
    --collect judges each run by its own device, while training more runs here is still refused (they
    would be float32 beside bfloat16). A table that mixes a GPU's runs and a CPU's is refused by
    --collect, naming one run of each kind; and auto never meant bfloat16 on a CPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the runs train on the CPU even where a GPU is
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    base = [a for a in BASE if not a.startswith("--device")] + ["--device=auto", f"--data_dir={data_dir}",
                                                                "--max_iters=5"]
    runs = [Run({"learning_rate": 1e-3}, 0), Run({"learning_rate": 1e-3}, 1)]
    root = str(tmp_path / "sw")
    Sweep(root, runs, base).run(progress=False)

    def recorded_as(run, device, dtype):  # the run's stored record, as if it had been made there
        path = os.path.join(root, "runs.jsonl")
        with open(path) as f:
            records = [json.loads(line) for line in f]
        for record in records:
            if record["name"] == run.name:
                record["config"]["device"], record["config"]["config"]["dtype"] = device, dtype
        with open(path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))

    os.remove(os.path.join(root, "results.csv"))  # the training sweep's table; --collect writes its own
    recorded_as(runs[0], "cuda", "bfloat16")
    with pytest.raises(BabyGPTError, match=r"mixes runs made on different devices or dtypes: bfloat16 on cuda "
                                           r"\(e.g. learning_rate=0.001__seed=0\); float32 on cpu \(e.g. "
                                           r"learning_rate=0.001__seed=1\)"):
        Sweep(root, runs, base, collect=True).run(progress=False)
    assert not os.path.exists(os.path.join(root, "results.csv"))
    recorded_as(runs[1], "cuda:0", "bfloat16")
    rows = Sweep(root, runs, base, collect=True).run(progress=False)
    assert [row["name"] for row in rows] == [run.name for run in runs] and all(row["status"] in DONE for row in rows)
    assert os.path.exists(os.path.join(root, "results.csv"))
    with pytest.raises(BabyGPTError, match=r"holds the run .* with other settings \(dtype='bfloat16' there, 'float32' "
                                           r"now\)"):
        Sweep(root, runs, base).check()
    recorded_as(runs[1], "cpu", "bfloat16")
    with pytest.raises(BabyGPTError, match=r"learning_rate=0.001__seed=1 with other settings "
                                           r"\(dtype='bfloat16' there, 'auto' now\)"):
        Sweep(root, runs, base, collect=True).check()


@pytest.mark.slow
def test_a_dead_shards_runs_are_retried_and_collect_waits_for_them(data_dir, tmp_path, capsys):
    """Shard 1/2 dies (its sweep and its train.py are killed, as when a node goes down) in the middle
    of its run. --collect refuses, naming what is missing; shard 0/2 trains its own run, then resumes
    the dead shard's from its checkpoint; then --collect writes the table."""
    out = tmp_path / "sw"
    dying = subprocess.Popen(sweep_cli(out, data_dir, "--shard", "1/2"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    first = out / "runs" / "learning_rate=0.003__seed=0"  # position 1 of 2: shard 1's run
    wait_until(lambda: (first / "ckpt.pt").exists(), dying, "the shard's first checkpoint")
    trainer = RunLock(str(first)).holder()
    dying.send_signal(signal.SIGKILL)
    dying.wait()
    assert trainer, "the shard's train.py holds its run directory"
    os.kill(trainer, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while RunLock(str(first)).holder() is not None:  # gone once the kernel has closed its files
        assert time.monotonic() < deadline, "the killed train.py still holds its run directory"
        time.sleep(0.01)

    code, _, err = in_process(sweep_cli(out, data_dir, "--collect")[2:], capsys)
    assert_user_error(err, code, "2 runs in", "have not finished", "shard 1/2 stopped",
                      "run the shards that own them again")
    assert not (out / "results.csv").exists()

    # Shard 0/2 in this process (its train.py runs are processes, as always): it holds its shard
    # record until this process exits, as a shard process does until it exits.
    code, shard_out, err = in_process(sweep_cli(out, data_dir, "--shard", "0/2")[2:], capsys)
    assert code == 0, err[-3000:]
    assert "shard 0/2: done; 2 of 2 runs of the sweep have finished" in shard_out
    assert (first / "summary.json").exists()
    with open(first / "config.json") as f:
        assert len(json.load(f)["resumes"]) == 1  # resumed from the dead shard's checkpoint, not restarted

    code, _, err = in_process(sweep_cli(out, data_dir, "--collect")[2:], capsys)
    assert code == 0, err
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["status"] in DONE for r in rows)
    # no run was trained twice: one training start per log, but the resumed run's second start
    starts = {r["name"]: open(out / "logs" / (r["name"] + ".log")).read().count("training on ") for r in rows}
    assert starts == {r["name"]: 2 if r["name"] == first.name else 1 for r in rows}


def test_shard_refusals_are_one_line_and_change_nothing(data_dir, tmp_path, capsys):
    code, _, err = in_process(sweep_cli(tmp_path / "none", data_dir, "--collect")[2:], capsys)
    assert_user_error(err, code, "2 runs in", "have not finished")
    assert not (tmp_path / "none").exists()
    other = tmp_path / "other"
    RunLock(str(other / "shards"), Shard(0, 3).file_name()).acquire()  # a 3-way split was started here
    code, _, err = in_process(sweep_cli(other, data_dir, "--shard", "0/2")[2:], capsys)
    assert_user_error(err, code, "holds shards of another split (0-of-3)")
    assert sorted(os.listdir(other)) == ["shards"]


def test_the_slurm_job_script_gives_each_task_its_shard(tmp_path):
    """docs/slurm_sweep.sh as a job array's task runs it: task 1 of 4 runs the experiment with
    --out and --shard 1/4 and the script's own arguments (a stand-in experiment prints its argv)."""
    script = os.path.join(ROOT, "docs", "slurm_sweep.sh")
    stand_in = tmp_path / "experiment.py"
    stand_in.write_text("import sys; print(sys.argv[1:])\n")
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4", "PYTHON": sys.executable,
           "EXPERIMENT": str(stand_in), "OUT": "results/exp2_cluster"}
    task = subprocess.run(["bash", script, "--configs", "config/prenorm_ln.py"], env=env, capture_output=True, text=True)
    assert task.returncode == 0, task.stderr
    assert task.stdout.strip() == str(["--out", "results/exp2_cluster", "--shard", "1/4", "--configs", "config/prenorm_ln.py"])
    del env["SLURM_ARRAY_TASK_ID"]
    outside = subprocess.run(["bash", script], env=env, capture_output=True, text=True)
    assert outside.returncode != 0 and "run this with sbatch --array" in outside.stderr
