"""Command-line entry points. train.py and sample.py only call these.

A BabyGPTError (a mistake the user can fix) becomes ``error: ...`` lines on
stderr and exit status 2, with no traceback unless ``--debug`` is given.
Exit codes: 0 done, 2 bad input, 3 diverged, 130 SIGINT, 143 SIGTERM (1 is a bug: a traceback).
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import sys
import traceback

from .errors import BabyGPTError, Interrupted, ShardDone
from .files import os_error_message
from .options import ShowHelp

# Exit codes of train.py (sample.py uses 0 and 2 only).
EXIT_USAGE = 2  # a mistake in the input: nothing ran, nothing on disk changed
EXIT_DIVERGED = 3  # the loss became non-finite (diverged), or the run has no finite result (skipped_out)
EXIT_SIGNAL_BASE = 128  # + signal number: 130 for SIGINT (Ctrl-C), 143 for SIGTERM


def run(main, argv: list[str]) -> int:
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        return main(argv) or 0
    except ShowHelp as h:
        print(h.text)
        return 0
    except ShardDone as e:
        print(e)
        return 0
    except BabyGPTError as e:
        if debug:
            traceback.print_exc()
        rank = os.environ.get("RANK", "0")  # under torchrun, say which process hit the problem
        for problem in e.problems:
            print(f"error: {problem}" if rank == "0" else f"error: [rank {rank}] {problem}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. sample.py ... | head: the reader is gone, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except Interrupted as e:  # e.g. a sweep whose runs checkpointed and stopped
        print(str(e), file=sys.stderr)
        return EXIT_SIGNAL_BASE + e.signum
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and exits by itself)
        if debug:
            traceback.print_exc()
        print("interrupted", file=sys.stderr)
        return EXIT_SIGNAL_BASE + signal.SIGINT
    except OSError as e:  # the filesystem refused: a full disk, a read-only directory, a long name
        message = os_error_message(e, doing="accessing")
        if message is None or debug:
            raise
        print(f"error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except (MemoryError, RuntimeError) as e:  # an allocation that passed the up-front estimate
        from .memory import is_out_of_memory  # here: torch is loaded only by the commands that use it

        if not is_out_of_memory(e) or debug:
            raise
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        print(f"error: out of memory ({detail}); reduce batch_size, block_size, n_embd or n_layer", file=sys.stderr)
        return EXIT_USAGE


def without_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without ``--name=value`` or ``--name value``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == f"--{name}":
            skip = True
        elif not arg.startswith(f"--{name}="):
            out.append(arg)
    return out


def train_main(argv: list[str]) -> int:
    from .config import load_config
    from .trainer import train

    cfg = load_config(argv)
    summary = train(cfg, argv)
    status, out = summary["status"], cfg.out_dir
    # Every rank returns the same exit code; only rank 0 (or the only process) speaks.
    say = print if os.environ.get("RANK", "0") == "0" else (lambda *a, **k: None)
    if status == "interrupted":
        args = shlex.join([*without_option(argv, "init_from"), "--init_from=resume"])
        launcher = "torchrun [the same options] train.py" if "world_size" in summary else "python train.py"
        say(f"interrupted by {summary['signal']} at iteration {summary['iter']}; checkpoint saved to "
            f"{out}/ckpt.pt; resume with: {launcher} {args}", file=sys.stderr)
        return EXIT_SIGNAL_BASE + getattr(signal, summary["signal"])
    if status == "diverged":
        say(f"diverged: non-finite loss at iteration {summary['diverged_at']}; the last good state is in "
            f"{out}/ckpt.pt and {out}/best.pt; see {out}/summary.json", file=sys.stderr)
        return EXIT_DIVERGED
    if status == "skipped_out":
        skipped = summary["skipped_steps"] + summary["scaler_skipped_steps"]
        say(f"skipped_out: the run reached iteration {summary['iter']} with {skipped} of its steps skipped and its "
            f"last finite evaluation at iteration {summary['final_eval_iter']}: it has no result (lower the "
            f"learning_rate, or use float32 or bfloat16); see {out}/summary.json", file=sys.stderr)
        return EXIT_DIVERGED
    best, full, test = summary["best_val_loss"], summary.get("val_loss_full"), summary.get("test_loss")
    whole = "" if full is None else f", val loss over the whole split {full:.4f}"
    tested = "" if test is None else (f", test loss {test:.4f} (the validation split's second half in sliding "
                                      f"windows; {floors_note(summary, 'references_test')} scored alike)")
    if summary.get("target_reached_at") is not None:
        say(f"reached target_val_loss {cfg.target_val_loss:g} at iteration {summary['target_reached_at']}, "
            f"and stopped {summary['wall_time_s']:.1f} s after it started (compile and evaluations included)")
    say(f"done: {summary['iter']} iterations, best val loss {'n/a' if best is None else f'{best:.4f}'}{whole}"
        f"{tested}; sample with: python sample.py --ckpt {out}/best.pt")
    if status == "collapsed":
        say(f"collapsed: the model is no better than predicting character frequencies (the unigram loss); "
            f"{collapse_advice(summary, cfg)}", file=sys.stderr)
    return 0


def collapse_advice(summary: dict, cfg) -> str:
    """What to check when a run collapsed, naming only what can have caused it: the learning rate
    only once steps were taken and no norm_eps drowns the signal, and in the direction the loss
    points to."""
    from .model import LARGE_NORM_EPS
    from .ngram import COLLAPSE_MARGIN

    m = cfg.model
    if summary["iter"] == 0:
        return ("nothing was trained (max_iters=0 evaluates the model as initialised, and the learning_rate "
                "played no part); set max_iters > 0 to train it")
    if m.norm_eps >= LARGE_NORM_EPS:  # no learning rate fixes that (a norm that reads no eps refuses another)
        return (f"norm_eps={m.norm_eps:g} is large: a norm divides by sqrt(mean square + norm_eps), so beside "
                f"activations of mean square about 1e-3 to 1 it scales them down instead of normalizing them; "
                f"use a small one (default 1e-5)")
    vocab, loss = vocab_size(cfg.data_dir), summary.get("val_loss_full")
    if vocab and loss is not None and abs(loss - math.log(vocab)) < COLLAPSE_MARGIN:
        return (f"its loss stayed at that of uniform guessing (ln {vocab} = {math.log(vocab):.3f}): it learned "
                f"nothing in {summary['iter']} steps; try a higher learning_rate than {cfg.learning_rate:g}, or "
                f"more max_iters")
    return ("try a lower learning_rate (a loss stuck at the unigram is the usual sign of one too high), or more "
            "max_iters if its loss was still falling (see metrics.jsonl)")


def vocab_size(data_dir: str) -> int | None:
    """The size of the run's vocabulary (ln of it is the loss of uniform guessing); None if unreadable."""
    from .data import load_meta

    try:
        return len(load_meta(data_dir)["vocab"])
    except BabyGPTError:
        return None


