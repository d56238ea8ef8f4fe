"""BabyGPT: a character-level GPT for studying normalization in transformers."""

from .model import GPT, GPTConfig
from .norms import NORMS, Norm, NormOptions, build_norm

__all__ = ["GPT", "GPTConfig", "NORMS", "Norm", "NormOptions", "build_norm"]
