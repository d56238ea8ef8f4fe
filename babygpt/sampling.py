"""Loading a trained model from a checkpoint and streaming samples from it."""

from __future__ import annotations

import contextlib
import math
import os
import stat
import sys
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from .checkpoint import checkpoint_vocab, load_checkpoint
from .data import CharTokenizer
from .errors import BabyGPTError
from .model import GPT, GPTConfig
from .options import option, parse_into
from .memory import check_fits, inference_bytes, is_out_of_memory
from .runtime import DTYPES, resolve_device

MIN_TEMPERATURE = 1e-3  # below this sampling is greedy in all but name, and logits / T overflow near 1e-38
USAGE = "python sample.py --ckpt PATH [--start TEXT|FILE:path] [--key value ...] [--debug]"


@dataclass
class SampleOptions:
    """sample.py's command line."""

    ckpt: str = option(help="checkpoint path, e.g. out/prenorm_rms/best.pt, or a run directory (its best.pt)")
    start: str = option("\n", "prompt text, or FILE:path to read it from a file")
    num_samples: int = option(3, "how many samples")
    max_new_tokens: int = option(500, "characters per sample")
    temperature: float = option(0.8, "0 = greedy; <1 sharper, >1 flatter")
    top_k: Optional[int] = option(None, "sample only among the k likeliest characters")
    seed: int = option(1337, "random seed")
    device: str = option("auto", "auto, cpu, cuda or mps")
    no_kv_cache: bool = option(False, "recompute the whole context at every step (slower; the same text)")
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", "weights and activations in this dtype (a pure cast, not autocast); the norms still "
                   "square in float32, so a stream above 255.9 does not overflow float16")

    def problems(self) -> list[str]:
        """Values that parsed but cannot be used (top_k is checked against the checkpoint's vocabulary)."""
        problems = [f"--{name} must be positive, got {getattr(self, name)}"
                    for name in ("num_samples", "max_new_tokens") if getattr(self, name) <= 0]
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            problems.append(f"--temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        elif 0 < self.temperature < MIN_TEMPERATURE:  # logits / temperature would overflow float32
            problems.append(f"--temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature:g}")
        return problems


def load_model(path: str, device: torch.device, dtype: str = "float32",
               kv_cache: bool = False) -> tuple[GPT, CharTokenizer]:
    """The model and tokenizer stored in a BabyGPT checkpoint, in eval mode, its weights cast to
    ``dtype``; ``kv_cache``: the memory check counts the cache that sampling with it allocates."""
    ckpt = load_checkpoint(path, map_location=device)
    with _damaged(path):
        cfg = GPTConfig(**ckpt["model_config"])
    tok = CharTokenizer(checkpoint_vocab(ckpt, cfg.vocab_size, path))
    # Before building it: a damaged or hostile file may describe a model no machine can hold.
    check_fits(inference_bytes(cfg, device.type, kv_cache), device,
               f"the model in '{path}' (n_layer={cfg.n_layer}, n_embd={cfg.n_embd}, block_size={cfg.block_size})",
               "use a checkpoint of a smaller model, or a machine with more memory")
    with _damaged(path):
        model = GPT(cfg)
        model.load_state_dict(ckpt["model"])
    refuse_nonfinite_weights(model, path)
    return model.to(device=device, dtype=DTYPES[dtype]).eval(), tok


def refuse_nonfinite_weights(model: GPT, path: str) -> None:
    """A model with a NaN or inf weight samples text that looks ordinary (argmax and multinomial
    still pick tokens), so it is refused, naming the first such tensor."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise BabyGPTError(f"'{path}' holds non-finite weights ({name} has NaN or inf): its run had gone bad "
                               f"when it was saved; sample from the run's best.pt, or an earlier checkpoint")


def refuse_nonfinite_logits(model: GPT, idx: torch.Tensor, path: str, dtype: str) -> None:
    """Finite weights can still compute NaN or inf (a weight so large that the forward overflows, a
    BatchNorm whose running variance went negative), and argmax or multinomial would still pick
    tokens from it: the first step's logits are checked before any text is printed."""
    with torch.inference_mode():
        logits = model(idx[:, model.context_start(idx.shape[1]):])[0][:, -1, :]  # (1, V)
    if not torch.isfinite(logits).all():
        raise BabyGPTError(f"the model in '{path}' computes non-finite logits (NaN or inf) in {dtype} although its "
                           f"weights are finite: its run had gone bad, or {dtype} overflows in it; sample from "
                           f"the run's best.pt or an earlier checkpoint, or with --dtype float32")


@contextlib.contextmanager
def _damaged(path: str):
    """Report what a checkpoint's contents break as one error naming the file (running out of
    memory is not damage: cli.run reports it as such)."""
    try:
        yield
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        if is_out_of_memory(e):
            raise
        raise BabyGPTError(f"'{path}' is damaged or from an incompatible version "
                           f"({type(e).__name__}: {str(e).splitlines()[0][:120]}); use another checkpoint") from None


# A prompt longer than this is a mistake (the model sees its last block_size characters only),
# and reading stops there: FILE:/dev/zero must not fill the memory.
MAX_PROMPT_BYTES = 1 << 20


def read_prompt(start: str) -> str:
    """``--start`` text, or the contents of the file named by ``FILE:path`` (at most 1 MiB)."""
    if start.startswith("FILE:"):
        path = start[len("FILE:"):]
        mode = os.stat(path).st_mode if os.path.exists(path) else 0
        if stat.S_ISDIR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):  # a FIFO with no writer blocks forever
            kind = "a directory" if stat.S_ISDIR(mode) else "a pipe or socket, not a file"
            raise BabyGPTError(f"prompt file '{path}' is {kind}; save the prompt in a file, or pass it as "
                               f"--start TEXT")
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_PROMPT_BYTES + 1)
        except OSError as e:
            raise BabyGPTError(f"cannot read prompt file '{path}' ({e.strerror}); check the path") from None
        if len(data) > MAX_PROMPT_BYTES:
            raise BabyGPTError(f"prompt file '{path}' is longer than {MAX_PROMPT_BYTES >> 20} MiB; "
                               f"the model reads only its last characters: pass a shorter prompt")
        try:  # decoded as is: the prompt reaches the model byte for byte (CRLF stays CRLF)
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BabyGPTError(f"prompt file '{path}' is not UTF-8 text (bad byte at offset {e.start}); "
                               f"save it as UTF-8") from None
    return start


