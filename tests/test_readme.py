"""Every ``dsconf`` and ``python ...`` command README.md shows in its fenced code blocks runs as written.

The commands are read from the README itself (lines starting with ``dsconf``/``python``, or ``.venv/bin/``
either, after an optional ``$ `` prompt; a trailing ``# comment`` is dropped; in a block with prompts only
the prompted lines are commands, the rest is their shown output). Each is classified:

- quick: ``dsconf show/check/explain/describe/diff/validate/import/estimate/groups``, a ``python`` command
  that only composes or prints (``--help``, ``--cfg``, ``-sc``), and any command the README shows failing
  with a ``dsconf:`` line (it stops before anything runs). Each is run here, from a temporary copy of the
  repository's ``conf/`` and ``examples/`` (so nothing is written into the repository), with
  ``DS_ACCELERATOR=cpu``, the leading ``python``/``dsconf`` replaced by this environment's interpreter and
  console script, and pipes kept. Files the README has the reader make are made first: ``$ cat NAME``
  output becomes NAME, a ``# NAME: {...}`` comment becomes NAME, ``# DIR: a run of OVERRIDES`` becomes
  DIR/ds_config.json composed from OVERRIDES, and ``# DIR: an empty dir`` an empty DIR.
- slow: everything that trains or sweeps (``train.py`` without ``--help``/``--cfg``, ``-m``, several nodes,
  SLURM) and ``dsconf report`` of the sweep dir such a command leaves. They are not run here: the training
  runs are covered by tests/examples (the example's single runs, sweeps, checkpoints and errors) and
  tests/launch (the launcher: ranks, sweeps, several nodes, SLURM, bounds on failures). Each slow command
  still gets a test (its id names it) asserting why it is slow, so none is dropped silently; a single run of
  ``examples/train.py`` is at least composed here (``--cfg job`` appended), so a stale option fails.

The exit status expected is the one the README states: 2 when the shown output has a ``dsconf:`` error line
(whose first 60 characters, up to a ``...``, must then appear on stderr), 1 for ``dsconf validate`` showing
problems and for ``dsconf diff`` showing differences, else 0. No command may print a traceback. One refusal
depends on the machine, and DeepSpeed's CPU accelerator is asked for it: fp16, which it trains where the CPU's
oneDNN has fp16 (AVX512-FP16/AMX). There the command the README shows refused must train instead (exit 0,
the run's ``metrics.json`` written).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from accelerator_here import accelerator

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
COMMAND = re.compile(r"(?:\.venv/bin/)?(?:dsconf|python) ")
QUICK_DSCONF = ("show", "check", "explain", "describe", "diff", "validate", "import", "estimate", "groups", "schema")
PRINTS_ONLY = ("--help", "-h", "--cfg", "-c", "--shell-completion", "-sc", "--info", "-i")
MIN_QUICK = 18  # the README shows 20 today: a reformat that hides them from this reader fails here
# dsconf's refusal of fp16 where DeepSpeed's accelerator lacks it (dsconf.hardware): the commands here run on
# DeepSpeed's CPU accelerator, whose fp16 depends on the CPU
FP16_REFUSAL = "fp16 training needs an accelerator that supports it"


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line in README.md
    text: str  # the command as written, without prompt or trailing comment
    comment: str
    shown: Tuple[str, ...]  # the output the README shows below it (prompted blocks only)


def _split_comment(line: str) -> Tuple[str, str]:
    """(command, comment): a ``#`` after whitespace and outside quotes starts the comment."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and i and line[i - 1].isspace():
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def _blocks() -> List[Tuple[int, List[str]]]:
    """(first line number, lines) of every fenced shell block, continuation lines joined."""
    blocks, current, start, lang = [], None, 0, ""
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current, start, lang = [], number + 1, line[3:].strip()
            else:
                if lang in SHELL_BLOCKS:
                    blocks.append((start, current))
                current = None
        elif current is not None:
            joined = [i for i, kept in enumerate(current) if kept is not None]
            if joined and current[joined[-1]].endswith("\\"):
                current[joined[-1]] = current[joined[-1]][:-1].rstrip() + " " + line.strip()
                current.append(None)  # keeps line numbers: the joined line stands in for this one
            else:
                current.append(line)
    return blocks


