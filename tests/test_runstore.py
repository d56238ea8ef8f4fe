"""A sweep's store of finished runs (babygpt/runstore.py): what a sweep appends, what a fresh clone's
sweep reads back, the converter from run directories, and damaged stores refused by line."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from babygpt import runstore
from babygpt.errors import BabyGPTError
from babygpt.runstore import FILES, RunStore, files, load_run, pack
from babygpt.state import ENDED
from babygpt.sweep import Run, Sweep
from conftest import ROOT, TINY_TRAIN_ARGS, prepare_small_data

pytestmark = pytest.mark.slow  # not in the fast loop: each test trains runs and stores them, or reads the committed stores

BASE = [a for a in TINY_TRAIN_ARGS if not a.startswith("--device")] + ["--device=cpu", "--max_iters=10"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("runstore"))


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """A sweep of two tiny runs, trained once for the module: (its root, its runs, its rows)."""
    root = str(tmp_path_factory.mktemp("sweep") / "sw")
    runs = [Run({"learning_rate": 1e-3}, 0), Run({"learning_rate": 1e-3}, 1)]
    rows = Sweep(root, runs, BASE + [f"--data_dir={data_dir}"]).run(progress=False)
    return root, runs, rows


def read_files(directory) -> dict[str, str]:
    return {name: open(os.path.join(directory, name), encoding="utf-8").read() for name in FILES}


def test_a_finished_run_is_stored_whole_with_the_commit_that_made_it(trained):
    root, runs, _ = trained
    records = RunStore(root).records()
    assert list(records) == [r.name for r in runs]
    for run in runs:
        record = records[run.name]
        assert files(record) == read_files(os.path.join(root, "runs", run.name))  # byte for byte
        assert record["format"] == runstore.STORE_FORMAT and record["summary"]["status"] in ENDED
        assert record["source"] == record["config"]["source"] and set(record["source"]) == {"commit", "dirty"}


def test_a_fresh_clone_resumes_from_the_store_alone(trained, data_dir, tmp_path):
    """The run directories are not committed: with only runs.jsonl, the sweep trains nothing and
    writes the same table (the exit codes aside: only runs trained by this call have one)."""
    root, runs, rows = trained
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copy(os.path.join(root, runstore.STORE), clone)
    sweep = Sweep(str(clone), runs, BASE + [f"--data_dir={data_dir}"])
    again = sweep.run(progress=False)
    assert not os.path.exists(clone / "runs") and sweep.exit_codes == {}  # nothing trained
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("exit_code", "out_dir")} for r in rs]  # noqa: E731
    assert strip(again) == strip(rows)
    assert [r["out_dir"] for r in again] == [str(clone / "runs" / r.name) for r in runs]  # the same paths, read
    for row in again:  # from the store
        assert load_run(row["out_dir"])["summary"]["final_val_loss"] == row["final_val_loss"]


def test_a_stored_run_with_other_settings_is_refused(trained, data_dir, tmp_path):
    root, runs, _ = trained
    shutil.copy(os.path.join(root, runstore.STORE), tmp_path)  # a clone: the store without the bindings
    other = Sweep(str(tmp_path), runs, BASE + [f"--data_dir={data_dir}", "--dropout=0.1"])
    with pytest.raises(BabyGPTError, match=r"runs.jsonl holds the run learning_rate=0.001__seed=0 with other "
                                           r"settings \(dropout=0.0 there, 0.1 now\)"):
        other.check()


def test_compare_and_plot_read_stored_runs_and_whole_sweeps(trained, tmp_path):
    root, runs, rows = trained
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copy(os.path.join(root, runstore.STORE), clone)
    for args in ([str(clone)], [str(clone / "runs" / r.name) for r in runs]):
        done = subprocess.run([sys.executable, os.path.join(ROOT, "compare.py"), *args,
                               f"--plot={tmp_path / 'c.png'}"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert all(f"| {clone}/runs/{r.name} | {rows[i]['status']} |" in done.stdout for i, r in enumerate(runs))
    assert runstore.expand_runs([str(clone), "elsewhere"]) == [str(clone / "runs" / r.name) for r in runs] + \
        ["elsewhere"]


def record_of(name, status="finished", **summary):
    """A store line as pack writes it, without training."""
    summary = {"status": status, "iter": 5, "val_loss_full": 2.5, "final_val_loss": 2.5, "best_val_loss": 2.5,
               **summary}
    return {"format": runstore.STORE_FORMAT, "name": name, "source": {"commit": "abc", "dirty": False},
            "config": {"config": {"seed": 0}, "resumes": []}, "summary": summary,
            "metrics": [{"iter": 0, "loss": 4.2}, {"iter": 5, "loss": 2.5, "val_loss": 2.5}]}


def test_the_store_is_appended_once_per_run_and_forgives_only_a_last_line_cut_short(tmp_path):
    store = RunStore(str(tmp_path))
    assert store.records() == {} and store.add(record_of("a")) and not store.add(record_of("a"))
    assert store.add(record_of("b")) and list(store.records()) == ["a", "b"]
    with open(store.path, "ab") as f:  # an append a kill cut short
        f.write(b'{"format": 3, "name": "c", "sum')
    assert list(store.records()) == ["a", "b"]
    assert store.add(record_of("c")) and list(RunStore(str(tmp_path)).records()) == ["a", "b", "c"]
    lines = open(store.path, encoding="utf-8").read().splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["a", "b", "c"]  # the cut line gave way to c's own


def with_config(record, **fields):
    """``record`` with config.json's ``fields`` changed."""
    return {**record, "config": {**record["config"], **fields}}


