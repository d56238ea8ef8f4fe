"""bench.py (babygpt/bench.py): end to end on a tiny model (figures are printed, never asserted against
a speed), its table, and its --help."""

import json

import pytest

from babygpt.bench import NOT_USED
from conftest import TINY_TRAIN_ARGS, assert_refused_in_process, prepare_small_data, run_script

# bench.py refuses the training keys it has no use for (schedule, evaluation, logging) on its command line.
BENCH_ARGS = [a for a in TINY_TRAIN_ARGS if a[2:].partition("=")[0] not in NOT_USED]


@pytest.mark.slow
def test_bench_prints_table_and_writes_json(tmp_path):
    data = prepare_small_data(tmp_path)
    proc = run_script("bench.py", *BENCH_ARGS, f"--data_dir={data}", "--windows=2", "--window_iters=2",
                      "--sample_tokens=40", "--json=bench.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for label in ("train tokens/s", "train ms/iter", "MFU", "peak RSS", "matmul peak", "matmul peak by dtype",
                  "sample tokens/s"):
        assert label in proc.stdout
    r = json.loads((tmp_path / "bench.json").read_text())
    assert r["tokens_per_s"] > 0 and r["ms_per_iter"] > 0 and len(r["ms_per_iter_windows"]) == 2
    assert 0 < r["mfu"] < 1 and r["matmul_peak_flops_per_s"] > 0
    assert r["sample_tokens_per_s_cached"] > 0 and r["sample_tokens_per_s_uncached"] > 0
    assert r["config"]["n_layer"] == 2 and r["peak_rss_mb"] > 0
    assert sorted(r["matmul_peak_by_dtype"]) == ["bfloat16", "float16", "float32"]
    assert all(f > 0 for f in r["matmul_peak_by_dtype"].values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "corpus.txt", "data"]  # no run dir left


@pytest.mark.slow
def test_bench_bad_flag(tmp_path, monkeypatch, capsys):
    """Refused before anything runs: bench.py's main through babygpt.cli.run, as bench.py calls it,
    in this process (bench.py itself runs as a process above)."""
    from babygpt.bench import main

    monkeypatch.chdir(tmp_path)
    assert_refused_in_process(main, ["--windows=many"], capsys, "windows must be an integer, got 'many'")


@pytest.mark.slow
def test_the_table_names_each_emulated_dtype():
    from babygpt.bench import by_dtype_note

    note = by_dtype_note({"float32": 69e9, "bfloat16": 0.8e9, "float16": 70e9})
    assert note == " (bfloat16 86x slower than float32: emulated)"
    assert by_dtype_note({"float32": 69e9, "bfloat16": 140e9, "float16": 60e9}) == ""


@pytest.mark.slow
def test_an_emulated_dtype_gets_no_mfu():
    from babygpt.bench import format_table

    r = {"config": {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16, "batch_size": 8,
                    "norm_placement": "pre", "norm_type": "rmsnorm", "dtype": "bfloat16", "compile": False},
         "params": 30000, "device": "cpu", "threads": 2, "torch": "x", "tokens_per_s": 800.0, "ms_per_iter": 2400.0,
         "ms_per_iter_windows": [2400.0], "model_flops_per_s": 4e9, "matmul_peak_flops_per_s": 1.3e9,
         "matmul_peak_by_dtype": {"float32": 170e9, "bfloat16": 1.3e9, "float16": 1.4e9}, "mfu": None,
         "peak_rss_mb": 400.0, "cuda_max_allocated_mb": None, "sample_tokens": 50,
         "sample_tokens_per_s_cached": 10.0, "sample_tokens_per_s_uncached": 5.0, "kv_cache_speedup": 2.0}
    mfu = next(line for line in format_table(r).splitlines() if line.startswith("MFU"))
    assert "bfloat16 is emulated on this machine" in mfu and "%" not in mfu


def test_bench_help_lists_only_the_keys_bench_reads(capsys):
    from babygpt.bench import NOT_USED, read_args
    from babygpt.options import ShowHelp

    with pytest.raises(ShowHelp) as shown:
        read_args(["--help"])
    listed = {line.split()[0][2:] for line in str(shown.value).splitlines() if line.strip().startswith("--")}
    assert "learning_rate" in listed and "n_layer" in listed and not listed & set(NOT_USED)
