"""What a `server.TritonServer` loads and when: the verified load plan, the loads after
Triton started, a restart's left-out instances (`first_instances`). A mixin of
`TritonServer`, kept apart for the module's size."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from dispatch_service.core.signing import TrustedKeys
from dispatch_service.ops.child_process import ServerError
from dispatch_service.ops.first_instances import FirstInstanceRepository
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    ready_versions,
)
from dispatch_service.ops.repository_copy import RepositoryCopy
from dispatch_service.ops.stubs import instance_count
from dispatch_service.ops.verified_load import LoadPlan, LoadVerifier, plan_load

__all__ = ["PlannedLoads", "failures_text"]

logger = logging.getLogger("dispatch_service.ops.server")


class LoadOptions(Protocol):
    """What the plan reads of `server.ServerOptions`."""

    model_repository: Path
    profile: str
    model_control: str
    load_models: Sequence[str]
    admin_key: str | None
    trusted_keys: Path | None


class PlannedLoads:
    """The load plan's part of `server.TritonServer` (which sets these attributes)."""

    options: LoadOptions
    load_plan: LoadPlan | None
    repository_copy: RepositoryCopy | None
    first_instances: FirstInstanceRepository | None
    process: subprocess.Popen[bytes] | None

    @property
    def http_url(self) -> str:
        raise NotImplementedError

    @property
    def source_repository(self) -> Path:
        raise NotImplementedError

    def stop(self, timeout_s: float = 20.0, *, graceful: bool = True) -> None:
        raise NotImplementedError

    @property
    def instances_pending(self) -> tuple[str, ...]:
        """Models serving on their first instance alone, their others still to load."""
        plan = self.load_plan
        return () if plan is None or self.process is None else plan.first_instance

    def add_instances(self, timeout_s: float = 60.0) -> list[str]:
        """Load the instances `start_first_instances` left out of the next model pending
        (one model a call: the supervisor heals stubs between two), with the config it
        serves now (a restart's live routing kept) and the instance groups of its file:
        Triton 2.51 adds the new instances beside the serving one. The event line
        (``instances_added``, or ``instances_not_added`` with the error: tried again at the
        next call)."""
        plan = self.load_plan
        if plan is None or not plan.first_instance:
            return []
        name, *rest = plan.first_instance
        try:
            served = model_config(self.http_url, name)
            groups = plan.configs[name].get("instance_group") or [{}]
            first = {**(served.get("instance_group") or [{}])[0]}
            first["count"] = groups[0].get("count", 1)
            config = {**served, "instance_group": [first, *groups[1:]]}
            key = self.options.admin_key
            load_model(self.http_url, name, config, admin_key=key, timeout_s=timeout_s)
        except ModelControlError as exc:
            return [_line("instances_not_added", model=name, error=str(exc)[:500])]
        if self.first_instances is not None:
            self.first_instances.restore(name)  # a load from the files reads the whole
        self.load_plan = dataclasses.replace(plan, first_instance=tuple(rest))
        return [_line("instances_added", model=name, instances=instance_count(config))]

    def plan_verified_load(self, *, first_instances: bool = False) -> list[str]:
        """Verify the repository's signatures (with trusted keys) and decide what loads
        (``first_instances``: `plan_load`'s; an unverified server then has a plan too).

        Returns the log lines: one per refused version and per refused or restricted model,
        or one warning that nothing is verified. Raises SigningError for an unusable key
        directory (missing, holding a bad key, or no key at all).
        """
        opts = self.options
        first_instances = first_instances and opts.model_control == "explicit"
        if opts.trusted_keys is None:
            self.load_plan = (
                plan_load(
                    opts.model_repository,
                    None,
                    opts.profile,
                    opts.load_models,
                    first_instances=True,
                )
                if first_instances
                else None
            )
            line = json.dumps(
                {
                    "event": "signatures_not_verified",
                    "reason": "no trusted keys configured (--trusted-keys): models load unverified",
                }
            )
            logger.warning(line)
            return [line]
        trusted = TrustedKeys.required_in(opts.trusted_keys)
        if self.repository_copy is None:
            self.repository_copy = RepositoryCopy(opts.model_repository, trusted)
        copy = self.repository_copy
        copy.trusted = trusted
        copy.prepare()
        plan = plan_load(
            copy.repository,
            trusted,
            opts.profile,
            opts.load_models,
            verdicts=copy.verdicts,
            first_instances=first_instances,
        )
        self.load_plan = plan
        lines = plan.log_lines()
        for line in lines:
            logger.warning(line)
        summary = json.dumps(
            {
                "event": "signatures_verified",
                "trusted_keys": sorted(trusted.keys),
                "load": list(plan.startup),
                "restricted": {name: list(v) for name, v in plan.restricted.items()},
                "deferred": list(plan.deferred),
                "refused": sorted(plan.refused),
            },
            sort_keys=True,
        )
        logger.info(summary)
        return [*lines, summary]

    def plan_without(self, failed: dict[tuple[str, int], str]) -> list[str]:
        """Set the load plan to leave out the ``failed`` versions; the lines to log. Raises
        ServerError naming them and their causes when that leaves a model out."""
        opts = self.options
        copy = self.repository_copy
        trusted = None if copy is None else copy.trusted
        verdicts = None if copy is None else copy.verdicts
        repository, profile, requested = self.source_repository, opts.profile, opts.load_models
        before = plan_load(repository, trusted, profile, requested, verdicts=verdicts)
        first = self.load_plan is not None and bool(self.load_plan.first_instance)
        plan = plan_load(
            repository,
            trusted,
            profile,
            requested,
            failed=failed,
            verdicts=verdicts,
            first_instances=first,
        )
        lost = {name: why for name, why in plan.refused.items() if name not in before.refused}
        if lost:
            raise ServerError(
                f"cannot start: {failures_text(failed)}; without it: "
                + "; ".join(f"{name}: {why}" for name, why in sorted(lost.items()))
            )
        self.load_plan = plan
        return [line for line in plan.log_lines() if '"model_version_failed"' in line]

    def load_verifier(self) -> LoadVerifier | None:
        """What every load after start is checked with on a verified server (the supervisor's
        reloads, a restart's live configs); None when this server does not verify."""
        copy = self.repository_copy
        if copy is None:
            return None
        return LoadVerifier(self.options.model_repository, copy.trusted, copy)

    def load_after_start(self) -> None:
        """Load what the plan defers: restricted models with their override, all at once,
        then their dependents."""
        plan = self.load_plan
        if plan is None:
            return
        key = self.options.admin_key
        try:
            # At once: restricted models with their override (cut to their first instance
            # in a restart's plan).
            after_start = sorted(plan.restricted)
            if after_start:
                with ThreadPoolExecutor(len(after_start), thread_name_prefix="load") as pool:
                    loads = [
                        pool.submit(load_model, self.http_url, n, plan.load_config(n), key)
                        for n in after_start
                    ]
                    for load in loads:
                        load.result()
            for name in plan.deferred:
                load_model(self.http_url, name, admin_key=key)
            # Loading an ensemble re-reads its steps' folders; fail closed if that brought
            # back a version the plan refused.
            for name, versions in plan.restricted.items():
                serving = ready_versions(self.http_url, name, admin_key=key)
                if serving != tuple(sorted(versions)):
                    raise ModelControlError(
                        f"{name} serves versions {list(serving)}, verified {list(versions)}"
                    )
        except ModelControlError as exc:
            self.stop()
            raise ServerError(f"loading verified models after start failed: {exc}") from None


def _line(event: str, **fields: object) -> str:
    return json.dumps({"event": event, **fields}, sort_keys=True)


def failures_text(failed: dict[tuple[str, int], str]) -> str:
    """Versions that failed to load and their causes, in one line."""
    return "; ".join(
        f"{model} version {version} failed to load ({cause})"
        for (model, version), cause in sorted(failed.items())
    )
