"""A restart's model repository: the served one, each Python model of several instances cut
to its first instance.

A start of the embedded Triton is mostly its Python stubs (14 of them, each a Python
interpreter importing the library its model runs: about 8 CPU-seconds on the 2-core host,
docs/operations.md), and all of them set up at once, so a server restarted after a crash is
ready only when the last one is. Started on the first instance of each model (7 stubs: about
half that CPU), it serves sooner; the launcher then loads the other instances beside the
serving one (`server.TritonServer.add_instances`).

Triton takes a model's config from its files when it starts (a config override needs the
repository API, which opens with the ports: a client would meanwhile be told the entry
points do not exist). So Triton reads this folder instead: every model folder a symbolic link
to the served repository's, but the cut models, which are folders of links with the config
file Triton reads (``--model-config-name``) written with one instance. `restore` puts a
model's own config back once its instances are added, so a later load from the files reads
the whole. The folder is private (0700, under the temporary directory) and removed with the
server, or by the next one when its launcher was killed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from dispatch_service.core.model_config import (
    profile_config_path,
    read_model_config,
    write_model_config,
)
from dispatch_service.ops.repository_copy import remove_orphaned_copies

__all__ = ["VIEW_PREFIX", "FirstInstanceRepository"]

# dispatch-first-instances-<launcher pid>-<random>: one whose launcher is gone is removed.
VIEW_PREFIX: Final = "dispatch-first-instances-"


class FirstInstanceRepository:
    """``source`` seen through a private folder where each of ``models`` has its first
    instance alone (see the module docstring)."""

    def __init__(self, source: Path, models: Iterable[str], profile: str) -> None:
        self.source = Path(source).resolve()
        remove_orphaned_copies(prefix=VIEW_PREFIX)  # a killed launcher's
        self.root = Path(tempfile.mkdtemp(prefix=f"{VIEW_PREFIX}{os.getpid()}-"))  # mode 0700
        self.models = tuple(models)
        self.profile = profile
        for entry in sorted(self.source.iterdir()):
            if entry.name in self.models:
                self._cut(entry)
            else:
                (self.root / entry.name).symlink_to(entry)

    def _config_paths(self, model: str) -> tuple[Path, Path]:
        """(the config file Triton reads for the model in the source, the same file here)."""
        chosen = profile_config_path(self.source / model, self.profile)
        return chosen, self.root / chosen.relative_to(self.source)

    def _cut(self, folder: Path) -> None:
        chosen, target = self._config_paths(folder.name)
        _link_all_but(folder, self.root / folder.name, chosen)
        config = read_model_config(chosen)
        del config.instance_group[1:]
        if config.instance_group:
            config.instance_group[0].count = 1
        write_model_config(target, config)

    def restore(self, model: str) -> None:
        """Give ``model`` its own config again (a link to the source's file)."""
        chosen, target = self._config_paths(model)
        target.unlink(missing_ok=True)
        target.symlink_to(chosen)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _link_all_but(source: Path, target: Path, skip: Path) -> None:
    """``target`` made a folder of links to ``source``'s entries, down to ``skip`` (left
    out): only the folders on the way to it are made, everything else is linked."""
    target.mkdir()
    for entry in sorted(source.iterdir()):
        if entry == skip:
            continue
        if skip.is_relative_to(entry):
            _link_all_but(entry, target / entry.name, skip)
        else:
            (target / entry.name).symlink_to(entry)
