"""The Python-backend stubs of a running Triton, read from /proc: which run which model
version and file, how many a version runs, and which of those that vanished died."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dispatch_service.ops.host import STUB_NAME, proc_stat

__all__ = [
    "StubKey",
    "instance_count",
    "stub_deaths",
    "stub_model_files",
    "stub_models",
    "stub_versions",
    "zombie_stubs",
]

StubKey = tuple[str, str]  # (model, version folder)


def stub_models(parent_pid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> model of every Python-backend stub whose parent is ``parent_pid``."""
    return {pid: model for pid, (model, _) in stub_versions(parent_pid, proc).items()}


def stub_versions(parent_pid: int, proc: Path = Path("/proc")) -> dict[int, StubKey]:
    """pid -> (model, version) of every Python-backend stub whose parent is ``parent_pid``.

    A stub's command line is ``stub <repository>/<model>/<version>/model.py <region> ...``.
    """
    return {
        pid: (model_py.parent.parent.name, model_py.parent.name)
        for pid, model_py in stub_model_files(parent_pid, proc).items()
    }


def stub_model_files(parent_pid: int, proc: Path = Path("/proc")) -> dict[int, Path]:
    """pid -> the ``model.py`` each Python-backend stub of ``parent_pid`` runs (its folder is
    the version folder Triton loaded it from: a temporary one for files uploaded in a load
    request)."""
    found = {}
    for entry in proc.glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) < 2 or not argv[0].endswith(STUB_NAME.encode()):
            continue
        stat = proc_stat(entry)
        if stat is None or stat.state == "Z" or stat.parent != parent_pid:
            continue
        found[int(entry.name)] = Path(argv[1].decode(errors="replace"))
    return found


def zombie_stubs(parent_pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of ``parent_pid``'s dead stubs it has not reaped (state Z). A zombie has no
    command line left: it is known by its command name, the stub's cut to 15 bytes."""
    found = []
    for entry in proc.glob("[0-9]*"):
        stat = proc_stat(entry)
        if (
            stat is not None
            and stat.state == "Z"
            and stat.parent == parent_pid
            and STUB_NAME.startswith(stat.name)
            and stat.name
        ):
            found.append(int(entry.name))
    return sorted(found)


def instance_count(config: dict[str, Any]) -> int:
    """The stubs one version of a Python-backend model runs: its instance groups' counts
    (1 by default), a KIND_GPU group's once per listed GPU."""
    groups = config.get("instance_group") or [{}]
    total = 0
    for group in groups:
        count = int(group.get("count", 1) or 1)
        gpus = group.get("gpus") or []
        total += count * (len(gpus) if group.get("kind") == "KIND_GPU" and gpus else 1)
    return total


def stub_deaths(
    lost: dict[int, StubKey],
    alive: dict[int, StubKey],
    ready: set[StubKey],
    instances: dict[str, int],
    stale: frozenset[int] | set[int] = frozenset(),
) -> dict[str, list[int]]:
    """model -> pids of the ``lost`` stubs that died rather than being ended by Triton.

    Triton ends a version's stubs when it unloads that version (then it is no longer READY)
    and the old instances' stubs when it reloads a model with a new config (then the new
    stubs already serve the version: as many as ``instances`` asks). A lost stub whose
    version is READY with fewer ``alive`` stubs than its model's instance count died.

    ``stale`` stubs serve nothing: the old instances that Triton 2.51 never ends after one
    of their model's stubs died and the model was reloaded. Counted as serving, they hid
    the next death of a new instance (two deaths 3 s apart: the second was taken for a
    retirement and never healed). A lost stale stub is no death either.
    """
    deaths: dict[str, list[int]] = {}
    for pid, key in sorted(lost.items()):
        model = key[0]
        if key not in ready or pid in stale:
            continue  # unloaded (or unloading): Triton ended it
        serving = sum(1 for other, k in alive.items() if k == key and other not in stale)
        if serving >= instances.get(model, 1):
            continue  # replaced by a reload's new instances
        deaths.setdefault(model, []).append(pid)
    return deaths
