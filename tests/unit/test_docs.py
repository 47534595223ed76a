"""Every command and repository path README.md and docs/ name exists, and every shell command
they show is checked.

Commands are read from code blocks and `code spans`: `make <target>` (a Makefile target),
`python -m <module>` (an importable module), console scripts (`dispatch-admin <command>`,
`dispatch-client`; declared in a pyproject.toml). Paths are the code-span or code-block
words that start at a top-level entry of the repository or at a model folder, and every
relative Markdown link; `<placeholder>` and `*` match any name (at least one must exist).

Every fenced block names its language. Each simple command of a shell block (`sh`, `bash`)
is classified and checked without running it: `make` targets exist; `python -m <module>` and
the console scripts parse their arguments with the program's own argparse parser (stopped
right after parsing, in a child process, so nothing executes); `curl` asks a port the
deployment publishes for a path the server answers; any other program is listed in
`OTHER_COMMANDS` with what runs or checks it. Module commands in code spans that carry
arguments are parsed too. Python blocks must compile and import only names that exist; JSON
blocks must parse.

The pages describe the project as it is: no issue numbers of this project, commit hashes or
date-stamped runs (history belongs in commit messages and CHANGELOG.md).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.repository_layout import CONFIG_FILE, SCORING_MODEL

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MODELS = ROOT / "model_repository"
TOP_LEVEL = {entry.name for entry in ROOT.iterdir() if not entry.name.startswith(".")}
# Run outputs: a documented `perf/reports/<kind>-<stamp>/` must be an ignored output folder.
GENERATED = ("perf/reports/",)
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
TAGGED_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
SHELL = {"sh", "bash", "shell"}
# Programs of shell blocks that are neither make, python -m, a console script nor curl: each
# with what runs or checks it.
OTHER_COMMANDS = {
    "cat": "feeds a file to the next command of the line (the client reads stdin: test_cli.py)",
    "grep": "filters the previous command's output",
    "cp": "copies the repository to sign it (test_operator_walkthrough.py signs a copy so)",
    "export": "shell builtin: sets variables for the commands that follow",
    "docker": "tests/unit/deploy/test_deploy.py checks the Dockerfiles and compose file "
    "(and runs `docker-compose config` where installed); no Docker in CI",
    "kubectl": "tests/unit/deploy/test_deploy.py renders and validates the manifests",
    "perf/gpu_check.sh": "needs an NVIDIA GPU: run on a GPU host, not in CI",
}
# Paths the launcher's health endpoint and Triton answer (curl commands may ask these).
HEALTH_PATHS = ("/readyz", "/livez", "/healthz", "/metrics")
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _snippets(text: str) -> Iterator[str]:
    """Each line of each code block, then each code span outside the blocks."""
    for block in FENCE.findall(text):
        yield from block.splitlines()
    yield from SPAN.findall(FENCE.sub("", text))


def _words(line: str) -> list[str]:
    line = line.strip().removeprefix("$ ").rstrip("\\").strip()
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


def _commands(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line (split at ;, && and ||, pipes)."""
    command: list[str] = []
    for word in _words(line):
        if word in {";", "&&", "||", "|"}:
            if command:
                yield command
            command = []
        else:
            command.append(word.rstrip(";"))
    if command:
        yield command


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", text, re.M))


def _projects() -> list[dict[str, Any]]:
    return [
        tomllib.loads(path.read_text())["project"]
        for path in (ROOT / "pyproject.toml", *ROOT.glob("*/pyproject.toml"))
    ]


def _console_scripts() -> set[str]:
    return {name for project in _projects() for name in project.get("scripts", {})}


def _admin_commands() -> set[str]:
    from dispatch_service.ops.admin import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if a.choices]  # the subcommands' action
    return {name for action in actions for name in (action.choices or {})}


