"""Every command README.md, CONTRIBUTING.md and docs/*.md show, and every example of ``dsconf COMMAND --help``, runs
as written; the output the docs show is the output it gives; a newcomer's first hour works from a clean environment.

Reading the docs. In a fenced shell block (no language, ``bash``, ``sh``, ``shell``, ``console``) every line that is
not a comment is a command, except in a block with ``$ `` prompts, where the prompted lines are the commands and the
lines under each are its shown output. A trailing ``# comment`` is not part of the command; ``# GPU only`` in it
marks a command that needs CUDA GPUs. A ``python`` or ``yaml`` block whose first line is ``# NAME`` is the file NAME
(the README's ``train.py`` and ``conf/config.yaml``); any other ``python`` block is a snippet, run as a script.
Blocks in other languages (``text``, ``json``, ...) are shown, not run.

Where they run. All docs share one workspace: a copy of the checkout's ``conf/`` and ``examples/``, the files the
docs show (``# NAME`` blocks; ``$ cat NAME`` output, unless an earlier command wrote NAME, in which case the command
is checked against the file; a ``# NAME: {...}`` comment; ``# DIR: a run of [train.py] OVERRIDES``, a run dir with
the ``ds_config.json`` those overrides compose to; ``# DIR: an empty dir``). Each command runs once (the same text
in two docs is one run), in the order of the docs, with ``python``/``dsconf`` as the environment's:

- quick commands (``dsconf`` commands, scripts that only print or are refused before anything starts) run in the
  test environment, through one warm interpreter (tests/warm_python.py); with shell syntax (pipes, redirections)
  through bash;
- commands that start ranks (training runs, sweeps, ``torchrun``, ``mpiexec``) and ``dsconf report`` of a sweep
  they leave are slow: they run in the *newcomer environment*, a fresh venv holding a wheel of this checkout and,
  through a ``.pth`` file, the test environment's packages (torch, DeepSpeed, Hydra, ...: installing them would
  download gigabytes), with no ``PYTHONPATH``, no ``DS_ACCELERATOR`` and only the system's ``PATH`` after the
  venv's ``bin`` (what ``source .venv/bin/activate`` gives): dsconf must find the environment's own ninja there;
- commands that need GPUs run only where CUDA is; commands that need a cluster (``srun``, ``sbatch``, several nodes,
  Hydra's submitit launcher) and the set-up commands (``git clone``, ``scripts/setup.sh``, ``source``, the test
  suite itself) are not run, each test saying why; a cluster command's ``python train.py`` part is composed
  (``--cfg job``) so a stale option still fails.

The status expected: 2 when the shown output has a ``dsconf:`` error line, 1 for a shown traceback
(``HYDRA_FULL_ERROR=1``), for ``validate`` showing problems and ``diff`` showing differences, a help example's
``# exit N``; else 0. No command prints a traceback unless shown. Shown output is matched line by line, in order (other
lines may come between); ``...`` matches anything, and in the output of commands that train every number matches
any number (timings, throughputs). One refusal depends on the machine: fp16 on DeepSpeed's CPU accelerator, which
the CPU's oneDNN may have (tests/accelerator_here.py); there the command shown refused must train instead.

The newcomer's path (``test_newcomer_quickstart``): the README's quickstart, in order, in the newcomer environment:
each command exits 0, prints no traceback, and never leaves the user more than ``SILENT_LIMIT_S`` without a line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import warm_python
from accelerator_here import accelerator

REPO = Path(__file__).resolve().parents[1]
DOCS = [p for p in (REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))) if p.exists()]
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
FILE_BLOCKS = ("python", "yaml")
PRINTS_ONLY = ("--help", "-h", "--cfg", "-c", "--shell-completion", "-sc", "--info", "-i", "--hydra-help")
SHELL_SYNTAX = re.compile(r"[|<>;&`]|\$\(")
CLUSTER_PROGRAMS = ("srun", "sbatch", "scontrol", "kubectl", "sky")
SETUP_PROGRAMS = ("git", "source", "pip")
SILENT_LIMIT_S = 10.0
FP16_REFUSAL = "fp16 training needs an accelerator that supports it"
QUICKSTART_HEADING = "## Quickstart"
SLOW_TIMEOUT_S = 600


@dataclass(frozen=True)
class Command:
    doc: str  # path relative to the repository
    line: int
    text: str  # as written, without prompt, trailing comment or continuation backslashes
    comment: str
    shown: Tuple[str, ...]  # the output shown below it (prompted blocks)
    section: str  # the heading it is under

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}: {self.text[:70]}"


@dataclass
class Docs:
    commands: List[Command] = field(default_factory=list)
    files: Dict[str, str] = field(default_factory=dict)  # workspace-relative name -> text
    shown_files: Dict[str, str] = field(default_factory=dict)
    snippets: List[Tuple[str, int, str]] = field(default_factory=list)  # (doc, line, python code)


# ------------------------------------------------------------------------------------------------------- reading
def split_comment(line: str) -> Tuple[str, str]:
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


def blocks(path: Path) -> List[Tuple[int, str, str, List[Optional[str]]]]:
    """(first line number, language, heading, lines) of every fenced block; a shell line ending in ``\\`` is joined
    with the next (which becomes None, keeping line numbers)."""
    out, current, start, lang, heading = [], None, 0, "", ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if current is None and line.startswith("#") and not line.startswith("#!"):
            heading = line
        if line.startswith("```"):
            if current is None:
                current, start, lang = [], number + 1, line[3:].strip()
            else:
                out.append((start, lang, heading, current))
                current = None
        elif current is not None:
            kept = [i for i, text in enumerate(current) if text is not None]
            if lang in SHELL_BLOCKS and kept and current[kept[-1]].endswith("\\"):
                current[kept[-1]] = current[kept[-1]][:-1].rstrip() + " " + line.strip()
                current.append(None)
            else:
                current.append(line)
    return out


def read_docs() -> Docs:
    docs = Docs()
    for path in DOCS:
        name = str(path.relative_to(REPO))
        for start, lang, heading, lines in blocks(path):
            if lang in FILE_BLOCKS:
                first = lines[0] or ""
                made = re.fullmatch(r"# (\S+\.(?:py|ya?ml))", first.strip())
                if made:
                    text = "\n".join(line for line in lines[1:] if line is not None) + "\n"
                    if lang == "python":
                        text = "\n".join(line for line in lines if line is not None) + "\n"
                    assert docs.files.get(made.group(1), text) == text, f"{name}: {made.group(1)} shown differently"
                    docs.files[made.group(1)] = text
                elif lang == "python":
                    docs.snippets.append((name, start, "\n".join(line for line in lines if line is not None) + "\n"))
                continue
            if lang not in SHELL_BLOCKS:
                continue
            prompted = any(line is not None and line.startswith("$ ") for line in lines)
            for i, line in enumerate(lines):
                if line is None or not line.strip():
                    continue
                if prompted and not line.startswith("$ "):
                    continue
                if not prompted and line.lstrip().startswith("#"):
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
                text, comment = split_comment(body)
                if text.startswith("cat ") and not any(text[4:].strip() in c.text for c in docs.commands):
                    docs.shown_files[text[4:].strip()] = "\n".join(shown) + "\n"
                    continue
                docs.commands.append(Command(name, start + i, text, comment, tuple(shown), heading))
    return docs


DOCS_READ = read_docs()
COMMANDS = DOCS_READ.commands


def tokens(command: Command) -> Tuple[Dict[str, str], List[str]]:
    """(leading VAR=value assignments, the rest of the command's words)."""
    words = shlex.split(command.text)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def program(command: Command) -> str:
    _, words = tokens(command)
    return Path(words[0]).name if words else ""


def shows_an_error(command: Command) -> bool:
    return any(line.startswith("dsconf:") and not line.startswith(("dsconf: warning:", "dsconf: note:"))
               for line in command.shown)


def refused_here(command: Command) -> bool:
    """Whether this machine refuses what the docs show refused: always, except fp16 where the CPU has it."""
    if not any(FP16_REFUSAL in line for line in command.shown):
        return True
    return not accelerator("cpu").fp16


def in_a_cluster_block(command: Command) -> bool:
    return any(c.doc == command.doc and c.section == command.section and program(c) in CLUSTER_PROGRAMS
               and abs(c.line - command.line) <= 3 for c in COMMANDS)


def kind(command: Command) -> Tuple[str, str]:
    """("quick" | "slow" | "gpu" | "cluster" | "setup" | "check", why)."""
    env, words = tokens(command)
    name = program(command)
    args = words[1:]
    if "GPU only" in command.comment:
        return "gpu", "needs CUDA GPUs (marked 'GPU only')"
    if name in CLUSTER_PROGRAMS or (name == "export" and in_a_cluster_block(command)):
        return "cluster", f"{name}: part of a SLURM job"
    if any(a.startswith("hydra/launcher=submitit_slurm") for a in args):
        return "cluster", "submits to a SLURM cluster"
    if any(re.fullmatch(r"dist\.nnodes=(?!1$)\S+", a) for a in args) and "rdzv_endpoint" in command.text:
        return "cluster", "needs several nodes"
    if name in SETUP_PROGRAMS or (name == "bash" and args[:1] == ["scripts/setup.sh"]):
        return "setup", "sets up an environment (network installs): the newcomer environment here stands in for it"
    if words[0].startswith(".venv/bin/"):
        return "setup", ("the checkout's development environment (CONTRIBUTING.md): the test suite itself, or the "
                         "reference's generator, which test_reference_is_generated_from_the_schema runs")
    if name == "cat" or (name == "echo" and args == ["$?"]):
        return "check", "checks a file or the status of the command above"
    if name == "dsconf":
        if args[:1] == ["report"] and "nope" not in command.text:
            return "slow", "reads the sweep dir a command above leaves"
        return "quick", "composes or prints"
    if name == "python":
        script_args = args[1:]
        if any(a in PRINTS_ONLY for a in script_args):
            return "quick", "composes and prints"
        if shows_an_error(command) and not env.get("HYDRA_FULL_ERROR") and refused_here(command):
            return "quick", "refused before any rank starts"
        if env.get("HYDRA_FULL_ERROR"):
            return "quick", "refused while composing (Hydra's full report)"
        return "slow", "trains"
    if name in ("torchrun", "mpiexec", "mpirun", "deepspeed"):
        return "slow", f"{name} starts processes"
    raise AssertionError(f"{command.id}: no rule says how to run {name!r}; add one to tests/test_readme.py")


def expected_status(command: Command) -> int:
    env, words = tokens(command)
    if env.get("HYDRA_FULL_ERROR") and any("Traceback" in line for line in command.shown):
        return 1
    if shows_an_error(command):
        return 2 if refused_here(command) else 0
    sub = words[1] if program(command) == "dsconf" and len(words) > 1 else ""
    if sub == "validate" and any(re.search(r": \d+ problems?:", line) for line in command.shown):
        return 1
    if sub == "diff" and command.shown:
        return 1
    return 0


# ------------------------------------------------------------------------------------------------------ matching
def _pattern(line: str, loose_numbers: bool) -> re.Pattern:
    parts = [re.escape(part) for part in line.strip().split("...")]
    if loose_numbers:
        parts = [re.sub(r"(?:\\-)?\d+(?:\\\.\d+)?(?:e(?:\\-|\\\+)?\d+)?", r"-?[\\d.e+-]+", part) for part in parts]
    return re.compile(".*".join(parts))


def unmatched_shown(shown: Tuple[str, ...], output: str, *, loose_numbers: bool = False) -> Optional[str]:
    """The first shown line that the output does not have (in order), or None."""
    lines = [line.strip() for line in output.splitlines()]
    at = 0
    for line in shown:
        if not line.strip() or line.strip() == "...":
            continue
        pattern = _pattern(line, loose_numbers)
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            return line
        at += 1
    return None


# ----------------------------------------------------------------------------------------------------- workspace
@dataclass
class Result:
    code: int
    output: str  # stdout and stderr (merged where the command ran as a subprocess)
    stderr: str
    gaps: List[Tuple[float, str]] = field(default_factory=list)  # (seconds without output, the line that ended it)
    seconds: float = 0.0


def _quick_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "HYDRA_FULL_ERROR")}
    env["DS_ACCELERATOR"] = "cpu"
    return env


