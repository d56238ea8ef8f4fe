"""TrainConfig: every training knob in one typed dataclass, and how it is read.

The model's fields are declared once, in ``model.GPTConfig``; a TrainConfig holds one as
``cfg.model``. On the command line and in config files both are set by their plain names
(``--n_layer=6``, ``learning_rate = 1e-3``): ``FIELDS`` lists every such key.

Precedence: dataclass defaults < config file < ``--key=value`` (or ``--key value``) on the
command line, read by ``babygpt.options`` like every other BabyGPT command.

A config file is plain Python run in a private namespace; every top-level name
it binds must be a key. Names starting with ``_`` and imported modules are ignored,
so ``import math`` or ``_width = 256`` are fine helpers. Every problem found (unknown
keys, bad values, contradictions between fields) is reported in one BabyGPTError. The file runs
as foreign code (``foreign.foreign_code``): it may only assign keys, and a file that would end or
signal the process, or change its state (streams, builtins, signal handlers, ...), is refused with
that state put back; its values are read as plain data.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import signal
import threading
import types
from dataclasses import dataclass, field
from typing import Literal, Optional

from .errors import BabyGPTError, Checked
from .model import GPTConfig
from .norms import NORMS, build_norm
from .options import Option, Range, convert as convert_value, range_problems, format_help, option, options_of, \
    parse, unknown_name
from . import tracker
from .foreign import ProcessExit, StateChanged, foreign_code
from .memory import FIX, attention_bytes, memory_problem, training_bytes
from .runtime import check_dtype, resolve_device, resolve_dtype


MAX_LR = 1e3  # beyond any useful learning rate, far below where float32 arithmetic in AdamW overflows
AT_LEAST_0 = Range(0)
BELOW_1 = Range(0, 1, high_open=True)


@dataclass
class TrainConfig(Checked):
    # I/O and hardware
    out_dir: str = option("out/run", "run directory: config.json, metrics.jsonl, ckpt.pt, best.pt")
    data_dir: str = option("data/shakespeare_char", "holds input.txt; train.bin/val.bin/meta.json are made there")
    device: Literal["auto", "cpu", "cuda", "mps"] = option("auto", "auto = cuda if available, else mps, else cpu")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "autocast dtype; auto = bfloat16 on CUDA (float16 + GradScaler if the GPU lacks bf16), "
                "float32 on CPU/MPS; bfloat16 and float16 (+ GradScaler) also work on CPU, fast only where the CPU "
                "has them natively (a run says so, and warns where they are emulated)")
    compile: bool = option(False, "torch.compile the model (falls back to eager with a warning)")
    deterministic: bool = option(
        False, "use only deterministic kernels (torch.use_deterministic_algorithms; an op that has none stops "
               "the run): on a GPU the same seed then repeats bit for bit, where otherwise it ends a few "
               "thousandths apart (docs/campaign.md)")
    seed: int = option(1337, "seed for init, batches and dropout",
                       valid=Range(0, 2**32, high_open=True, text="in [0, 2**32)"))
    # data
    batch_size: int = option(32, "sequences per micro-step", valid=Range(0, low_open=True))
    gradient_accumulation_steps: int = option(1, "micro-steps per optimizer step",
                                              valid=Range(0, low_open=True))
    # the model: GPTConfig's fields, set by their own names
    model: GPTConfig = field(default_factory=GPTConfig)
    # optimization: 5.5e-3 (min_lr a tenth of it) is the baseline's LR tuned at 2,400 iterations on two
    # seeds (results/full/exp2_gpt2, docs/campaign.md); other configurations tune their own
    learning_rate: float = option(5.5e-3, "peak learning rate (AdamW)", valid=Range(
        0, MAX_LR, low_open=True, why=": AdamW moves each weight by about learning_rate per step, and far larger "
                                      "values overflow inside it"))
    decay_norms: bool = option(
        False, "weight-decay every norm parameter too (gains, biases, DyT's and Derf's alpha), as DyT's LLaMA "
               "recipe does; with norm_gain_offset the decay pulls a gain towards 1 instead of 0")
    optimizer: Literal["adamw", "muon"] = option(
        "adamw", "adamw = AdamW for every parameter; muon = torch.optim.Muon for the blocks' 2-D weight matrices "
                 "and AdamW (learning_rate) for embeddings, the LM head and every gain, bias and scalar "
                 "(docs/guide.md)")
    muon_lr: float = option(0.02, "optimizer muon: peak learning rate of the Muon group (same warmup and "
                                  "cosine shape as learning_rate)", valid=Range(0, MAX_LR, low_open=True))
    muon_momentum: float = option(0.95, "optimizer muon: Muon's (Nesterov) momentum", valid=BELOW_1)
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = option(
        "match_rms_adamw", "optimizer muon: torch.optim.Muon's adjust_lr_fn: original = lr * sqrt(max(1, A/B)) "
                           "(Jordan et al.), match_rms_adamw = lr * 0.2 sqrt(max(A, B)) (Liu et al. 2025)")
    muon_ns_dtype: Literal["bfloat16", "float32"] = option(
        "bfloat16", "optimizer muon: the dtype of the Newton-Schulz iterations; bfloat16 = torch.optim.Muon's and "
                    "the authors' (fast on a GPU or a CPU with native bfloat16), float32 = the same iteration in "
                    "float32 (for a CPU that emulates bfloat16; docs/performance.md, babygpt/optim.py)")
    qk_clip_tau: float = option(0.0, "QK-Clip (Kimi K2): after each step, rescale a head's W_q and W_k when "
                                     "its largest attention logit of the step passed this; 0 = off",
                                valid=Range(0))
    weight_decay: float = option(0.1, "weight decay on matrices, decoupled, times each optimizer's own learning "
                                      "rate: AdamW's, and under optimizer muon Muon's too (never on norm gains, "
                                      "biases or scalars; docs/guide.md)",
                                 valid=AT_LEAST_0)
    beta1: float = option(0.9, "AdamW beta1", valid=BELOW_1)
    beta2: float = option(0.99, "AdamW beta2", valid=BELOW_1)
    adam_eps: float = option(1e-8, "AdamW eps, added to sqrt(v) in the update's denominator: a gradient much "
                                   "smaller than it gets a proportionally smaller step", valid=Range(
        0, 1, low_open=True, why=": AdamW divides by sqrt(v) + adam_eps, and a weight whose gradient is exactly 0 "
                                 "would get 0/0"))
    z_loss: float = option(0.0, "weight of the z-loss added to the training objective: z_loss * mean of "
                                "(log Z)^2, Z the softmax normalizer of the output logits (PaLM; Wortsman et al. "
                                "2023 use 1e-4); the logged and evaluated losses stay plain cross-entropy; 0 = off",
                          valid=AT_LEAST_0)
    grad_clip: float = option(1.0, "clip the global gradient norm to this; 0 = off", valid=AT_LEAST_0)
    warmup_iters: int = option(100, "linear warmup from 0 to learning_rate over this many iterations",
                               valid=Range(0))
    lr_decay_iters: Optional[int] = option(None, "cosine decay reaches min_lr here; none = max_iters")
    min_lr: float = option(5.5e-4, "learning rate at the end of the cosine decay", valid=AT_LEAST_0)
    max_iters: int = option(2400, "optimizer steps in total", valid=Range(0))
    target_val_loss: float = option(
        0.0, "end the run at the first evaluation whose val loss is at or below this (e.g. nanoGPT's 1.4697 for "
             "config/shakespeare_char_gpu.py); each evaluation's metrics row has elapsed_s, the time to it; 0 = off",
        valid=AT_LEAST_0)
    ema_decay: float = option(0.0, "also keep an exponential moving average of the weights, ema <- ema_decay * "
                                   "ema + (1 - ema_decay) * weights after each step (babygpt/averaging.py), and "
                                   "score it at the end beside the weights (summary.json's *_ema losses); it "
                                   "never changes training; 0 = off", valid=Range(0, 1, high_open=True))
    # logging and checkpoints
    eval_interval: int = option(400, "evaluate train/val loss and checkpoint every this many iterations",
                                valid=Range(0, low_open=True))
    eval_iters: int = option(50, "batches per split in each evaluation", valid=Range(0, low_open=True))
    log_interval: int = option(10, "write a metrics row every this many iterations",
                               valid=Range(0, low_open=True))
    diag_interval: int = option(0, "every this many iterations, log per-layer stream RMS, max attention "
                                 "logit, token independence, grad norm and update/weight ratio "
                                 "(babygpt/diagnostics.py); 0 = off", valid=Range(0))
    tensorboard: bool = option(False, "also log every metrics row as TensorBoard scalars in out_dir/tensorboard "
                                      "(needs pip install tensorboard; metrics.jsonl stays the record)")
    init_from: Literal["scratch", "resume"] = option("scratch", "resume continues from out_dir/ckpt.pt")
    nonfinite: Literal["stop", "skip"] = option(
        "stop", "on a non-finite loss: stop the run (status diverged), or skip that step and go on")

    def problems(self) -> list[str]:
        """Problems with the training fields (the model's are GPTConfig's own)."""
        problems = range_problems(self)  # every number key's own declared range
        if (self.lr_decay_iters is not None and self.warmup_iters >= 0
                and self.lr_decay_iters < self.warmup_iters):
            problems.append(f"lr_decay_iters ({self.lr_decay_iters}) must be >= warmup_iters ({self.warmup_iters})")
        broken = tracker.missing_problem() if self.tensorboard else None
        if broken:
            problems.append(broken)
        placement = self.model.placement_class
        if placement is not None and placement.on_sphere and self.weight_decay != 0:
            problems.append(f"norm_placement {self.model.norm_placement} renormalizes its matrices after every step, "
                            f"which undoes weight decay on them (only the position embedding would decay; nGPT "
                            f"trains without it); set weight_decay 0")
        problems += self.normalization_conflicts()
        # the rules between float keys are read once each key is in its own range
        return problems + ([] if range_problems(self, only=float) else self.float_pair_problems())

    def normalization_conflicts(self) -> list[str]:
        """What the model's own normalizations would undo or fight: Muon's update under nGPT, which puts
        its matrices back on the unit sphere after every step (GPT.after_step) while Muon sizes the
        update from the matrix's shape (adjust_lr), so part of it would be projected away, and nGPT was
        tuned with Adam (Loshchilov et al. 2024, arXiv:2410.01131); an average of nGPT's weights, which is
        off the sphere; and QK-Clip wherever a norm sits between W_q, W_k and the logits
        (GPTConfig.qk_clip_refusal)."""
        problems = []
        placement = self.model.placement_class
        if self.optimizer == "muon" and placement is not None and placement.on_sphere:
            problems.append(f"norm_placement {self.model.norm_placement} puts its matrices back on the unit sphere "
                            f"after every step: Muon's orthogonalized update, sized by the matrix's shape, would "
                            f"be partly projected away, and nGPT's learning rates are AdamW's; set optimizer adamw")
        problems += self.unused_muon_keys() + self.unused_decay_norms()
        if self.ema_decay > 0 and placement is not None and placement.on_sphere:
            problems.append(f"ema_decay with norm_placement {self.model.norm_placement}: its matrices live on the unit "
                            f"sphere, and their average does not (an average of unit vectors is shorter), so the "
                            f"averaged model would not be the placement's; set ema_decay 0")
        refusal = self.model.qk_clip_refusal() if self.qk_clip_tau > 0 else None
        if refusal is not None:
            problems.append(f"qk_clip_tau {self.qk_clip_tau:g}: {refusal}")
        return problems

    def unused_muon_keys(self) -> list[str]:
        """muon_lr, muon_momentum, muon_adjust_lr and muon_ns_dtype set away from their defaults under adamw:
        they would change nothing, so a run would not be the ablation it claims to be (as rope_base under
        pos learned)."""
        if self.optimizer == "muon":
            return []
        defaults = TrainConfig.__dataclass_fields__
        keys = ("muon_lr", "muon_momentum", "muon_adjust_lr", "muon_ns_dtype")
        changed = [f"{name} {getattr(self, name)!r}" for name in keys if getattr(self, name) != defaults[name].default]
        return [f"{', '.join(changed)}: the muon_* keys apply to optimizer muon only, got optimizer "
                f"{self.optimizer}; set optimizer muon or leave them out"] if changed else []

    def unused_decay_norms(self) -> list[str]:
        """decay_norms where it would decay nothing: weight_decay 0, or a model whose norms have no
        parameters (norm_type none or rmsnorm_noparam, or a placement that builds no norm layers).
        Which norms have parameters is read from the norm class built as the model would build it."""
        if not self.decay_norms:
            return []
        if self.weight_decay == 0:
            return ["decay_norms decays the norms' parameters by weight_decay, which is 0: it would change "
                    "nothing; set weight_decay, or leave decay_norms out"]
        placement, model = self.model.placement_class, self.model
        if placement is None or model.norm_type not in NORMS or not isinstance(model.n_embd, int):
            return []  # (reported by GPTConfig.problems)
        norm = build_norm(model.norm_type, model.n_embd, model.norm_options()) if placement.uses_norm_type else None
        if norm is None or not any(True for _ in norm.parameters()):
            what = (f"norm_type {model.norm_type} has no parameters" if norm is not None else
                    f"norm_placement {model.norm_placement} builds no norm layers")
            return [f"decay_norms decays the norms' parameters, but {what}: it would change nothing; leave "
                    f"decay_norms out"]
        return []

    def float_pair_problems(self) -> list[str]:
        """The rules between float keys, each of which is already in its own range."""
        problems = []
        if self.learning_rate * self.weight_decay >= 1:
            problems.append(f"learning_rate x weight_decay must be below 1, got {self.learning_rate:g} x "
                            f"{self.weight_decay:g}: AdamW scales every decayed weight by (1 - their product) "
                            f"each step; lower one of them")
        if self.optimizer == "muon" and self.muon_lr * self.weight_decay >= 1:
            problems.append(f"muon_lr x weight_decay must be below 1 under optimizer muon, got {self.muon_lr:g} x "
                            f"{self.weight_decay:g}: Muon scales every matrix by (1 - their product) each step; "
                            f"lower one of them")
        if self.min_lr > self.learning_rate:
            problems.append(f"min_lr ({self.min_lr}) must be between 0 and learning_rate ({self.learning_rate})")
        return problems

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The model to build for a vocabulary of ``vocab_size`` (which the data decides)."""
        split = self.optimizer == "muon" if self.model.split_qkv is None else self.model.split_qkv
        return dataclasses.replace(self.model, vocab_size=vocab_size, split_qkv=split)

    @property
    def decay_iters(self) -> int:
        return self.max_iters if self.lr_decay_iters is None else self.lr_decay_iters

    def schedule_warnings(self) -> list[str]:
        """What a valid but probably unintended schedule does, for one warning line each: an LR
        that never peaks, evaluations too sparse to draw a curve, a decay that ends after the run."""
        warnings, n = [], self.max_iters
        if 0 < n < self.warmup_iters:
            warnings.append(f"max_iters ({n}) < warmup_iters ({self.warmup_iters}): the learning rate never "
                            f"reaches {self.learning_rate:g}; lower warmup_iters to train at it")
        if n > 0 and n % self.eval_interval:
            evals = [*range(0, n, self.eval_interval), n]
            shown = ", ".join(map(str, evals)) if len(evals) <= 4 else f"every {self.eval_interval} and at {n}"
            warnings.append(f"max_iters ({n}) is not a multiple of eval_interval ({self.eval_interval}): the run "
                            f"is evaluated at iterations {shown} only; set eval_interval to a divisor of max_iters")
        if self.decay_iters > n > 0:
            warnings.append(f"lr_decay_iters ({self.decay_iters}) is past max_iters ({n}): the run stops before "
                            f"its learning rate decays to min_lr ({self.min_lr:g})")
        return warnings