def checkpoint_in(path: str) -> str:
    """``--ckpt`` as a checkpoint file: a run directory stands for its best.pt (said on stderr)."""
    best = os.path.join(path, "best.pt")
    if os.path.isdir(path) and os.path.isfile(best):
        print(f"sampling from {best}, the run's best checkpoint", file=sys.stderr)
        return best
    return path


def sample_cli(argv: list[str]) -> int:
    """sample.py: read the options, load the checkpoint, stream samples to stdout."""
    args = parse_into(SampleOptions, argv, USAGE, "Sample text from a BabyGPT checkpoint.")
    if sys.stdout is None or sys.stdout.closed:
        raise BabyGPTError("standard output is closed, and the samples are written there; run sample.py with it "
                           "open (e.g. > samples.txt)")
    device = resolve_device(args.device)
    ckpt = checkpoint_in(args.ckpt)
    model, tok = load_model(ckpt, device, args.dtype, kv_cache=not args.no_kv_cache)
    if args.top_k is not None and not 1 <= args.top_k <= tok.vocab_size:
        raise BabyGPTError(f"--top_k must be between 1 and the vocabulary size {tok.vocab_size}, "
                           f"got {args.top_k}")
    prompt = read_prompt(args.start)
    if not prompt:
        raise BabyGPTError("the prompt is empty; pass --start TEXT or --start FILE:path with some text")
    idx = torch.tensor([tok.encode(prompt)], dtype=torch.long, device=device)  # (1, T)
    refuse_nonfinite_logits(model, idx, ckpt, args.dtype)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    out = sys.stdout
    samples = args.num_samples
    if args.temperature == 0 and samples > 1:  # greedy decoding has one answer per prompt
        print(f"--temperature 0 is greedy: every sample would be the same text, so 1 is printed, not {samples}",
              file=sys.stderr)
        samples = 1
    for i in range(samples):
        out.write(prompt)
        for next_id in model.generate_iter(idx, args.max_new_tokens, args.temperature, args.top_k, generator,
                                           use_cache=not args.no_kv_cache):
            out.write(tok.decode(next_id[0].tolist()))
            out.flush()
        out.write("\n" + "-" * 40 + "\n")
        out.flush()
    return 0
