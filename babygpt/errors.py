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


def unknown_choice(kind: str, value, choices) -> str:
    """``unknown norm_type 'rms'; choose one of: layernorm, rmsnorm, none (did you mean 'rmsnorm'?)``"""
    choices = list(choices)
    msg = f"unknown {kind} {value!r}; choose one of: {', '.join(choices)}"
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
    return msg + (f" (did you mean '{close[0]}'?)" if close else "")