def _make_files(root: Path, docs: Docs) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "outputs", "multirun")
    for name in ("conf", "examples"):
        shutil.copytree(REPO / name, root / name, ignore=ignore, dirs_exist_ok=True)
    for name, text in {**docs.shown_files, **docs.files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    import dsconf

    for command in docs.commands:
        made = re.fullmatch(r"(\S+): (.*)", command.comment)
        if not made:
            continue
        name, what = made.groups()
        if what.startswith("{"):
            (root / name).write_text(what + "\n")
        elif what.startswith("a run of "):
            overrides = what[len("a run of "):].split()
            options = {}
            if overrides[:1] == ["train.py"]:  # the README's script: its config dir
                overrides, options = overrides[1:], {"config_dir": str(root / "conf"), "config_name": "config"}
            (root / name).mkdir(parents=True)
            ds = dsconf.compose(overrides, world_size=1, **options)
            (root / name / "ds_config.json").write_text(json.dumps(ds, indent=2))
        elif what == "an empty dir":
            (root / name).mkdir(parents=True)


def _newcomer_venv(root: Path) -> Dict[str, str]:
    """A fresh venv: this checkout installed as a wheel, the test environment's packages through a .pth file."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ask = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = subprocess.run([str(venv / "bin" / "python"), "-c", ask], capture_output=True, text=True,
                          check=True).stdout.strip()
    import sysconfig

    # the test environment's packages, its own .pth files processed (setuptools' distutils hook among them), but not
    # the editable install of dsconf this test environment may have: the venv's dsconf is this checkout's wheel
    packages = sysconfig.get_path("purelib")
    (Path(site) / "test_environment.pth").write_text(  # one line, run by site.addpackage (an `import` line)
        f"import sys; sys.path.append({packages!r}); list(map(lambda name: __import__('site').addpackage("
        f"{packages!r}, name, None), sorted(n for n in __import__('os').listdir({packages!r}) if n.endswith('.pth') "
        "and not n.startswith(('_dsconf', '__editable__.dsconf')))))\n")
    test_bin = Path(sys.executable).parent
    for script in sorted(test_bin.iterdir()):  # the scripts pip would have put in the venv with the packages
        target = venv / "bin" / script.name
        if target.exists() or script.name.startswith(("python", "activate", "pip", "dsconf")) or not script.is_file():
            continue
        with open(script, "rb") as fh:
            first = fh.readline()
        if first.strip() == f"#!{sys.executable}".encode():
            target.write_bytes(f"#!{venv / 'bin' / 'python'}\n".encode() + script.read_bytes().split(b"\n", 1)[1])
            target.chmod(0o755)
    # the system's programs (its ninja among them) before the test environment's other executables (mpiexec)
    env = {"PATH": os.pathsep.join([str(venv / "bin"), "/usr/local/bin:/usr/bin:/bin", str(test_bin)]),
           "HOME": os.environ.get("HOME", "/root"),
           "LANG": os.environ.get("LANG", "C.UTF-8"), "TERM": "dumb", "VIRTUAL_ENV": str(venv)}
    for key in ("TMPDIR", "TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                              "--no-build-isolation", "--no-index", str(REPO)], capture_output=True, text=True,
                             env={**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    where = subprocess.run(["python", "-c", "import dsconf; print(dsconf.__file__)"], capture_output=True, text=True,
                           env=env, cwd=root)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # this checkout's wheel, nothing else
    return env


def run_streaming(script: str, cwd: Path, env: Dict[str, str], timeout: float = SLOW_TIMEOUT_S) -> Result:
    """Run ``script`` with bash, stdout and stderr merged as a terminal shows them, timing each line."""
    start = time.monotonic()
    proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    lines, gaps, last = [], [], start
    try:
        for line in proc.stdout:
            now = time.monotonic()
            gaps.append((now - last, line.rstrip()[:160]))
            last = now
            lines.append(line)
        proc.wait()
    finally:
        killer.cancel()
    end = time.monotonic()
    gaps.append((end - last, "<exit>"))
    output = "".join(lines)
    return Result(proc.returncode, output, output, gaps, end - start)


class Session:
    """The shared workspace, and every command's result, each run once, in the docs' order."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results: Dict[str, Result] = {}
        self.newcomer_env: Optional[Dict[str, str]] = None
        _make_files(root / "work", DOCS_READ)

    @property
    def work(self) -> Path:
        return self.root / "work"

    def newcomer(self) -> Dict[str, str]:
        if self.newcomer_env is None:
            self.newcomer_env = _newcomer_venv(self.root)
        return self.newcomer_env

    def result(self, command: Command) -> Result:
        """Run the commands of its kind before it first (a report needs its sweep), then it."""
        how, _ = kind(command)
        for earlier in COMMANDS[:COMMANDS.index(command)]:
            same_kind = kind(earlier)[0] == how and (how == "quick" or earlier.doc == command.doc)
            if same_kind and result_key(earlier) not in self.results:
                self._run(earlier)
        return self._run(command)

    def _run(self, command: Command) -> Result:
        key = result_key(command)
        if key not in self.results:
            how, _ = kind(command)
            self.results[key] = self._quick(command) if how == "quick" else self._slow(command)
        return self.results[key]

    def _quick(self, command: Command) -> Result:
        env, words = tokens(command)
        full_env = {**_quick_env(), **env}
        if SHELL_SYNTAX.search(command.text):
            script = command.text.replace("dsconf ", shlex.quote(_dsconf_script()) + " ", 1) \
                if program(command) == "dsconf" else command.text
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", script], cwd=self.work, env=full_env,
                                  capture_output=True, text=True, timeout=120)
        else:
            argv = [_dsconf_script(), *words[1:]] if program(command) == "dsconf" else words[1:]
            proc = warm_python.run(argv, cwd=str(self.work), env=full_env, timeout=120)
        return Result(proc.returncode, proc.stdout + proc.stderr, proc.stderr)

    def _slow(self, command: Command) -> Result:
        env = {**self.newcomer(), **tokens(command)[0]}
        if program(command) in ("mpiexec", "mpirun") and os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")  # Open MPI's own switches
        return run_streaming(command.text, self.work, env)