def _ignored(path: str) -> bool:
    """Whether .gitignore ignores the folder `path` (a run's output folder)."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return path.rstrip("/") + "/" in {line.strip().lstrip("/") for line in lines}


def _path_exists(word: str, base: Path) -> bool:
    word = word.rstrip("/.,:)")
    if word.startswith(GENERATED) and "<" in word:
        return base == ROOT and _ignored(word.split("<", 1)[0].rsplit("/", 1)[0])
    pattern = re.sub(r"<[^>]+>", "*", word)
    return any(base.glob(pattern)) if "*" in pattern else (base / pattern).exists()


def _repository_path(word: str) -> Path | None:
    """Where a word that names a repository path is rooted; None when it names none."""
    word = word.split("=", 1)[-1].removeprefix("./")
    head = word.split("/", 1)[0]
    if not head or ("/" not in word and "." not in word):
        return None
    if (head in TOP_LEVEL and head != "docs") or word.startswith("docs/"):
        return ROOT
    if "/" in word and (MODELS / head).is_dir():
        return MODELS
    return None


def _kubernetes_object_names() -> set[str]:
    """Names the manifests give Kubernetes objects (a Secret `dispatch-keys` is no command)."""
    import yaml

    names: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "name" and isinstance(value, str):
                    names.add(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for manifest in (ROOT / "deploy" / "k8s").rglob("*.yaml"):
        for document in yaml.safe_load_all(manifest.read_text()):
            walk(document)
    # Prometheus scrape jobs (`dispatch-launcher`) are names too, not commands.
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    names |= {str(job["job_name"]) for job in prometheus["scrape_configs"]}
    return names


def _found() -> dict[str, list[tuple[str, str]]]:
    """Kind -> (document, what it names)."""
    found: dict[str, list[tuple[str, str]]] = {
        "make": [],
        "module": [],
        "script": [],
        "path": [],
        "link": [],
    }
    scripts = _console_scripts()
    distributions = {str(project["name"]) for project in _projects()}
    objects = _kubernetes_object_names()
    for doc in DOCS:
        text = doc.read_text()
        name = doc.relative_to(ROOT).as_posix()
        for snippet in _snippets(text):
            for command in _commands(snippet):
                program = Path(command[0]).name
                if program == "make":
                    targets = [w for w in command[1:] if "=" not in w and not w.startswith("-")]
                    found["make"] += [(name, target) for target in targets]
                elif program.startswith("python") and command[1:2] == ["-m"] and len(command) > 2:
                    found["module"].append((name, command[2]))
                elif program in scripts or (
                    program.startswith("dispatch-")
                    and program not in distributions
                    and program not in objects
                ):
                    found["script"].append((name, " ".join([program, *command[1:2]])))
                for word in command:
                    if _repository_path(word) is not None:
                        found["path"].append((name, word))
        for target in LINK.findall(text):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                found["link"].append((name, target.split("#", 1)[0]))
    return found


FOUND = _found()


def test_the_docs_name_commands_and_paths() -> None:
    """The sweep itself works: it finds what the README is known to name."""
    assert ("README.md", "serve") in FOUND["make"]
    assert any(doc == "README.md" for doc, _ in FOUND["link"])
    assert len(FOUND["path"]) > 30 and len(FOUND["module"]) > 3


def test_every_make_target_exists() -> None:
    targets = _make_targets()
    missing = sorted({(doc, t) for doc, t in FOUND["make"] if t not in targets})
    assert missing == [], missing


def test_every_python_module_exists() -> None:
    missing = sorted(
        {(doc, m) for doc, m in FOUND["module"] if importlib.util.find_spec(m) is None}
    )
    assert missing == [], missing


def test_every_console_script_and_admin_command_exists() -> None:
    scripts, commands = _console_scripts(), _admin_commands()
    missing = []
    for doc, named in sorted(set(FOUND["script"])):
        program, _, argument = named.partition(" ")
        if program not in scripts:
            missing.append((doc, program))
        elif program == "dispatch-admin" and argument[:1].isalpha() and argument not in commands:
            missing.append((doc, named))
    assert missing == [], missing


def test_every_repository_path_exists() -> None:
    missing = []
    for doc, word in sorted(set(FOUND["path"])):
        base = _repository_path(word)
        assert base is not None
        if not _path_exists(word.split("=", 1)[-1].removeprefix("./"), base):
            missing.append((doc, word))
    assert missing == [], missing


def test_every_relative_link_exists() -> None:
    missing = [
        (doc, target)
        for doc, target in sorted(set(FOUND["link"]))
        if not (ROOT / doc).parent.joinpath(target).exists()
    ]
    assert missing == [], missing


@pytest.mark.parametrize(
    ("word", "exists"),
    [
        ("perf/bench.py", True),
        ("perf/no_such_file.py", False),
        (f"model_repository/<model>/{CONFIG_FILE}", True),
        (f"{SCORING_MODEL}/{CONFIG_FILE}", True),
        (f"{SCORING_MODEL}/nothing.pbtxt", False),
    ],
)
def test_the_path_check_can_fail(word: str, exists: bool) -> None:
    base = _repository_path(word)
    assert base is not None
    assert _path_exists(word, base) is exists


# ------------------------------------------------------------- shell commands, checked


def _blocks(text: str) -> Iterator[tuple[str, str]]:
    """(language, body) of each fenced block."""
    for info, body in TAGGED_FENCE.findall(text):
        yield info.strip().split(" ", 1)[0], body


def _shell_lines(body: str) -> Iterator[str]:
    """The command lines of a shell block, continuation lines joined."""
    line = ""
    for raw in body.splitlines():
        line += raw.rstrip()
        if line.endswith("\\"):
            line = line[:-1] + " "
            continue
        if line.strip():
            yield line
        line = ""


def _without_assignments(command: list[str]) -> list[str]:
    """The command without leading `NAME=value` environment words."""
    words = list(command)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words.pop(0)
    return words


def _published_ports() -> set[int]:
    """The host ports docker-compose.yml publishes: the documented ports of the service."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    ports = set()
    for service in {**compose["services"], "x-triton": compose["x-triton"]}.values():
        for mapping in service.get("ports", []):
            ports.add(int(str(mapping).split(":")[0]))
    return ports