def with_settings(record, **settings):
    """``record`` with the settings of its run (config.json's "config") changed."""
    return with_config(record, config={**record["config"]["config"], **settings})


@pytest.mark.parametrize("line, problem", [
    ("not json", "not a format-3 run record"),
    (json.dumps({**record_of("x"), "format": 2}), "not a format-3 run record"),
    (json.dumps(record_of("x", status="interrupted")), "x: a run that is not over"),
    (json.dumps(record_of("x", val_loss_full=None)), "x: its summary is damaged"),
    (json.dumps({**record_of("x"), "metrics": [{"loss": 1}]}), "x: its metrics are not rows"),
    (json.dumps({**record_of("x"), "source": None}), "x: no source"),
    (json.dumps({**record_of("a"), "metrics": []}), "holds a twice, with different records"),
    *[(json.dumps(record_of(name)), f"its name {name!r} is not a run name")
      for name in ("../../evil", "a/b", "/abs", ".", "..", "a\0b")],
    (json.dumps(record_of("")), "no run name"),
    (json.dumps(with_config(record_of("x"), format=99)), "x's config.json: its format 99 is none this code reads"),
    (json.dumps(with_settings(record_of("x"), n_layer="six")),
     "x's config.json: n_layer must be an integer, got 'six'"),
    (json.dumps(with_settings(record_of("x"), norm_type="nonorm")), "x's config.json: unknown norm_type 'nonorm'"),
    (json.dumps(record_of("x", wall_time_s=-5.0)), "x's summary.json: its wall_time_s is -5.0, not a finite number"),
    (json.dumps({**record_of("x"), "metrics": [{"iter": 0, "loss": "Infinity"}]}),
     "x's metrics.jsonl: its row at iter 0 has loss 'Infinity', not a number"),
])
def test_a_damaged_store_is_refused_by_line(tmp_path, line, problem):
    store = RunStore(str(tmp_path))
    store.add(record_of("a"))
    with open(store.path, "a", encoding="utf-8") as f:
        f.write(line + "\n" + json.dumps(record_of("z")) + "\n")
    with pytest.raises(BabyGPTError, match="line 2") as e:
        RunStore(str(tmp_path)).records()
    assert problem in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_whole_last_line_without_its_newline_is_read_not_forgiven_as_cut_short(tmp_path):
    """Only an append cut short is forgiven: a last line that is a whole JSON object is a record,
    checked as any other (a kill just before its newline leaves a good one; a damaged one is refused)."""
    store = RunStore(str(tmp_path))
    store.add(record_of("a"))
    with open(store.path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record_of("b")))
    assert list(RunStore(str(tmp_path)).records()) == ["a", "b"]
    with open(store.path, "a", encoding="utf-8") as f:
        f.write("\n" + json.dumps({**record_of("c"), "format": 99}))
    with pytest.raises(BabyGPTError, match=r"line 3 is damaged \(not a format-3 run record\)"):
        RunStore(str(tmp_path)).records()