def result_key(command: Command) -> str:
    """A command that starts ranks runs once, however many docs show it; a quick one each time it is shown (the
    second of two identical ``import`` commands is refused: the first wrote the file)."""
    return command.text if kind(command)[0] == "slow" else command.id


def _dsconf_script() -> str:
    script = Path(sys.executable).parent / "dsconf"
    found = str(script) if script.exists() else shutil.which("dsconf")
    assert found, "the dsconf console script is not installed"
    return found


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(tmp_path_factory.mktemp("docs"))


# --------------------------------------------------------------------------------------------------------- tests
def _marks(command: Command) -> list:
    how, _ = kind(command)
    return [pytest.mark.slow] if how == "slow" else []


def check_result(command: Command, result: Result, loose_numbers: bool) -> None:
    shows_traceback = any("Traceback" in line for line in command.shown)
    assert shows_traceback or "Traceback" not in result.output, result.output[-4000:]
    assert result.code == expected_status(command), result.output[-4000:]
    missing = unmatched_shown(command.shown, result.output, loose_numbers=loose_numbers)
    assert missing is None, f"shown but not printed: {missing!r}\n--- printed:\n{result.output[-4000:]}"


@pytest.mark.parametrize("command", [pytest.param(c, marks=_marks(c), id=c.id) for c in COMMANDS])
def test_command_runs_as_written(command: Command, session: Session) -> None:
    how, why = kind(command)
    if how in ("cluster", "setup") or (how == "gpu" and not _cuda()):
        assert why
        _, words = tokens(command)
        if "python" in words and "train.py" in " ".join(words) and how == "cluster":
            python_part = words[words.index("python") + 1:]
            script = "train.py" if python_part[0] == "train.py" else python_part[0]
            args = [re.sub(r"=([^,]*),.*", r"=\1", a) for a in python_part[1:]  # one job of a sweep
                    if a not in ("-m", "--multirun") and "$" not in a
                    and not a.startswith(("hydra/launcher=", "hydra.launcher.", "dist.rdzv_endpoint"))]
            proc = warm_python.run([script, *args, "--cfg", "job"], cwd=str(session.work), env=_quick_env(),
                                   timeout=120)
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr  # it composes
        pytest.skip(f"not run here: {why}")
    if how == "check":
        _check_command(command, session)
        return
    result = session.result(command)
    if not refused_here(command):  # it trains here, where the docs show a refusal (fp16 on a CPU that has it)
        assert "Traceback" not in result.output and result.code == 0 and FP16_REFUSAL not in result.output, \
            result.output[-4000:]
        return
    check_result(command, result, loose_numbers=how == "slow")  # a training run's numbers are its machine's


