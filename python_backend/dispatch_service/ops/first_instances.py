"""A restart's model repository: the served one, each Python model of several instances cut
to its first instance.

A start of the embedded Triton is mostly its Python stubs (14 of them, each a Python
interpreter importing the library its model runs: about 10 CPU-seconds on the 2-core host
at load 10, docs/operations.md), and all of them set up at once, so a server restarted after
a crash is ready only when the last one is. Started on the first instance of each model (7
stubs: under half that CPU), it serves sooner; the launcher then loads the other instances
beside the serving one (`server.TritonServer.add_instances`).

Triton takes a model's config from its files when it starts (a config override needs the
repository API, which opens with the ports: a client would meanwhile be told the entry
points do not exist). So Triton reads this folder instead: every model folder a symbolic link
to the served repository's, but the cut models, which are folders of links with the config
file Triton reads (``--model-config-name``) written with one instance. `restore` puts a
model's own config back once its instances are added, so a later load from the files reads
the whole.

A restart also starts the models whose configs `deploy` and `rollback` set live (the scoring
versions, the routing of the router and of the in-process routing models) with those
configs, written here the same way (``live``; cut to the first instance where the model is
cut). Loaded back once the server was ready instead, each started new stubs before it said
ready again: three reloads in a row, 2-3 s on a loaded host.

The folder is private (0700, under the temporary directory) and removed with the server, or
by the next one when its launcher was killed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from dispatch_service.core.model_config import (
    ModelConfigError,
    config_from_dict,
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
    instance alone, and each model of ``live`` (model -> its config in Triton's JSON form)
    that config (cut to its first instance where it is one of ``models``); see the module
    docstring."""

    def __init__(
        self,
        source: Path,
        models: Iterable[str],
        profile: str,
        live: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.source = Path(source).resolve()
        remove_orphaned_copies(prefix=VIEW_PREFIX)  # a killed launcher's
        self.root = Path(tempfile.mkdtemp(prefix=f"{VIEW_PREFIX}{os.getpid()}-"))  # mode 0700
        self.models = tuple(models)
        self.profile = profile
        live = live or {}
        for entry in sorted(self.source.iterdir()):
            if entry.name in self.models or entry.name in live:
                self._cut(entry, live.get(entry.name))
            else:
                (self.root / entry.name).symlink_to(entry)

    def _config_paths(self, model: str) -> tuple[Path, Path]:
        """(the config file Triton reads for the model in the source, the same file here)."""
        chosen = profile_config_path(self.source / model, self.profile)
        return chosen, self.root / chosen.relative_to(self.source)

    def _cut(self, folder: Path, live: Mapping[str, Any] | None = None) -> None:
        """The model's folder of links with the config Triton reads written: ``live`` (or
        its own), cut to its first instance where it is one of `models`. A live config
        protobuf cannot read (a field this schema lacks) leaves the model its own: the
        launcher then loads the live one back once the server is ready, as before."""
        chosen, target = self._config_paths(folder.name)
        _link_all_but(folder, self.root / folder.name, chosen)
        config = None
        if live is not None:
            try:
                config = config_from_dict(live)
            except ModelConfigError:
                config = None
        if config is None:
            config = read_model_config(chosen)
        if folder.name in self.models:
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