@pytest.mark.parametrize("name", ["../../evil", "a/b", ".", "..", "", "a\0b"])
def test_a_run_whose_name_is_not_one_path_component_is_not_stored(tmp_path, name):
    with pytest.raises(BabyGPTError, match="cannot store a run in"):
        RunStore(str(tmp_path)).add(record_of(name))
    assert not os.path.exists(tmp_path / runstore.STORE)


def old_layout_run(root, name, status="finished", source=True):
    """A run directory as a sweep left it before stores (config.json with or without its source)."""
    record = record_of(name, status=status)
    run = os.path.join(root, "runs", name)
    os.makedirs(run)
    config = {**record["config"], **({"source": {"commit": "made-here", "dirty": True}} if source else {})}
    with open(os.path.join(run, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2) + "\n")
    with open(os.path.join(run, "summary.json"), "w") as f:
        f.write(json.dumps(record["summary"], indent=2) + "\n")
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in record["metrics"]))
    return run


def test_the_converter_moves_finished_runs_byte_for_byte_and_leaves_the_others(tmp_path):
    root = str(tmp_path / "results" / "exp")
    made = {name: read_files(old_layout_run(root, name, source=name != "old"))
            for name in ("new", "old")}
    running = old_layout_run(root, "running", status="interrupted")
    open(os.path.join(root, "runs", "new", "ckpt.pt"), "wb").close()  # not a record: stays
    assert runstore.sweep_roots(str(tmp_path)) == [root]
    assert runstore.convert(root, {}) == (2, 1)
    records = RunStore(root).records()
    assert {name: files(records[name]) for name in made} == made
    assert records["new"]["source"] == {"commit": "made-here", "dirty": True}  # as the run recorded it
    assert records["old"]["source"]["commit"] is None and "inferred" in records["old"]["source"]
    assert os.listdir(os.path.join(root, "runs", "new")) == ["ckpt.pt"]
    assert not os.path.exists(os.path.join(root, "runs", "old")) and os.path.isdir(running)
    assert runstore.convert(root, {}) == (0, 1)  # again: nothing more to move


def test_the_converter_names_the_commit_a_record_was_made_at_from_git_history():
    """The repository's own converted records: each names the parent of the commit that added it."""
    added = {"results/x/runs/a/config.json": "f" * 40}
    assert runstore.inferred(added["results/x/runs/a/config.json"])["inferred"] == \
        f"the parent of {'f' * 40}, the commit that added this record"
    store = RunStore(os.path.join(ROOT, "results", "exp10_depth"))
    sources = [r["source"] for r in store.records().values()]
    assert sources and all(len(s["commit"] or "") == 40 for s in sources)


def test_pack_refuses_a_finished_run_without_its_config(tmp_path):
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(record_of("a")["summary"]))
    with pytest.raises(BabyGPTError, match="has a summary but no config.json"):
        pack(str(run))
    assert pack(str(tmp_path / "runs" / "none")) is None  # nothing there: not over


def test_every_committed_sweep_keeps_its_runs_in_a_store_and_no_run_directory_is_committed():
    tracked = subprocess.run(["git", "-C", ROOT, "ls-files", "results"], capture_output=True, text=True).stdout.split()
    tracked = [p for p in tracked if os.path.exists(os.path.join(ROOT, p))]  # (a copied tree's index may be older)
    if not tracked:
        pytest.skip("not a git checkout")
    assert [p for p in tracked if "/runs/" in p] == []
    stores = [p for p in tracked if p.endswith("/" + runstore.STORE)]
    assert stores and all(RunStore(os.path.join(ROOT, os.path.dirname(p))).records() for p in stores)