def _entry_points() -> dict[str, str]:
    """Console script -> `module:function`."""
    return {
        name: target
        for project in _projects()
        for name, target in project.get("scripts", {}).items()
    }


def _shell_commands() -> list[tuple[str, list[str]]]:
    """(document, command words) of every simple command in the shell blocks."""
    found = []
    for doc in DOCS:
        name = doc.relative_to(ROOT).as_posix()
        for language, body in _blocks(doc.read_text()):
            if language not in SHELL:
                continue
            for line in _shell_lines(body):
                for command in _commands(line):
                    words = _without_assignments(command)
                    if words:
                        found.append((name, words))
    return found


SHELL_COMMANDS = _shell_commands()

# Runs each program's own argument parser on the documented arguments and stops right after
# it parsed them: ArgumentParser.parse_args raises `Parsed` instead of returning, so the
# program never goes on to do its work. A parse error exits or returns before that: reported.
PARSE_ONLY = r"""
import argparse, contextlib, importlib, io, json, runpy, sys

class Parsed(BaseException):
    pass

parse_args = argparse.ArgumentParser.parse_args

def parse_then_stop(self, args=None, namespace=None):
    parse_args(self, args, namespace)
    raise Parsed

argparse.ArgumentParser.parse_args = parse_then_stop
verdicts = []
for kind, target, argv in json.loads(sys.stdin.read()):
    sys.argv = [target, *argv]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if kind == "module":
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                module, function = target.split(":")
                getattr(importlib.import_module(module), function)()
        verdict = "returned without parsing its arguments: " + out.getvalue()[-400:]
    except Parsed:
        verdict = "ok"
    except SystemExit as exc:
        wants_help = "--help" in argv or "-h" in argv
        verdict = "ok" if wants_help and exc.code in (0, None) else (
            f"exit {exc.code}: " + out.getvalue()[-400:])
    except BaseException as exc:
        verdict = f"{type(exc).__name__}: {exc}"
    verdicts.append(verdict)
print(json.dumps(verdicts))
"""