def _parse() -> Tuple[List[Command], Dict[str, str]]:
    """The README's commands, and the files its ``$ cat NAME`` lines show."""
    commands, shown_files = [], {}
    for start, lines in _blocks():
        prompted = any(line and line.startswith("$ ") for line in lines)
        for i, line in enumerate(lines):
            if line is None:
                continue
            if prompted and not line.startswith("$ "):
                continue
            body = line[2:] if line.startswith("$ ") else line
            shown: List[str] = []
            if prompted:
                for following in lines[i + 1:]:
                    if following is None:
                        continue
                    if following.startswith("$ "):
                        break
                    shown.append(following)
            if body.startswith("cat "):
                shown_files[body[4:].strip()] = "\n".join(shown) + "\n"
            if not COMMAND.match(body):
                continue
            text, comment = _split_comment(body)
            commands.append(Command(start + i, text, comment, tuple(shown)))
    return commands, shown_files


COMMANDS, SHOWN_FILES = _parse()


def _tokens(command: Command) -> Tuple[List[str], List[str]]:
    """The command's own tokens and the pipeline after it (empty when none)."""
    tokens = shlex.split(command.text)
    if "|" in tokens:
        bar = tokens.index("|")
        return tokens[:bar], tokens[bar + 1:]
    return tokens, []


def _shown_dsconf_lines(command: Command) -> List[str]:
    return [line for line in command.shown if line.startswith("dsconf:")]


def _shows_an_error(command: Command) -> bool:
    return any(not line.startswith(("dsconf: warning:", "dsconf: note:")) for line in _shown_dsconf_lines(command))


def slow_reason(command: Command) -> Optional[str]:
    """Why the command is not run here; None for a quick one."""
    tokens, _ = _tokens(command)
    program, args = Path(tokens[0]).name, tokens[1:]
    if program == "dsconf":
        if args[0] in QUICK_DSCONF or _shows_an_error(command):
            return None
        return f"dsconf {args[0]} reads the sweep dir a training sweep above leaves"
    if any(arg in PRINTS_ONLY for arg in args) or _shows_an_error(command):
        return None  # composes and prints, or is refused before any rank starts
    if any(arg.startswith("hydra/launcher=submitit") for arg in args):
        return "submits to a SLURM cluster"
    if any(arg.startswith("dist.nnodes=") for arg in args):
        return "needs several nodes"
    if "-m" in args or "--multirun" in args:
        return "a training sweep"
    return "trains"


QUICK = [c for c in COMMANDS if slow_reason(c) is None]
SLOW = [c for c in COMMANDS if slow_reason(c) is not None]


def starts_torch(command: Command) -> bool:
    """A run of a ``python`` script (the examples import torch and DeepSpeed before they compose) or of ``dsconf
    estimate`` (DeepSpeed's estimator): seconds each, so its test is marked slow; the other dsconf commands are not."""
    tokens, _ = _tokens(command)
    return Path(tokens[0]).name == "python" or tokens[1:2] == ["estimate"]


def composes_an_example(command: Command) -> bool:
    """A training command of the examples: its test composes it (``--cfg job``), which starts the example."""
    tokens, _ = _tokens(command)
    return Path(tokens[0]).name == "python" and tokens[1].startswith("examples/") and slow_reason(command) == "trains"


def slow_where(commands: List[Command], heavy) -> list:
    return [pytest.param(c, marks=pytest.mark.slow) if heavy(c) else c for c in commands]


def _id(command: Command) -> str:
    return f"L{command.line}: {command.text}"


def refused_here(command: Command) -> bool:
    """Whether this machine refuses the command as the README shows: always, except the fp16 refusal where
    DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``, as every command runs here) does fp16."""
    if not any(FP16_REFUSAL in line for line in _shown_dsconf_lines(command)):
        return True
    return not accelerator("cpu").fp16