def store_copy(root, directory, **machine):
    """``root``'s store copied into ``directory``, each run's machine changed by ``machine``."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(root, runstore.STORE), encoding="utf-8") as f, \
            open(os.path.join(directory, runstore.STORE), "w", encoding="utf-8") as out:
        for line in f:
            record = json.loads(line)
            record["summary"]["machine"].update(machine)
            out.write(json.dumps(record) + "\n")
    return str(directory)


def test_reuse_copies_runs_made_alike_and_trains_those_made_on_another_kind(trained, data_dir, tmp_path, capsys):
    """--reuse takes a stored run of the same name and settings made on this kind of machine
    instead of training it; one made on another CPU kind is trained here (a table is made on one
    kind), and the sweep says which it did."""
    root, runs, rows = trained
    other_kind = store_copy(root, tmp_path / "elsewhere", cpu="Another CPU (AVX-512 bf16)")
    mine = Sweep(str(tmp_path / "mine"), runs, BASE + [f"--data_dir={data_dir}"], reuse=[other_kind, root])
    mine.check()
    mine.copy_reused()
    copied = mine.store.records()
    assert list(copied) == [r.name for r in runs] and {c["copied_from"] for c in copied.values()} == {root}
    assert all(files(copied[name]) == files(RunStore(root).get(name)) for name in copied)
    err = capsys.readouterr().err
    assert f"reused 2 run(s) from {root} (same settings, same kind of machine)" in err
    assert f"--reuse {other_kind}: runs with these settings were made on Another CPU (AVX-512 bf16), " in err
    # another kind only: nothing copied; other settings: nothing copied, nothing said
    alone = Sweep(str(tmp_path / "alone"), runs, BASE + [f"--data_dir={data_dir}"], reuse=[other_kind])
    alone.check()
    alone.copy_reused()
    assert alone.store.records() == {}
    other = Sweep(str(tmp_path / "other"), runs, BASE + [f"--data_dir={data_dir}", "--dropout=0.1"], reuse=[root])
    other.check()
    other.copy_reused()
    assert other.store.records() == {} and "reused" not in capsys.readouterr().err


def test_reuse_names_a_directory_without_a_store(tmp_path, capsys):
    from babygpt import sweep as sweep_module

    with pytest.raises(BabyGPTError, match=r"--reuse 'nowhere' holds no runs.jsonl; pass sweep directories"):
        sweep_module.main(["--grid", "learning_rate=1e-3", "--reuse", "nowhere", f"--out={tmp_path / 'o'}"])
    assert not os.path.exists(tmp_path / "o")


def test_a_damaged_reuse_store_is_refused_before_the_sweep_writes_anything(trained, data_dir, tmp_path):
    root, runs, _ = trained
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / runstore.STORE).write_text(json.dumps(record_of("a")) + "\ngarbage\n" + json.dumps(record_of("b")) + "\n")
    mine = Sweep(str(tmp_path / "mine"), runs, BASE + [f"--data_dir={data_dir}"], reuse=[str(damaged)])
    with pytest.raises(BabyGPTError, match="runs.jsonl line 2 is damaged"):
        mine.run(progress=False)
    assert not (tmp_path / "mine").exists()


def test_record_files_that_are_fifos_are_refused_not_waited_on(tmp_path):
    """Opening a FIFO with no writer blocks forever: a record that is not a regular file is unreadable."""
    from babygpt.rundir import RunDir, read_record

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "config.json")
    os.mkfifo(run / "metrics.jsonl")
    with pytest.raises(BabyGPTError, match="config.json is not a readable JSON object"):
        read_record(str(run / "config.json"))
    with pytest.raises(BabyGPTError, match="metrics.jsonl is not a regular file"):
        RunDir(str(run)).metrics_rows()