def floors_note(summary: dict, key: str = "references") -> str:
    """"unigram 3.3620, modified KN 9-gram 1.5507": the collapse line and the strongest n-gram floor
    (babygpt/ngram.py) the run's summary recorded under ``key``."""
    from .ngram import label, strongest

    refs = summary.get(key) or {}
    floors = [("unigram", refs["unigram"])] if "unigram" in refs else []
    best = strongest(refs)
    return ", ".join(f"{label(key)} {nats:.4f}" for key, nats in floors + ([best] if best else []))


def sample_main(argv: list[str]) -> int:
    from .sampling import sample_cli

    return sample_cli(argv)


def prepare_main(argv: list[str], data_dir: str) -> int:
    from .data import PrepareOptions, prepare
    from .options import parse_into

    args = parse_into(PrepareOptions, argv, "python data/shakespeare_char/prepare.py [--input FILE] [--data_dir DIR]",
                      "Write train.bin, val.bin and meta.json.")
    data_dir = args.data_dir or data_dir
    meta = prepare(data_dir, args.input)
    print(f"vocab {meta['vocab_size']}, {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
          f"written to {data_dir}")
    return 0


def main_prepare(data_dir: str) -> None:
    sys.exit(run(lambda argv: prepare_main(argv, data_dir), sys.argv[1:]))


def main_train() -> None:
    sys.exit(run(train_main, sys.argv[1:]))


def main_sample() -> None:
    sys.exit(run(sample_main, sys.argv[1:]))