def _parse_only(runs: list[tuple[str, str, list[str]]]) -> list[str]:
    """The verdict of each (kind, module or entry point, arguments) parse, from a child."""
    done = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY],
        input=json.dumps(runs),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(verdicts, list) and len(verdicts) == len(runs)
    return [str(v) for v in verdicts]


def _argument_runs() -> list[tuple[str, tuple[str, str, list[str]]]]:
    """(document, (kind, target, arguments)) for every command whose arguments are parsed:
    the module and console-script commands of shell blocks, and module commands with
    arguments in code spans."""
    scripts = _entry_points()
    runs: list[tuple[str, tuple[str, str, list[str]]]] = []
    for doc, words in SHELL_COMMANDS:
        program = Path(words[0]).name
        if program.startswith("python") and words[1:2] == ["-m"]:
            runs.append((doc, ("module", words[2], words[3:])))
        elif program in scripts:
            runs.append((doc, ("script", scripts[program], words[1:])))
    for page in DOCS:
        name = page.relative_to(ROOT).as_posix()
        for span in SPAN.findall(FENCE.sub("", page.read_text())):
            for command in _commands(span):
                words = _without_assignments(command)
                program = Path(words[0]).name if words else ""
                if program.startswith("python") and words[1:2] == ["-m"] and len(words) > 3:
                    runs.append((name, ("module", words[2], words[3:])))
    unique = {(doc, (kind, target, tuple(argv))) for doc, (kind, target, argv) in runs}
    return sorted((doc, (kind, target, list(argv))) for doc, (kind, target, argv) in unique)


def test_every_block_names_its_language() -> None:
    untagged = [
        doc.relative_to(ROOT).as_posix()
        for doc in DOCS
        for language, _ in _blocks(doc.read_text())
        if not language
    ]
    assert untagged == []


def test_every_shell_command_is_classified() -> None:
    scripts = _entry_points()
    unclassified = sorted(
        {
            (doc, words[0])
            for doc, words in SHELL_COMMANDS
            if Path(words[0]).name not in {"make", "curl", *scripts}
            and not (Path(words[0]).name.startswith("python") and words[1:2] == ["-m"])
            and words[0] not in OTHER_COMMANDS
            and Path(words[0]).name not in OTHER_COMMANDS
        }
    )
    assert unclassified == [], "add each to OTHER_COMMANDS with what runs it"
    assert len(SHELL_COMMANDS) > 20


def test_every_documented_command_line_parses() -> None:
    runs = _argument_runs()
    assert len(runs) > 10
    assert any(kind == "script" for _, (kind, _, _) in runs)
    verdicts = _parse_only([run for _, run in runs])
    failed = [
        (doc, " ".join([target, *argv]), verdict)
        for (doc, (_, target, argv)), verdict in zip(runs, verdicts, strict=True)
        if verdict != "ok"
    ]
    assert failed == []


def test_the_parse_check_can_fail() -> None:
    verdicts = _parse_only(
        [
            ("script", "dispatch_service.ops.admin:main", ["deploy", "--no-such-option"]),
            ("script", "dispatch_client.cli:main", ["--retries"]),
            ("module", "dispatch_service.ops.server", ["--profile", "tpu"]),
            ("module", "dispatch_service.ops.server", ["--http-port", "9000"]),
        ]
    )
    assert [v == "ok" for v in verdicts] == [False, False, False, True], verdicts