TRAIN_FIELDS = options_of(TrainConfig, exclude=("model",))
MODEL_FIELDS = options_of(GPTConfig, exclude=("vocab_size",))  # the vocabulary comes from the data
FIELDS: dict[str, Option] = {**TRAIN_FIELDS, **MODEL_FIELDS}  # every key of a config file or --key=value
CONFIG_FILE = Option("config", Optional[str], None, "a config file (Python) applied before --key=value",
                     positional=True, metavar="CONFIG.py")
USAGE = "python train.py [CONFIG.py] [--key=value ...] [--debug]"


def convert(name: str, value, from_cli: bool):
    """``value`` converted to the type of key ``name``; ValueError with a message if it cannot be."""
    return convert_value(name, FIELDS[name].type, value, from_cli)


def set_problems(specs: list[str]) -> list[str]:
    """What is wrong with a sweep's ``--set KEY=VALUE`` options taken one by one, before any run is
    made of them: malformed, an unknown key, an empty value, one the key's type or declared range
    refuses, and a key set twice (the last value would silently win). The rules between keys need
    the whole of each run's settings: the sweep checks those."""
    problems, by_key = [], {}
    for spec in specs:
        key, eq, text = spec.partition("=")
        if not (key and eq):
            problems.append(f"malformed --set '{spec}'; write --set key=value")
            continue
        by_key.setdefault(key, []).append(spec)
        if key not in FIELDS:
            problems.append(f"--set {spec}: {unknown_name(key, FIELDS, 'config key', '')}")
        elif not text:
            problems.append(f"--set {spec} was given an empty value; give {key} a value, or leave that --set out")
        else:
            try:
                value = convert(key, text, from_cli=True)
            except ValueError as e:
                problems.append(f"--set {spec}: {e}")
                continue
            problem = FIELDS[key].range_problem(value)
            if problem:
                problems.append(f"--set {spec}: {problem}")
    return problems + [f"--set {key} is given {len(given)} times ({', '.join(given)}); set each key once"
                       for key, given in by_key.items() if len(given) > 1]


