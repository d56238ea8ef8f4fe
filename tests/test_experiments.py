"""The experiments (experiments/*.py and their shared experiments/_common.py): each one's options,
its --quick mode end to end, its tables, plots and reports, and the records it reads."""

import csv
import glob
import json
import math
import os
import re
import statistics
import types

import pytest
import torch

from babygpt.docverdicts import table_rows, table_verdict
from babygpt.doctables import report_table
from babygpt.errors import BabyGPTError
from babygpt.sweep import DONE
from conftest import (ROOT, TINY_TRAIN_ARGS, assert_refused_in_process, experiment_command, once,
                      prepare_small_data, run_script)

BASE = [a for a in TINY_TRAIN_ARGS if not a.startswith("--device")]


def run_experiment(script, *args, cwd, monkeypatch):
    """experiments/<script>.py with ``args`` in ``cwd``, as its ``__main__`` runs it (_common.main: the
    same argv, errors and exit code) but in this process: a CompletedProcess. Its runs still train in
    processes of their own, forked from a server that imported torch once for this test worker
    (babygpt/launcher.py), where a new process would import torch twice (itself and its server): a
    quarter of the time. test_an_experiment_runs_as_a_command starts one as a user does."""
    import contextlib
    import io
    import subprocess
    import sys

    from babygpt import cli

    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    # pytest names the running test in the environment; the launcher starts its server again whenever
    # the environment changed, which would be at every test. No run reads the name.
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    main = experiment_command(script)
    path = os.path.join(ROOT, "experiments", script + ".py")
    monkeypatch.setattr(sys, "argv", [path, *args])  # the report's "Command:" line reads it
    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.run(main, list(args))
    finally:
        torch.set_num_threads(threads)  # an experiment that times kernels may set its own
    return subprocess.CompletedProcess([path, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_small_data(tmp_path_factory.mktemp("exp"))


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("script", ["exp3_prenorm_vs_postnorm", "exp4_grad_norm_at_init"])
def test_the_placements_help_lists_every_placement_the_option_accepts(monkeypatch, script):
    """Generated from the registry: a new placement that places norms shows up by itself."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import importlib

    import _common
    from babygpt.placements import PLACEMENTS

    options = next(v for k, v in vars(importlib.import_module(script)).items() if k.endswith("Options"))
    help_text = options.__dataclass_fields__["placements"].metadata["help"]
    listed = help_text.split("among ")[1].split(",")
    accepted = [pl for pl in PLACEMENTS if not _common.placement_problems(pl)]
    assert listed == accepted and {"parallel", "prepost", "sandwich"} <= set(listed)


def test_exp4_plots_every_placement_it_is_given_in_a_colour_of_its_own(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp4_grad_norm_at_init as exp4
    from babygpt.placements import PLACEMENTS

    placements, inits, depths = list(PLACEMENTS), ["gpt2", "xavier"], [2, 4]
    change = {(i, pl, d): 1.0 + k for k, (i, pl, d) in enumerate(
        (i, pl, d) for i in inits for pl in placements for d in depths)}
    drawn = []
    monkeypatch.setattr(exp4, "save", lambda fig, path: drawn.extend(fig.axes[0].get_lines()))
    exp4.plot_amplification(change, inits, placements, depths, str(tmp_path / "a.png"))
    labels = [line.get_label() for line in drawn]
    assert labels == [f"{pl}, {i}" for i in inits for pl in placements]
    first = {line.get_label().split(",")[0]: line.get_color() for line in drawn[:len(placements)]}
    assert len(set(first.values())) == min(len(placements), 10)


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
        _common.parse(Exp3Options, ["--placements=pre,side", "--depths=4,x", "--inits=gpt", "--lrs=1e-3,-1",
                                    "--seeds=0", "--warmups=-5"], "exp3_prenorm_vs_postnorm", "doc")
    assert len(e.value.problems) == 6
    with pytest.raises(BabyGPTError, match="--depths takes comma-separated positive integers"):
        _common.parse(Exp3Options, ["--depths=0"], "exp3_prenorm_vs_postnorm", "doc")
    assert _common.parse(Exp3Options, ["--warmups=0,10"], "exp3_prenorm_vs_postnorm", "doc").warmups == "0,10"
    assert any("did you mean 'gpt2'" in p for p in e.value.problems)
    with pytest.raises(BabyGPTError, match="did you mean '--placements'"):
        _common.parse(Exp3Options, ["--placement=pre"], "exp3_prenorm_vs_postnorm", "doc")
    from exp6_postln_collapse import Exp6Options, arm_runs

    assert _common.parse(Exp6Options, [], "exp6_postln_collapse", "doc").lrs == "3e-3,1e-2"
    with pytest.raises(BabyGPTError) as e:
        _common.parse(Exp6Options, ["--lrs=3e-3,x", "--seeds=0"], "exp6_postln_collapse", "doc")
    assert len(e.value.problems) == 2 and "--lrs takes comma-separated numbers" in e.value.problems[1]
    with pytest.raises(BabyGPTError, match="--lrs lists 0.003 more than once"):
        _common.parse(Exp6Options, ["--lrs=3e-3,3e-3"], "exp6_postln_collapse", "doc")
    runs = arm_runs([1e-2, 3e-3], 2, 5)
    assert list(runs)[0] == ("baseline", 1e-2) and len(runs) == 16 and all(len(rs) == 2 for rs in runs.values())


@pytest.mark.slow
@pytest.mark.parametrize("script,extra,outputs", [
    ("exp1_gradient_vanishing", [], ["gradient_vanishing.png", "gradient_vanishing.csv", "report.md"]),
    ("exp4_grad_norm_at_init", ["--data_dir={data}", "--placements=pre,post,sandwich,deepnorm"],
     ["grad_norm_at_init.png", "grad_norm_at_init.csv", "report.md"]),
    ("exp3_prenorm_vs_postnorm", ["--data_dir={data}", "--jobs=2"], ["stability_map.png", "results.csv", "report.md"]),
    ("exp6_postln_collapse", ["--data_dir={data}", "--jobs=2", "--seeds=1", "--diag_interval=5", "--lrs=3e-3"],
     ["collapse_diagnostics.png", "results.csv", "report.md"]),
    ("exp7_lr_sensitivity", ["--data_dir={data}", "--jobs=2", "--lrs=1e-1"],
     ["lr_sensitivity.png", "results.csv", "report.md"]),
    ("exp8_dyt_saturation", ["--data_dir={data}", "--jobs=2"], ["dyt_saturation.png", "results.csv", "report.md"]),
    ("exp9_fp16_overflow", ["--data_dir={data}", "--jobs=2"], ["fp16_overflow.png", "results.csv", "report.md"]),
    ("exp10_depth", ["--data_dir={data}", "--jobs=2"], ["depth.png", "results.csv", "report.md"]),
    ("exp11_regime", ["--data_dir={data}", "--jobs=2"], ["frontier.png", "results.csv", "report.md"]),
    ("exp13_stack_speed", ["--data_dir={data}"], ["stack_speed.png", "stack_speed.csv", "sampling.csv", "report.md"]),
    ("exp16_noise", ["--data_dir={data}", "--jobs=2"], ["noise.csv", "lr_choice.csv", "results.csv", "report.md"]),
])
def test_experiment_quick_mode(script, extra, outputs, data_dir, tmp_path, monkeypatch, capsys):
    args = [a.format(data=data_dir) for a in extra]
    proc = run_experiment(script, "--quick", "--out=res", *args, cwd=tmp_path, monkeypatch=monkeypatch)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in outputs:
        assert (tmp_path / "res" / name).stat().st_size > 0, name
    report = (tmp_path / "res" / "report.md").read_text()
    assert "| " in report and "Command: `python experiments/" in report
    if script == "exp3_prenorm_vs_postnorm":
        assert len(read_csv(tmp_path / "res" / "results.csv")) == 6  # 3 placements x 2 warmups, 1 depth, LR, seed
        for key in ("stable_lr", "map", "references"):
            assert f"<!-- table: {key} -->" in report
    if script == "exp4_grad_norm_at_init":
        assert (tmp_path / "res" / "amplification.png").stat().st_size > 0
        for key in ("per_layer", "last_layer", "amplification"):
            assert f"<!-- table: {key} -->" in report
    if script == "exp16_noise":  # each SD is the one of the runs' own records
        import statistics

        runs = read_csv(tmp_path / "res" / "results.csv")
        noise = {(r["config"], r["estimate"]): r for r in read_csv(tmp_path / "res" / "noise.csv")}
        row = noise[("prenorm_rms", "test, weights")]
        tests = [float(r["test_loss"]) for r in runs
                 if r["label"].startswith("prenorm_rms") and float(r["cfg.learning_rate"]) == float(row["lr"])]
        assert len(tests) == 3 and float(row["sd"]) == pytest.approx(statistics.stdev(tests))
        assert len(read_csv(tmp_path / "res" / "lr_choice.csv")) == 2 * 2 * 2  # configs x sizes x rules
    if script == "exp13_stack_speed":  # every piece timed, both position kinds sampled both ways
        monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
        import exp13_stack_speed as exp13

        rows = read_csv(tmp_path / "res" / "stack_speed.csv")
        assert [r["piece"] for r in rows] == list(exp13.PIECES) and all(float(r["tokens_per_s"]) > 0 for r in rows)
        assert [r["pos"] for r in read_csv(tmp_path / "res" / "sampling.csv")] == ["learned", "rope"]
    if script == "exp7_lr_sensitivity":  # 8 arms x the one LR asked for x 1 width x 1 seed; z-loss, qk_norm and
        # weight decay reach the runs
        rows = read_csv(tmp_path / "res" / "results.csv")
        assert len(rows) == 8 and {(r["cfg.qk_norm"], r["cfg.z_loss"]) for r in rows} == \
            {("False", "0.0"), ("True", "0.0"), ("False", "0.0001"), ("True", "0.0001")}
        decays = {(r["label"].rsplit(", w", 1)[0], float(r["cfg.learning_rate"])): float(r["cfg.weight_decay"])
                  for r in rows if r["cfg.weight_decay"]}
        assert decays == {(f"{arm}, {kind}", 1e-1): pytest.approx(wd) for arm in ("plain", "z_loss")
                          for kind, wd in (("wd 0", 0.0), ("independent wd 1e-4", 1e-4 / 1e-1))}
        assert "<!-- table: sensitivity -->" in report and "<!-- table: instabilities -->" in report
    if script == "exp8_dyt_saturation":  # plain and paper DyT under both inits, saturation measured
        assert len(read_csv(tmp_path / "res" / "results.csv")) == 4
        assert "<!-- table: saturation -->" in report and report.count("| prenorm_dyt_paper |") >= 2
        # From the committed records only (no checkpoints), --collect and a rerun (which trains none of
        # the ended runs) are refused before they write a byte.
        monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
        import exp8_dyt_saturation as exp8

        for ckpt in (tmp_path / "res" / "runs").glob("*/ckpt.pt"):
            ckpt.unlink()
        before = {p: p.read_bytes() for p in (tmp_path / "res").rglob("*") if p.is_file()}
        monkeypatch.chdir(tmp_path)
        for again in (["--collect"], []):
            assert_refused_in_process(exp8.main, ["--quick", "--out=res", *args, *again], capsys,
                                      "learned alphas from its final weights", "run the experiment into a new --out")
            assert {p: p.read_bytes() for p in (tmp_path / "res").rglob("*") if p.is_file()} == before
    if script == "exp10_depth":  # six placements at 4 layers, each measured once, every block
        assert len(read_csv(tmp_path / "res" / "results.csv")) == 6
        assert "<!-- table: depth -->" in report and "| mixln_rms | 4 |" in report and "—" not in report
    if script == "exp11_regime":  # two tiny points x two LRs, no extension in the quick tier
        rows = read_csv(tmp_path / "res" / "results.csv")
        assert len(rows) == 4 and {r["cfg.max_iters"] for r in rows} == {"10", "20"}
        assert "<!-- table: frontier -->" in report and "<!-- table: references -->" in report
        # each point is read against its own floor: the strongest count model scored as its run was
        assert "scored as the run" in report and "− its floor, scored as the run (the floor)" in report
    if script == "exp9_fp16_overflow":  # one LR; the tiny model's stream stays far below 255.9
        rows = read_csv(tmp_path / "res" / "results.csv")
        assert len(rows) == 1 and rows[0]["first_crossing"] == "" and rows[0]["checkpoint_iter"] == "10"
        assert "<!-- table: crossing -->" in report and "<!-- table: half -->" in report
    if script == "exp6_postln_collapse":
        rows = read_csv(tmp_path / "res" / "results.csv")
        assert len(rows) == 8 and {r["cfg.diag_interval"] for r in rows} == {"5"}  # 8 arms x the one LR x 1 seed
        assert {(r["label"], r["cfg.learning_rate"]) for r in rows if r["cfg.init_depth_factor"] == "False"} == \
            {("no depth factor", "0.003")}
        assert {r["label"] for r in rows if r["cfg.init_linear"] == "xavier"} == {"xavier weights"}
        assert "<!-- table: hypotheses -->" in report and "<!-- table: diagnostics -->" in report


def test_frontier_keeps_the_points_no_cheaper_one_beats_and_extrapolates_to_the_floor(monkeypatch):
    """Pareto: cheapest first, each better than every cheaper one; the trend is the least-squares
    line of loss against log10(minutes) through them, and where it meets the floor."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp11_regime as exp11

    def point(minutes, loss):
        return {"row": {"wall_time_s": 60 * minutes, "val_loss_full": loss, "status": "finished"}}

    points = [point(10, 1.70), point(1, 2.0), point(100, 1.60), point(20, 1.80), point(1000, 1.65)]
    front = exp11.pareto(points)
    assert [exp11.minutes(p["row"]) for p in front] == [1, 10, 100]
    a, b, cross = exp11.trend(front, 1.5)
    assert (a, b) == (pytest.approx(2.0 - 0.7 / 3 + 0.2), pytest.approx(-0.2))  # through (0, 2.0), (1, 1.7), (2, 1.6)
    assert cross == pytest.approx(10 ** ((1.5 - a) / b))
    assert exp11.trend(front[:1], 1.5) is None
    flat = [point(1, 2.0), point(10, 2.0 - 1e-9)]
    assert exp11.trend(exp11.pareto(flat), 1.5)[2] == math.inf  # falls, too slowly to ever get there
    assert exp11.trend([point(1, 1.9), point(10, 1.8)], 1.9)[2] == pytest.approx(1.0)


def tier_report(directory, rows: list[tuple]) -> None:
    """A report shaped as experiment 2 writes it: its tuned table, one (configuration, mean, verdict) per row."""
    os.makedirs(directory)
    lines = ["# Normalization configurations compared", "", "<!-- table: tuned -->",
             "| configuration | tuned LR | val loss, mean ± 95% CI | verdict |", "|---|---|---|---|"]
    lines += [f"| {c} | 0.001 | {loss} ± 0.010 | {verdict} |" for c, loss, verdict in rows]
    with open(os.path.join(directory, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def test_proxy_ranks_the_shared_configurations_and_marks_verdicts_that_flip(tmp_path, monkeypatch, capsys):
    from babygpt import cli

    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    monkeypatch.chdir(tmp_path)
    import exp12_proxy as exp12

    tier_report(tmp_path / "short", [("base", 2.10, "—"), ("a", 2.20, "worse"), ("b", 2.05, "better"),
                                     ("c", 2.12, "inconclusive (3 pairs)"), ("only_short", 2.0, "better")])
    tier_report(tmp_path / "long", [("base", 1.60, "—"), ("a", 1.58, "inconclusive"), ("b", 1.55, "better"),
                                    ("c", 1.62, "inconclusive")])
    assert cli.run(exp12.main, ["--tiers=short,long", "--out=proxy"]) == 0
    report = (tmp_path / "proxy" / "report.md").read_text()
    # short order b < base < c < a, long order b < a < base < c: pairs (a,base) and (a,c) swap -> (4 - 2) / 6
    tau = report_rows(report, "tau")
    assert tau[1][:4] == ["short", "long", "4", "+0.333"]
    assert float(tau[1][4]) == pytest.approx(18 / 24)
    ranking = {row[0]: row for row in report_rows(report, "ranking")[1:]}
    assert set(ranking) == {"base", "a", "b", "c"}  # only_short is not in both tiers
    assert ranking["a"][1:] == ["4 (2.200) worse", "2 (1.580) inconclusive", "changed (worse → inconclusive)"]
    assert ranking["c"][3] == "no" and ranking["base"][1] == "2 (2.100) baseline"
    assert exp12.verdict_change(["better", "inconclusive (2 pairs)", "worse"]) == \
        "reversed (better → inconclusive → worse)"
    assert exp12.verdict_change(["equivalent within ±0.010", "equivalent within ±0.020"]) == "no"
    # a tier joined from two reports of one budget: the first report that holds a configuration wins
    tier_report(tmp_path / "more", [("a", 9.0, "worse"), ("d", 2.3, "worse")])
    assert cli.run(exp12.main, ["--tiers=short+more,long", "--out=joined"]) == 0
    rows = {row[0]: row for row in report_rows((tmp_path / "joined" / "report.md").read_text(), "ranking")[1:]}
    assert rows["a"][1] == "4 (2.200) worse" and "d" not in rows
    assert_refused_in_process(exp12.main, ["--tiers=short,nowhere", "--out=p2"], capsys, "nowhere/report.md not found")
    assert not (tmp_path / "p2").exists()


def test_transfer_compares_each_stack_with_the_reference_and_says_how_each_verdict_moved(tmp_path, monkeypatch,
                                                                                           capsys):
    from babygpt import cli
    from babygpt.rankings import transfer

    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    monkeypatch.chdir(tmp_path)
    import exp17_transfer as exp17

    tier_report(tmp_path / "adamw", [("base", 2.10, "—"), ("a", 2.20, "worse"), ("b", 2.05, "better"),
                                     ("c", 2.12, "inconclusive (3 pairs)"), ("ngpt", 2.0, "better")])
    tier_report(tmp_path / "muon", [("base", 1.60, "—"), ("a", 1.58, "better"), ("b", 1.55, "better"),
                                    ("c", 1.65, "worse")])
    tier_report(tmp_path / "modern", [("base", 1.60, "—"), ("a", 1.70, "inconclusive"), ("b", 1.50, "better"),
                                      ("c", 1.62, "equivalent within ±0.010"), ("ngpt", 1.4, "better"),
                                      ("every_run_failed", "—", "inconclusive (0 pairs)")])
    assert cli.run(exp17.main, ["--stacks=ref=adamw,m=muon,mod=modern", "--out=transfer"]) == 0
    report = (tmp_path / "transfer" / "report.md").read_text()
    tau = report_rows(report, "tau")
    # muon over base, a, b, c: ref order b < base < c < a, muon's b < a < base < c: 2 of 6 pairs swap
    assert tau[1][:3] == ["m", "4", "+0.333"]
    assert tau[2][:3] == ["mod", "5", f"{1.0:+.3f}"]  # the same order over the five both hold
    verdicts = {row[0]: row for row in report_rows(report, "verdicts")[1:]}
    assert verdicts["a"] == ["a", "worse (2.200)", "better (1.580)", "inconclusive (1.700)", "reversed", "lost"]
    assert verdicts["c"][4:] == ["appears", "appears"]
    assert verdicts["ngpt"][2] == "not run" and verdicts["ngpt"][4:] == ["not run", "holds"]
    assert verdicts["base"][4:] == ["baseline", "baseline"]
    assert transfer("inconclusive (look 6, 30 pairs)", "inconclusive (2 pairs)") == "undecided on both"
    assert verdicts["every_run_failed"][1:4] == ["not run", "not run", "inconclusive (0 pairs) (no finished run)"]
    assert transfer("equivalent within ±0.010", "better") == "changed"
    assert transfer("better", "equivalent within ±0.020") == "changed"
    rows = (tmp_path / "transfer" / "results.csv").read_text().splitlines()
    assert rows[0] == "configuration,stack,mean_loss,verdict" and len(rows) == 1 + 5 + 4 + 6
    tier_report(tmp_path / "other_base", [("a", 1.6, "—"), ("base", 1.7, "worse")])
    assert_refused_in_process(exp17.main, ["--stacks=ref=adamw,o=other_base", "--out=t2"], capsys,
                              "drawn against different baselines (ref: base, o: a)")
    assert_refused_in_process(exp17.main, ["--stacks=ref=adamw,m=nowhere", "--out=t2"], capsys,
                              "nowhere/report.md not found")
    assert_refused_in_process(exp17.main, ["--stacks=ref=adamw,adamw", "--out=t2"], capsys, "is not LABEL=DIR")
    assert_refused_in_process(exp17.main, ["--stacks=ref=adamw,ref=muon", "--out=t2"], capsys, "names a label twice")
    assert_refused_in_process(exp17.main, ["--stacks=ref=adamw", "--out=t2"], capsys, "at least one other stack")
    assert not (tmp_path / "t2").exists()


@pytest.mark.parametrize("row", ["| a | 0.001 | lots ± 0.010 | worse |", "| a | 0.001 |", "| a | 0.001 | inf | worse |"])
def test_proxy_refuses_a_damaged_row_by_report_and_row(row, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    monkeypatch.chdir(tmp_path)
    import exp12_proxy as exp12

    tier_report(tmp_path / "short", [("base", 2.10, "—"), ("a", 2.20, "worse")])
    tier_report(tmp_path / "long", [("base", 1.60, "—")])
    with open(tmp_path / "long" / "report.md", "a") as f:
        f.write(row + "\n")
    assert_refused_in_process(exp12.main, ["--tiers=short,long", "--out=proxy"], capsys,
                              "long/report.md: row 4 of its tuned table is damaged")
    assert not (tmp_path / "proxy").exists()


def test_proxy_says_tau_is_undefined_where_a_tier_ties_every_configuration(tmp_path, monkeypatch):
    from babygpt import cli

    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    monkeypatch.chdir(tmp_path)
    import exp12_proxy as exp12

    tier_report(tmp_path / "short", [("base", 2.10, "—"), ("a", 2.10, "inconclusive"), ("b", 2.10, "inconclusive")])
    tier_report(tmp_path / "long", [("base", 1.60, "—"), ("a", 1.58, "inconclusive"), ("b", 1.55, "better")])
    assert cli.run(exp12.main, ["--tiers=short,long", "--out=proxy"]) == 0
    tau = report_rows((tmp_path / "proxy" / "report.md").read_text(), "tau")
    assert tau[1][3:5] == ["undefined (one table ties them all)", "—"]
    assert "nan" not in (tmp_path / "proxy" / "report.md").read_text()


def test_reports_say_which_machines_trained_their_runs(monkeypatch):
    """A campaign's runs come from several sessions: the report names each run's machine (its row's,
    from the run's own summary.json), not the machine that wrote the report."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    from babygpt.runtime import machine_label

    machines = [{"cpu": "AMD EPYC (AVX-512 bf16)", "threads": 1, "device": "cpu"},
                {"cpu": "AMD EPYC (AVX-512 bf16)", "threads": 1, "device": "cpu"},
                {"cpu": "x86_64", "threads": 16, "device": "cuda", "gpu": "NVIDIA H100"}, None]
    rows = [{"machine": machine_label(m), "wall_time_s": 10.0} for m in machines]
    assert machine_label({"cpu": "Intel Xeon", "threads": 2, "device": "cpu"}) == "Intel Xeon, 2 threads"
    assert _common.trained_on([]) == "no runs trained"
    assert _common.trained_on(rows[:2]) == "trained on AMD EPYC (AVX-512 bf16), 1 thread: all 2 runs"
    assert _common.trained_on(rows) == ("trained on AMD EPYC (AVX-512 bf16), 1 thread: 2 runs; NVIDIA H100: 1 run; "
                                        "a machine its summary.json does not name: 1 run")
    assert _common.training_time(rows[2:3]).startswith("1 run, 10 s of training summed over runs (")
    assert _common.training_time(rows[2:3]).endswith("; trained on NVIDIA H100: 1 run")


def test_stability_map_cells_and_largest_stable_lr(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    import exp3_prenorm_vs_postnorm as exp3

    args = _common.parse(exp3.Exp3Options, ["--lrs=3e-3,1e-3,1e-2", "--depths=6", "--warmups=0,10", "--seeds=2",
                                            "--placements=post"], "exp3", "doc")
    grid = exp3.Grid.of(args)
    assert grid.lrs == [1e-3, 3e-3, 1e-2] and grid.inits == ["xavier"] and grid.seeds == [0, 1]
    runs = exp3.cell_runs(grid, "layernorm")
    assert len(runs) == 6 and all(len(rs) == 2 for rs in runs.values())
    run = runs["xavier", "post", 6, 10, 3e-3][1]
    assert run.seed == 1 and run.overrides["min_lr"] == run.overrides["learning_rate"] == 3e-3
    # warmup 0: trains at 1e-3 only; warmup 10: at 1e-3 and 3e-3, one seed of 1e-2 collapses.
    outcome = {(0, 1e-3): ["finished"] * 2, (0, 3e-3): ["finished", "collapsed"], (0, 1e-2): ["diverged"] * 2,
               (10, 1e-3): ["finished"] * 2, (10, 3e-3): ["finished"] * 2, (10, 1e-2): ["collapsed", "finished"]}
    rows = {r.name: {"status": s, "val_loss_full": 2.0 if s == "finished" else 3.35}
            for (w, lr), statuses in outcome.items() for r, s in zip(runs["xavier", "post", 6, w, lr], statuses)}
    assert exp3.largest_stable_lr(runs, rows, ("xavier", "post", 6, 0)) == 1e-3
    assert exp3.largest_stable_lr(runs, rows, ("xavier", "post", 6, 10)) == 3e-3
    assert "| xavier | post | 6 | 0.001 | 0.003 |" in exp3.stable_lr_table(grid, runs, rows)
    assert "| xavier | post | 6 | 0 | 2.00 / 2.00 | 2.00 / C | D / D |" in exp3.map_table(grid, runs, rows)
    assert exp3.extensions(grid, runs, rows, {}, limit=3) == []  # both answers lie inside the grid


def test_stability_map_extends_a_row_whose_answer_is_at_an_edge(monkeypatch):
    """A row stable at its top LR gets the next half-decade above; a row stable nowhere the next below;
    each until the answer is inside, or the limit leaves it marked as a grid edge."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    import exp3_prenorm_vs_postnorm as exp3

    args = _common.parse(exp3.Exp3Options, ["--lrs=1e-3,3e-3", "--depths=6", "--warmups=0", "--seeds=1",
                                            "--placements=pre,post"], "exp3", "doc")
    grid = exp3.Grid.of(args)
    pre, post = ("xavier", "pre", 6, 0), ("xavier", "post", 6, 0)
    runs = exp3.cell_runs(grid, "layernorm")
    # pre trains up to 1e-2; post only below 1e-4: the truth the extensions must find
    status = lambda placement, lr: "finished" if (lr <= 1.1e-2 if placement == "pre" else lr < 1.1e-4) else "collapsed"  # noqa: E731
    steps, rounds = {}, []
    while True:
        rows = {r.name: {"status": status(cell[1], cell[4]), "val_loss_full": 2.0} for cell, rs in runs.items()
                for r in rs}
        new = exp3.extensions(grid, runs, rows, steps, limit=3)
        if not new:
            break
        rounds.append(sorted(new))
        runs = {**runs, **exp3.cell_runs(grid, "layernorm", new)}
    assert rounds == [sorted([(*pre, 1e-2), (*post, 3e-4)]), sorted([(*pre, 3e-2), (*post, 1e-4)])]
    assert exp3.stable_cell(runs, rows, pre) == "0.01" and exp3.stable_cell(runs, rows, post) == "0.0001"
    table = exp3.map_table(grid, runs, rows)
    assert "| lr 0.0001 | lr 0.0003 | lr 0.001 | lr 0.003 | lr 0.01 | lr 0.03 |" in table
    assert "| xavier | pre | 6 | 0 |  |  | 2.00 | 2.00 | 2.00 | C |" in table
    # with one extension a side, post's answer stays at the grid's lower edge, and says so
    steps, runs = {}, exp3.cell_runs(grid, "layernorm")
    for _ in range(3):
        rows = {r.name: {"status": status(cell[1], cell[4]), "val_loss_full": 2.0} for cell, rs in runs.items()
                for r in rs}
        runs = {**runs, **exp3.cell_runs(grid, "layernorm", exp3.extensions(grid, runs, rows, steps, limit=1))}
    assert exp3.stable_cell(runs, rows, post) == "none (< 0.0003, grid edge)"
    assert exp3.stable_cell(runs, rows, pre) == ">= 0.01 (grid edge)"


def test_loglog_slope_and_output_change(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp4_grad_norm_at_init as exp4

    depths = [2, 4, 8, 16]
    assert exp4.loglog_slope(depths, [3 * d ** -0.5 for d in depths]) == pytest.approx(-0.5)
    idx = torch.randint(29, (2, 16))
    model = exp4.model_at_init("post", "xavier", 2, exp4.SHAPES["quick"], 29, idx)
    before = [p.clone() for p in model.parameters()]
    assert exp4.output_change(model, idx, lr=0.0) == 0.0
    small, large = exp4.output_change(model, idx, lr=1e-4), exp4.output_change(model, idx, lr=1e-2)
    assert 0 < small < large
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # weights restored

    # Admin is measured as a run from scratch starts: its omega profiled (1 only where profiling starts)
    admin = exp4.model_at_init("admin", "xavier", 2, exp4.SHAPES["quick"], 29, idx)
    assert torch.all(admin.blocks[0].omega_attn.weight == 1)
    assert torch.all(admin.blocks[0].omega_ffwd.weight > 1)
    assert exp4._common.placement_problems("pre,admin") == []
    assert "builds no norm layers" in exp4._common.placement_problems("pre,ngpt")[0]


def test_exp2_options_are_checked_together(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    from exp2_norm_comparison import CORE, Exp2Options, config_name

    assert [config_name(c) for c in _common.parse(Exp2Options, [], "exp2", "doc").config_files()] == list(CORE)
    with pytest.raises(BabyGPTError) as e:
        _common.parse(Exp2Options, ["--quick", "--full", "--baseline=nope", "--seeds=1", "--lrs=1e-3,-1",
                                    "--tune_seeds=1", "--margin=-0.1", "--runner_up=some",
                                    "--configs=config/prenorm_ln.py,other/prenorm_ln.py"], "exp2", "doc")
    joined = "\n".join(e.value.problems)
    for fragment in ("--quick and --full are two tiers", "--baseline 'nope' is not among", "--seeds must be at least 2",
                     "--tune_seeds must be at least 2", "--margin takes a positive number",
                     "unknown runner_up 'some'; choose one of: baseline, all",
                     "--lrs must be in (0, 1000]", "names a configuration twice",
                     "config file 'other/prenorm_ln.py' not found"):
        assert fragment in joined
    with pytest.raises(BabyGPTError, match="--beyond is a tier of its own"):
        _common.parse(Exp2Options, ["--full", "--beyond"], "exp2", "doc")


@pytest.mark.slow
def test_exp2_tunes_one_lr_for_both_of_muons_groups_and_refuses_the_unmatched_update_size(tmp_path, monkeypatch):
    """Under optimizer muon (a config file's or --set's) a grid point sets muon_lr = learning_rate, as
    Liu et al. 2025 tune it; AdamW's configurations keep their two keys. muon_adjust_lr original is
    refused before anything is written."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    import exp2_norm_comparison as exp2

    rms, modern = exp2.config_path("prenorm_rms"), exp2.config_path("modern_rms")
    assert not _common.trains_with_muon(rms, []) and _common.trains_with_muon(modern, [])
    assert _common.trains_with_muon(rms, ["optimizer=muon"]) and not _common.trains_with_muon(modern, ["optimizer=adamw"])
    configs = {"prenorm_rms": rms, "modern_rms": modern}
    assert _common.muon_configurations(configs, []) == {"modern_rms"}  # what main gives the Plan
    assert _common.muon_configurations(configs, ["optimizer=muon"]) == set(configs)
    assert _common.muon_configurations(configs, ["optimizer=adamw"]) == set()
    plan = exp2.Plan("default", str(tmp_path), configs, "prenorm_rms", {}, [0, 1], [2, 3],
                     muon=_common.muon_configurations(configs, []))
    assert plan.run("prenorm_rms", 3e-3, 2).overrides == {"learning_rate": 3e-3, "min_lr": 3e-3 / 10}
    assert plan.run("modern_rms", 3e-3, 2).overrides == {"learning_rate": 3e-3, "min_lr": 3e-3 / 10, "muon_lr": 3e-3}
    assert {r.overrides["muon_lr"] for rs in plan.tuning({"modern_rms": [1e-3, 1e-2]})["modern_rms"].values()
            for r in rs} == {1e-3, 1e-2}
    assert exp2.muon_tie(plan).startswith("; under optimizer muon (modern_rms) muon_lr = lr as well")
    assert exp2.muon_tie(exp2.Plan("default", str(tmp_path), {"prenorm_rms": rms}, "prenorm_rms", {}, [0, 1], [2])) == ""
    with pytest.raises(BabyGPTError) as e:
        _common.parse(exp2.Exp2Options, [f"--configs={rms},{modern}", "--set=muon_adjust_lr=original"], "exp2", "doc")
    assert e.value.problems == [f"{modern} trains with optimizer muon and muon_adjust_lr original: the LR search moves "
                                f"learning_rate and muon_lr together, which assumes Muon's update is sized like "
                                f"AdamW's; use muon_adjust_lr match_rms_adamw (--set muon_adjust_lr=match_rms_adamw)"]
    with pytest.raises(BabyGPTError, match="malformed --set 'help'"):  # read as a key, never as a request for help
        _common.parse(exp2.Exp2Options, ["--set", "help"], "exp2", "doc")
    with pytest.raises(BabyGPTError, match="--set muon_lr has no effect: each run's muon_lr is set by the sweep's own"):
        _common.budget_args(_common.parse(exp2.Exp2Options, ["--set=muon_lr=0.02"], "exp2", "doc"), {},
                            [plan.run("modern_rms", 3e-3, 2)])


def test_exp2_beyond_tier_trains_the_frontiers_point_from_the_lrs_an_earlier_tier_tuned(tmp_path, monkeypatch):
    """--beyond: its own directory, the frontier point's budget (then --set), and each search starting
    around the LR --tuned_from tuned, as --full's does; nothing is trained here."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    import exp2_norm_comparison as exp2
    from babygpt.sweep import Run

    args = _common.parse(exp2.Exp2Options, ["--beyond", "--set=dtype=float32", "--tuned_from=" + str(tmp_path)],
                         "exp2", "doc")
    assert _common.tier(args) == "beyond"
    assert _common.output_path(args, exp2.NAME) == os.path.join("out", "beyond", exp2.NAME)
    published = _common.parse(exp2.Exp2Options, ["--beyond", "--publish", "--tuned_from=" + str(tmp_path)], "exp2", "doc")
    assert _common.output_path(published, exp2.NAME) == os.path.join("results", "beyond", exp2.NAME)
    run = Run(exp2.lr_overrides(1e-3), 0, exp2.config_path("prenorm_rms"))
    assert _common.budget_args(args, {}, [run]) == ["--block_size=128", "--max_iters=4800",
                                                    f"--data_dir={args.data_dir}", "--dtype=float32"]
    (tmp_path / exp2.TUNED_FILE).write_text(json.dumps({"tuned": {"prenorm_rms": 0.0055, "postnorm_ln": None}}))
    grids = exp2.start_grids(args, "beyond", {"prenorm_rms": "a.py", "postnorm_ln": "b.py"}, str(tmp_path))
    assert grids == {"prenorm_rms": [3e-3, 1e-2, 3e-2], "postnorm_ln": exp2.floats(exp2.GRID["default"])}


def test_exp2_sequential_table_draws_robustness_like_for_like_on_the_first_looks_pairs(monkeypatch):
    """The runner-up runs of a sequential stage hold the first look's seeds; its robustness cell compares
    the verdict on those pairs at the tuned LRs with the same pairs against the runner-up baseline,
    not the sequential verdict, which rests on more pairs and could never be redrawn on fewer."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2
    from babygpt.sequential import sequential_verdicts
    from babygpt.verdicts import compare_table

    configs = {"base": "base.py", "var": "var.py"}
    looks = [3, 6]
    plan = exp2.Plan("default", "out", configs, "base", [1e-3, 3e-3], [0, 1], list(range(2, 8)), looks=looks)
    seed_runs = plan.seed_runs({"base": 1e-3, "var": 3e-3})
    values = {"base": [2.10, 2.20, 2.15, 2.12, 2.18, 2.14], "var": [2.05, 2.17, 2.08, 2.07, 2.15, 2.09]}
    rows = {r.name: {"status": "finished", "val_loss_full": v, "num_params": 10, "wall_time_s": 1.0}
            for n in configs for r, v in zip(seed_runs[n], values[n])}
    paths = sequential_verdicts({"var": [a - b for a, b in zip(values["var"], values["base"])]}, looks, 0.01)
    outcome = exp2.Outcome({"base": {1e-3: 2.0, 3e-3: 2.1}, "var": {1e-3: 2.1, 3e-3: 2.0}},
                           {"base": 1e-3, "var": 3e-3}, {"base": 3e-3, "var": 1e-3}, {}, seed_runs, {}, rows, paths)
    first = {n: v[:3] for n, v in values.items()}
    for runner_up in ([2.101, 2.201, 2.151], [2.04, 2.18, 2.07]):  # the verdict on 3 pairs kept, then lost
        text = exp2.tuned_table(plan, outcome, values, {"base": runner_up}, 0.01, {}, None)
        header, _, _, var = [line.split(" | ") for line in text.splitlines()]
        cell = var[next(i for i, h in enumerate(header) if h.startswith("robust at runner-up LR"))]
        tuned, again = compare_table(first, "base", 0.01)["var"], compare_table({**first, "base": runner_up},
                                                                                 "base", 0.01)["var"]
        kept = tuned.call() == again.call()
        assert cell == (f"{'yes' if kept else 'no'}: {tuned.call()}" + ("" if kept else f" → {again.call()}")
                        + f", {tuned.delta()} → {again.delta()} / not run")
        assert cell.startswith("yes: better, " if runner_up[0] > 2.1 else "no: better → inconclusive, ")


def test_exp2_table_draws_each_verdict_and_its_robustness_to_either_sides_runner_up(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2
    from babygpt.verdicts import compare_table, floor_interval

    configs = {"base": "base.py", "var": "var.py"}
    plan = exp2.Plan("default", "out", configs, "base", [1e-3, 3e-3], [0, 1], [2, 3, 4])
    seed_runs = plan.seed_runs({"base": 1e-3, "var": 3e-3})
    values = {"base": [2.10, 2.20, 2.15], "var": [2.00, 2.12, 2.04]}
    rows = {r.name: {"status": "finished", "val_loss_full": v, "num_params": 10, "wall_time_s": 1.0}
            for n in configs for r, v in zip(seed_runs[n], values[n])}
    outcome = exp2.Outcome({"base": {1e-3: 2.0, 3e-3: 2.1}, "var": {1e-3: 2.1, 3e-3: 2.0}},
                           {"base": 1e-3, "var": 3e-3}, {"base": 3e-3, "var": 1e-3}, {}, seed_runs, {}, rows)
    # the baseline at its runner-up LR is as good as var: against it the verdict changes; var's own
    # runner-up LR was not run (--runner_up baseline)
    text = exp2.tuned_table(plan, outcome, values, {"base": [2.00, 2.12, 2.05]}, 0.01, {"base": 0.1, "var": 0.25},
                            None)
    cells = {line.split(" | ")[0][2:]: line.split(" | ") for line in text.splitlines()[2:]}
    expected = compare_table(values, "base", 0.01)["var"]
    assert cells["var"][2:5] == ["0.003", "0.001", "0.250"] and cells["var"][7] == expected.delta()
    assert cells["var"][8] == expected.adjusted() and cells["var"][9] == "better" == expected.call()
    # decided: no pairs to decide; three seeds less one leave two pairs, too few for any verdict
    assert cells["var"][10:12] == ["—", "stable in 0 of 3 deletions"]
    assert cells["var"][12].startswith("no: inconclusive") and cells["var"][12].endswith(" / not run")
    assert cells["base"][7] == "(baseline)"
    same = exp2.tuned_table(plan, outcome, values, {"base": [2.11, 2.19, 2.16]}, 0.01, {"base": 0.1, "var": 0.25},
                            None)
    assert "| better | — | stable in 0 of 3 deletions | yes / not run |" in same
    # --runner_up all: var at its own runner-up LR as well (there as good as the baseline: not better)
    both = exp2.tuned_table(plan, outcome, values, {"base": [2.11, 2.19, 2.16], "var": [2.12, 2.18, 2.14]}, 0.01,
                            {"base": 0.1, "var": 0.25}, None)
    own = compare_table({**values, "var": [2.12, 2.18, 2.14]}, "base", 0.01)["var"]
    assert f"| yes / no: {own.call()} ({own.delta()}) |" in both and own.call() != "better"
    # with the data's strongest floor, each row says where its mean lies against it (the regime)
    floored = exp2.tuned_table(plan, outcome, values, {"base": [2.11, 2.19, 2.16]}, 0.01, {"base": 0.1, "var": 0.25},
                               ("kn8", 2.05, True))
    header, *_, var = [line.split(" | ") for line in floored.splitlines()[:1] + floored.splitlines()[2:]]
    assert header[7] == "mean − KN 8-gram floor, scored as the runs (2.0500)" and var[8] == expected.delta()
    assert var[7] == floor_interval(values["var"], 2.05) == f"{sum(values['var']) / 3 - 2.05:+.3f} (at)"
    # without runner-up runs there is no robustness to show; an edge LR is marked
    outcome.censored = {"var": True}
    text = exp2.tuned_table(plan, outcome, values, {}, 0.01, {"base": 0.1, "var": None}, None)
    assert "| var | 10 | 0.003 (edge) | 0.001 | — (no LR trains) |" in text and "| not run / not run |" in text
    text = exp2.tuned_table(plan, outcome, values, {"base": [], "var": []}, 0.01, {"base": 0.1, "var": None}, None)
    assert "| no runner-up LR / no runner-up LR |" in text
    # the report's rule names how many comparisons the correction spans, and says what the code does
    assert "Verdicts are drawn for the table's one comparison: " in exp2.verdict_rule(1, 0.01, None, 3.3473)
    rule = exp2.verdict_rule(3, 0.01, None, 3.3473)
    assert "over the table's 3 comparisons together: " in rule
    for fragment in ("m = 0.01 nats, stated before the runs (not estimated from them)", "where Holm stopped",
                     "counts at the data's unigram loss (3.3473 nats)", "*pairs to decide*", "*Leave-one-seed-out*",
                     "a plain 95% interval, not the Holm step's (*not run*"):
        assert fragment in rule, fragment
    assert "stated before the runs with --margin" in exp2.verdict_rule(3, 0.02, 0.02, 3.3473)
    assert "has no pair" in exp2.verdict_rule(3, 0.01, None, None)
    # which runs --runner_up trains at their runner-up LRs: the baseline's (the default), or every one's
    second = {"base": 3e-3, "var": None}
    assert {n: len(rs) for n, rs in plan.runner_up_runs(second).items()} == {"base": 3}
    plan.args = types.SimpleNamespace(runner_up="all")
    assert {n: len(rs) for n, rs in plan.runner_up_runs(second).items()} == {"base": 3, "var": 0}
    plan.args = None
    # the LR table: mean over the tuning seeds, bold tuned, italic runner-up
    grid = exp2.lr_grid_table(outcome, {"base": 4.2, "var": 4.2})
    assert "| base | 4.200 | **2.000** | *2.100* |" in grid
    # A configuration that collapsed at every LR has no LR sensitivity (it would read as ~0, "robust").
    assert exp2.sensitivity([1e-3, 1e-2], {1e-3: 3.35, 1e-2: 3.35}, 4.2, trained=False) is None
    assert exp2.sensitivity([1e-3, 1e-2], {1e-3: 3.35, 1e-2: 2.35}, 4.2, trained=True) == pytest.approx(0.5)
    # Over one grid only: configurations whose searches started from different grids are not compared.
    means = {"a": {1e-3: 3.35, 1e-2: 2.35}, "b": {1e-3: 3.0, 1e-2: 2.8}}
    same = exp2.sensitivities_over_one_grid({"a": [1e-3, 1e-2], "b": [1e-3, 1e-2]}, means, {"a": 4.2, "b": 4.2},
                                            trained={"a"})
    assert same == {"a": pytest.approx(0.5), "b": None}
    assert exp2.sensitivities_over_one_grid({"a": [1e-3, 1e-2], "b": [1e-2, 3e-2]}, means, {"a": 4.2, "b": 4.2},
                                            trained={"a", "b"}) == {}
    # The report names where the search started: the grid, or (--full, --beyond) the earlier tier's LRs,
    # even where the points around them coincide.
    one_grid = {"a": [1e-3, 3e-3, 1e-2], "b": [1e-3, 3e-3, 1e-2]}

    def start(tier, lrs=None):
        return exp2.search_start(exp2.Plan(tier, "out", configs, "a", one_grid, [0, 1], [2],
                                           types.SimpleNamespace(lrs=lrs)), "results/x")
    assert start("default") == start("full", lrs="1e-3,3e-3,1e-2") == "the grid 0.001, 0.003, 0.01"
    assert start("full").startswith("the three half-decade points around the LR results/x tuned for each")


def report_rows(report: str, key: str) -> list[list[str]]:
    """The cells of the table after ``<!-- table: key -->`` in a report, header row first."""
    lines = report.splitlines()
    start = lines.index(f"<!-- table: {key} -->") + 1
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def committed_exp2_reports() -> list[str]:
    """Every experiment-2 report under results/ that git holds (by its settings.json)."""
    from babygpt.docfigures import tracked_files

    paths = {p for p in tracked_files(ROOT) if p.startswith("results/")}
    return sorted(os.path.dirname(p) for p in paths if p.endswith("/settings.json")
                  and json.loads(open(os.path.join(ROOT, p)).read()).get("experiment") == "exp2_norm_comparison"
                  and os.path.dirname(p) + "/report.md" in paths)


@pytest.mark.parametrize("result", committed_exp2_reports())
def test_every_committed_exp2_table_has_its_regime_and_one_row_per_configuration(result, monkeypatch):
    """A committed table written by an older version of the experiment goes stale silently (the five
    400-iteration ones lacked the floor column until they were collected again): each names the
    strongest n-gram floor it is measured against, and has a row for each configuration it ran."""
    report = open(os.path.join(ROOT, result, "report.md"), encoding="utf-8").read()
    header, *rows = report_rows(report, "tuned")
    assert re.fullmatch(r"mean − (modified )?KN \d+-gram floor, scored as the runs \(\d\.\d{4}\)", header[7]), (result, header)
    assert all(re.fullmatch(r"[+-]\d\.\d{3} \((above|below|at)\)", row[7]) for row in rows), result
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2

    settings = json.loads(open(os.path.join(ROOT, result, "settings.json")).read())
    configs = [exp2.config_name(c) for c in (settings["configs"] or "").split(",") if c]
    assert [row[0] for row in rows] == (configs or list(exp2.CORE))


def assert_collect_rewrites_the_same_tables(tmp_path, report, *args):
    """--collect on a finished experiment trains nothing and writes the same tables (but for the
    time columns); sharded runs are collected the same way (test_scaleout). (The experiment's main
    in this process: with nothing to train it starts none.)"""
    import contextlib

    import exp2_norm_comparison as exp2
    from babygpt import cli

    res = tmp_path / "res"
    kept = {p: p.stat().st_mtime_ns for p in (res / "runs").rglob("*") if p.is_file()}
    with contextlib.chdir(tmp_path):
        assert cli.run(exp2.main, ["--quick", "--out=res", *args, "--collect"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (res / "runs").rglob("*") if p.is_file()} == kept  # nothing trained
    again = (res / "report.md").read_text()
    for key in ("tuned", "lr_grid", "references", "parts"):
        one, collected = report_rows(report, key), report_rows(again, key)
        keep = [i for i, name in enumerate(one[0]) if "time" not in name]
        assert [[row[i] for i in keep] for row in collected] == [[row[i] for i in keep] for row in one], key


@pytest.mark.slow
def test_exp2_tunes_on_two_seeds_then_evaluates_each_configuration_at_its_own_lr(data_dir, tmp_path, monkeypatch,
                                                                                  capsys):
    """Quick tier: the LR grid on tuning seeds 0-1, the quarter-decade point beside the best, each
    configuration's best mean, evaluation seeds 2-3 there (and the baseline at its runner-up), paired
    with the baseline; then --full tunes again at its own budget, from the three half-decade points
    around the LR the earlier tier tuned, and evaluates seeds 2-3 at what it finds (the baseline
    alone there: the search and the pairing are the quick tier's, checked above)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2

    configs = "--configs=" + ",".join(os.path.join(ROOT, "config", c + ".py") for c in ("prenorm_rms", "postnorm_ln"))
    proc = run_experiment("exp2_norm_comparison", "--quick", "--out=res", f"--data_dir={data_dir}",
                          "--jobs=2", configs, cwd=tmp_path, monkeypatch=monkeypatch)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = tmp_path / "res"
    for name in ("norm_comparison.png", "lr_sensitivity.png", "results.csv", "report.md", "tuned_lrs.json"):
        assert (res / name).stat().st_size > 0, name
    rows = read_csv(res / "results.csv")
    assert all(r["status"] in DONE for r in rows)
    # 2 configs x (3 LRs x 2 tuning seeds + 2 evaluation seeds) + the baseline's 2 at its runner-up
    assert len(rows) == 2 * (3 * 2 + 2) + 2
    record = json.loads((res / "tuned_lrs.json").read_text())
    for config in ("prenorm_rms", "postnorm_ln"):
        mine = [r for r in rows if r["name"].startswith(config + "__")]
        tuning = [r for r in mine if r["seed"] in ("0", "1")]
        means = {}
        for r in tuning:
            means.setdefault(float(r["cfg.learning_rate"]), []).append(float(r["val_loss_full"]))
        assert sorted(means) == [3e-3, 9.5e-3, 3e-2] and all(len(v) == 2 for v in means.values())
        ranked = sorted(means, key=lambda lr: sum(means[lr]))  # quick runs neither diverge nor tie
        assert record["tuned"][config] == ranked[0] and record["second"][config] == ranked[1]
        evaluated = [(r["seed"], float(r["cfg.learning_rate"])) for r in mine if r["seed"] in ("2", "3")]
        expected = [(s, ranked[0]) for s in ("2", "3")] + ([(s, ranked[1]) for s in ("2", "3")]
                                                             if config == "prenorm_rms" else [])
        assert sorted(evaluated) == sorted(expected)
    report = (res / "report.md").read_text()
    table = {row[0]: row for row in report_rows(report, "tuned")[1:]}
    assert table["prenorm_rms"][8] == "(baseline)"
    assert float(table["postnorm_ln"][2].split()[0]) == record["tuned"]["postnorm_ln"]
    assert table["postnorm_ln"][10] == "inconclusive (2 pairs)"  # a verdict needs >= 3 seed pairs
    # the regime: each mean against the data's strongest n-gram floor, named in the header
    floor = report_rows(report, "tuned")[0][7]
    assert re.fullmatch(r"mean − (modified )?KN \d+-gram floor, scored as the runs \(\d\.\d{4}\)", floor), floor
    assert all(re.fullmatch(r"[+-]\d\.\d{3} \((above|below|at)\)", row[7]) for row in table.values())
    assert len(report_rows(report, "lr_grid")) == 3
    # runs of this code report the test part in sliding windows, and the floors are scored the same way
    references = [row[0] for row in report_rows(report, "references")[1:]]
    assert references == ["KN, full context", "modified KN, full context", "KN, as the runs: `sliding16s8`",
                          "modified KN, as the runs: `sliding16s8`"]
    assert "losses are reported on its second half (the test part, which no LR was chosen on)" in report
    # beside the verdicts, the same pairs on each part of the split; on the test part, the table's own Δ
    parts = {row[0]: row for row in report_rows(report, "parts")[1:]}
    assert list(parts) == ["postnorm_ln"] and all(re.fullmatch(r"[+-]\d\.\d{3} ± \d\.\d{3}", c) for c in parts["postnorm_ln"][2:])
    assert table["prenorm_rms"][5] == table["postnorm_ln"][5] == "2 finished"  # every pair trained, so
    assert parts["postnorm_ln"][1] == "2" and parts["postnorm_ln"][2] == table["postnorm_ln"][8]  # the same Δ
    assert_collect_rewrites_the_same_tables(tmp_path, report, f"--data_dir={data_dir}", configs)

    full = run_experiment("exp2_norm_comparison", "--full", "--out=full", "--tuned_from=res",
                          f"--data_dir={data_dir}", "--jobs=2", "--seeds=2", configs.split(",")[0],
                          *[f"--set={a[2:]}" for a in BASE if not a.startswith("--eval_interval")],
                          "--set=max_iters=4", "--set=eval_interval=2", cwd=tmp_path, monkeypatch=monkeypatch)
    assert full.returncode == 0, full.stderr[-2000:]
    rows = read_csv(tmp_path / "full" / "results.csv")
    full_record = json.loads((tmp_path / "full" / "tuned_lrs.json").read_text())
    assert set(full_record["tuned"]) == {"prenorm_rms"} and all(r["name"].startswith("prenorm_rms__") for r in rows)
    for config, lr in record["tuned"].items():
        if config not in full_record["tuned"]:
            continue
        mine = [r for r in rows if r["name"].startswith(config + "__")]
        tried = {float(r["cfg.learning_rate"]) for r in mine if r["seed"] in ("0", "1")}
        assert full_record["grids"][config] == exp2.centered_grid(lr) and set(exp2.centered_grid(lr)) <= tried
        evaluated = {(float(r["cfg.learning_rate"]), r["seed"]) for r in mine if r["seed"] in ("2", "3")}
        assert {(full_record["tuned"][config], s) for s in ("2", "3")} <= evaluated
    assert (tmp_path / "full" / "lr_sensitivity.png").exists()
    full_report = (tmp_path / "full" / "report.md").read_text()
    assert "the three half-decade points around the LR res tuned for each configuration" in full_report
    # One configuration searched one grid: the LR sensitivity is given (what it is left out for is below).
    assert "is left out" not in full_report
    assert re.fullmatch(r"\d\.\d{3}", report_rows(full_report, "tuned")[1][4])
    # Without the default tier's record --full is refused before anything is written (in this process).
    monkeypatch.chdir(tmp_path)
    assert_refused_in_process(exp2.main, ["--full", "--out=full2", "--tuned_from=nowhere", f"--data_dir={data_dir}"],
                              capsys, "--tuned_from names 'nowhere', which is not a directory")
    (tmp_path / "empty").mkdir()
    assert_refused_in_process(exp2.main, ["--full", "--out=full2", "--tuned_from=empty", f"--data_dir={data_dir}"],
                              capsys, "no tuned_lrs.json in 'empty'; run the default tier first")
    assert not (tmp_path / "full2").exists()


@pytest.mark.slow
def test_an_experiment_runs_as_a_command(tmp_path):
    """The other tests run the experiments' main in their own process (run_experiment); here one
    starts as a user starts it, and its report names the command it was given."""
    proc = run_script("experiments/exp1_gradient_vanishing.py", "--quick", "--out=res", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = (tmp_path / "res" / "report.md").read_text()
    assert "Command: `python experiments/exp1_gradient_vanishing.py --quick --out=res`" in report


@pytest.mark.slow
def test_exp5_norm_speed_quick_mode(data_dir, tmp_path, monkeypatch):
    """Every implementation (the registry, read now, the from-scratch formulas of classes that call
    a fused kernel, and PyTorch's two) gets a timing row per
    pass and width, and every norm_type a training-speed row; --quick compiles nothing."""
    from babygpt.norms import NORMS, norm_class

    proc = run_experiment("exp5_norm_speed", "--quick", "--out=res", f"--data_dir={data_dir}", cwd=tmp_path,
                          monkeypatch=monkeypatch)
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


def test_exp5_norm_speed_rejects_unmeasured_compile_width(tmp_path, monkeypatch, capsys):
    """Refused before anything is measured or written (the script's main, in this process)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp5_norm_speed

    monkeypatch.chdir(tmp_path)
    assert_refused_in_process(exp5_norm_speed.main, ["--quick", "--compile_widths=100"], capsys,
                              "--compile_widths must be among")
    assert_refused_in_process(exp5_norm_speed.main, ["--quick", "--set", "norm_type=dyt"], capsys,
                              "--set norm_type=dyt: experiment 5 times every norm_type in turn")
    assert not (tmp_path / "results").exists()
    import _common

    args = _common.parse(exp5_norm_speed.Exp5Options, ["--quick", "--compile_widths=off", "--set", "n_layer=3"],
                         "exp5", "doc")
    assert args.compiled() == [] and args.set_keys() == {"n_layer"}


@pytest.mark.slow
def test_exp6_counts_block_0_from_the_records_as_the_checkpoint_holds_it(data_dir, tmp_path, monkeypatch):
    """The per-element gradient needs block 0's size: read from config.json (committed), it is the
    count of block 0's tensors in the run's checkpoint (not committed), for Post-LN with biases and without."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp6_postln_collapse as exp6
    from babygpt.checkpoint import load_checkpoint
    from babygpt.config import load_config
    from babygpt.trainer import train

    for bias in (True, False):
        out = tmp_path / f"bias{bias}"
        train(load_config(once(f"--data_dir={data_dir}", f"--out_dir={out}", *TINY_TRAIN_ARGS, "--max_iters=2",
                           "--norm_placement=post", "--norm_type=layernorm", f"--bias={bias}", "--n_layer=3")))
        state = load_checkpoint(str(out / "ckpt.pt"))["model"]
        expected = sum(t.numel() for name, t in state.items() if name.startswith("blocks.0."))
        (out / "ckpt.pt").unlink()  # what a fresh clone has: the records only
        assert exp6.block0_size(str(out)) == expected


def test_lr_sensitivity_experiment_reads_the_diagnostics(monkeypatch):
    """exp7: the peak attention logit is the largest over layers and iterations, |log Z| is read at the
    last measurement, and the table's LR sensitivity is babygpt.stats' on the seed-mean losses."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp7_lr_sensitivity as exp7
    from babygpt.stats import lr_sensitivity

    run = {"metrics": [{"iter": 10, "attn_logit_max": [3.0, 9.0], "output_logz": [-4.0]},
                       {"iter": 20, "loss": 2.0},
                       {"iter": 30, "attn_logit_max": [5.0, None], "output_logz": [-6.0]}]}
    assert exp7.peak_diag(run, "attn_logit_max") == 9.0 and exp7.last_diag(run, "output_logz") == -6.0
    lrs, widths = [1e-3, 1e-2], [64]
    losses = {"plain": [2.5, 2.2], "qk_norm": [2.4, 2.3], "z_loss": [2.5, math.inf], "qk_norm + z_loss": [3.0, 2.9]}
    losses.update({arm: [2.6, 2.4] for arm in exp7.ARMS if arm not in losses})  # the weight-decay arms
    summary = {(arm, 64, lr): {"loss": loss, "logit": 1.0, "logz": 2.0}
               for arm, ls in losses.items() for lr, loss in zip(lrs, ls)}
    table = exp7.sensitivity_table(summary, lrs, widths, {64: 4.2})
    plain = next(line for line in table.splitlines() if "| plain |" in line)
    assert f"| {lr_sensitivity({1e-3: 2.5, 1e-2: 2.2}, 4.2):.3f} |" in plain and "| 0.01 | 2.200 |" in plain
    assert "diverged" in next(line for line in table.splitlines() if "| z_loss |" in line)
    assert len(table.splitlines()) == 2 + len(exp7.ARMS)  # every arm has its row


def test_a_naive_half_norm_loses_the_rows_whose_square_overflows(monkeypatch):
    """exp9's naive RMSNorm equals the library's in float32; in float16 a row holding 300.0 has
    mean(x^2) = inf there and comes out as zeros, while the library's norm (squaring in float32)
    matches the float32 result."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp9_fp16_overflow as exp9
    from babygpt.norms import RMSNorm

    norm = RMSNorm(8)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
    naive = exp9.NaiveHalfRMSNorm(norm)
    x = torch.randn(3, 8) * 10
    x[1, 2] = 300.0  # 300^2 = 90,000 > 65,504
    torch.testing.assert_close(naive(x), norm(x))
    h = x.half()
    assert torch.isinf(h[1].pow(2).mean())
    naive_out, ours = naive(h.clone()), norm.half()(h.clone())
    assert torch.equal(naive_out[1], torch.zeros(8, dtype=torch.float16))  # the row is lost
    torch.testing.assert_close(naive_out[[0, 2]].float(), norm.float()(x)[[0, 2]], atol=1e-2, rtol=1e-2)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours.float(), norm.float()(h.float()), atol=1e-2, rtol=1e-2)


def test_fp16_overflow_finds_the_first_crossing_and_swaps_every_rmsnorm(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp9_fp16_overflow as exp9
    from babygpt.model import GPT
    from babygpt.norms import RMSNorm
    from conftest import tiny_config

    run = {"metrics": [{"iter": 5, "resid_max": [3.0, 200.0]}, {"iter": 7, "loss": 2.0},
                       {"iter": 10, "resid_max": [100.0, 256.0]}, {"iter": 15, "resid_max": [300.0, None]}]}
    assert exp9.first_crossing(run) == 10
    assert exp9.first_crossing({"metrics": run["metrics"][:2]}) is None
    model = exp9.with_naive_norms(GPT(tiny_config(norm_type="rmsnorm")))
    kinds = [type(m) for m in model.modules()]
    assert RMSNorm not in kinds and kinds.count(exp9.NaiveHalfRMSNorm) == 5  # ln1 and ln2 of 2 blocks, ln_f


@pytest.mark.slow
def test_fp16_overflow_stops_a_crossing_run_at_the_crossing_with_the_same_weights(monkeypatch, data_dir, tmp_path):
    """With the threshold lowered so that the tiny model crosses it, the experiment's second sweep stops
    the run at the crossing and its diagnostics there equal the long run's: same weights."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp9_fp16_overflow as exp9

    monkeypatch.setattr(exp9, "FP16_SQUARE_LIMIT", 1.0)
    monkeypatch.chdir(tmp_path)
    assert exp9.main(["--quick", f"--data_dir={data_dir}", "--out=res"]) == 0
    row = read_csv(tmp_path / "res" / "results.csv")[0]
    assert row["first_crossing"] == row["checkpoint_iter"] != "10" and row["same_as_long_run"] == "True"
    assert (tmp_path / "res" / "at_crossing" / "results.csv").exists()


@pytest.mark.slow
def test_beyond_tier_trains_where_the_committed_frontier_first_passed_plain_kneser_ney(monkeypatch):
    """_common.BEYOND_BUDGET is where the committed frontier (results/regime) first ends below the
    plain interpolated Kneser-Ney 8-gram with full context, the floor the tier was chosen by (each
    point at its best LR, the cheapest in training minutes among those below); the stronger floors
    scored as the runs are, which no point passes, are experiment 11's report's."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    import exp11_regime as exp11
    from babygpt.runstore import RunStore

    stored = RunStore(os.path.join(ROOT, "results", "regime")).records()  # the runs that have ended
    summaries = {name: record["summary"] for name, record in stored.items()}
    lrs = sorted({run.overrides["learning_rate"] for p in exp11.FRONTIER for run in p.runs(p.lrs).values()}
                 | {float(name.split("learning_rate=")[1].split("__")[0]) for name in summaries})
    points = []
    for p in exp11.FRONTIER:
        rows = [summaries[run.name] for run in p.runs(lrs).values() if run.name in summaries]
        if rows:
            points.append({"point": p, "row": min(rows, key=exp11.run_loss)})
    floor = next(iter(summaries.values()))["references"]["kn8"]
    for p in points:
        p["floor"] = ("kn8", floor)
    below = exp11.crossing(points)
    assert below, f"no committed frontier run ends below {floor}; the beyond tier has no point to train at"
    assert dict(below["point"].overrides) == _common.BEYOND_BUDGET


def test_full_tier_search_starts_around_the_default_tiers_lr_from_the_first_record_that_has_it(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2

    assert exp2.centered_grid(0.0055) == [3e-3, 1e-2, 3e-2]  # a quarter-decade point: the nearer in log scale
    assert exp2.centered_grid(1e-3) == [3e-4, 1e-3, 3e-3] and exp2.centered_grid(0.017) == [3e-3, 1e-2, 3e-2]
    for name, tuned in (("a", {"x": 1e-3, "y": None}), ("b", {"x": 3e-2, "z": 3e-3})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tuned_lrs.json").write_text(json.dumps({"tuned": tuned, "second": {"x": 3e-3}}))
    record = exp2.read_record([str(tmp_path / "a"), str(tmp_path / "b")], ["x", "y", "z"])
    assert record == {"tuned": {"x": 1e-3, "y": None, "z": 3e-3}, "second": {"x": 3e-3}}
    with pytest.raises(BabyGPTError, match="has no tuned LR for w"):
        exp2.read_record([str(tmp_path / "a")], ["x", "w"])


def test_exp14_reads_each_arms_runs_picks_the_lr_on_the_tune_loss_and_reads_the_test_loss_against_its_floor(
        tmp_path, monkeypatch, capsys):
    """Experiment 14 trains nothing: from sweeps laid out as its README's commands make them, the tuned LR
    is the lowest mean tune loss over both seeds (an LR with one finished seed cannot be chosen), and each
    run is below its floor when its test loss is below the strongest floor of its own test targets."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp14_five_minutes as exp14

    floors = {"unigram": 3.3, "kn8": 1.58, "mkn9": 1.55}
    runs = {  # sweep dir -> [(lr, seed, tune, test)]
        "modern_rms": [(0.01, 0, 1.64, 1.72), (0.01, 1, 1.66, 1.73), (0.02, 0, 1.60, 1.54), (0.02, 1, 1.61, 1.56),
                       (0.04, 0, 1.50, 1.50)],  # 0.04: one seed only
        "modern_rms_adamw_lr3e-3": [(3e-3, 0, 1.70, 1.75), (3e-3, 1, 1.71, 1.76)],
        "modern_rms_eval": [(0.02, 2, 1.65, 1.53)],  # an evaluation seed: chooses nothing
    }
    for sweep, rows in runs.items():
        key = "learning_rate" if "adamw" in sweep else "muon_lr"
        for lr, seed, tune, test in rows:
            run = tmp_path / sweep / "runs" / f"{sweep}__{key}={lr}__seed={seed}"
            run.mkdir(parents=True)
            (run / "config.json").write_text(json.dumps({"config": {key: lr, "seed": seed}}))
            (run / "summary.json").write_text(json.dumps({"status": "finished", "iter": 300, "tune_loss": tune,
                                                          "test_loss": test, "references_test": floors,
                                                          "val_loss_full": test, "final_val_loss": test,
                                                          "best_val_loss": test}))
    timings = tmp_path / "timings.csv"
    timings.write_text("piece,ms_per_iter\ndefault,180\nmodern_rms.py,1000\nmodern_rms_adamw.py,200\n")
    assert exp14.main([f"--out={tmp_path}", f"--timings={timings}"]) == 0
    rows = read_csv(tmp_path / "results.csv")
    tuned = {(r["arm"], float(r["lr"])) for r in rows if r["tuned"] == "True" and r["role"] == "tuning"}
    assert tuned == {("modern_rms (Muon)", 0.02)}  # an arm that tried one LR tuned none
    below = {(float(r["lr"]), r["seed"]) for r in rows if r["below_floor"] == "True"}
    assert below == {(0.02, "0"), (0.04, "0"), (0.02, "2")}
    assert json.loads((tmp_path / "settings.json").read_text())["experiment"] == "exp14_five_minutes"
    report = (tmp_path / "report.md").read_text()
    assert "3 of 8 runs end below" in report and "at the tuned LRs, 1 of 2; of the evaluation seeds, 1 of 1" in report
    assert "300 steps in 300 s" in report  # the Muon arm's budget: 300 s / 1,000 ms


def test_exp15_reads_the_time_to_each_runs_first_eval_at_the_target(tmp_path, monkeypatch, capsys):
    """Experiment 15 trains nothing: a run's time to the target is the elapsed_s of its first evaluation
    at or below it; a run that never got there says so, with its best evaluation beside it."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp15_time_to_target as exp15

    evals = {"h200/fast": [(0, 4.2, 1.0), (250, 1.50, 10.0), (500, 1.46, 20.0)],
             "h100/slow": [(0, 4.2, 1.5), (250, 1.52, 12.0), (500, 1.48, 24.0), (750, 1.49, 36.0)]}
    for name, rows in evals.items():
        run = tmp_path / name
        run.mkdir(parents=True)
        config = {"target_val_loss": 1.47, "optimizer": "adamw", "compile": False, "learning_rate": 1e-3,
                  "muon_lr": 0.02, "seed": 0}
        (run / "config.json").write_text(json.dumps({"config": config}))
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"iter": i, "tokens_per_s": 1e6, "elapsed_s": s, "val_loss": v}) + "\n" for i, v, s in rows))
        (run / "summary.json").write_text(json.dumps({
            "status": "finished", "iter": rows[-1][0], "test_loss": 1.52, "machine": {"device": "cuda", "gpu": name[:4]},
            "references_test": {"unigram": 3.3, "kn8": 1.58, "mkn9": 1.55}}))
    assert exp15.main([f"--out={tmp_path}"]) == 0
    rows = {r["arm"]: r for r in read_csv(tmp_path / "results.csv")}
    assert rows["fast"]["reached_at"] == "500" and float(rows["fast"]["seconds_to_target"]) == 20.0
    assert rows["slow"]["reached_at"] == "" and rows["slow"]["best_at"] == "500"
    assert rows["slow"]["card"] == "h100"
    report = (tmp_path / "report.md").read_text()
    assert "1 of 2 runs reached val 1.47, in 20.0 to 20.0 s." in report and "not reached" in report


def test_exp15_refuses_a_run_trained_without_a_target(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp15_time_to_target as exp15

    run = tmp_path / "h200" / "plain"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"config": {"target_val_loss": 0.0}}))
    (run / "summary.json").write_text(json.dumps({"status": "finished", "iter": 10}))
    (run / "metrics.jsonl").write_text("")
    assert_refused_in_process(exp15.main, [f"--out={tmp_path}"], capsys, "trained without --target_val_loss")
    assert not (tmp_path / "results.csv").exists()


def test_an_experiment_says_when_its_budget_overrides_a_config_files_own_key():
    import sys

    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import _common
    from babygpt.sweep import Run

    runs = [Run({}, 0, os.path.join(ROOT, "config", name)) for name in ("ngpt.py", "prenorm_rms.py")]
    lines = _common.budget_over_config(dict(_common.DEFAULT_BUDGET), runs)
    assert len(lines) == 1 and "ngpt.py sets warmup_iters = 0" in lines[0] and "warmup_iters=50" in lines[0]


@pytest.mark.parametrize("key, value", [("tuned", -0.003), ("tuned", math.nan), ("second", 0), ("tuned", "3e-3"),
                                        ("tuned", True), ("tuned", 1e300)])
def test_a_damaged_tuned_lrs_json_is_refused_by_name(key, value, data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2

    record = {"tuned": {"prenorm_rms": 3e-3}, "second": {"prenorm_rms": 1e-3}}
    record[key]["prenorm_rms"] = value
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "tuned_lrs.json").write_text(json.dumps(record))  # (NaN as JSON writes it: NaN)
    out = tmp_path / "full"
    assert_refused_in_process(exp2.main, ["--full", f"--out={out}", f"--tuned_from={tmp_path / 'res'}",
                                          f"--configs={ROOT}/config/prenorm_rms.py", f"--data_dir={data_dir}"], capsys,
                              f"{tmp_path / 'res' / 'tuned_lrs.json'} is damaged: its {key} LR for prenorm_rms is",
                              "not a learning rate train.py accepts")
    assert not out.exists()


@pytest.mark.parametrize("text", ["{", "[1, 2]", ""])
def test_a_tuned_lrs_json_that_is_not_a_json_object_is_called_damaged_not_missing(text, data_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2

    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "tuned_lrs.json").write_text(text)
    out = tmp_path / "full"
    assert_refused_in_process(exp2.main, ["--full", f"--out={out}", f"--tuned_from={tmp_path / 'res'}",
                                          f"--configs={ROOT}/config/prenorm_rms.py", f"--data_dir={data_dir}"], capsys,
                              f"{tmp_path / 'res' / 'tuned_lrs.json'} is not a readable JSON object: it is damaged")
    assert not out.exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--tuned_from=results"], "--tuned_from is read by --full and --beyond only"),
    (["--quick", "--tuned_from=results"], "--tuned_from is read by --full and --beyond only"),
    (["--full", "--tuned_from=results", "--lrs=1e-3,3e-3"], "--tuned_from and --lrs both say where"),
    (["--full", "--tuned_from=results,no/such/dir"], "--tuned_from names 'no/such/dir', which is not a directory"),
])
@pytest.mark.slow
def test_exp2_tuned_from_is_refused_where_nothing_reads_it(argv, fragment, monkeypatch):
    """Used or refused: the default and quick tiers search their own grid, and --lrs replaces the
    points around the earlier LRs, so --tuned_from would do nothing there."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    from exp2_norm_comparison import Exp2Options

    with pytest.raises(BabyGPTError, match=re.escape(fragment)):
        _common.parse(Exp2Options, argv, "exp2", "doc")


@pytest.mark.parametrize("script, argv, fragment", [
    ("exp1_gradient_vanishing", ["--depth=1000000"], "experiment 1 at --depth=1000000 (width 256, batch 1024) needs "
                                                     "at least 3,418.0 GiB"),
    ("exp4_grad_norm_at_init", ["--depths=2,1000000"], "experiment 4 at n_layer=1000000 (width 128) needs at least"),
    ("exp1_gradient_vanishing", ["--depth=3000000", "--quick"], "experiment 1 at --depth=3000000 (width 64, batch 64)"),
])
def test_sizes_beyond_memory_are_refused_with_the_figure_before_anything_is_written(script, argv, fragment, data_dir,
                                                                                     tmp_path, capsys, monkeypatch):
    import importlib

    from babygpt import memory

    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    monkeypatch.setattr(memory, "available_bytes", lambda device: 8 * 2**30)  # 8 GiB free, whatever is
    module = importlib.import_module(script)
    data = [f"--data_dir={data_dir}"] if script == "exp4_grad_norm_at_init" else []  # (exp1 reads no data)
    assert_refused_in_process(module.main, [*argv, f"--out={tmp_path / 'out'}", *data], capsys,
                              fragment, "more than the 8.0 GiB of memory free", "lower --depth")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("script, argv, fragment", [
    ("exp4_grad_norm_at_init", ["--depths=2,4"], "experiment 4 at n_layer=4 (width 32) would take about 10.0 hours"),
    ("exp1_gradient_vanishing", ["--depth=4"], "experiment 1 at --depth=4 (width 64, batch 64) would take about "
                                               "10.0 hours"),
])
def test_sizes_that_fit_but_would_run_for_hours_are_refused_with_the_estimate(script, argv, fragment, data_dir,
                                                                               tmp_path, capsys, monkeypatch):
    """The estimate: each unit of the experiment timed at 1 and 2 blocks, extended linearly to the
    depths asked for (here a machine where a block takes 1,000 s, 500 s more for the unit: exp4's
    default 3 placements x 2 inits x (2 x 500 + (2 + 4) x 1,000) s = 42,000 s; exp1's quick tier,
    2 seeds x 3 norms x (500 + 4 x 1,000) s = 27,000 s)."""
    import importlib

    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common

    from babygpt import memory

    module = importlib.import_module(script)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**40)
    monkeypatch.setattr(_common, "seconds_by_depth", lambda run_at: (500.0, 1000.0))
    monkeypatch.setattr(_common, "MAX_SECONDS", 3600)
    data = [f"--data_dir={data_dir}"] if script == "exp4_grad_norm_at_init" else []
    hours = {"exp4_grad_norm_at_init": 42000 / 3600, "exp1_gradient_vanishing": 27000 / 3600}[script]
    assert_refused_in_process(module.main, [*argv, "--quick", f"--out={tmp_path / 'out'}", *data], capsys,
                              fragment.replace("10.0", f"{hours:,.1f}"), "(timed at 1 and 2 blocks now)",
                              "lower --depth")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("script, argv, said", [
    ("exp1_gradient_vanishing", ["--depth=4"], "experiment 1 at --depth=4 (width 64, batch 64) takes about 240 s here "
                                               "(timed at 1 and 2 blocks now)\n"),
    ("exp4_grad_norm_at_init", ["--depths=2,4"], "experiment 4 at n_layer=4 (width 32) takes about 360 s here (timed "
                                                 "at 1 and 2 blocks now)\n"),
])
def test_a_size_whose_estimate_is_over_half_a_minute_says_it_before_it_starts(script, argv, said, data_dir, tmp_path,
                                                                               capsys, monkeypatch):
    """A size that fits but takes minutes (exp1 --depth=5000, exp4 --depths=2000) says its estimate on
    stderr before anything runs, as train.py does for a deep build; under SAY_SECONDS it says nothing.
    Here a block takes 10 s (exp1's quick tier: 2 seeds x 3 norms x 4 x 10 s; exp4's: 3 placements x
    2 inits x (2 + 4) x 10 s), then 0.5 s; the experiment is stopped where it would start (claim)."""
    import importlib

    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common

    module = importlib.import_module(script)

    class Started(Exception):
        pass

    def started(self, sweep=None):
        raise Started

    monkeypatch.setattr(_common.Experiment, "claim", started)
    data = [f"--data_dir={data_dir}"] if script == "exp4_grad_norm_at_init" else []
    for per_block, line in ((10.0, said), (0.5, "")):
        monkeypatch.setattr(_common, "seconds_by_depth", lambda run_at: (0.0, per_block))
        capsys.readouterr()
        with pytest.raises(Started):
            module.main([*argv, "--quick", f"--out={tmp_path / 'out'}", *data])
        assert capsys.readouterr().err == line
    assert os.listdir(tmp_path) == []


def test_the_time_estimate_is_a_units_cost_at_one_block_and_each_blocks_beyond(monkeypatch):
    """seconds_by_depth on a clock that a unit of n blocks advances by 3 + 2n seconds (the fastest
    of two runs counts: the first run at each depth is slower here by 5 s)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common

    now, calls = [0.0], []

    def run_at(n):
        calls.append(n)
        now[0] += 3 + 2 * n + (5 if calls.count(n) == 1 else 0)

    assert _common.seconds_by_depth(run_at, clock=lambda: now[0]) == (3.0, 2.0)
    assert calls == [1, 1, 2, 2]


@pytest.mark.slow
def test_exp2_looks_are_checked_with_the_other_options(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    from exp2_norm_comparison import Exp2Options

    assert _common.parse(Exp2Options, ["--looks=5,10,20"], "exp2", "doc").look_list() == [5, 10, 20]
    for argv, fragment in ((["--looks=2,5"], "start at 3 pairs or more"), (["--looks=5,5"], "must increase"),
                           (["--looks=5,x"], "whole numbers of seed pairs"),
                           (["--looks=5,10", "--seeds=5"], "--seeds and --looks both"),
                           (["--looks=5,10", "--configs=config/prenorm_rms.py"], "at least two configurations")):
        with pytest.raises(BabyGPTError, match=fragment):
            _common.parse(Exp2Options, argv, "exp2", "doc")


def test_exp2_runner_up_all_is_refused_with_the_baseline_alone(monkeypatch):
    """Used or refused: with one configuration every side --runner_up all names is the baseline, whose
    runner-up runs the default trains already: the option would do nothing."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    from exp2_norm_comparison import Exp2Options

    one = f"--configs={ROOT}/config/prenorm_rms.py"
    with pytest.raises(BabyGPTError) as e:
        _common.parse(Exp2Options, ["--runner_up=all", one], "exp2", "doc")
    assert e.value.problems == ["--runner_up all also trains the configurations besides the baseline at their "
                                "runner-up LR, but --configs names only prenorm_rms, the baseline; drop --runner_up, "
                                "or add configurations to --configs"]
    assert _common.parse(Exp2Options, ["--runner_up=baseline", one], "exp2", "doc").runner_up == "baseline"
    two = f"{one},{ROOT}/config/prenorm_ln.py"
    assert _common.parse(Exp2Options, ["--runner_up=all", two], "exp2", "doc").runner_up == "all"


@pytest.mark.parametrize("script", ["exp1_gradient_vanishing", "exp2_norm_comparison", "exp13_stack_speed"])
def test_publish_with_out_is_refused_as_one_of_them_doing_nothing(script, tmp_path, monkeypatch, capsys):
    """--out names the output directory itself, so --publish (results/ in place of out/) would be
    silently dropped: refused, before anything is written."""
    import importlib

    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(script)
    err = assert_refused_in_process(module.main, ["--quick", "--publish", "--out=res"], capsys)
    assert err == ("error: --publish puts the results under results/ in place of out/, but --out 'res' names the "
                   "directory itself; pass one of them\n")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("script, where", [("exp14_five_minutes", "results/modern_5min"),
                                           ("exp15_time_to_target", "results/gpu/time_to_target")])
def test_the_experiments_that_write_to_results_already_refuse_publish(script, where, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import importlib

    import _common

    options = next(v for k, v in vars(importlib.import_module(script)).items() if k.endswith("Options"))
    with pytest.raises(BabyGPTError, match=re.escape(f"--publish: experiment {script[3:5]} writes into {where} "
                                                     f"already (or --out); leave it out")):
        _common.parse(options, ["--publish"], script, "doc")


# Every comma-separated option of the experiments, by script: declared so (metavar "X,..."), each
# refuses an empty entry (babygpt.options). A new list option belongs here.
REUSE = {"reuse"}  # every training experiment's (babygpt.scaleout)
LIST_OPTIONS = {
    "exp1_gradient_vanishing": set(),
    "exp2_norm_comparison": {"configs", "lrs", "tuned_from", "looks", *REUSE},
    "exp3_prenorm_vs_postnorm": {"lrs", "depths", "warmups", "inits", "placements", *REUSE},
    "exp4_grad_norm_at_init": {"placements", "depths", "inits"},
    "exp5_norm_speed": {"compile_widths"},
    "exp6_postln_collapse": {"lrs", *REUSE},
    "exp7_lr_sensitivity": {"lrs", "widths", *REUSE},
    "exp8_dyt_saturation": REUSE,
    "exp9_fp16_overflow": {"lrs", *REUSE},
    "exp10_depth": {"configs", *REUSE},
    "exp11_regime": REUSE,
    "exp12_proxy": {"tiers"},
    "exp13_stack_speed": set(),
    "exp14_five_minutes": set(),
    "exp15_time_to_target": set(),
    "exp16_noise": {"configs", "lrs", "tuning_seeds", *REUSE},
    "exp17_transfer": {"stacks"},
    "exp18_qk_stability": {"lrs", *REUSE},
}


def experiment_options(script):
    import importlib

    return next(v for k, v in vars(importlib.import_module(script)).items()
                if k.endswith("Options") and k.startswith("Exp"))


def test_every_comma_separated_experiment_option_is_declared_as_one(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    from babygpt.options import options_of

    scripts = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "experiments", "exp*.py"))}
    assert scripts == set(LIST_OPTIONS)
    for script, names in LIST_OPTIONS.items():
        options = options_of(experiment_options(script))
        assert {name for name, o in options.items() if o.comma_separated} == names, script
        # an option whose help says it takes a comma-separated list is declared as one (--gpus: its
        # pattern, babygpt.scaleout, refuses an empty entry with the rest of a malformed list)
        assert not [n for n, o in options.items() if "comma-separated" in o.help and not o.comma_separated
                    and n != "gpus"], script


@pytest.mark.parametrize("script, option", sorted((s, o) for s, names in LIST_OPTIONS.items() for o in names))
@pytest.mark.slow
def test_an_empty_entry_of_a_comma_separated_experiment_option_is_refused(script, option, monkeypatch):
    """``--reuse ,`` read as no --reuse, ``--lrs 1e-3,,3e-3`` as a grid of two, ``--configs a.py,,b.py``
    as a config file named '': each refused by name, one line."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    monkeypatch.chdir(ROOT)  # (the defaults of other options name files here)
    import _common

    for text in (",", "x,,y", "x,", " ,x"):
        with pytest.raises(BabyGPTError) as e:
            _common.parse(experiment_options(script), [f"--{option}={text}"], script, "doc")
        assert e.value.problems == [f"--{option} has an empty entry in {text!r}; give its comma-separated values "
                                    f"with none empty or blank (no comma doubled or at either end)"], text


def test_exp2_looks_train_seeds_in_rounds_only_for_the_comparisons_still_open(monkeypatch, tmp_path):
    """--looks: every configuration runs the first look's seeds; a comparison decided at a look trains no
    more; the baseline and the open ones go on to the last look; the paths are the sequential verdicts of
    all the data; each round waits for the other shards (last=False); progress.md says after each look
    where the stage stands."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2
    from babygpt.sequential import sequential_verdicts

    looks = [5, 10, 15, 20, 25, 30]
    plan = exp2.Plan("full", str(tmp_path), {"base": "base.py", "clear": "clear.py", "null": "null.py"}, "base",
                     {}, [0, 1], list(range(2, 32)), looks=looks)
    plan.sweep = lambda runs: runs

    def loss(run):
        noise = 0.02 * math.sin(7.0 * run.seed)  # shared by the configurations: what pairing removes
        return 2.0 + noise + {"base.py": 0.0, "clear.py": -0.5 - 0.001 * (run.seed % 3),
                              "null.py": 0.05 * (-1) ** run.seed}[run.config]

    rounds = []

    progress = tmp_path / exp2.PROGRESS_FILE
    seen = []  # progress.md as each round after the first starts: the look before it

    def finished_rows(runs, last=True):
        if rounds:
            seen.append(progress.read_text())
        rounds.append(({exp2.config_name(r.config) for r in runs}, len(runs), last))
        return {r.name: {"status": "finished", "val_loss_full": loss(r)} for r in runs}

    monkeypatch.setattr(exp2._common, "finished_rows", finished_rows)
    runs, paths = exp2.sequential_rounds(plan, {"base": 1e-3, "clear": 3e-3, "null": 1e-3}, 0.01, 3.35)
    assert {name: [r.seed for r in rs] for name, rs in runs.items()} == {
        "base": list(range(2, 32)), "clear": list(range(2, 7)), "null": list(range(2, 32))}
    assert [n for _, n, _ in rounds] == [15, 25, 35, 45, 55, 65] and not any(last for *_, last in rounds)
    losses = {name: [loss(r) for r in rs] for name, rs in runs.items()}
    want = sequential_verdicts({n: [a - b for a, b in zip(losses[n], losses["base"])] for n in ("clear", "null")},
                               looks, 0.01)
    assert paths == want and paths["clear"][0].verdict == "better" and paths["null"][-1].verdict is None
    # the report: the look-by-look path (blank once stopped), and the verdict at its deciding look
    section = exp2.looks_section(looks, paths)
    clear_row = next(line for line in section.splitlines() if line.startswith("| clear |")).split(" | ")
    assert clear_row[1] == paths["clear"][0].cell() and clear_row[2:7] == [""] * 5 and clear_row[7] == "5 |"
    diffs = [a - b for a, b in zip(losses["clear"], losses["base"])]
    ci, verdict, to_decide, _ = exp2.sequential_cells(paths["clear"], diffs, looks, 0.01)
    assert verdict == "better (look 1, 5 pairs)" and to_decide == "—" and ci.endswith("%)")
    null_diffs = [a - b for a, b in zip(losses["null"], losses["base"])]
    _, verdict, to_decide, _ = exp2.sequential_cells(paths["null"], null_diffs, looks, 0.01)
    assert verdict == "inconclusive (look 6, 30 pairs)" and "(TOST ±0.01)" in to_decide
    # the first look's seeds for the robustness runs
    assert [r.seed for r in plan.runner_up_runs({"base": 3e-3})["base"]] == list(range(2, 7))
    rule = exp2.verdict_rule(2, 0.01, None, 3.35, looks)
    assert "group-sequential" in rule and "O'Brien-Fleming" in rule and "30 pairs: " in rule
    # progress.md: the table after each look, open comparisons "so far" until the stage ends
    assert len(seen) == 5 and "after look 1 of 6" in seen[0] and "It continues" in seen[0]
    assert "\n\nCommand: `python " in seen[0] and f"CPUs, torch {torch.__version__}\n" in seen[0]
    def progress_rows(text):
        (tmp_path / "look.md").write_text(text)
        return table_rows(report_table(str(tmp_path / "look.md"), "progress"))

    first = progress_rows(seen[0])
    assert first["clear"]["verdict"] == "better (look 1, 5 pairs)"
    assert first["null"]["verdict"] == "inconclusive so far (look 1, 5 pairs)"
    assert table_verdict(first["null"]) == "inconclusive" and table_verdict(first["base"]) == "baseline"  # citable
    assert first["null"]["pairs to decide"].endswith("(difference)") and first["base"]["runs"] == "5 finished"
    assert first["null"]["paired Δ vs base, CI at the latest look"].startswith(f"{statistics.fmean(null_diffs[:5]):+.3f} ± ")
    assert [exp2.confidence(a) for a in (0.05, 0.0125, 2.4e-07)] == ["95%", "98.75%", "99.999976%"]
    last = progress.read_text()
    # a stage whose every comparison is decided at look 1 stops there, and says so
    decided = {"clear": paths["clear"]}
    pair = exp2.Plan("full", str(tmp_path), {"base": "base.py", "clear": "clear.py"}, "base", {}, [0, 1],
                     list(range(2, 32)), looks=looks)
    exp2.write_progress(pair, {n: runs[n][:5] for n in ("base", "clear")}, {r.name: {"status": "finished",
                        "val_loss_full": loss(r)} for rs in runs.values() for r in rs},
                        {n: losses[n][:5] for n in ("base", "clear")}, decided, 0.01, continues=False)
    assert "after look 1 of 6" in progress.read_text() and "It has ended" in progress.read_text()
    exp2.write_progress(plan, runs, {r.name: {"status": "finished", "val_loss_full": loss(r)} for rs in runs.values()
                                     for r in rs}, losses, paths, 0.01, continues=False, floor=("mkn9", 2.1, True))
    from babygpt.ngram import label
    from babygpt.verdicts import floor_interval
    where = progress_rows(progress.read_text())["base"][f"mean − {label('mkn9')} floor, scored as the runs (2.1000)"]
    assert where == floor_interval(losses["base"], 2.1) and where.endswith("(below)")
    exp2.write_progress(plan, runs, {r.name: {"status": "finished", "val_loss_full": loss(r)} for rs in runs.values()
                                     for r in rs}, losses, paths, 0.01, continues=False, floor=("mkn9", 2.2, False))
    assert f"mean − {label('mkn9')} floor, full context (2.2000)" in progress_rows(progress.read_text())["base"]
    # --collect on a stage whose next look has runs missing refuses before writing progress.md; on a
    # stage whose runs are all there it writes the last look's, as the training did
    progress.unlink()
    plan.args = types.SimpleNamespace(collect=True)

    def stored(runs, last=True, have=None):
        if have is not None and len(runs) > have:
            raise BabyGPTError("runs missing")
        return {r.name: {"status": "finished", "val_loss_full": loss(r)} for r in runs}

    monkeypatch.setattr(exp2._common, "finished_rows", lambda runs, last=True: stored(runs, last, have=15))
    with pytest.raises(BabyGPTError, match="runs missing"):
        exp2.sequential_rounds(plan, {"base": 1e-3, "clear": 3e-3, "null": 1e-3}, 0.01, 3.35)
    assert not progress.exists()
    monkeypatch.setattr(exp2._common, "finished_rows", stored)
    assert exp2.sequential_rounds(plan, {"base": 1e-3, "clear": 3e-3, "null": 1e-3}, 0.01, 3.35)[1] == paths
    assert progress.read_text() == last
    exp2.write_progress(plan, runs, {r.name: {"status": "finished", "val_loss_full": loss(r)} for rs in runs.values()
                                     for r in rs}, losses, paths, 0.01, continues=False)
    assert "after look 6 of 6" in last and "It has ended" in last and "look 6: 30 pairs" in last
    final = progress_rows(last)
    assert final["null"]["verdict"] == verdict and final["null"]["runs"] == "30 finished"
    assert final["clear"]["collapsed or failed, 95% CI"] == "0 of 5 (0%–52%)"
    assert final["null"]["verdict on the runs that trained"] == "— (every run trained)"
    # the sentence on the split's parts, and (only for runs that recorded both halves) each comparison's
    # pairs on every part: here the tuning part's difference for clear is 0.02 lower than the test part's
    assert "these runs predate the test split" in last and "table: parts" not in last
    from babygpt.verdicts import difference_interval, split_sentence
    halves = {r.name: {"status": "finished", "val_loss_full": loss(r), "test_loss": loss(r) + 0.1,
                       "tune_loss": loss(r) - 0.1 - 0.02 * (r.config == "clear.py")} for rs in runs.values() for r in rs}
    tuned_on = plan.run("base", 1e-3, 0)  # a tuning run of this code: it recorded both halves too
    plan.tuning_runs = [tuned_on]
    halves[tuned_on.name] = {"status": "finished", "val_loss_full": 2.0, "tune_loss": 1.9, "test_loss": 2.1}
    exp2.write_progress(plan, runs, halves, losses, paths, 0.01, continues=False)
    assert split_sentence("test", "test") in progress.read_text()
    (tmp_path / "look.md").write_text(progress.read_text())
    parts = table_rows(report_table(str(tmp_path / "look.md"), "parts"))
    assert parts["clear"]["pairs"] == "5" and parts["null"]["pairs"] == "30" and "base" not in parts
    assert parts["clear"]["Δ on the test part (the verdicts')"] == difference_interval(diffs[:5])
    assert parts["clear"]["Δ on the tuning part"] == difference_interval([d - 0.02 for d in diffs[:5]])
    assert parts["null"]["Δ on the whole split (non-overlapping windows)"] == difference_interval(null_diffs)


def test_exp2_table_gives_each_configurations_collapse_rate_and_its_verdict_on_the_runs_that_trained(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp2_norm_comparison as exp2
    from babygpt.stats import clopper_pearson
    from babygpt.verdicts import compare_table

    configs = {"base": "base.py", "var": "var.py"}
    plan = exp2.Plan("default", "out", configs, "base", [1e-3, 3e-3], [0, 1], [2, 3, 4, 5, 6])
    seed_runs = plan.seed_runs({"base": 1e-3, "var": 3e-3})
    values = {"base": [2.10, 2.20, 2.15, 2.12, 2.18], "var": [2.00, 3.30, 2.04, 2.03, 2.07]}
    status = {"base": ["finished"] * 5, "var": ["finished", "collapsed", "finished", "finished", "finished"]}
    rows = {r.name: {"status": s, "val_loss_full": v, "num_params": 10, "wall_time_s": 1.0}
            for n in configs for r, v, s in zip(seed_runs[n], values[n], status[n])}
    outcome = exp2.Outcome({"base": {1e-3: 2.0}, "var": {3e-3: 2.0}}, {"base": 1e-3, "var": 3e-3}, {}, {}, seed_runs,
                           {}, rows)
    text = exp2.tuned_table(plan, outcome, values, {}, 0.01, {}, None)
    header, _, base_row, var_row = [line.split(" | ") for line in text.splitlines()]
    column = header.index("collapsed or failed, 95% CI")
    lo, hi = clopper_pearson(1, 5)
    assert var_row[column] == f"1 of 5 ({100 * lo:.1f}%–{100 * hi:.0f}%)" == "1 of 5 (0.5%–72%)"
    assert base_row[column] == "0 of 5 (0%–52%)" and exp2.percent(1.0) == "100%" and exp2.percent(0.0995) == "10%"
    trained = compare_table({"base": values["base"], "var": [2.00, math.inf, 2.04, 2.03, 2.07]}, "base", 0.01)["var"]
    assert var_row[column + 1] == f"{trained.call()} (4 pairs)" == "better (4 pairs)"
    assert var_row[header.index("verdict")] == compare_table(values, "base", 0.01)["var"].call() == "inconclusive"
    rows = {name: {**row, "status": "finished"} for name, row in rows.items()}
    calm = exp2.tuned_table(plan, exp2.Outcome(outcome.means, outcome.tuned, {}, {}, seed_runs, {}, rows), values, {},
                            0.01, {}, None)
    assert "| 0 of 5 (0%–52%) | — (every run trained) |" in calm
    fixed = exp2.Plan("default", "out", configs, "base", [1e-3, 3e-3], [0, 1], [2, 3, 4, 5, 6])
    gone = {"base": [{"status": "finished", "val_loss_full": v} for v in values["base"]],
            "var": [{"status": "collapsed", "val_loss_full": 3.3}] * 5}  # no pair trained: counted once
    assert exp2.trained_verdicts(fixed, gone, 0.01) == {"var": "inconclusive (0 pairs)"}
    assert "Clopper & Pearson 1934" in exp2.verdict_rule(1, 0.01, None, 3.35)
    # --looks: progress.md's row, the collapse rate and the sequential verdict over the runs that trained
    from babygpt.sequential import sequential_verdicts

    looks = [5, 10]
    plan = exp2.Plan("default", "out", configs, "base", [1e-3, 3e-3], [0, 1], list(range(2, 12)), looks=looks)
    by_name = {n: [{"status": s, "val_loss_full": v} for v, s in zip(values[n], status[n])] for n in configs}
    paths = sequential_verdicts({"var": [a - b for a, b in zip(values["var"], values["base"])]}, looks, 0.01)
    progress = exp2.progress_table(plan, by_name, values, paths, 0.01, continues=True)
    row = table_rows(progress)["var"]
    assert row["collapsed or failed, 95% CI"] == "1 of 5 (0.5%–72%)" and row["runs"] == "4 finished, 1 collapsed"
    # the 4 pairs that trained do not reach the first look's 5 (the fixed design above calls them better)
    assert sequential_verdicts({"var": [-0.10, -0.11, -0.09, -0.11]}, looks, 0.01) == {"var": []}
    assert row["verdict on the runs that trained"] == "inconclusive (4 pairs)"
    assert row["verdict"] == "inconclusive so far (look 1, 5 pairs)"
    # beside it, a configuration whose runs all trained reads its own verdict, not the collapsed one's
    three = exp2.Plan("default", "out", {**configs, "calm": "calm.py"}, "base", [1e-3, 3e-3], [0, 1],
                      list(range(2, 12)), looks=looks)
    calm_rows = [{"status": "finished", "val_loss_full": v} for v in (2.0, 2.1, 2.05, 2.02, 2.08)]
    trained = exp2.trained_verdicts(three, {**by_name, "calm": calm_rows}, 0.01)
    assert trained == {"var": "inconclusive (4 pairs)", "calm": "— (every run trained)"}
    collapsed_base = {**by_name, "base": [{**by_name["base"][0], "status": "collapsed"}, *by_name["base"][1:]]}
    assert exp2.trained_verdicts(plan, collapsed_base, 0.01)["var"] == "inconclusive (3 pairs)"


@pytest.mark.parametrize("argv, fragment", [
    (["--depths=2,2"], "--depths lists 2 more than once"),
    (["--depths=4,2,04"], "--depths lists 4 more than once"),
    (["--placements=pre,pre"], "--placements lists pre more than once"),
    (["--inits=gpt2,gpt2"], "--inits lists gpt2 more than once"),
])
def test_exp4_refuses_an_entry_listed_twice(argv, fragment, monkeypatch):
    """Used or refused: a depth, placement or init listed twice would be measured once."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import _common
    from exp4_grad_norm_at_init import Exp4Options

    with pytest.raises(BabyGPTError, match=re.escape(fragment)):
        _common.parse(Exp4Options, ["--quick", *argv], "exp4", "doc")


def _exp16():
    import sys

    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import exp16_noise

    return exp16_noise


def test_exp16_fits_its_parabola_as_numpy_does_and_moves_its_minimum_to_the_grid():
    import numpy as np

    exp16 = _exp16()
    xs, ys = [-3.0, -2.75, -2.5, -2.25, -2.0], [2.31, 2.2, 2.16, 2.18, 2.3]
    np.testing.assert_allclose(exp16.quadratic_fit(xs, ys), np.polyfit(xs, ys, 2), rtol=1e-9)
    lrs = [10 ** x for x in xs]
    # a parabola whose minimum (-2.6) lies between the grid's 2nd and 3rd points, nearer the 3rd
    by_lr = {lr: (math.log10(lr) + 2.6) ** 2 for lr in lrs}
    by_lr[lrs[1]] -= 0.015  # noise that makes the 2nd point the best grid point
    assert min(by_lr, key=by_lr.get) == lrs[1] and exp16.parabola_lr(by_lr) == lrs[2]
    falling = {lr: -math.log10(lr) for lr in lrs}  # no minimum inside: the best point itself
    assert exp16.parabola_lr(falling) == lrs[-1]


def test_exp16_scores_each_lr_choice_on_the_seeds_it_did_not_see():
    """Two LRs, four seeds: seed 0 alone prefers the worse LR; sets of one seed that hold it pick it, and
    the other seeds, which score it, find it 0.1 worse."""
    exp16 = _exp16()
    lrs, seeds = [1e-3, 1e-2], [0, 1, 2, 3]
    tune = {(lr, s): (1.0 if lr == 1e-2 else 1.1) for lr in lrs for s in seeds}
    tune[(1e-3, 0)] = 0.9
    test = {(lr, s): (1.0 if lr == 1e-2 else 1.1) for lr in lrs for s in seeds}
    out = exp16.lr_choice(tune, test, lrs, seeds, 1)["best grid point"]
    assert out["sets"] == 4 and out["share_overall_best"] == 0.75
    assert out["mean_regret"] == pytest.approx(0.1 / 4) and out["max_regret"] == pytest.approx(0.1)


def test_exp16_refuses_what_it_cannot_score(capsys):
    exp16 = _exp16()
    assert_refused_in_process(exp16.main, ["--quick", "--seeds=2"], capsys, "--seeds must be at least 3")
    assert_refused_in_process(exp16.main, ["--quick", "--tuning_seeds=3"], capsys,
                              "--tuning_seeds takes sizes from 1 to one less than the number of seeds (3)")
    assert_refused_in_process(exp16.main, ["--quick", "--configs=config/prenorm_rms.py"], capsys,
                              "--configs needs a baseline and at least one configuration")
    assert_refused_in_process(exp16.main, ["--full"], capsys, "--full is not a tier of this experiment")


def test_exp18_maps_each_arm_at_every_muon_lr_with_its_largest_logit_and_failures(monkeypatch, capsys):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    import exp18_qk_stability as exp18

    runs = exp18.arm_runs([0.01, 0.3], 2, 100.0, 25)
    assert len(runs) == 3 * 2 * 2 and len({r.name for r in runs.values()}) == 12
    for (arm, lr, seed), run in runs.items():
        assert run.seed == seed and run.overrides["optimizer"] == "muon" and run.overrides["muon_lr"] == lr
        assert "learning_rate" not in run.overrides and run.overrides["diag_interval"] == 25
        assert (run.overrides.get("qk_clip_tau") == 100.0) == (arm == "QK-Clip")
        assert run.config.endswith("prenorm_rms_qknorm.py" if arm == "QK-norm" else "prenorm_rms.py")
    metrics = [{"iter": 10, "loss": 3.0}, {"iter": 25, "attn_logit_max": [1.5, 7.25]},
               {"iter": 30, "qk_clipped_heads": 2}, {"iter": 40, "qk_clipped_heads": 0},
               {"iter": 50, "attn_logit_max": [3.0, 2.0], "qk_clipped_heads": 1}]
    assert exp18.largest_logit(metrics) == 7.25 and exp18.largest_logit(metrics[:1]) is None
    for overflowed in ([math.nan, 5.0], [5.0, math.nan], [math.inf, 1.0]):  # wherever the bad value lies
        assert exp18.largest_logit(metrics + [{"iter": 75, "attn_logit_max": overflowed}]) == math.inf
    assert exp18.clipped_steps(metrics) == (2, 3) and exp18.clipped_steps(metrics[:2]) == (0, 0)
    results = [{"arm": "QK-Clip", "muon_lr": 0.3, "seed": 0, "status": "finished", "final_loss": 2.0,
                "max_attn_logit": 120.0, "clipped_steps": 3, "logged_steps": 40},
               {"arm": "QK-Clip", "muon_lr": 0.3, "seed": 1, "status": "collapsed", "final_loss": 4.1,
                "max_attn_logit": 90.0, "clipped_steps": 1, "logged_steps": 12},
               {"arm": "no QK-norm", "muon_lr": 0.3, "seed": 0, "status": "diverged", "final_loss": math.inf,
                "max_attn_logit": None, "clipped_steps": 0, "logged_steps": 0}]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in exp18.map_table(results, [0.3]).splitlines()]
    rows = {(row[0], row[1]): row[2:] for row in cells[2:]}
    assert rows["QK-Clip", "0.3"] == ["120.0", "1 of 2", "2.0000", "4 of 52"]
    assert rows["no QK-norm", "0.3"] == ["—", "1 of 1", "—", ""]
    assert rows["QK-norm", "0.3"] == ["—", "0 of 0", "—", ""]
    assert_refused_in_process(exp18.main, ["--quick", "--seeds=0", "--qk_clip_tau=-1", "--lrs=0.1,0.1"], capsys,
                              "--seeds must be at least 1", "--qk_clip_tau must be a positive number",
                              "--lrs lists 0.1 more than once")
