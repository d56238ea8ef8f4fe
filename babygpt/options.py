"""Typed command-line options: one style for every BabyGPT command.

A command declares its options as dataclass fields made with ``option`` (a default and a help
text); ``parse`` reads them the same way in train.py, sample.py, bench.py, experiments/*.py and
``python -m babygpt.plot``::

    --key=value   or   --key value     any option
    --flag        (or --flag=false)    a true/false option
    NAME ...                           positional arguments, where a command takes them
    -h, --help                         the generated list of options

Values are converted by the field's type (int, float, bool, str, a Literal's choices, Optional,
``list[str]`` for an option that may be repeated); an unknown name gets a close-match suggestion;
an empty value (``--key=``) and an option that is not repeatable given twice are refused; every
problem found is reported together, in one BabyGPTError. An option declared with a metavar that ends
in ``,...`` (``option(None, ..., metavar="LR,...")``) takes a comma-separated list, and an empty entry
in it (``--lrs=1e-3,,3e-3``, ``--reuse ,``) is refused as well: it would be dropped, or read as a
value nobody gave.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Literal

from .errors import BabyGPTError, unknown_choice

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class ShowHelp(Exception):
    """Raised by ``parse`` for -h/--help; the command-line runner prints ``text`` and exits 0."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def option(default: Any = MISSING, help: str = "", *, positional: bool = False, metavar: str = "",
           valid: "Range | None" = None):
    """A dataclass field that is a command-line option. No default: the option is required.
    A list default becomes a fresh list per instance (an option that may be given repeatedly).
    ``valid``: the values a number option accepts (see Range and range_problems): every float option
    declares one, an int option where it has a range."""
    meta = {"help": help, "positional": positional, "metavar": metavar, "valid": valid}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Option:
    """One option of a command, as read from a dataclass field."""

    name: str
    type: Any
    default: Any  # MISSING: required
    help: str
    positional: bool = False
    metavar: str = ""
    valid: "Range | None" = None  # a number option's declared range

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def range_problem(self, value) -> str | None:
        """Why ``value`` is outside this option's declared range, or None (no range declared, or None)."""
        if self.valid is None or value is None:
            return None
        return self.valid.problem(self.name, value, integer=_base(self.type) is int)

    @property
    def is_flag(self) -> bool:
        return _base(self.type) is bool

    @property
    def repeats(self) -> bool:
        return typing.get_origin(self.type) is list

    @property
    def comma_separated(self) -> bool:
        """The option takes a comma-separated list: its metavar says so (``DIR,...``)."""
        return self.metavar.endswith(",...")


@functools.cache
def type_hints(cls) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, evaluated once per class: the annotations are strings here (from
    __future__ import annotations), and evaluating them again at each config check cost more than
    the check itself."""
    return typing.get_type_hints(cls)


def options_of(cls, exclude: tuple[str, ...] = ()) -> dict[str, Option]:
    """The options declared by dataclass ``cls``, by name, in declaration order."""
    hints = type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out[f.name] = Option(f.name, hints[f.name], default, f.metadata.get("help", ""),
                             f.metadata.get("positional", False), f.metadata.get("metavar", ""),
                             f.metadata.get("valid"))
    return out


# ---------------------------------------------------------------- values

def _base(tp):
    """X for Optional[X], else tp."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def describe(tp) -> str:
    """A type as --help shows it: int, float, true|false, pre|post, int|none, str (repeatable)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return describe(_base(tp)) + "|none"
    if typing.get_origin(tp) is Literal:
        return "|".join(typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return describe(typing.get_args(tp)[0]) + "..."
    return "true|false" if tp is bool else tp.__name__


def convert(name: str, tp, value, from_cli: bool):
    """Convert ``value`` (a string from the command line, or a Python value from a config file)
    to type ``tp`` of option ``name``. Raises ValueError with a message that names the option."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        if value is None or (from_cli and str(value).lower() in ("none", "null")):
            return None
        return convert(name, _base(tp), value, from_cli)
    if origin is list:
        items = value if isinstance(value, list) else [value]
        return [convert(name, typing.get_args(tp)[0], v, from_cli) for v in items]
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
        return _to_int(name, value, from_cli)
    if tp is float:
        if isinstance(value, bool) or not (from_cli or isinstance(value, (int, float))):
            raise ValueError(f"{name} must be a number, got {value!r}")
        try:
            number = float(value)
        except (ValueError, OverflowError):  # OverflowError: an int beyond float's range
            raise ValueError(f"{name} must be a finite number, got {str(value)[:40]!r}") from None
        if not math.isfinite(number):  # nan/inf would pass every range check that follows
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{name} must be a string, got {value!r}")
    raise TypeError(f"no parser for option {name} of type {tp}")  # a bug in a declaration, not user input


def _to_int(name: str, value, from_cli: bool) -> int:
    """An integer that fits in 64 bits (the tensors and loops it ends up in overflow beyond)."""
    number = _parse_int(name, value, from_cli)
    if not -2**63 <= number < 2**63:
        raise ValueError(f"{name} must fit in 64 bits (below 2**63), got {number}")
    return number