def test_every_curl_asks_a_published_port_for_a_served_path() -> None:
    ports = _published_ports()
    assert {8000, 8001, 8002, 8003} <= ports
    checked, wrong = 0, []
    for doc, words in SHELL_COMMANDS:
        if Path(words[0]).name != "curl":
            continue
        urls = [w for w in words[1:] if re.match(r"(https?://)?[\w.-]+:\d+", w)]
        for url in urls:
            match = re.match(r"(?:https?://)?[\w.-]+:(\d+)(/\S*)?", url)
            assert match is not None
            port, path = int(match.group(1)), match.group(2) or "/"
            checked += 1
            if port not in ports or not (path in HEALTH_PATHS or path.startswith("/v2/")):
                wrong.append((doc, url))
        if not urls:
            wrong.append((doc, " ".join(words)))
    assert wrong == []
    assert checked > 0


def test_the_health_paths_are_served() -> None:
    source = "\n".join(path.read_text() for path in (ROOT / "python_backend").rglob("*.py"))
    assert all(f'"{path}"' in source for path in HEALTH_PATHS)


def _imports(tree: ast.AST) -> Iterator[tuple[str, str | None]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield from ((node.module, alias.name) for alias in node.names)


def test_python_blocks_compile_and_import_what_exists() -> None:
    missing, blocks = [], 0
    for doc in DOCS:
        for language, body in _blocks(doc.read_text()):
            if language != "python":
                continue
            blocks += 1
            tree = ast.parse(body)  # a syntax error fails here, naming the line
            for module, name in _imports(tree):
                try:
                    imported = importlib.import_module(module)
                except ImportError:
                    missing.append((doc.name, module))
                    continue
                if name is not None and not hasattr(imported, name):
                    missing.append((doc.name, f"{module}.{name}"))
    assert blocks >= 3
    assert missing == []


def test_json_blocks_parse() -> None:
    for doc in DOCS:
        for language, body in _blocks(doc.read_text()):
            if language == "json":
                json.loads(body)


def test_make_variables_on_a_command_line_are_read_by_the_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text()
    unread = sorted(
        {
            (doc, word.split("=", 1)[0])
            for doc, words in SHELL_COMMANDS
            if Path(words[0]).name == "make"
            for word in words[1:]
            if "=" in word and f"$({word.split('=', 1)[0]})" not in makefile
        }
    )
    assert unread == []


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_every_link_anchor_names_a_heading() -> None:
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or "#" not in target:
                continue
            path, anchor = target.split("#", 1)
            page = (doc.parent / path) if path else doc
            if page.suffix != ".md" or not page.exists():
                continue
            headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append((doc.relative_to(ROOT).as_posix(), target))
    assert broken == []


# Messages docs/troubleshooting.md quotes that Triton, not this project, writes.
TRITON_MESSAGES = (
    "Exceeds maximum queue size",
    "Request timeout expired",
    "Request for unknown model",
    "This protocol is restricted",
    "has kind KIND_GPU but no GPUs are available",
)


def _source_text() -> str:
    """The project's Python source as its messages read: implicitly joined string literals
    joined, `{CONSTANT}` fields of f-strings replaced by the string constant's value, and
    backticks dropped (a code span cannot quote them)."""
    text = "\n".join(
        path.read_text()
        for folder in ("python_backend", "client", "contract")
        for path in (ROOT / folder).rglob("*.py")
    )
    text = re.sub(r"\"\s*\n\s*f?\"", "", text)
    constants = dict(
        re.findall(r"^([A-Z][A-Z0-9_]*)(?:: Final(?:\[str\])?)? = \"([^\"]*)\"", text, re.M)
    )
    text = re.sub(r"\{([A-Z][A-Z0-9_]*)\}", lambda m: constants.get(m.group(1), m.group(0)), text)
    return text.replace("`", "")


def test_every_troubleshooting_message_is_one_the_code_prints() -> None:
    """Each message the troubleshooting tables quote is written by the code (or by Triton):
    its literal pieces between `<placeholders>` and `...` appear in the source."""
    source, missing, checked = _source_text(), [], 0
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    for row in re.findall(r"^\| (.+?) \| .+\|$", text, re.M):
        for quoted in SPAN.findall(row):
            pieces = re.split(r"<[^>]*>|\.\.\.|\+ log tail", quoted)
            for piece in (p.strip(" :,()'") for p in pieces):
                if len(piece) < 12 or piece.startswith(("--", "`")):
                    continue
                checked += 1
                if piece not in source and not any(m in piece for m in TRITON_MESSAGES):
                    missing.append(piece)
    assert checked > 30
    assert missing == []


# ---- the docs describe the project as it is --------------------------------------------------

# History (which issue asked for a change, the commit that made it, the run that measured it)
# belongs in commit messages and CHANGELOG.md. A citation of another project's issue or pull
# request names that project ("triton-inference-server/server issue 7368"), or follows such a
# citation as "its" ("..., fixed by its pull request 7840").
OWN_ISSUE = re.compile(
    r"(?P<owner>\b[\w.-]+/[\w.-]+\s+)?(?P<its>\bits\s+)?"
    r"\b(?:issues?|pull requests?|PRs?)\s+#?\d+|(?<![\w/&])#\d+\b",
    re.I,
)
CITED = re.compile(r"\b[\w.-]+/[\w.-]+\s+(?:issue|pull request)", re.I)
# A 7-40 digit hex word with at least one digit and one letter: what a commit hash looks like.
HEX_WORD = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
# Hex words the docs show on purpose: the signature algorithm's name and example values.
HEX_EXAMPLES = {
    "ed25519": "the signature algorithm",
    "bab69cd79bd443938ebebee48aeaaabb": "docs/contract.md: an example request id",
    "95e827eb90cff0f1": "docs/fleet.md: an example signing key id",
}
RUN_STAMP = re.compile(r"\b20\d{6}-\d{6}\b|\b(?:19|20|21)\d{2}-[01]\d-[0-3]\d\b")
# Dates the docs name as facts, not as the day of a run: the bounds of a valid unix time.
DATES = {"2000-01-01", "2100-01-01"}


def _history(text: str) -> list[str]:
    """The issue references, commit-hash-like words and run stamps of one page."""
    found = [
        m.group(0).removeprefix(m.group("its") or "")
        for m in OWN_ISSUE.finditer(text)
        if not m.group("owner")
        and not (m.group("its") and CITED.search(text, max(0, m.start() - 200), m.start()))
    ]
    found += [word for word in HEX_WORD.findall(text) if word not in HEX_EXAMPLES]
    found += [stamp for stamp in RUN_STAMP.findall(text) if stamp not in DATES]
    return found


def test_the_docs_carry_no_history() -> None:
    found = {
        doc.relative_to(ROOT).as_posix(): hits
        for doc in DOCS
        if (hits := _history(doc.read_text()))
    }
    assert found == {}


@pytest.mark.parametrize(
    ("text", "hits"),
    [
        ("the bound (issue 10) holds", ["issue 10"]),
        ("the launcher answers its issue 15", ["issue 15"]),
        ("as issues 10 and 15 ask", ["issues 10"]),
        ("see #14 for why", ["#14"]),
        ("measured at 3f9c2e1 on a quiet host", ["3f9c2e1"]),
        ("perf/reports/bench-20990101-120000/report.md", ["20990101-120000"]),
        ("the run of 2099-01-02 showed it", ["2099-01-02"]),
        ("triton-inference-server/server issue 7368, fixed by its pull request 7840", []),
        ("times within [2000-01-01, 2100-01-01); Ed25519 keys; ed25519; 1764400000", []),
        ("## Heading\n\n[link](operations.md#known-issue), colour #ffffff", []),
    ],
)
def test_the_history_check_can_fail(text: str, hits: list[str]) -> None:
    assert _history(text) == hits
