"""The one exception type users see for a config mistake, and the problems it carries."""

from __future__ import annotations

import contextlib
import difflib
import sys
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator, NoReturn, Sequence

# Exit codes of dsconf's commands and of a dsconf app's single run.
EXIT_JOB_FAILED = 1  # a rank failed, or the job timed out
EXIT_CONFIG_ERROR = 2  # a config mistake, reported before anything runs
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: 128 + SIGINT, as a shell reports an interrupted command


@dataclass(frozen=True)
class Problem:
    """One mistake in a config: where it is, what is wrong, and what would be valid."""

    path: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text} ({self.hint})" if self.hint else text


class ConfigWarning(UserWarning):
    """Something in a config that runs, but not as written: dsconf says what DeepSpeed does with it."""


class ConfigError(ValueError):
    """A config mistake; ``problems`` lists every problem found, each with its dotted path."""

    def __init__(self, problems: Sequence[Problem] | Problem | str) -> None:
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__(self.render())

    @property
    def paths(self) -> list[str]:
        return [p.path for p in self.problems]

    def render(self) -> str:
        if len(self.problems) == 1:
            return f"invalid DeepSpeed config: {self.problems[0]}"
        lines = [f"invalid DeepSpeed config ({len(self.problems)} problems):"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A 'did you mean ...?' hint naming the closest candidates, or listing the valid ones."""
    pool = sorted({str(c) for c in candidates})
    lowered = {c.lower(): c for c in pool}
    close = [lowered[word.lower()]] if word.lower() in lowered else difflib.get_close_matches(word, pool, n=3,
                                                                                             cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    if len(pool) <= 12:
        return "valid: " + ", ".join(pool)
    return ""


def join_path(*parts: object) -> str:
    """Dotted path from parts, skipping empty ones; list indices as [i]."""
    out = ""
    for part in parts:
        if part is None or part == "":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def exit_with(message: str, code: int) -> NoReturn:
    """End the process with ``dsconf: message`` on stderr and ``code``: no traceback."""
    sys.stdout.flush()
    print(f"dsconf: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


@contextlib.contextmanager
def config_warnings_to_stderr(show: bool = True) -> Iterator[None]:
    """dsconf's config warnings raised inside, each once, as ``dsconf: warning: ...`` lines on stderr (none when not
    ``show``: the other ranks of a job); any other warning goes on to Python's handling unchanged."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        yield
    shown = set()
    for warning in caught:
        if not issubclass(warning.category, ConfigWarning):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        elif show and str(warning.message) not in shown:
            shown.add(str(warning.message))
            print(f"dsconf: warning: {warning.message}", file=sys.stderr, flush=True)