def _parse_int(name: str, value, from_cli: bool) -> int:
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


# float32's largest finite number and its smallest normal one (torch.finfo(torch.float32).max / .tiny).
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38


@dataclass(frozen=True)
class Range:
    """The values a float option accepts, declared once with it (``option(..., valid=Range(0, 1))``)
    and checked by ``range_problems``: finite, from ``low`` to ``high`` (each end open or closed),
    and representable in float32. Every float key ends up in float32 (the weights, the optimizer's
    state, the norms' arithmetic): beyond float32's largest number a value becomes inf there, and a
    nonzero value below its smallest normal number is flushed to 0 (as GPUs and flush-to-zero CPUs
    do with subnormals), so such a value would silently mean something else."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    why: str = ""  # appended to the out-of-range message: why the range is what it is
    text: str = ""  # the range in words, where the numbers would read badly ("in [0, 2**32)")

    def describe(self, integer: bool = False) -> str:
        """"positive", ">= 0", "in [0, 1)": the range as a message states it."""
        if self.text:
            return self.text
        if integer and (self.low, self.low_open, self.high) == (0, True, math.inf):
            return "a positive integer"
        if self.high == math.inf:
            if self.low == 0:
                return "positive" if self.low_open else ">= 0"
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def contains(self, value: float) -> bool:
        above_low = value > self.low or (value == self.low and not self.low_open)
        return above_low and (value < self.high or (value == self.high and not self.high_open))

    def problem(self, name: str, value, integer: bool = False) -> str | None:
        """Why ``value`` cannot be option ``name``'s (an int option's where ``integer``), or None."""
        if integer:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{name} must be an integer, got {value!r}"
            return None if self.contains(value) else f"{name} must be {self.describe(True)}, got {value!r}{self.why}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{name} must be a number, got {value!r}"
        if not math.isfinite(value):
            return f"{name} must be a finite number, got {value!r}"
        if not self.contains(value):
            return f"{name} must be {self.describe()}, got {value!r}{self.why}"
        if abs(value) > FLOAT32_MAX:
            return (f"{name} must be at most {FLOAT32_MAX:.4g}, float32's largest number (a larger one is inf "
                    f"in float32), got {value!r}")
        if 0 < abs(value) < FLOAT32_TINY:
            zero = "0 or " if self.contains(0.0) else ""
            return (f"{name} must be {zero}at least {FLOAT32_TINY:.4g}, float32's smallest normal number (a "
                    f"smaller one underflows to 0 in float32), got {value!r}")
        return None


def range_problems(obj, only: type | None = None) -> list[str]:
    """The one check of every number option of dataclass ``obj`` against its declared Range: each
    float option (or Optional float; None passes) must declare one, and a float option declared
    without one is a bug in the declaration (TypeError), so that no float key can escape the rule;
    an int option is checked where it declares one. ``only``: int or float, the options of that type alone."""
    hints = type_hints(type(obj))
    problems = []
    for f in dataclasses.fields(obj):
        kind, valid = _base(hints[f.name]), f.metadata.get("valid")
        if kind is float and valid is None:
            raise TypeError(f"float option {type(obj).__name__}.{f.name} declares no valid=Range(...)")
        if kind not in (int, float) or valid is None or only not in (None, kind):
            continue
        value = getattr(obj, f.name)
        optional = _base(hints[f.name]) != hints[f.name]
        problem = None if value is None and optional else valid.problem(f.name, value, integer=kind is int)
        if problem:
            problems.append(problem)
    return problems


def unknown_name(name: str, known, kind: str = "option", dashes: str = "--") -> str:
    """``unknown option '--temp' (did you mean '--temperature'?)``."""
    # An abbreviation (--temp) names its option as surely as a typo does; difflib alone misses it.
    close = [k for k in known if k.startswith(name)][:1] or \
        difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    hint = f" (did you mean '{dashes}{close[0]}'?)" if close else "; see --help for the list"
    return f"unknown {kind} '{dashes}{name}'{hint}"


# ---------------------------------------------------------------- argv

def parse(argv: list[str], options: dict[str, Option], usage: str, *, kind: str = "option",
          dashes: str = "--", help_text: str | None = None) -> tuple[dict, list[str]]:
    """Read ``argv`` against ``options``: ({name: converted value} for what argv sets, problems).

    Raises ShowHelp for -h/--help in an option's place (not as another option's value).
    ``kind`` and ``dashes`` shape the unknown-name message (train.py says "unknown config key 'lr'")."""
    named = {n: o for n, o in options.items() if not o.positional}
    positional = [o for o in options.values() if o.positional]
    values: dict = {}
    problems: list[str] = []
    given: dict[str, list[str]] = {}  # the texts each option that is not repeatable was given
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            raise ShowHelp(help_text or format_help(usage, options))
        if not arg.startswith("-") or arg == "-":
            _take_positional(arg, positional, values, problems, usage)
            continue
        key, eq, text = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if not key:
            problems.append(f"unexpected argument '{arg}'; usage: {usage}")
            continue
        opt = named.get(key)
        follows = args[0] if args and not args[0].startswith("--") else None
        if opt is None:
            if not eq and follows is None:  # nothing to take as its value either
                problems.append(f"malformed argument '{arg}': {unknown_name(key, named, kind, dashes)}")
                continue
            if not eq:
                args.pop(0)  # its value, so that it is not read as a positional argument
            problems.append(unknown_name(key, named, kind, dashes))
            continue
        if not eq and opt.is_flag:
            # --flag alone is true; --flag false (or none, for an optional one) takes the word, and so
            # does --flag "" (an empty shell variable), to be refused as empty below.
            spelled = follows is not None and follows.lower() in _TRUE | _FALSE | {"none", "null", ""}
            text = args.pop(0) if spelled else "true"
        elif not eq:
            if follows is None:
                problems.append(f"malformed argument '{arg}': no value; write --key=value or --key value "
                                f"(e.g. {arg}=VALUE)")
                continue
            text = args.pop(0)  # --key value
        if not text:  # read as none or as an empty name, it would quietly mean "not given" or "here"
            problems.append(f"--{key} was given an empty value ''; give it a value"
                            + ("" if opt.required else ", or leave it out for its default"))
            continue
        if not opt.repeats:
            given.setdefault(key, []).append(text)
        empty = empty_entry_problems(f"--{key}", text) if opt.comma_separated else []
        if empty:
            problems += empty
            continue
        try:
            value = convert(key, opt.type, text, from_cli=True)
        except ValueError as e:
            problems.append(str(e))
            continue
        values[key] = values.get(key, []) + value if opt.repeats else value
    # Of two values the last would silently win, whatever the first was meant to say.
    problems += [f"--{key} is given {len(texts)} times ({', '.join(map(repr, texts))}); give it once"
                 for key, texts in given.items() if len(texts) > 1]
    for opt in [*named.values(), *positional]:
        if opt.required and opt.name not in values:
            what = f"--{opt.name}" if not opt.positional else (opt.metavar or opt.name.upper())
            problems.append(f"{what} is required; usage: {usage}")
    return values, problems


def empty_entry_problems(name: str, text: str) -> list[str]:
    """An empty (or blank) entry of comma-separated list ``text`` given to ``name`` (``1,,2``, ``,``,
    ``a,``): dropped, it would leave a list shorter than it reads, and read, a value nobody gave."""
    if all(entry.strip() for entry in text.split(",")):
        return []
    return [f"{name} has an empty entry in {text!r}; give its comma-separated values with none empty or blank "
            f"(no comma doubled or at either end)"]


def _take_positional(arg: str, positional: list[Option], values: dict, problems: list[str], usage: str):
    for opt in positional:
        if opt.repeats:
            values.setdefault(opt.name, []).append(arg)
            return
        if opt.name not in values:
            values[opt.name] = arg
            return
    problems.append(f"unexpected argument '{arg}'; usage: {usage}")


def parse_into(cls, argv: list[str], usage: str, description: str = ""):
    """An instance of options dataclass ``cls`` read from ``argv``. If ``cls`` has a ``problems()``
    method (checks across options, ranges), it runs on what parsed, and every problem found, in
    parsing or there, is raised together in one BabyGPTError."""
    options = options_of(cls)
    values, problems = parse(argv, options, usage, help_text=format_help(usage, options, description))
    missing = [o for o in options.values() if o.required and o.name not in values]
    args = None if missing else cls(**values)  # options that failed to parse keep their defaults
    if args is not None and hasattr(args, "problems"):
        problems += args.problems()
    if problems:
        raise BabyGPTError(*problems)
    return args


def format_help(usage: str, options: dict[str, Option], description: str = "",
                sections: dict[str, dict[str, Option]] | None = None) -> str:
    """usage, description, then one line per option: name, type, default, meaning."""
    lines = [f"usage: {usage}"] + (["", description] if description else [])
    for title, opts in (sections or {"options": options}).items():
        lines += ["", f"{title}:"]
        for o in opts.values():
            name = (o.metavar or o.name.upper()) if o.positional else f"--{o.name}"
            default = "(required)" if o.required else _show(o.default)
            lines.append(f"  {name:<30} {describe(o.type):<24} {default:<22} {o.help}")
    lines += ["", f"  {'--debug':<30} {'':<24} {'':<22} show a traceback on errors"]
    return "\n".join(lines)


def _show(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    if isinstance(value, str) and not value.isprintable():  # e.g. a newline: shown as \n, not as a line break
        return repr(value)[1:-1]
    return str(value)


def repeated_entries(option: str, entries: list) -> list[str]:
    """An entry a comma-separated option lists twice: it would be used once, the second silently
    dropped (used or refused)."""
    twice = sorted({str(e) for e in entries if entries.count(e) > 1})
    return [f"{option} lists {', '.join(twice)} more than once; give each once"] if twice else []
