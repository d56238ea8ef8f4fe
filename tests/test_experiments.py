"""The sweep engine, the plot module and every experiment's --quick mode."""

import csv
import os
import subprocess
import sys

import pytest

from babygpt.errors import BabyGPTError
from babygpt.plot import diverged_at, load_run
from babygpt.state import COMPLETED
from babygpt.sweep import DONE, Run, Sweep, grid
from conftest import ROOT, TINY_TRAIN_ARGS, prepare_small_data, run_script

BASE = [a for a in TINY_TRAIN_ARGS if not a.startswith("--device")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("exp"))


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_experiment_options_are_checked_before_anything_runs(monkeypatch):
    """The experiments share babygpt.options' command line; their own checks report together."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    from exp3_prenorm_vs_postnorm import Exp3Options

    args = _common.parse(Exp3Options, ["--quick", "--set", "max_iters=3", "--set=seed=1", "--placements",
                                       "pre,sandwich"], "exp3_prenorm_vs_postnorm", "doc")
    assert args.quick and args.set == ["max_iters=3", "seed=1"] and args.placements == "pre,sandwich"
    assert args.data_dir == "data/shakespeare_char" and args.jobs == 1 and args.out is None
    with pytest.raises(BabyGPTError, match="unknown placement 'side'") as e:
        _common.parse(Exp3Options, ["--placements=pre,side", "--depths=4,x"], "exp3_prenorm_vs_postnorm", "doc")
    assert len(e.value.problems) == 2
    with pytest.raises(BabyGPTError, match="did you mean '--placements'"):
        _common.parse(Exp3Options, ["--placement=pre"], "exp3_prenorm_vs_postnorm", "doc")


def test_grid_and_run_names():
    combos = grid({"norm_type": ["layernorm", "rmsnorm"], "learning_rate": [1e-3, 3e-3]})
    assert len(combos) == 4 and {"norm_type": "rmsnorm", "learning_rate": 3e-3} in combos
    run = Run({"norm_type": "rmsnorm", "learning_rate": 0.001}, seed=2, config="config/prenorm_ln.py")
    assert run.name == "prenorm_ln__norm_type=rmsnorm__learning_rate=0.001__seed=2"
    with pytest.raises(BabyGPTError, match="unknown config key"):
        Run({"learnig_rate": 1e-3}, 0)


DIVERGING = {"norm_type": "none", "learning_rate": 1e3, "weight_decay": 0.0, "grad_clip": 0.0, "warmup_iters": 0,
             "min_lr": 0.0, "log_interval": 1}


@pytest.fixture(scope="module")
def small_sweep(data_dir, tmp_path_factory):
    """A finished two-run sweep: one normal run, one that diverges."""
    runs = [Run({"norm_type": "rmsnorm"}, 0), Run(DIVERGING, 0)]
    sweep = Sweep(str(tmp_path_factory.mktemp("sweep")), runs,
                  BASE + [f"--data_dir={data_dir}", "--max_iters=20"], jobs=2)
    return sweep, runs, sweep.run(progress=False)


@pytest.mark.slow
def test_sweep_runs_skips_finished_resumes_killed_and_reads_divergence(small_sweep):
    sweep, runs, first = small_sweep
    rows = {r["name"]: r for r in first}
    ok, bad = rows[runs[0].name], rows[runs[1].name]
    assert ok["status"] in COMPLETED and ok["exit_code"] == 0 and ok["final_val_loss"] < 3.4
    assert bad["status"] == "diverged" and bad["exit_code"] == 3 and bad["diverged_at"] >= 1
    on_disk = read_csv(os.path.join(sweep.root, "results.csv"))
    assert on_disk[0]["status"] in COMPLETED and on_disk[1]["status"] == "diverged"
    assert on_disk[0]["cfg.norm_type"] == "rmsnorm" and int(on_disk[0]["num_params"]) > 0

    # Done runs are not run again.
    summary = os.path.join(sweep.out_dir(runs[0]), "summary.json")
    before = os.stat(summary).st_mtime_ns
    rows = sweep.run(progress=False)
    assert os.stat(summary).st_mtime_ns == before and rows[0]["exit_code"] is None

    # A run killed after its last checkpoint (no summary.json) resumes instead of starting over:
    # with nothing left to train, it only gets its summary back; its other files are untouched.
    os.remove(summary)
    kept = {name: os.stat(os.path.join(sweep.out_dir(runs[0]), name)).st_mtime_ns
            for name in ("ckpt.pt", "metrics.jsonl", "config.json")}
    rows = sweep.run(progress=False)
    assert rows[0]["status"] in COMPLETED and rows[0]["exit_code"] == 0 and os.path.exists(summary)
    assert {name: os.stat(os.path.join(sweep.out_dir(runs[0]), name)).st_mtime_ns for name in kept} == kept

    # Finished runs made with other settings are never mixed into the results.
    other = Sweep(sweep.root, runs, sweep.base_args[:-1] + ["--max_iters=30"])
    with pytest.raises(BabyGPTError, match="was run with other settings"):
        other.run(progress=False)


@pytest.mark.slow
def test_sweep_cli(data_dir, tmp_path):
    proc = run_script("experiments/sweep.py", "--grid", "norm_type=layernorm,rmsnorm", "--seeds", "0",
                      "--out", "sw", *[f"--set={a[2:]}" for a in BASE], f"--set=data_dir={data_dir}",
                      "--set=max_iters=5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert all(r["status"] in COMPLETED for r in read_csv(tmp_path / "sw" / "results.csv"))
    bad = run_script("experiments/sweep.py", "--grid", "norm_typ=layernorm", cwd=tmp_path)
    assert bad.returncode == 2 and "unknown config key" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_plot_cli_and_divergence_marker(small_sweep, tmp_path):
    sweep, runs, _ = small_sweep
    assert diverged_at(load_run(sweep.out_dir(runs[1]))) is not None
    assert diverged_at(load_run(sweep.out_dir(runs[0]))) is None
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "babygpt.plot", *[sweep.out_dir(r) for r in runs],
                           "--out", "curves.png"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "curves.png").stat().st_size > 0
    proc = subprocess.run([sys.executable, "-m", "babygpt.plot", str(tmp_path / "nothing")],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "no metrics.jsonl" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script,extra,outputs", [
    ("exp1_gradient_vanishing", [], ["gradient_vanishing.png", "gradient_vanishing.csv", "report.md"]),
    ("exp4_grad_norm_at_init", ["--data_dir={data}", "--placements=pre,post,sandwich,deepnorm"],
     ["grad_norm_at_init.png", "grad_norm_at_init.csv", "report.md"]),
    ("exp3_prenorm_vs_postnorm", ["--data_dir={data}", "--jobs=2"], ["prenorm_vs_postnorm.png", "results.csv", "report.md"]),
    ("exp2_norm_comparison", ["--data_dir={data}", "--jobs=2"],
     ["norm_comparison.png", "lr_tolerance.png", "results.csv", "report.md"]),
])
def test_experiment_quick_mode(script, extra, outputs, data_dir, tmp_path):
    args = [a.format(data=data_dir) for a in extra]
    proc = run_script(f"experiments/{script}.py", "--quick", "--out=res", *args, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in outputs:
        assert (tmp_path / "res" / name).stat().st_size > 0, name
    report = (tmp_path / "res" / "report.md").read_text()
    assert "| " in report and "Command: `python experiments/" in report
    if script == "exp2_norm_comparison":
        for config in ("prenorm_none", "postnorm_ln", "prenorm_ln", "prenorm_rms", "postnorm_rms"):
            assert f"| {config} |" in report
        assert all(r["status"] in DONE for r in read_csv(tmp_path / "res" / "results.csv"))
    if script == "exp3_prenorm_vs_postnorm":
        assert len(read_csv(tmp_path / "res" / "results.csv")) == 4  # 1 depth x 2 placements x 2 warmups


@pytest.mark.slow
def test_exp5_norm_speed_quick_mode(data_dir, tmp_path):
    """Every implementation (the registry, read now, the from-scratch formulas of classes that call
    a fused kernel, and PyTorch's two) gets a timing row per
    pass and width, and every norm_type a training-speed row; --quick compiles nothing."""
    from babygpt.norms import NORMS, norm_class

    proc = run_script("experiments/exp5_norm_speed.py", "--quick", "--out=res", f"--data_dir={data_dir}",
                      cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = tmp_path / "res"
    for name in ("norm_speed.csv", "end_to_end.csv", "norm_speed.png", "report.md"):
        assert (res / name).stat().st_size > 0, name
    formulas = [f"{n} formula" for n, entry in NORMS.items() if hasattr(norm_class(entry), "formula")]
    assert "layernorm formula" in formulas  # the from-scratch LayerNorm is timed beside the fused one
    impls = [*NORMS, *formulas, "F.layer_norm", "F.rms_norm"]
    rows = read_csv(res / "norm_speed.csv")
    assert {r["mode"] for r in rows} == {"eager"}
    for impl in impls:
        mine = [r for r in rows if r["impl"] == impl and r["dtype"] == "float32" and r["device"] == "cpu"]
        assert {(r["pass"], r["width"]) for r in mine} == {(p, w) for p in ("fwd", "fwdbwd") for w in ("128", "512")}
        assert all(r["status"] == "ok" and float(r["us"]) > 0 for r in mine), impl
    e2e = {r["norm_type"]: r for r in read_csv(res / "end_to_end.csv")}
    assert set(e2e) == set(NORMS)
    assert all(float(r["tokens_per_s"]) > 0 for r in e2e.values() if r["status"] == "ok")
    report = (res / "report.md").read_text()
    assert "Command: `python experiments/exp5_norm_speed.py" in report and "## Answer" in report
    assert "| width | mode | " + " | ".join(impls) + " |" in report


@pytest.mark.slow
def test_exp5_norm_speed_rejects_unmeasured_compile_width(tmp_path):
    proc = run_script("experiments/exp5_norm_speed.py", "--quick", "--compile_widths=100", cwd=tmp_path)
    assert proc.returncode == 2 and "--compile_widths must be among" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "results").exists()


def test_sweep_options_report_every_problem_together():
    from babygpt.options import parse_into
    from babygpt.sweep import SWEEP_USAGE, SweepOptions

    with pytest.raises(BabyGPTError) as err:
        parse_into(SweepOptions, ["nope.py", "--grid", "x", "--seeds", "a,1", "--jobs", "0", "--sed=1",
                                  "--grid=n_layer=1,2", "--grid=n_layer=3"], SWEEP_USAGE)
    joined = "\n".join(err.value.problems)
    for fragment in ("malformed --grid 'x'", "--seeds must be comma-separated integers", "--jobs must be at least 1",
                     "config file 'nope.py' not found", "unknown option '--sed' (did you mean '--seeds'?)",
                     "--grid n_layer is given 2 times"):
        assert fragment in joined
    ok = parse_into(SweepOptions, ["--grid", "norm_type=layernorm,rmsnorm", "--grid=learning_rate=1e-3",
                                   "--seeds", "0,1"], SWEEP_USAGE)
    assert ok.axes() == {"norm_type": ["layernorm", "rmsnorm"], "learning_rate": [1e-3]} and ok.seed_list() == [0, 1]
