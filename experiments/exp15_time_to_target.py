"""Experiment 15: how long does a run take to reach a target val loss? nanoGPT reports val 1.4697 in
about 3 minutes on one A100 for the shape of config/shakespeare_char_gpu.py; this reads GPU runs of that
config trained with --target_val_loss (each stops at its first evaluation at or below it) and tabulates,
per card and arm, the wall time to the target (compile and every evaluation included: the metrics rows'
elapsed_s), the iteration, the best evaluation and the throughput.

The runs are made by results/gpu/time_to_target/run.sh on a lent GPU and copied into
``--out``/<card>/<arm>/ (config.json, metrics.jsonl, summary.json). This script trains nothing: it
writes settings.json, results.csv and report.md into --out.

    python experiments/exp15_time_to_target.py [--out DIR]
"""

import glob
import json
import os
import statistics
import time
from dataclasses import dataclass

import _common

from babygpt import files
from babygpt.errors import BabyGPTError
from babygpt.ngram import label, strongest
from babygpt.rundir import write_json
from babygpt.runtime import machine_label


@dataclass
class Exp15Options(_common.Options):
    @property
    def root(self) -> str:
        """The cards' parent directory, where results.csv and report.md go: --out, or results/gpu/time_to_target."""
        return self.out if self.out is not None else os.path.join(_common.ROOT, "results", "gpu", "time_to_target")

    def problems(self) -> list[str]:
        problems = [f"--{name}: experiment 15 trains nothing (it reads the runs under --out); leave it out"
                    for name in ("quick", "overwrite") if getattr(self, name)]
        if self.publish:  # (root: --out, else the committed directory already)
            problems.append("--publish: experiment 15 writes into results/gpu/time_to_target already (or --out); "
                            "leave it out")
        return problems + ([] if os.path.isdir(self.root) else [f"{self.root!r} not found; check the path"])


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def run_row(directory: str) -> dict:
    """One run: its card, arm, settings, and where its evaluations met the target."""
    config = read_json(os.path.join(directory, "config.json"))["config"]
    summary = read_json(os.path.join(directory, "summary.json"))
    with open(os.path.join(directory, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    target = config["target_val_loss"]
    if not target:
        raise BabyGPTError(f"{directory} was trained without --target_val_loss; experiment 15 reads runs that set it")
    evals = [r for r in rows if r.get("val_loss") is not None and r.get("elapsed_s") is not None]
    reached = next((r for r in evals if r["val_loss"] <= target), None)
    best = min(evals, key=lambda r: r["val_loss"])
    speeds = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")]
    floors = summary.get("references_test")
    floor, floor_loss = strongest(floors) if floors else (None, None)
    return {"card": machine_label(summary.get("machine")), "arm": os.path.basename(directory),
            "optimizer": config["optimizer"], "compile": config["compile"], "lr": config["learning_rate"],
            "muon_lr": config["muon_lr"] if config["optimizer"] == "muon" else None, "seed": config["seed"],
            "target": target, "status": summary["status"], "stopped_at": summary["iter"],
            "reached_at": reached["iter"] if reached else None,
            "seconds_to_target": reached["elapsed_s"] if reached else None,
            "best_val_loss": best["val_loss"], "best_at": best["iter"], "seconds_to_best": best["elapsed_s"],
            "median_tokens_per_s": statistics.median(speeds) if speeds else None,
            "test_loss": summary.get("test_loss"), "floor": label(floor) if floor else None, "floor_loss": floor_loss}


def table(rows: list[dict]) -> str:
    def opt(r):
        return f"{r['optimizer']} (lr {r['lr']:g}" + (f", muon_lr {r['muon_lr']:g})" if r["muon_lr"] else ")")

    header = ["card", "arm", "optimizer", "compile", "reached the target at", "seconds to it", "best val (iter, s)",
              "median tokens/s", "ended", "test loss", "strongest floor"]
    return _common.markdown_table(header, [
        [r["card"], r["arm"], opt(r), "yes" if r["compile"] else "no",
         "—" if r["reached_at"] is None else f"{r['reached_at']:,}",
         "not reached" if r["seconds_to_target"] is None else f"{r['seconds_to_target']:.1f}",
         f"{r['best_val_loss']:.4f} ({r['best_at']:,}, {r['seconds_to_best']:.1f})",
         "—" if r["median_tokens_per_s"] is None else f"{r['median_tokens_per_s'] / 1e3:,.0f}k",
         f"{r['status']} at {r['stopped_at']:,}", "—" if r["test_loss"] is None else f"{r['test_loss']:.4f}",
         "—" if r["floor"] is None else f"{r['floor']} {r['floor_loss']:.4f}"] for r in rows])


def main(argv):
    started = time.time()
    args = _common.parse(Exp15Options, argv, "exp15_time_to_target", __doc__)
    dirs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(args.root, "*", "*", "summary.json")))
    if not dirs:
        raise BabyGPTError(f"no run under {args.root}/<card>/<arm>/; copy the runs of results/gpu/time_to_target/run.sh "
                           f"there first")
    rows = [run_row(d) for d in dirs]
    write_json(os.path.join(args.root, "settings.json"), _common.settings(args, "exp15_time_to_target"))
    files.write_csv(os.path.join(args.root, "results.csv"), list(rows[0]), rows)
    reached = [r for r in rows if r["seconds_to_target"] is not None]
    answer = (f"{len(reached)} of {len(rows)} runs reached val {rows[0]['target']:g}"
              + (f", in {min(r['seconds_to_target'] for r in reached):.1f} to "
                 f"{max(r['seconds_to_target'] for r in reached):.1f} s." if reached else "."))
    body = (f"Each run stops at its first evaluation at or below the target; times are wall-clock from the "
            f"start of training (compile and every evaluation included, data loading and model building "
            f"not), read from the metrics rows' elapsed_s.\n\n{_common.table_marker('runs')}{table(rows)}\n\n"
            f"{answer}\n")
    _common.write_report(os.path.join(args.root, "report.md"), "Time to nanoGPT's val loss on one GPU",
                         _common.command_line(), body, started)
    return 0


if __name__ == "__main__":
    _common.main(main)
