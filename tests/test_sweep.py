"""The sweep engine (babygpt/sweep.py, babygpt/sweepdir.py and experiments/sweep.py's command line):
grids and run names, running a sweep (finished runs skipped, killed ones resumed, divergence read,
runs made with other settings refused) and its options."""

import csv
import json
import os
import sys

import pytest

from babygpt.errors import BabyGPTError
from babygpt.state import COMPLETED
from babygpt.sweep import Run, Sweep, grid
from conftest import ROOT, TINY_TRAIN_ARGS, assert_refused_in_process, prepare_small_data, run_script

sys.path.insert(0, os.path.join(ROOT, "experiments"))  # the experiments' _common, for the directories they make

BASE = [a for a in TINY_TRAIN_ARGS if not a.startswith("--device")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("data"))


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_grid_and_run_names():
    combos = grid({"norm_type": ["layernorm", "rmsnorm"], "learning_rate": [1e-3, 3e-3]})
    assert len(combos) == 4 and {"norm_type": "rmsnorm", "learning_rate": 3e-3} in combos
    run = Run({"norm_type": "rmsnorm", "learning_rate": 0.001}, seed=2, config="config/prenorm_ln.py")
    # prenorm_ln.py sets norm_type, which the run overrides: its name leads with what it is
    assert run.name == "norm_type=rmsnorm__learning_rate=0.001__from=prenorm_ln__seed=2"
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
    # each row names the machine its run trained on, from the run's own summary.json
    from babygpt.runtime import cpu_name
    assert ok["machine"] == on_disk[0]["machine"] and ok["machine"].startswith(cpu_name() + ", ")

    # Done runs are not run again.
    summary = os.path.join(sweep.out_dir(runs[0]), "summary.json")
    before = os.stat(summary).st_mtime_ns
    rows = sweep.run(progress=False)
    assert os.stat(summary).st_mtime_ns == before and rows[0]["exit_code"] is None

    # A run killed after its last checkpoint (no summary.json, so never stored) resumes instead of
    # starting over: with nothing left to train, it only gets its summary back; its other files are untouched.
    os.remove(summary)
    edit_store(sweep.root, runs[0].name, None)
    kept = {name: os.stat(os.path.join(sweep.out_dir(runs[0]), name)).st_mtime_ns
            for name in ("ckpt.pt", "metrics.jsonl", "config.json")}
    rows = sweep.run(progress=False)
    assert rows[0]["status"] in COMPLETED and rows[0]["exit_code"] == 0 and os.path.exists(summary)
    assert {name: os.stat(os.path.join(sweep.out_dir(runs[0]), name)).st_mtime_ns for name in kept} == kept

    # Finished runs made with other settings are never mixed into the results.
    other = Sweep(sweep.root, runs, sweep.base_args[:-1] + ["--max_iters=30"])
    with pytest.raises(BabyGPTError, match=r"with other settings \(max_iters=20 there, 30 now\)"):
        other.run(progress=False)

    # A run made before a field existed (its config.json lacks the key) ran as that field's default:
    # it is reused where the field is at its default now, and refused where it is not.
    def made_before_z_loss(record):
        for start in [record["config"], *record["config"].get("resumes", [])]:
            start["config"].pop("z_loss")
        return record

    edit_store(sweep.root, runs[0].name, made_before_z_loss)
    assert sweep.run(progress=False)[0]["exit_code"] is None  # found done, not run again
    # Without the directory's bindings (a fresh clone: run_settings/ is not committed), config.json decides.
    import shutil

    shutil.rmtree(os.path.join(sweep.root, "run_settings"))
    with pytest.raises(BabyGPTError, match="holds the run .* with other settings .z_loss=0.0 there, 0.0001 now"):
        Sweep(sweep.root, runs, sweep.base_args + ["--z_loss=1e-4"]).run(progress=False)


def edit_store(root, name, change):
    """Rewrite the run ``name``'s line of the sweep's runs.jsonl by ``change`` (None: drop the line)."""
    path = os.path.join(root, "runs.jsonl")
    with open(path) as f:
        records = [json.loads(line) for line in f]
    kept = [r if r["name"] != name else change(r) for r in records if r["name"] != name or change is not None]
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in kept))


