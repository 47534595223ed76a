"""Which models of a repository may load, decided from their signatures before Triton starts.

For each model (a folder with a config) the config the profile selects is read
(``configs/<profile>.pbtxt``, else ``config.pbtxt``) to find the versions it would serve
(``version_policy``: latest N -- the default is latest 1 --, all, or specific), and every
version folder is verified (`signing.verify_version`). Then:

- every served version verifies -> the model loads at start (``--load-model``). An
  ensemble's version folders are not checked: Triton reads nothing from them (the config is
  the whole ensemble; it holds a ``.gitkeep`` at most), and an empty folder of any model has
  nothing to sign;
- some served versions verify -> the model loads right after start with a config override
  whose ``version_policy`` names only the verified ones (``restricted``); the refused ones
  never load. Nothing else is substituted: a bad "latest" version does not bring back an
  older one;
- no served version verifies -> the model is refused;
- a model that routes over a restricted model (dispatch_router; dispatch_fused and
  dispatch_priority, by their ``scoring_model``) loads after start too, with the verified
  versions as its ``scoring_versions`` parameter: a refused canary is then out of every
  entry point's routing (until a fleet revision names the versions served);
- an ensemble loads only when every step's model loads (Triton loads an ensemble's steps
  with it, from the repository's files, so an ensemble over a refused model would bring it
  back) and a step that pins a version finds it verified. An ensemble over a restricted
  model loads after it (``deferred``) so it finds the override in place. A Python model
  that calls others through BLS declares no dependency: a call to a refused model gets an
  error response at run time;
- a Python model that reads another model's files itself (`dispatch_fused` runs its scoring
  versions' model.onnx in process) depends on its stable version like an ensemble on a
  pinned step: it loads only when that one verifies. Its other versions (the canary) need
  not: the model verifies every folder again in its own `initialize` (the launcher passes
  the trusted keys in the server's environment) and a refused canary is out of its routing,
  as it is out of the router's once Triton does not serve it.

One line per refused version and per refused model goes to the log (`LoadPlan.log_lines`).

After start, every load the launcher or `dispatch-admin` sends (a stub's reload, a restart's
live configs, a deploy's versions, the GPU monitor's new router parameters) is checked
first with `check_load`: the versions the config would serve are verified again from the
files as they are now, and a refused version is left out or the load is not sent
(`LoadCheck`); each refusal is logged with the digest of what was found
(`refusal_fields`). The launcher verifies and Triton reads its private copy of the
repository (`repository_copy.RepositoryCopy`, behind `LoadVerifier`): what is verified is
what loads, even when a file of the repository changes right after its check.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dispatch_service.core.model_config import CONFIG_NAME, profile_config_path, read_config_dict
from dispatch_service.core.repository_layout import ModelLayout
from dispatch_service.core.settings import parameters_from_model_config
from dispatch_service.core.signing import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    Outcome,
    SigningError,
    TrustedKeys,
    Verification,
    artifact_files,
    file_digest,
    verify_version,
)
from dispatch_service.ops.stubs import instance_count
from dispatch_service.routing.settings import (
    ROUTER_MODEL_NAME,
    SCORING_MODEL_NAME,
    FusedSettings,
)

__all__ = [
    "CONFIG_NAME",
    "LoadCheck",
    "LoadPlan",
    "LoadVerifier",
    "ModelEntry",
    "VerifiedCopy",
    "check_load",
    "first_instance_groups",
    "folder_digest",
    "load_failures",
    "plan_load",
    "read_config",
    "read_model",
    "refusal_fields",
    "repository_models",
    "served_versions",
]


@dataclass(frozen=True)
class ModelEntry:
    """One model folder as the repository describes it."""

    name: str
    config: dict[str, Any]  # Triton's JSON form of the config the profile selects
    versions: tuple[int, ...]  # numeric version folders present, ascending
    served: tuple[int, ...]  # those the version policy would serve
    # ensemble steps and versions a model reads itself: (model, version; -1 = latest)
    steps: tuple[tuple[str, int], ...]

    @property
    def is_ensemble(self) -> bool:
        return self.config.get("platform") == "ensemble"


def read_config(model_dir: Path, profile: str = "cpu") -> dict[str, Any]:
    """The model's config file as Triton's JSON form (the schema of Triton's own protobuf)."""
    config = read_config_dict(profile_config_path(model_dir, profile))
    config.setdefault("name", model_dir.name)
    return config


def served_versions(config: Mapping[str, Any], versions: Sequence[int]) -> tuple[int, ...]:
    """What Triton would serve of ``versions`` under the config's version policy."""
    policy = config.get("version_policy") or {"latest": {"num_versions": 1}}
    present = sorted(versions)
    if "all" in policy:
        return tuple(present)
    if "specific" in policy:
        wanted = {int(v) for v in policy["specific"].get("versions", [])}
        return tuple(v for v in present if v in wanted)
    count = int(policy.get("latest", {}).get("num_versions", 1))
    return tuple(present[-count:]) if count > 0 else ()


def read_model(model_dir: Path, profile: str = "cpu") -> ModelEntry:
    config = read_config(model_dir, profile)
    versions = ModelLayout(model_dir).versions()
    steps = tuple(
        (str(step["model_name"]), int(step.get("model_version", -1)))
        for step in config.get("ensemble_scheduling", {}).get("step", [])
    )
    return ModelEntry(
        model_dir.name, config, versions, served_versions(config, versions), steps + _reads(config)
    )


def _scoring_model_of(config: Mapping[str, Any]) -> str | None:
    """The model whose versions a routing model routes over: dispatch_router's, or the
    ``scoring_model`` of an in-process one (dispatch_fused, dispatch_priority); None for
    another model."""
    parameters = parameters_from_model_config(config)
    if "scoring_model" in parameters:
        return parameters["scoring_model"]
    return SCORING_MODEL_NAME if config.get("name") == ROUTER_MODEL_NAME else None


def _reads(config: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The (model, version) folder a Python model cannot run without: its stable version."""
    parameters = parameters_from_model_config(config)
    if "scoring_model" not in parameters:
        return ()
    settings = FusedSettings.from_parameters(parameters)
    return ((settings.scoring_model, settings.routing.stable_version),)


def repository_models(repository: Path, profile: str = "cpu") -> dict[str, ModelEntry]:
    """Every model folder of the repository that has a config, by name."""
    return {
        path.name: read_model(path, profile)
        for path in sorted(repository.iterdir())
        if path.is_dir() and (path / CONFIG_NAME).is_file()
    }


@dataclass(frozen=True)
class LoadPlan:
    """What the launcher loads, in order: ``startup``, then ``restricted``, then ``deferred``."""

    startup: tuple[str, ...]
    restricted: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    deferred: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)  # model -> why it does not load
    verifications: tuple[Verification, ...] = ()
    configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # models that route over a restricted scoring model -> the versions it serves
    scoring_versions: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # versions left out because they failed to load at an earlier start -> the cause
    failed: Mapping[tuple[str, int], str] = field(default_factory=dict)
    # A restart's plan (`plan_load(first_instances=True)`): the Python models of several
    # instances, which load with their first instance alone (`first_instances`); the
    # others follow once the server is ready (`server.TritonServer.add_instances`).
    first_instance: tuple[str, ...] = ()

    @property
    def refused_versions(self) -> tuple[Verification, ...]:
        return tuple(v for v in self.verifications if not v.accepted)

    def override_config(self, model: str) -> dict[str, Any]:
        """The config a restricted model loads with: its own, serving the verified versions."""
        versions = sorted(self.restricted[model])
        config = {**self.configs[model], "version_policy": {"specific": {"versions": versions}}}
        if model in self.scoring_versions:
            parameters = dict(config.get("parameters") or {})
            served = ",".join(str(v) for v in self.scoring_versions[model])
            parameters["scoring_versions"] = {"string_value": served}
            config["parameters"] = parameters
        return config

    def load_config(self, model: str) -> dict[str, Any]:
        """The config a model loading after start loads with: a restricted one's override,
        cut to its first instance in a restart's plan, else its own."""
        if model in self.restricted:
            config = self.override_config(model)
        else:
            config = dict(self.configs[model])
        if model in self.first_instance:
            config["instance_group"] = first_instance_groups(config)
        return config

    def log_lines(self) -> list[str]:
        """One JSON line per refused version, per restricted model and per refused model."""
        lines = [
            _line(
                "model_version_refused",
                model=v.model,
                version=v.version,
                reason=v.reason,
                check=v.outcome.value,
            )
            for v in self.refused_versions
        ]
        lines += [
            _line("model_version_failed", model=model, version=version, cause=cause)
            for (model, version), cause in sorted(self.failed.items())
        ]
        lines += [
            _line("model_restricted", model=name, versions=list(versions))
            for name, versions in sorted(self.restricted.items())
        ]
        lines += [
            _line("model_refused", model=name, reason=reason)
            for name, reason in sorted(self.refused.items())
        ]
        return lines


def _line(event: str, **fields: Any) -> str:
    return json.dumps({"event": event, **fields}, sort_keys=True)


def first_instance_groups(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The instance groups of ``config`` cut to its first instance (the first group's,
    which the repository's configs give rate-limiter priority 1: the warm one)."""
    groups = config.get("instance_group") or [{}]
    return [{**groups[0], "count": 1}]


def _several_cpu_stubs(config: Mapping[str, Any]) -> bool:
    """Whether a model runs Python-backend stubs on CPU, more than one."""
    groups = config.get("instance_group") or [{}]
    return (
        config.get("backend") == "python"
        and instance_count(dict(config)) > 1
        and all(group.get("kind", "KIND_CPU") == "KIND_CPU" for group in groups)
    )


def _closure(models: Mapping[str, ModelEntry], names: Iterable[str]) -> list[str]:
    """``names`` plus every model their ensemble steps reach."""
    seen: list[str] = []
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.append(name)
        entry = models.get(name)
        if entry is not None:
            pending.extend(step for step, _ in entry.steps)
    return sorted(seen)


def plan_load(
    repository: Path,
    trusted: TrustedKeys | None,
    profile: str = "cpu",
    requested: Sequence[str] = ("*",),
    *,
    failed: Mapping[tuple[str, int], str] | None = None,
    verdicts: Mapping[tuple[str, int], Verification] | None = None,
    first_instances: bool = False,
) -> LoadPlan:
    """Verify every version folder of the requested models (and what their ensembles use).

    ``trusted`` None: nothing is verified (every version is accepted). ``failed``: versions
    that failed to load in an earlier start (model, version -> cause), left out like a
    refused one, so that a broken canary does not stop the server (`load_failures`).
    ``verdicts``: the verdicts a `RepositoryCopy` reached on what it read, used instead of
    reading the folders again (``repository`` is then the copy). ``first_instances``: a
    restart's plan, ready on half the stubs: each Python model of several CPU instances
    loads with its first instance alone (`LoadPlan.first_instance`; at start from
    `first_instances.FirstInstanceRepository`, a restricted one after start with its
    override cut the same way)."""
    failed = dict(failed or {})
    models = repository_models(repository, profile)
    names = list(models) if "*" in requested else _closure(models, requested)
    verifications: list[Verification] = []
    good: dict[str, tuple[int, ...]] = {}
    refused: dict[str, str] = {}
    partial: set[str] = set()
    for name in names:
        entry = models.get(name)
        if entry is None:
            refused[name] = "no such model in the repository"
            continue
        if trusted is None:
            accepted = set(entry.versions)
        else:
            results = [
                _verify(repository, entry, version, trusted, verdicts) for version in entry.versions
            ]
            verifications += results
            accepted = {r.version for r in results if r.accepted}
        broken = {v for (model, v) in failed if model == name}
        serving = tuple(v for v in entry.served if v in accepted - broken)
        if entry.served and not serving:
            refused[name] = (
                "no version left to serve: "
                + "; ".join(f"version {v} failed to load ({failed[(name, v)]})" for v in broken)
                if broken and not (set(entry.served) & accepted) - broken
                else "no verified version to serve"
            )
        else:
            good[name] = serving
            if serving != entry.served:
                partial.add(name)
    # Ensembles: refused when a step's model is refused or its pinned version is not served;
    # repeated until nothing changes (each pass refuses at least one model or stops).
    for _ in range(len(names) + 1):
        newly = {
            name: reason
            for name in good
            if (reason := _step_problem(models[name], good)) is not None
        }
        if not newly:
            break
        for name, reason in newly.items():
            refused[name] = reason
            good.pop(name, None)
            partial.discard(name)
    # A model that routes over a restricted scoring model loads with the verified versions as
    # its scoring_versions, so that both entry points route over what is actually served.
    routed_over: dict[str, tuple[int, ...]] = {}
    for name in sorted(good):
        scoring = _scoring_model_of(models[name].config)
        if scoring in partial and name not in partial:
            routed_over[name] = good[scoring]
            partial.add(name)
    deferred_set = {
        name
        for name in good
        if name not in partial and (set(_closure(models, [name])) - {name}) & partial
    }
    startup = tuple(sorted(set(good) - partial - deferred_set))
    first = {n for n in good if _several_cpu_stubs(models[n].config)} if first_instances else ()
    deferred = _dependency_order(models, deferred_set)
    return LoadPlan(
        startup=startup,
        restricted={name: good[name] for name in sorted(partial)},
        scoring_versions=routed_over,
        deferred=deferred,
        refused=refused,
        verifications=tuple(verifications),
        configs={name: models[name].config for name in names if name in models},
        failed=failed,
        first_instance=tuple(sorted(first)),
    )


def _verify(
    repository: Path,
    entry: ModelEntry,
    version: int,
    trusted: TrustedKeys,
    verdicts: Mapping[tuple[str, int], Verification] | None = None,
) -> Verification:
    if entry.is_ensemble:
        return Verification(
            entry.name, version, Outcome.NO_ARTIFACTS, "ensemble: its version folder is not read"
        )
    if verdicts is not None:
        found = verdicts.get((entry.name, version))
        if found is not None:
            return found
        return Verification(entry.name, version, Outcome.MISSING_MANIFEST, "not read")
    return verify_version(repository / entry.name / str(version), trusted)


def _step_problem(entry: ModelEntry, good: Mapping[str, tuple[int, ...]]) -> str | None:
    for step, version in entry.steps:
        if step not in good:
            return f"depends on refused model {step}"
        if version > 0 and version not in good[step]:
            return f"depends on {step} version {version}, which does not load"
    return None


def _dependency_order(models: Mapping[str, ModelEntry], names: set[str]) -> tuple[str, ...]:
    """``names`` with every model after the models of ``names`` its steps use."""
    ordered: list[str] = []
    remaining = sorted(names)
    for _ in range(len(remaining) + 1):
        if not remaining:
            break
        ready = [
            n for n in remaining if not {s for s, _ in models[n].steps} & (set(remaining) - {n})
        ]
        ordered += ready or remaining  # a cycle cannot be ordered: keep the rest as it is
        remaining = [n for n in remaining if n not in ordered]
    return tuple(ordered)


_NAMED_FILE = re.compile(r"file (\S.*)$")


def folder_digest(files: Mapping[str, str]) -> str:
    """SHA-256 over a folder's files' paths and SHA-256 digests, as a manifest lists them."""
    return hashlib.sha256(json.dumps(dict(files), sort_keys=True).encode()).hexdigest()


def refusal_fields(
    repository: Path, verification: Verification, files: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What a refusal's log line says of the files found: the folder's digest
    (`folder_digest`) and, where the verdict names one file, that file's SHA-256. ``files``:
    the digests of what was read (a `RepositoryCopy`'s), else the folder is read now."""
    folder = repository / verification.model / str(verification.version)
    fields: dict[str, Any] = {
        "model": verification.model,
        "version": verification.version,
        "check": verification.outcome.value,
        "reason": verification.reason,
    }
    if files is None:
        try:
            files = {name: file_digest(folder / name) for name in artifact_files(folder)}
        except (OSError, SigningError):
            files = {}
    files = {n: d for n, d in files.items() if n not in (MANIFEST_NAME, SIGNATURE_NAME)}
    fields["folder_sha256"] = folder_digest(files)
    named = _NAMED_FILE.search(verification.reason)
    if named and named.group(1) in files:
        fields["file"] = named.group(1)
        fields["file_sha256"] = files[named.group(1)]
    return fields


@dataclass(frozen=True)
class LoadCheck:
    """The versions a load with ``config`` would bring up, checked against the files now."""

    model: str
    config: Mapping[str, Any]
    served: tuple[int, ...]  # what the config's version policy serves of the folders present
    refused: tuple[Verification, ...] = ()

    @property
    def accepted(self) -> tuple[int, ...]:
        refused = {v.version for v in self.refused}
        return tuple(v for v in self.served if v not in refused)

    @property
    def clean(self) -> bool:
        return not self.refused

    def restricted_config(self) -> dict[str, Any] | None:
        """``config`` serving only the verified versions; None when none verifies."""
        if self.clean:
            return dict(self.config)
        if not self.accepted:
            return None
        return {**self.config, "version_policy": {"specific": {"versions": list(self.accepted)}}}


def check_load(
    repository: Path, trusted: TrustedKeys, model: str, config: Mapping[str, Any]
) -> LoadCheck:
    """Verify every version folder a load of ``model`` with ``config`` would read.

    Triton reads a version's folder again whenever it loads the model and the folder
    changed, so every served version is checked, not only a new one. An ensemble reads no
    version folder (the config is the whole model)."""
    folder = repository / model
    versions = (
        sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
        if folder.is_dir()
        else []
    )
    served = served_versions(config, versions)
    if config.get("platform") == "ensemble":
        return LoadCheck(model, config, served)
    refused = tuple(
        verdict
        for version in served
        if not (verdict := verify_version(folder / str(version), trusted)).accepted
    )
    return LoadCheck(model, config, served, refused)


class VerifiedCopy(Protocol):
    """What Triton reads on a verified server (`repository_copy.RepositoryCopy`)."""

    @property
    def repository(self) -> Path: ...

    def check(self, model: str, config: Mapping[str, Any]) -> LoadCheck: ...

    def files_read(self, model: str, version: int) -> dict[str, str]: ...


@dataclass(frozen=True)
class LoadVerifier:
    """The repository and keys of a verified server: `check_load` for every load after start.

    With ``copy`` (the launcher's), each check refreshes the copy Triton reads from what it
    reads and judges, so the load that follows reads exactly what was verified."""

    repository: Path
    trusted: TrustedKeys
    copy: VerifiedCopy | None = None

    @property
    def served_repository(self) -> Path:
        """The folder Triton reads: the launcher's copy, else the repository itself."""
        return self.repository if self.copy is None else self.copy.repository

    def check(self, model: str, config: Mapping[str, Any]) -> LoadCheck:
        if self.copy is not None:
            return self.copy.check(model, config)
        return check_load(self.repository, self.trusted, model, config)

    def refusal_fields(self, verdict: Verification) -> dict[str, Any]:
        """`refusal_fields` of the files the verdict was reached on."""
        files = None if self.copy is None else self.copy.files_read(verdict.model, verdict.version)
        return refusal_fields(self.repository, verdict, files)

    def refusal_lines(self, check: LoadCheck, event: str = "model_load_refused") -> list[str]:
        """One JSON line per refused version, with the digest of the files found."""
        return [_line(event, **self.refusal_fields(verdict)) for verdict in check.refused]


# Triton's line for a version that did not load, e.g.
# E1203 ... model_lifecycle.cc:642] "failed to load 'dispatch_model' version 2: Internal: ..."
_LOAD_FAILURE = re.compile(
    r"failed to load '(?P<model>[^']+)' version (?P<version>\d+): (?P<cause>.*?)(?:\\n|\"$|$)",
    re.M,
)


def load_failures(log_text: str) -> dict[tuple[str, int], str]:
    """(model, version) -> the first line of its cause, for every version Triton's log says
    failed to load (the last cause when one failed more than once)."""
    return {
        (m["model"], int(m["version"])): m["cause"].strip()[:500]
        for m in _LOAD_FAILURE.finditer(log_text)
    }
