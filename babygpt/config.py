"""TrainConfig: every training knob in one typed dataclass, and how it is read.

Precedence: dataclass defaults < config file < ``--key=value`` on the command line.

A config file is plain Python run in a private namespace; every top-level name
it binds must be a TrainConfig field. Names starting with ``_`` and imported
modules are ignored, so ``import math`` or ``_width = 256`` are fine helpers.
Values are converted by the field's type, and every problem found (unknown
keys, bad values, contradictions between fields) is reported in one go.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Literal, Optional

from .errors import BabyGPTError, unknown_choice
from .model import PLACEMENTS, GPTConfig, model_config_problems
from .norms import NORMS
from .runtime import check_dtype, resolve_device, resolve_dtype


def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


_M = GPTConfig  # model-field defaults live in GPTConfig, the model's own contract


@dataclass
class TrainConfig:
    # I/O and hardware
    out_dir: str = _opt("out/run", "run directory: config.json, metrics.jsonl, ckpt.pt, best.pt")
    data_dir: str = _opt("data/shakespeare_char", "holds input.txt; train.bin/val.bin/meta.json are made there")
    device: Literal["auto", "cpu", "cuda", "mps"] = _opt("auto", "auto = cuda if available, else mps, else cpu")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = _opt(
        "auto", "autocast dtype; auto = bfloat16 on CUDA (float16 + GradScaler if the GPU lacks bf16), "
                "float32 on CPU/MPS; bfloat16 also works on CPU; float16 needs CUDA")
    compile: bool = _opt(False, "torch.compile the model (falls back to eager with a warning)")
    seed: int = _opt(1337, "seed for init, batches and dropout")
    # data
    batch_size: int = _opt(32, "sequences per micro-step")
    block_size: int = _opt(_M.block_size, "context length in characters")
    gradient_accumulation_steps: int = _opt(1, "micro-steps per optimizer step")
    # model
    n_layer: int = _opt(_M.n_layer, "number of transformer blocks")
    n_head: int = _opt(_M.n_head, "attention heads per block (must divide n_embd)")
    n_embd: int = _opt(_M.n_embd, "model width")
    dropout: float = _opt(_M.dropout, "dropout probability")
    bias: bool = _opt(_M.bias, "biases in Linear layers, and beta in LayerNorm, DyT and BatchNorm")
    norm_type: str = _opt(_M.norm_type, "one of: " + ", ".join(NORMS))
    norm_placement: str = _opt(_M.norm_placement, "one of: " + ", ".join(PLACEMENTS))
    norm_eps: float = _opt(_M.norm_eps, "epsilon inside every norm")
    final_norm: Optional[bool] = _opt(
        _M.final_norm, "norm before the LM head; none = on for pre/sandwich, off for post/deepnorm")
    qk_norm: bool = _opt(_M.qk_norm, "normalize queries and keys per head with norm_type before attention")
    dyt_alpha_init: float = _opt(_M.dyt_alpha_init, "initial alpha of norm_type dyt: y = gamma*tanh(alpha*x)+beta")
    # optimization
    learning_rate: float = _opt(2e-3, "peak learning rate (AdamW)")
    weight_decay: float = _opt(0.1, "AdamW weight decay on matrices (never on norm gains or biases)")
    beta1: float = _opt(0.9, "AdamW beta1")
    beta2: float = _opt(0.99, "AdamW beta2")
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this; 0 = off")
    warmup_iters: int = _opt(100, "linear warmup from 0 to learning_rate over this many iterations")
    lr_decay_iters: Optional[int] = _opt(None, "cosine decay reaches min_lr here; none = max_iters")
    min_lr: float = _opt(2e-4, "learning rate at the end of the cosine decay")
    max_iters: int = _opt(2400, "optimizer steps in total")
    # logging and checkpoints
    eval_interval: int = _opt(400, "evaluate train/val loss and checkpoint every this many iterations")
    eval_iters: int = _opt(50, "batches per split in each evaluation")
    log_interval: int = _opt(10, "write a metrics row every this many iterations")
    diag_interval: int = _opt(0, "every this many iterations, log per-layer stream RMS, grad norm and "
                                 "update/weight ratio (babygpt/diagnostics.py); 0 = off")
    init_from: Literal["scratch", "resume"] = _opt("scratch", "resume continues from out_dir/ckpt.pt")
    nonfinite: Literal["stop", "skip"] = _opt(
        "stop", "on a non-finite loss: stop the run (status diverged), or skip that step and go on")

    def model_config(self, vocab_size: int) -> GPTConfig:
        names = [f.name for f in dataclasses.fields(GPTConfig) if f.name != "vocab_size"]
        return GPTConfig(vocab_size=vocab_size, **{n: getattr(self, n) for n in names})

    @property
    def decay_iters(self) -> int:
        return self.max_iters if self.lr_decay_iters is None else self.lr_decay_iters


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
TYPES = typing.get_type_hints(TrainConfig)


# ---------------------------------------------------------------- value parsing

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _describe(tp) -> str:
    if typing.get_origin(tp) is Literal:
        return "|".join(typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _describe(inner[0]) + "|none"
    return tp.__name__


def convert(name: str, value, from_cli: bool):
    """Convert ``value`` (a string from the CLI, or a Python value from a config
    file) to the type of field ``name``. Raises ValueError with a message."""
    tp = TYPES[name]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        if value is None or (from_cli and str(value).lower() in ("none", "null")):
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ValueError(unknown_choice(name, value, choices))
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_cli and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if from_cli:
            try:
                return int(value)
            except ValueError:
                try:
                    value = float(value)
                except ValueError:
                    raise ValueError(f"{name} must be an integer, got {value!r}") from None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)  # 1e3 is a fine way to write 1000
        if isinstance(value, int):
            return value
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if from_cli:
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {value!r}") from None
        if isinstance(value, (int, float)):
            return float(value)
        raise ValueError(f"{name} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{name} must be a string, got {value!r}")
    raise TypeError(f"no parser for field {name} of type {tp}")  # a bug in TrainConfig, not user input


def _unknown_key(name: str) -> str:
    close = difflib.get_close_matches(name, FIELDS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else "; see --help for the list"
    return f"unknown config key '{name}'{hint}"


# ---------------------------------------------------------------- config files and argv

def read_config_file(path: str) -> dict:
    """Run a config file in a private namespace and return the names it set."""
    if not os.path.isfile(path):
        raise BabyGPTError(f"config file '{path}' not found; check the path (configs live in config/)")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    namespace: dict = {"__file__": os.path.abspath(path), "__name__": "__babygpt_config__"}
    try:
        code = compile(source, path, "exec")
    except SyntaxError as e:
        raise BabyGPTError(f"config file '{path}' has a syntax error at line {e.lineno}: {e.msg}") from None
    try:
        exec(code, namespace)
    except Exception as e:  # the user's file raised; report where, not a traceback
        raise BabyGPTError(f"config file '{path}' failed when run: {type(e).__name__}: {e}") from None
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not isinstance(v, types.ModuleType)}


def split_argv(argv: list[str]) -> tuple[str | None, list[tuple[str, str]], list[str]]:
    """Split argv into (config file or None, [(key, value)], problems)."""
    config_path, pairs, problems = None, [], []
    for arg in argv:
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq or not key:
                problems.append(f"malformed argument '{arg}'; write --key=value (e.g. --max_iters=2000)")
            else:
                pairs.append((key, value))
        elif arg.startswith("-") or config_path is not None:
            problems.append(f"unexpected argument '{arg}'; usage: train.py [CONFIG.py] [--key=value ...]")
        else:
            config_path = arg
    return config_path, pairs, problems


def load_config(argv: list[str]) -> TrainConfig:
    """Build a TrainConfig from ``[CONFIG.py] [--key=value ...]``; raise BabyGPTError
    listing every problem found."""
    config_path, pairs, problems = split_argv(argv)
    values: dict = {}
    file_values = {}
    if config_path is not None:
        try:
            file_values = read_config_file(config_path)
        except BabyGPTError as e:
            problems += e.problems
    for key, value in file_values.items():
        if key not in FIELDS:
            problems.append(f"{_unknown_key(key)} in {config_path}")
            continue
        try:
            values[key] = convert(key, value, from_cli=False)
        except ValueError as e:
            problems.append(f"{e} (in {config_path})")
    for key, value in pairs:
        if key not in FIELDS:
            problems.append(_unknown_key(key))
            continue
        try:
            values[key] = convert(key, value, from_cli=True)
        except ValueError as e:
            problems.append(str(e))
    cfg = TrainConfig(**values)  # keys that failed to parse keep their defaults here
    problems += config_problems(cfg)
    if problems:
        raise BabyGPTError(*problems)
    return cfg


def config_problems(cfg: TrainConfig) -> list[str]:
    """Problems with values that parsed but do not make sense, alone or together."""
    problems = model_config_problems(cfg)
    for name in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"):
        if getattr(cfg, name) <= 0:
            problems.append(f"{name} must be a positive integer, got {getattr(cfg, name)}")
    for name in ("max_iters", "warmup_iters", "diag_interval"):
        if getattr(cfg, name) < 0:
            problems.append(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.lr_decay_iters is not None and cfg.lr_decay_iters < cfg.warmup_iters:
        problems.append(f"lr_decay_iters ({cfg.lr_decay_iters}) must be >= warmup_iters ({cfg.warmup_iters})")
    if not cfg.learning_rate > 0:
        problems.append(f"learning_rate must be positive, got {cfg.learning_rate}")
    if not 0 <= cfg.min_lr <= cfg.learning_rate:
        problems.append(f"min_lr ({cfg.min_lr}) must be between 0 and learning_rate ({cfg.learning_rate})")
    if not 0 <= cfg.seed < 2**32:
        problems.append(f"seed must be in [0, 2**32), got {cfg.seed}")
    for name in ("weight_decay", "grad_clip"):
        if not getattr(cfg, name) >= 0:
            problems.append(f"{name} must be >= 0, got {getattr(cfg, name)}")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            problems.append(f"{name} must be in [0, 1), got {getattr(cfg, name)}")
    try:  # what this machine can run
        check_dtype(resolve_device(cfg.device), cfg.dtype)
    except BabyGPTError as e:
        problems += e.problems
    return problems


def with_resolved_dtype(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ``dtype=auto`` replaced by what it means on this machine: what a run records."""
    if cfg.dtype != "auto":
        return cfg
    return dataclasses.replace(cfg, dtype=resolve_dtype(resolve_device(cfg.device), "auto"))


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(values: dict) -> TrainConfig:
    """Rebuild a TrainConfig saved by ``to_dict`` (keys this version does not know are dropped)."""
    return TrainConfig(**{k: v for k, v in values.items() if k in FIELDS})


def help_text() -> str:
    lines = ["usage: python train.py [CONFIG.py] [--key=value ...] [--debug]", "",
             "Defaults < CONFIG.py < --key=value. Keys (type, default, meaning):"]
    for name, f in FIELDS.items():
        default = "none" if f.default is None else str(f.default).lower() if isinstance(f.default, bool) \
            else f.default
        lines.append(f"  --{name:<28} {_describe(TYPES[name]):<24} {str(default):<22} {f.metadata['help']}")
    lines.append("  --debug                      show a traceback on errors")
    return "\n".join(lines)