# ---------------------------------------------------------------- config files and argv

def read_config_file(path: str) -> dict:
    """Run a config file in a private namespace and return the names it set (at least one)."""
    if not os.path.exists(path):
        raise BabyGPTError(f"config file '{path}' not found; check the path (configs live in config/)")
    if not os.path.isfile(path):
        raise BabyGPTError(f"config file '{path}' is not a regular file; pass a .py file such as config/prenorm_rms.py")
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is allowed, as Python allows it
            source = f.read()
    except UnicodeDecodeError as e:
        raise BabyGPTError(f"config file '{path}' is not UTF-8 text (bad byte at offset {e.start}); "
                           f"save it as UTF-8") from None
    except OSError as e:
        raise BabyGPTError(f"cannot read config file '{path}': {e.strerror}; check its permissions") from None
    namespace: dict = {"__file__": os.path.abspath(path), "__name__": "__babygpt_config__"}
    try:
        code = compile(source, path, "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the source
        where = f" at line {e.lineno}: {e.msg}" if getattr(e, "lineno", None) else f": {getattr(e, 'msg', e)}"
        raise BabyGPTError(f"config file '{path}' has a syntax error{where}") from None
    imported = _imported_names(ast.parse(source)) - set(FIELDS)  # (a key imported from another file still counts)
    try:
        # Run as foreign code: a call that would end or signal the process (os._exit(), os.kill(), an exit
        # handler) is stopped, and process-wide state it changed (sys.stderr, builtins, signal handlers,
        # ...) is put back before the file is refused, so nothing it did outlives it. The values are read
        # in there too, as plain data: a value's own methods (an int subclass's __mul__) are the file's code.
        with _interrupts_noted() as interrupted, foreign_code():  # (inside: it puts builtins back first)
            exec(code, namespace)
            values = {k: _plain(v) for k, v in list(namespace.items())
                      if type(k) is str and not k.startswith("_") and not isinstance(v, types.ModuleType)
                      and k not in imported}
    except (SystemExit, ProcessExit) as e:  # exit(), sys.exit() or os._exit() must not end the program silently
        raise BabyGPTError(f"config file '{path}' called {getattr(e, 'call', 'exit()')}; a config file only assigns "
                           f"keys") from None
    except StateChanged as e:
        raise BabyGPTError(f"config file '{path}' {e}; a config file only assigns keys") from None
    except KeyboardInterrupt:
        if interrupted:  # a real Ctrl-C while the file ran: the command is interrupted, as anywhere else
            raise
        raise BabyGPTError(f"config file '{path}' raised KeyboardInterrupt; a config file only assigns keys") from None
    except BaseException as e:  # the user's file raised; report where, not a traceback
        raise BabyGPTError(f"config file '{path}' failed when run: {type(e).__name__}: {e}") from None
    if not values:  # e.g. JSON or YAML: valid Python (a dict expression, annotations) that binds nothing
        raise BabyGPTError(f"config file '{path}' sets no keys; a config file is Python with one "
                           f"assignment per key, e.g. `n_layer = 6` (JSON and YAML are not read)")
    return values


@contextlib.contextmanager
def _interrupts_noted():
    """[] while a config file runs, [signal] once a real SIGINT arrived (it is then handled as before:
    the handler in place is called, the default one raising KeyboardInterrupt): a KeyboardInterrupt
    with no SIGINT behind it was raised by the file itself. Off the main thread no handler can be
    installed, and every KeyboardInterrupt counts as real."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        noted.append(signal.SIGINT)
        yield noted
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        noted.append(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _plain(value):
    """``value`` as plain data, so that none of a config file's code runs after the file has: bool, int,
    float, str and None as they are, a subclass of int, float or str as its plain value, lists, tuples
    and dicts of them alike; anything else becomes a stand-in that names its type (no key takes one)."""
    kind = type(value)
    if kind in (bool, int, float, str, type(None)):
        return value
    if kind in (list, tuple):
        return kind(_plain(item) for item in value)
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    for base, plain in ((str, str.__str__), (float, float.__float__), (int, int.__int__)):  # (bool has no subclasses)
        if isinstance(value, base):
            return plain(value)  # the base type's own method: a plain copy, whatever the subclass overrides
    return _NotPlain(kind.__name__)


class _NotPlain:
    """A config file's value that is not plain data (a function, a class, an object), as the problems
    with it show it."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<a {self.type_name}>"


def _imported_names(tree: ast.Module) -> set[str]:
    """The names a config file's import statements bind (``from math import pi``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _file_values(path: str) -> tuple[dict, list[str]]:
    """The keys a config file sets, converted, and the problems found in it."""
    try:
        raw = read_config_file(path)
    except BabyGPTError as e:
        return {}, e.problems
    values, problems = {}, []
    for key, value in raw.items():
        if key not in FIELDS:
            problems.append(f"{unknown_name(key, FIELDS, 'config key', '')} in {path}")
            continue
        try:
            values[key] = convert(key, value, from_cli=False)
        except ValueError as e:
            problems.append(f"{e} (in {path})")
    return values, problems


def parse_train_args(argv: list[str], extra: dict[str, Option] | None = None,
                     usage: str = USAGE, unused: tuple[str, ...] = ()) -> tuple[dict, dict, list[str]]:
    """Read ``[CONFIG.py] [--key=value ...]`` (plus ``extra`` options, e.g. bench.py's own):
    (config key values with the file's applied first, extra values, problems). ``unused``: keys
    the command does not read, left out of its --help."""
    options = {"config": CONFIG_FILE, **FIELDS, **(extra or {})}
    values, problems = parse(argv, options, usage, kind="config key", dashes="",
                             help_text=help_text(extra, usage, unused))
    path = values.pop("config", None)
    file_values, file_problems = _file_values(path) if path is not None else ({}, [])
    keys = {k: v for k, v in values.items() if k in FIELDS}
    return {**file_values, **keys}, {k: v for k, v in values.items() if k not in FIELDS}, file_problems + problems


def build_config(values: dict) -> tuple[TrainConfig, list[str]]:
    """A TrainConfig from flat key values, and every problem with it: the model's (GPTConfig's
    checks), the training fields' (TrainConfig's), and what this machine cannot run. Where the
    model's or the training fields' checks fail, the returned config has the defaults in their place
    (a stand-in: it is never run)."""
    problems = []
    try:
        model = GPTConfig(**{k: v for k, v in values.items() if k in MODEL_FIELDS})
    except BabyGPTError as e:
        problems += e.problems
        model = GPTConfig()
    try:
        cfg = TrainConfig(model=model, **{k: v for k, v in values.items() if k in TRAIN_FIELDS})
    except BabyGPTError as e:
        problems += e.problems
        # The stand-in is the defaults' whole config: TrainConfig(model=model) could itself be refused
        # (nGPT's model with the default weight_decay), hiding the problems just found behind a false one.
        cfg = TrainConfig(model=GPTConfig())
    # The machine check reads the values asked for: cfg has defaults where a training field failed.
    device, dtype = (values.get(k, TRAIN_FIELDS[k].default) for k in ("device", "dtype"))
    try:
        check_dtype(resolve_device(device), dtype)
        if not problems:  # sizes known to be valid: would the run fit in memory at all?
            problems += memory_problems(cfg, resolve_device(device))
    except BabyGPTError as e:
        problems += e.problems
    return cfg, problems


def memory_problems(cfg: TrainConfig, device) -> list[str]:
    """The run refused if even a lower bound of its memory exceeds what ``device`` has free."""
    m = cfg.model
    needed = training_bytes(m, cfg.batch_size, device.type, diagnostics=cfg.diag_interval > 0)
    what, fix = f"batch_size={cfg.batch_size}, block_size={m.block_size}, n_embd={m.n_embd}, n_layer={m.n_layer}", FIX
    if attention_bytes(m, cfg.batch_size, device.type):  # the attention weights may be what does not fit
        what, fix = f"{what}, n_head={m.n_head}, dropout={m.dropout:g}", f"{FIX}, or set dropout=0 (then no " \
                                                                         f"attention weights are kept)"
    if cfg.diag_interval > 0:
        what, fix = f"{what}, diag_interval={cfg.diag_interval}", f"{fix}, or set diag_interval=0"
    problem = memory_problem(needed, device, f"training with {what}", fix)
    return [problem] if problem else []


def load_config(argv: list[str]) -> TrainConfig:
    """Build a TrainConfig from ``[CONFIG.py] [--key=value ...]``; raise BabyGPTError
    listing every problem found."""
    values, _, problems = parse_train_args(argv)
    cfg, more = build_config(values)
    if problems + more:
        raise BabyGPTError(*problems, *more)
    return cfg


def with_resolved_dtype(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ``dtype=auto`` replaced by what it means on this machine: what a run records."""
    if cfg.dtype != "auto":
        return cfg
    return dataclasses.replace(cfg, dtype=resolve_dtype(resolve_device(cfg.device), "auto"))


def to_dict(cfg: TrainConfig) -> dict:
    """Every key with its value, flat (the model's fields beside the training ones): config.json's form."""
    return {**{k: getattr(cfg, k) for k in TRAIN_FIELDS}, **{k: getattr(cfg.model, k) for k in MODEL_FIELDS}}


def changed_settings(had: dict, now: dict, ignore: tuple[str, ...] = ()) -> list[tuple[str, object, object]]:
    """(key, recorded value, value now) for each key of ``now`` whose value differs from the recorded
    settings ``had`` (config.json's form), ``ignore``'s keys left out. A key missing from ``had`` is a
    field added since it was recorded: it ran as that field's default (a new field defaults to the
    behaviour from before it existed: init, adam_eps, z_loss, ...)."""
    defaults = to_dict(TrainConfig())
    return [(k, had.get(k, defaults.get(k)), v) for k, v in now.items()
            if k not in ignore and had.get(k, defaults.get(k)) != v]


def help_text(extra: dict[str, Option] | None = None, usage: str = USAGE, unused: tuple[str, ...] = ()) -> str:
    training = {k: o for k, o in TRAIN_FIELDS.items() if k not in unused}
    sections = {"positional": {"config": CONFIG_FILE}, "training": training, "model": MODEL_FIELDS}
    if extra:
        sections["this command"] = extra
    return format_help(usage, FIELDS, "Defaults < CONFIG.py < --key=value. Keys (type, default, meaning):",
                       sections)