def expected_status(command: Command) -> int:
    if _shows_an_error(command):
        return 2 if refused_here(command) else 0  # not refused here: it runs (trains)
    tokens, _ = _tokens(command)
    subcommand = tokens[1] if Path(tokens[0]).name == "dsconf" and len(tokens) > 1 else ""
    if subcommand == "validate" and any(re.search(r": \d+ problems?:", line) for line in command.shown):
        return 1
    if subcommand == "diff" and command.shown:
        return 1
    return 0


def _workspace(tmp: Path) -> Path:
    """A copy of what the README's commands read from the repository root, plus the files it has you make."""
    ignore = shutil.ignore_patterns("__pycache__", "outputs", "multirun")
    for name in ("conf", "examples"):
        shutil.copytree(REPO / name, tmp / name, ignore=ignore)
    for name, text in SHOWN_FILES.items():
        (tmp / name).write_text(text)
    for command in COMMANDS:
        made = re.fullmatch(r"(\S+): (.*)", command.comment)
        if not made:
            continue
        name, what = made.groups()
        if what.startswith("{"):
            (tmp / name).write_text(what + "\n")
        elif what.startswith("a run of "):
            import dsconf

            run_dir = tmp / name
            run_dir.mkdir(parents=True)
            ds = dsconf.compose(what[len("a run of "):].split(), world_size=1)
            (run_dir / "ds_config.json").write_text(json.dumps(ds, indent=2))
        elif what == "an empty dir":
            (tmp / name).mkdir(parents=True)
    return tmp


def _argv0(program: str) -> str:
    if Path(program).name == "python":
        return sys.executable
    script = Path(sys.executable).parent / "dsconf"
    found = str(script) if script.exists() else shutil.which("dsconf")
    assert found, "the dsconf console script is not installed"
    return found


def test_the_readme_shows_its_commands():
    assert len(QUICK) >= MIN_QUICK, [c.text for c in QUICK]
    shown = {shlex.split(c.text)[1] for c in QUICK if Path(shlex.split(c.text)[0]).name == "dsconf"}
    assert {"show", "check", "explain", "diff", "validate", "import", "estimate"} <= shown
    assert any(Path(shlex.split(c.text)[0]).name == "python" for c in QUICK)
    assert SLOW, "the README's training commands are no longer found"


@pytest.mark.parametrize("command", slow_where(SLOW, composes_an_example), ids=_id)
def test_slow_command_is_left_to_the_example_and_launch_tests(command, tmp_path):
    tokens, _ = _tokens(command)
    program = Path(tokens[0]).name
    if program == "dsconf":
        assert tokens[1] == "report" and slow_reason(command).startswith("dsconf report reads the sweep dir")
    else:
        script = tokens[1]
        # the examples, or the reader's own train.py
        assert script == "train.py" or (script.startswith("examples/") and (REPO / script).is_file()), command.text
        assert slow_reason(command) in ("trains", "a training sweep", "needs several nodes",
                                        "submits to a SLURM cluster")
        if composes_an_example(command):
            proc = _run([sys.executable, *tokens[1:], "--cfg", "job"], _workspace(tmp_path))
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr  # it composes


def _run(argv: List[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "HYDRA_FULL_ERROR")}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env={**env, "DS_ACCELERATOR": "cpu"},
                          timeout=timeout)


@pytest.mark.parametrize("command", slow_where(QUICK, starts_torch), ids=_id)
def test_quick_command_runs_as_written(command, tmp_path):
    cwd = _workspace(tmp_path)
    tokens, pipeline = _tokens(command)
    script = shlex.join([_argv0(tokens[0]), *tokens[1:]])
    if pipeline:
        script += " | " + shlex.join(pipeline)
    refused = refused_here(command)
    # a command shown refused that trains here may first build DeepSpeed's CPU op (about 2 minutes)
    proc = _run(["bash", "-o", "pipefail", "-c", script], cwd, timeout=120 if refused else 600)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode == expected_status(command), output
    if not refused:  # DeepSpeed's accelerator here runs what the README shows refused elsewhere: it trained
        assert FP16_REFUSAL not in output and list(cwd.glob("outputs/**/metrics.json")), output
        return
    for line in _shown_dsconf_lines(command):
        assert line.split("...")[0][:60] in proc.stderr, (line, proc.stderr)