@pytest.mark.slow
def test_sweep_cli(data_dir, tmp_path, monkeypatch, capsys):
    proc = run_script("experiments/sweep.py", "--grid", "norm_type=layernorm,rmsnorm", "--seeds", "0",
                      "--out", "sw", *[f"--set={a[2:]}" for a in BASE], f"--set=data_dir={data_dir}",
                      "--set=max_iters=5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert all(r["status"] in COMPLETED for r in read_csv(tmp_path / "sw" / "results.csv"))
    # A bad grid is refused before anything runs (experiments/sweep.py's main, here in this process).
    from babygpt import sweep

    monkeypatch.chdir(tmp_path)
    assert_refused_in_process(sweep.main, ["--grid", "norm_typ=layernorm"], capsys, "unknown config key")


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


def test_a_sweep_run_that_overrides_its_config_is_named_by_the_override():
    import os

    from babygpt.sweep import Run
    from conftest import ROOT

    config = os.path.join(ROOT, "config", "prenorm_rms.py")
    assert Run({"norm_type": "layernorm"}, 0, config).name == "norm_type=layernorm__from=prenorm_rms__seed=0"
    assert Run({"learning_rate": 1e-3}, 0, config).name == "prenorm_rms__learning_rate=0.001__seed=0"  # unchanged


def test_a_key_set_twice_is_refused_by_name():
    """--set is repeatable, but each key once: of two values the last would silently win."""
    from babygpt.options import parse_into
    from babygpt.sweep import SWEEP_USAGE, SweepOptions

    with pytest.raises(BabyGPTError) as err:
        parse_into(SweepOptions, ["--set", "max_iters=10", "--set=n_layer=2", "--set", "max_iters=20",
                                  "--jobs=1", "--jobs", "2"], SWEEP_USAGE)
    assert err.value.problems == ["--jobs is given 2 times ('1', '2'); give it once",
                                  "--set max_iters is given 2 times (max_iters=10, max_iters=20); set each key once"]


@pytest.mark.parametrize("option", ["reuse", "shard", "gpus", "out", "seeds", "jobs", "set", "grid", "collect"])
def test_an_empty_option_value_is_refused_not_read_as_absent(option, tmp_path, monkeypatch, capsys):
    """``--reuse=`` would read as no --reuse at all, ``--out=`` as the current directory."""
    from babygpt import sweep

    monkeypatch.chdir(tmp_path)
    collect = [] if option == "collect" else ["--collect"]  # (nothing to train, whatever the option is read as)
    for argv in ([f"--{option}="], [f"--{option}", ""]):
        err = assert_refused_in_process(sweep.main, ["--grid", "learning_rate=1e-3", *collect, *argv], capsys)
        assert err == f"error: --{option} was given an empty value ''; give it a value, or leave it out for its " \
                      f"default\n", argv
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("spec, lines", [
    ("n_layer=1,,2", ["--grid n_layer has an empty entry in '1,,2'"]),
    ("n_layer=,", ["--grid n_layer has an empty entry in ','"]),
    ("dtype=float32,", ["--grid dtype has an empty entry in 'float32,'"]),
    ("n_layer= ,2", ["--grid n_layer has an empty entry in ' ,2'"]),
    ("=1,2", ["malformed --grid '=1,2'"]),
    # the run's own --seeds (0) replaced a grid's seed: every run trained at seed 0
    ("seed=1,2", ["--grid seed has no effect: each run's seed is set by --seeds; list the seeds there instead"]),
    ("seed=1,,2", ["--grid seed has an empty entry in '1,,2'", "--grid seed has no effect"]),
    ("seed=", ["malformed --grid 'seed='", "--grid seed has no effect"]),
    ("out_dir=a,b", ["--grid out_dir has no effect: each run's out_dir is set by --out; drop it"]),
])
def test_a_grid_axis_with_an_empty_value_or_a_key_the_sweep_sets_is_refused_by_name(spec, lines, tmp_path,
                                                                                     monkeypatch, capsys):
    """Used or refused: an empty value would be dropped, or read as a value nobody gave (seed=1,,2
    made three runs, all at seed 0), and a grid over a key the sweep sets for every run itself would
    be replaced by it. One line per problem, nothing written."""
    from babygpt import sweep

    monkeypatch.chdir(tmp_path)
    err = assert_refused_in_process(sweep.main, ["--grid", spec, "--collect"], capsys, *lines)
    assert len(err.splitlines()) == len(lines), err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, option", [(["--reuse=,"], "reuse"), (["--reuse", "a,,b"], "reuse"),
                                          (["--reuse=a,"], "reuse"), (["--seeds=0,,1"], "seeds")])
