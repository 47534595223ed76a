"""Every command and repository path README.md and docs/ name exists.

Commands are read from code blocks and `code spans`: `make <target>` (a Makefile target),
`python -m <module>` (an importable module), console scripts (`dispatch-admin <command>`,
`dispatch-client`; declared in a pyproject.toml). Paths are the code-span or code-block
words that start at a top-level entry of the repository or at a model folder, and every
relative Markdown link; `<placeholder>` and `*` match any name (at least one must exist).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MODELS = ROOT / "model_repository"
TOP_LEVEL = {entry.name for entry in ROOT.iterdir() if not entry.name.startswith(".")}
# Run outputs (git-ignored): a documented `perf/reports/<kind>-<stamp>/` needs only its folder.
GENERATED = ("perf/reports/",)
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
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


def _path_exists(word: str, base: Path) -> bool:
    word = word.rstrip("/.,:)")
    if word.startswith(GENERATED) and "<" in word:
        return (base / word.split("<", 1)[0]).parent.is_dir()
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
        ("model_repository/<model>/config.pbtxt", True),
        ("dispatch_model/config.pbtxt", True),
        ("dispatch_model/nothing.pbtxt", False),
    ],
)
def test_the_path_check_can_fail(word: str, exists: bool) -> None:
    base = _repository_path(word)
    assert base is not None
    assert _path_exists(word, base) is exists