def _check_command(command: Command, session: Session) -> None:
    before = COMMANDS[:COMMANDS.index(command)]
    if program(command) == "echo":
        previous = next(c for c in reversed(before) if c.doc == command.doc and kind(c)[0] != "check")
        assert session.result(previous).code == int(command.shown[0])
        return
    name = command.text[4:].strip()
    writer = next(c for c in reversed(before) if name in c.text)
    session.result(writer)
    text = (session.work / name).read_text()
    missing = unmatched_shown(command.shown, text)
    assert missing is None and len([s for s in command.shown if s.strip()]) == len(text.strip().splitlines()), text


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.parametrize("snippet", DOCS_READ.snippets, ids=lambda s: f"{s[0]}:{s[1]}")
def test_python_snippet_runs(snippet: Tuple[str, int, str], session: Session) -> None:
    path = session.work / f"snippet_{snippet[1]}.py"
    path.write_text(snippet[2])
    proc = warm_python.run([str(path)], cwd=str(session.work), env=_quick_env(), timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_the_docs_are_read() -> None:
    """A reformat that hides commands from this reader fails here."""
    by_doc = {doc: [c for c in COMMANDS if c.doc == doc] for doc in {c.doc for c in COMMANDS}}
    assert len(by_doc.get("README.md", [])) >= 12 and len(COMMANDS) >= 60, {d: len(c) for d, c in by_doc.items()}
    assert {"README.md", "CONTRIBUTING.md", "docs/bring-your-script.md", "docs/cli.md", "docs/troubleshooting.md",
            "docs/launching.md", "docs/sweeps.md", "docs/integrations.md"} <= {str(p.relative_to(REPO)) for p in DOCS}
    quickstart = [c for c in COMMANDS if c.doc == "README.md" and c.section == QUICKSTART_HEADING]
    assert [program(c) for c in quickstart][:5] == ["python", "python", "python", "dsconf", "dsconf"], quickstart
    assert {"train.py", "conf/config.yaml"} <= set(DOCS_READ.files)
    subcommands = {tokens(c)[1][1] for c in COMMANDS if program(c) == "dsconf"}
    assert {"show", "check", "explain", "diff", "validate", "import", "estimate", "report"} <= subcommands
    for command in COMMANDS:
        kind(command)  # every command has a rule


def test_readme_is_short() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 210


def test_docs_link_to_files_that_exist() -> None:
    for doc in [*DOCS, *sorted((REPO / "docs" / "reference").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(REPO)}: link to {target}"


# ---------------------------------------------------------------------------------------------------- help texts
def help_examples() -> List[Tuple[str, str, int]]:
    """(subcommand, example, expected status) from ``dsconf COMMAND --help``'s examples (dsconf.cli.EXAMPLES)."""
    from dsconf.cli import EXAMPLES

    out = []
    for sub, lines in EXAMPLES.items():
        for line in lines:
            text, comment = split_comment(line)
            status = re.match(r"exit (\d+)", comment)
            out.append((sub, text, int(status.group(1)) if status else 0))
    return out


def test_help_shows_the_examples() -> None:
    from dsconf.cli import EXAMPLES, _parser

    parser = _parser()
    choices = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(choices) == set(EXAMPLES)
    for sub, lines in EXAMPLES.items():
        text = choices[sub].format_help()
        assert all(f"  {line}" in text for line in lines), text


@pytest.mark.parametrize("sub, example, status",
                         [pytest.param(*e, marks=[pytest.mark.slow] if e[0] == "report" else [], id=e[1])
                          for e in help_examples()])
def test_help_example_runs(sub: str, example: str, status: int, session: Session) -> None:
    if sub == "report":  # the README quickstart's sweep dir
        sweep = next(c for c in COMMANDS if "hydra.sweep.dir=multirun/first" in c.text and c.doc == "README.md")
        session.result(sweep)
    words = shlex.split(example)
    proc = warm_python.run([_dsconf_script(), *words[1:]], cwd=str(session.work), env=_quick_env(), timeout=120)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == status, proc.stdout + proc.stderr


def test_cli_doc_lists_every_command_and_option() -> None:
    from dsconf.cli import _parser

    text = (REPO / "docs" / "cli.md").read_text()
    choices = _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for sub, parser in choices.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{sub}")), None)
        assert row is not None, f"docs/cli.md has no row for {sub}"
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    assert option in row, f"docs/cli.md: {sub}'s row does not name {option}"


# ----------------------------------------------------------------------------------------------------- reference
def test_reference_is_generated_from_the_schema() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import make_reference
    finally:
        sys.path.remove(str(REPO / "scripts"))
    wanted = make_reference.pages()
    present = {p.name: p.read_text() for p in (REPO / "docs" / "reference").glob("*.md")}
    stale = sorted(name for name in {*wanted, *present} if wanted.get(name) != present.get(name))
    assert not stale, f"docs/reference/ is out of date ({stale[:5]}): run python scripts/make_reference.py"
    assert "deepspeed.zero_optimization.md" in wanted and "dist.md" in wanted


# ------------------------------------------------------------------------------------------------------ newcomer
@pytest.mark.slow
def test_newcomer_quickstart(session: Session) -> None:
    """The README's quickstart in order, from the newcomer environment: exit 0, no traceback, never silent long."""
    quickstart = [c for c in COMMANDS if c.doc == "README.md" and c.section == QUICKSTART_HEADING
                  and kind(c)[0] != "check"]
    ordered = [c for c in quickstart if not c.shown][:5]
    assert [shlex.split(c.text)[:2] for c in ordered] == [["python", "examples/train.py"]] * 3 + [
        ["dsconf", "report"], ["dsconf", "check"]]
    env = session.newcomer()
    for command in ordered:
        result = session.results.get(command.text)
        if result is None or not result.gaps:  # run here, in the newcomer environment, timed
            result = session.results[command.text] = run_streaming(command.text, session.work, env)
            session.results[result_key(command)] = result
        assert result.code == 0 and "Traceback" not in result.output, (command.text, result.output[-4000:])
        longest = max(result.gaps)
        quiet = "; ".join(f"{gap:.1f} s before {line[:160]!r}" for gap, line in result.gaps if gap > SILENT_LIMIT_S / 2)
        assert longest[0] <= SILENT_LIMIT_S, f"{command.text}: silent for {quiet}\n{result.output[-3000:]}"
