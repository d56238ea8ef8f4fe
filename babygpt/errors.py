"""The one exception type for mistakes a user can fix (bad config, missing file, ...).

Command-line entry points catch it and print each line of its message as
``error: ...`` with a non-zero exit and no traceback; anything else is a bug
and keeps its traceback.
"""

import difflib


class BabyGPTError(ValueError):
    """A problem with the user's input; ``str(err)`` says what is wrong and how to fix it.

    A ValueError, so that library code constructing a bad ``GPTConfig`` catches it the usual way."""

    def __init__(self, *problems: str):
        self.problems = list(problems)
        super().__init__("\n".join(problems))


class Interrupted(Exception):
    """A command stopped by SIGINT/SIGTERM after saving what it could; the command line exits
    128 + ``signum`` with ``message`` (how to continue)."""

    def __init__(self, signum: int, message: str):
        self.signum = signum
        super().__init__(message)


class ShardDone(Exception):
    """A shard of a sweep (--shard K/N) has trained its part; the command exits 0 with ``message``
    (how to merge the shards' results)."""


class Checked:
    """A config dataclass that checks itself on construction: ``problems()`` lists every invalid
    value, and all of them are raised together in one BabyGPTError. The one validation path of
    GPTConfig and TrainConfig (and so of every command that builds them)."""

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise BabyGPTError(*problems)

    def problems(self) -> list[str]:
        raise NotImplementedError


def unknown_choice(kind: str, value, choices) -> str:
    """``unknown norm_type 'rms'; choose one of: layernorm, rmsnorm, none (did you mean 'rmsnorm'?)``"""
    choices = list(choices)
    msg = f"unknown {kind} {value!r}; choose one of: {', '.join(choices)}"
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
    return msg + (f" (did you mean '{close[0]}'?)" if close else "")