def test_an_empty_entry_of_a_comma_separated_sweep_option_is_refused(argv, option, tmp_path, monkeypatch, capsys):
    """``--reuse ,`` read as no --reuse at all, and ``--reuse a,,b`` as a,b: refused by name."""
    from babygpt import sweep

    monkeypatch.chdir(tmp_path)
    err = assert_refused_in_process(sweep.main, ["--grid", "learning_rate=1e-3", "--collect", *argv], capsys)
    assert err == f"error: --{option} has an empty entry in {argv[-1].partition('=')[2] or argv[-1]!r}; give its " \
                  f"comma-separated values with none empty or blank (no comma doubled or at either end)\n"
    assert os.listdir(tmp_path) == []


def test_a_sweep_directory_given_twice_to_reuse_is_refused(tmp_path, monkeypatch, capsys):
    """Each directory is read once: the second mention would silently change nothing."""
    from babygpt import sweep

    monkeypatch.chdir(tmp_path)
    assert_refused_in_process(sweep.main, ["--grid", "learning_rate=1e-3", "--collect", "--reuse=old,old"], capsys,
                              "--reuse lists old more than once; give each once")
    assert os.listdir(tmp_path) == []


def test_base_arguments_give_each_key_once_the_later_value_replacing_the_earlier():
    """An experiment's --set replaces its tier's budget: train.py, which refuses a key given twice, is
    given the --set value alone."""
    run = Run({"learning_rate": 1e-3}, 0)
    sweep = Sweep("unused", [run], ["--max_iters=10", "--n_layer=2", "--max_iters=20"])
    args = sweep._config_args(run)
    assert args == ["--max_iters=20", "--n_layer=2", "--learning_rate=0.001", "--seed=0"]
    sweep.check(on_disk=False)
    assert sweep._wanted[run.name]["max_iters"] == 20


def exp1_args(*argv):
    import _common
    from exp1_gradient_vanishing import Exp1Options

    return _common.parse(Exp1Options, list(argv), "exp1_gradient_vanishing", "doc")


def files_of(root):
    """Every file under ``root`` with its bytes and modification time."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[path] = (f.read(), os.stat(path).st_mtime_ns)
    return out


def test_a_sweep_refuses_an_experiments_directory_naming_a_bad_set_too(tmp_path, monkeypatch, capsys):
    """A sweep's runs and results.csv written into an experiment's results would mix with them, and
    its settings.json would no longer say what made them: refused before anything is written, with
    every other problem of the command (a bad --set is reported, not hidden behind the directory)."""
    import _common
    from babygpt import sweep

    monkeypatch.chdir(tmp_path)
    _common.claim("exp1", exp1_args(), "exp1")
    before = files_of(tmp_path)
    for argv in (["--out=exp1", "--collect"], ["--out", "exp1"]):
        assert_refused_in_process(sweep.main, ["--grid", "learning_rate=1e-3", *argv], capsys,
                                  "holds the results of experiment exp1", "use another --out")
    err = assert_refused_in_process(sweep.main, ["--grid", "learning_rate=1e-3", "--out=exp1", "--set", "max_iter=3",
                                                 "--set", "dropout=x"], capsys)
    assert "--set max_iter=3: unknown config key 'max_iter' (did you mean 'max_iters'?)" in err
    assert "--set dropout=x: dropout must be a finite number, got 'x'" in err
    assert "holds the results of experiment exp1" in err and len(err.splitlines()) == 3
    # a sweep of its own below an experiment's results is the sweep's (experiment 14 reads such sweeps)
    err = assert_refused_in_process(sweep.main, ["--grid", "learning_rate=1e-3", "--out", os.path.join("exp1", "arm"),
                                                 "--collect"], capsys, "have not finished")
    assert "experiment" not in err
    assert files_of(tmp_path) == before


def test_an_experiment_refuses_a_sweeps_directory(tmp_path, monkeypatch):
    """The other way round: a directory a sweep made has no settings.json, and an experiment refuses
    files of unknown origin (and finds nothing of its own there to --collect)."""
    import _common
    from babygpt.experimentdir import OutputDir

    monkeypatch.chdir(tmp_path)
    made = Sweep("sweep", [Run({"learning_rate": 1e-3}, 0)], ["--max_iters=5"])
    made.check()
    made.bind()
    before = files_of(tmp_path)
    with pytest.raises(BabyGPTError, match="sweep holds files without a settings.json"):
        _common.claim("sweep", exp1_args(), "exp1")
    with pytest.raises(BabyGPTError, match="nothing to collect in 'sweep'"):
        OutputDir("sweep", {"experiment": "exp7"}, collect=True).check()
    assert files_of(tmp_path) == before
