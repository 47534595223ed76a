"""The topk_resolver step: scored pairs in, each order's Top-K riders and a conflict-free
assignment out.

Reads and checks the resolver's tensors (or reuses the window the encoder validated), resolves
stack-aware where riders can carry several new orders (`pipeline.stacking`: the stacked
pairs re-scored by the version that scored each order), and resolves the windows of one
`execute` where nothing stacks together (`domain.resolver.resolve_many`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    CANDIDATE_RIDER_INDEX,
    ORDER_FIELDS,
    ORDER_MODEL_VERSION,
    PAIR_FEATURES,
    PAIR_OBJECTIVES,
    RESOLVER_INPUTS,
)
from dispatch_service.core.batches import isolated_outcomes
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.settings import load_settings, reject_unknown
from dispatch_service.domain.resolver import (
    Resolution,
    ResolverWindow,
    WindowTensors,
    checked_together,
    resolve_many,
)
from dispatch_service.domain.resolver_inputs import checked_order_ids
from dispatch_service.domain.scoring import ResolverSettings
from dispatch_service.domain.window import DispatchWindow, parse_objective_weights
from dispatch_service.domain.window_wire import (
    order_created_at_from_wire,
    rider_counts_from_wire,
)
from dispatch_service.pipeline.stacking import (
    Rescorer,
    StackedResolution,
    StackingSettings,
    Unstacked,
    can_stack,
    routed_rescorer,
    stage_checked,
    stage_stack_aware,
)
from dispatch_service.pipeline.step_io import Arrays, required
from dispatch_service.routing.engine import SyncScorer, check_pair_features

__all__ = ["ResolverItem", "TopKResolverStep"]


# One window for the resolver: its tensors, the window the encoder validated (or None) and
# the scorer that re-scores stacked pairs (or None).
ResolverItem = tuple[Mapping[str, NDArray[Any] | None], DispatchWindow | None, SyncScorer | None]
ResolvedOrUnstacked = Resolution | Unstacked


@dataclass(frozen=True)
class TopKResolverStep:
    settings: ResolverSettings = field(default_factory=ResolverSettings)
    stacking: StackingSettings = field(default_factory=StackingSettings)
    input_names: ClassVar[tuple[str, ...]] = tuple(spec.name for spec in RESOLVER_INPUTS)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> TopKResolverStep:
        reject_unknown(parameters, ResolverSettings, StackingSettings)
        return cls(
            settings=load_settings(ResolverSettings, parameters),
            stacking=load_settings(StackingSettings, parameters),
        )

    def run_stack_aware(
        self,
        inputs: Mapping[str, NDArray[Any] | None],
        rescore: Rescorer,
        window: DispatchWindow | None = None,
    ) -> StackedResolution:
        """`run` with stacked orders re-scored by ``rescore`` (`pipeline.stacking`); needs
        the encoder's PAIR_FEATURES and, without ``window``, ORDER_FIELDS (created_at).
        ``window``: as in `run`."""
        staged = self._stage_stack_aware(inputs, rescore, window)
        return staged.resolved() if isinstance(staged, Unstacked) else staged

    def _stage_stack_aware(
        self,
        inputs: Mapping[str, NDArray[Any] | None],
        rescore: Rescorer,
        window: DispatchWindow | None,
    ) -> StackedResolution | Unstacked:
        objectives = required(inputs, PAIR_OBJECTIVES.name)
        candidates = required(inputs, CANDIDATE_RIDER_INDEX.name)
        rider_ids = required(inputs, "RIDER_IDS")
        load, capacity = _rider_counts(inputs, window)
        created_at = _created_at(inputs, window, candidates)
        return stage_stack_aware(
            objectives=objectives,
            features=required(inputs, PAIR_FEATURES.name),
            candidate_rider_index=candidates,
            created_at=created_at,
            rider_ids=rider_ids,
            rider_load=load,
            rider_capacity=capacity,
            weights=parse_objective_weights(inputs.get("OBJECTIVE_WEIGHTS")),
            rescore=rescore,
            settings=self.settings,
            order_ids=_order_ids(inputs, window),
        )

    def run(
        self,
        inputs: Mapping[str, NDArray[Any] | None],
        window: DispatchWindow | None = None,
        score: SyncScorer | None = None,
    ) -> Arrays:
        """One window's objectives and riders -> the v2 answer (`RESOLVER_OUTPUTS`).

        ``window``: the window the encoder validated from these same ``inputs``
        (`FeatureEncoderStep.encode`, dispatch_fused); its rider load and capacity are the
        INT32 columns `rider_counts_from_wire` would unpack and check again.

        ``score`` (version, features) -> objectives: the model the orders were scored with.
        With it, ``stack_aware`` on, the request's PAIR_FEATURES and the orders' creation
        times (ORDER_FIELDS, or ``window``), the resolution is stack-aware: each order's
        pairs re-scored by its ORDER_MODEL_VERSION (required then). Without them, every
        pair keeps its stand-alone objectives.
        """
        staged = self._stage(inputs, window, score)
        resolution = (
            staged.window.resolution(staged.checked) if isinstance(staged, Unstacked) else staged
        )
        return resolution.as_wire_tensors()

    def run_batch(self, batch: Sequence[ResolverItem]) -> list[Arrays | Exception]:
        """`run` of several windows (inputs, window, score each; one Triton `execute` of
        dispatch_fused): each is checked, and resolved stack-aware where its riders can
        stack, on its own; the windows where nothing stacks are resolved together
        (`resolve_many`), each answer byte for byte its own. A window that fails gets its
        exception (DispatchInputError for bad input) in its place."""
        staged = self._stage_together(batch)
        if staged is None:
            staged = isolated_outcomes(batch, lambda item: self._stage(*item))
        plain = [item for item in staged if isinstance(item, Unstacked)]
        together = iter(resolve_many([(item.window, item.checked) for item in plain]))
        return [
            item
            if isinstance(item, Exception)
            else (next(together) if isinstance(item, Unstacked) else item).as_wire_tensors()
            for item in staged
        ]

    def _rescores(
        self, inputs: Mapping[str, NDArray[Any] | None], window: DispatchWindow | None
    ) -> bool:
        """Whether a window with a scorer is resolved stack-aware: the setting is on and its
        PAIR_FEATURES and the orders' creation times (the window, or ORDER_FIELDS) came."""
        return (
            self.stacking.stack_aware
            and inputs.get(PAIR_FEATURES.name) is not None
            and (window is not None or inputs.get(ORDER_FIELDS.name) is not None)
        )

    def _stage_together(
        self, batch: Sequence[ResolverItem]
    ) -> list[ResolvedOrUnstacked | Exception] | None:
        """`_stage` of the windows of one execute where re-scoring is on (dispatch_fused's
        validated windows, or the ensemble's with their ORDER_FIELDS), their checks made
        together (`_checked_together`); a window where riders can stack is then staged on
        its own from those checks. None where that does not apply or some window breaks a
        rule: each is staged alone then, naming its own error."""
        if len(batch) < 2:
            return None
        try:
            checked = self._checked_together(batch)
            if checked is None:
                return None
            stacking = can_stack([resolver_window for resolver_window, _, _ in checked])
        except Exception:  # a rule broken, a shape that does not concatenate: each alone names it
            return None
        out: list[ResolvedOrUnstacked | Exception] = []
        for item, (resolver_window, objectives, created_at), stacks in zip(
            batch, checked, stacking, strict=True
        ):
            try:
                out.append(_staged_checked(item, resolver_window, objectives, created_at, stacks))
            except Exception as exc:  # this window's own error
                out.append(exc)
        return out

    def _checked_together(
        self, batch: Sequence[ResolverItem]
    ) -> list[tuple[ResolverWindow, NDArray[np.float64], NDArray[np.int64]]] | None:
        """Each window's resolver window, checked objectives and orders' creation times, as
        `_stage` checks them (`checked_together` and `check_pair_features` over the
        concatenation of the windows of each candidate width); None when a window cannot be
        re-scored or breaks a rule (raises on a rule `_window_tensors` checks, and on shapes
        that do not concatenate)."""
        tensors: list[WindowTensors] = []
        features: list[NDArray[Any]] = []
        created: list[NDArray[np.int64]] = []
        parsed: dict[tuple[str, tuple[int, ...], bytes] | None, NDArray[np.float64]] = {}
        for item in batch:
            inputs, window, score = item
            if score is None or not self._rescores(inputs, window):
                return None
            parts = _window_tensors(item, parsed)
            if parts is None:
                return None
            tensors.append(parts[0])
            features.append(parts[1])
            created.append(parts[2])
        by_width: dict[int, list[int]] = {}
        for number, (candidates, *_) in enumerate(tensors):
            by_width.setdefault(candidates.shape[1], []).append(number)
        found: dict[int, tuple[ResolverWindow, NDArray[np.float64]]] = {}
        for members in by_width.values():
            check_pair_features(
                np.concatenate([features[i] for i in members]),
                np.concatenate([tensors[i][0] for i in members]),
            )
            together = checked_together([tensors[i] for i in members], self.settings)
            if together is None:
                return None
            found.update(zip(members, together, strict=True))
        return [(*found[number], created[number]) for number in range(len(batch))]

    def _stage(
        self,
        inputs: Mapping[str, NDArray[Any] | None],
        window: DispatchWindow | None,
        score: SyncScorer | None,
    ) -> Resolution | Unstacked:
        """`run` up to the plain resolution: a window where riders stack is resolved
        stack-aware here; one where nothing stacks (or without re-scoring) is left
        `Unstacked`."""
        objectives = required(inputs, PAIR_OBJECTIVES.name)
        candidates = required(inputs, CANDIDATE_RIDER_INDEX.name)
        # A validated window of one order cannot stack (`can_stack`): its stack-aware
        # resolution is the plain one, without the re-scoring inputs' checks (its encoder's
        # own tensors).
        one_order = window is not None and window.num_orders < 2
        if score is not None and not one_order and self._rescores(inputs, window):
            versions = required(inputs, ORDER_MODEL_VERSION.name)
            if not np.issubdtype(versions.dtype, np.integer):
                raise DispatchInputError(
                    ORDER_MODEL_VERSION.name, f"must be INT32, got {versions.dtype}", "dtype"
                )
            _same_orders(ORDER_MODEL_VERSION.name, versions, candidates)
            check_pair_features(required(inputs, PAIR_FEATURES.name), candidates)
            rescore = routed_rescorer(objectives, versions, candidates.shape[1], score)
            staged = self._stage_stack_aware(inputs, rescore, window)
            return staged.resolution if isinstance(staged, StackedResolution) else staged
        rider_ids = required(inputs, "RIDER_IDS")
        load, capacity = _rider_counts(inputs, window)
        checked = ResolverWindow.checked(
            candidates,
            rider_ids=rider_ids,
            rider_load=load,
            rider_capacity=capacity,
            weights=parse_objective_weights(inputs.get("OBJECTIVE_WEIGHTS")),
            settings=self.settings,
            order_ids=_order_ids(inputs, window),
        )
        return Unstacked(checked, checked.objectives(objectives), np.asarray(objectives))


def _window_tensors(
    item: ResolverItem,
    parsed: dict[tuple[str, tuple[int, ...], bytes] | None, NDArray[np.float64]],
) -> tuple[WindowTensors, NDArray[Any], NDArray[np.int64]] | None:
    """A re-scored window's (`TopKResolverStep._rescores`) `checked_together` tensors, its
    pair features and its orders' creation times, when each tensor is present and of the
    shape `_stage` asks for; else None. The rider counts and creation times are read as
    `_stage` reads them (raising as it does). ``parsed``: the batch's objective weights so
    far (windows of one caller share theirs; raises on bad ones)."""
    inputs, window, _ = item
    objectives = inputs.get(PAIR_OBJECTIVES.name)
    candidates = inputs.get(CANDIDATE_RIDER_INDEX.name)
    pairs = inputs.get(PAIR_FEATURES.name)
    versions = inputs.get(ORDER_MODEL_VERSION.name)
    ids = inputs.get("RIDER_IDS")
    if (
        objectives is None
        or candidates is None
        or pairs is None
        or versions is None
        or ids is None
        or not np.issubdtype(versions.dtype, np.integer)
        or candidates.ndim != 2
        or versions.ndim < 1
        or versions.shape[0] != candidates.shape[0]
        or pairs.dtype != np.float32
        or pairs.ndim != 2
        or pairs.shape[0] != candidates.size
    ):
        return None
    raw = inputs.get("OBJECTIVE_WEIGHTS")
    weights = None if raw is None else np.asarray(raw)
    key = None if weights is None else (weights.dtype.str, weights.shape, weights.tobytes())
    if key not in parsed:
        parsed[key] = parse_objective_weights(weights)
    load, capacity = _rider_counts(inputs, window)
    created_at = _created_at(inputs, window, candidates)
    return (candidates, ids, load, capacity, parsed[key], objectives), pairs, created_at


def _rider_counts(
    inputs: Mapping[str, NDArray[Any] | None], window: DispatchWindow | None
) -> tuple[NDArray[Any], NDArray[Any]]:
    """The riders' load and capacity: the validated window's, else read from RIDER_FIELDS."""
    if window is not None:
        return window.rider_load, window.rider_capacity
    return rider_counts_from_wire(inputs)


def _order_ids(
    inputs: Mapping[str, NDArray[Any] | None], window: DispatchWindow | None
) -> NDArray[Any] | None:
    """The orders' ids, which break exact ties between orders: the validated
    window's, else ORDER_IDS when sent (the ensemble maps the request's), else None (ties
    then fall to the rows)."""
    return window.order_ids if window is not None else inputs.get("ORDER_IDS")


def _created_at(
    inputs: Mapping[str, NDArray[Any] | None],
    window: DispatchWindow | None,
    candidates: NDArray[Any],
) -> NDArray[np.int64]:
    """The orders' creation times: the validated window's, else read from ORDER_FIELDS (one
    row per order of CANDIDATE_RIDER_INDEX)."""
    if window is not None:
        return window.created_at
    created_at = order_created_at_from_wire(inputs)
    _same_orders(ORDER_FIELDS.name, created_at, candidates)
    return created_at


def _staged_checked(
    item: ResolverItem,
    resolver_window: ResolverWindow,
    objectives: NDArray[np.float64],
    created_at: NDArray[np.int64],
    stacks: bool,
) -> ResolvedOrUnstacked:
    """`_stage` of a window already checked (`_checked_together`)."""
    inputs, window, score = item
    ids = _order_ids(inputs, window)
    if ids is not None:
        orders = resolver_window.candidates.shape[0]
        resolver_window = replace(resolver_window, order_ids=checked_order_ids(ids, orders))
    sent = required(inputs, PAIR_OBJECTIVES.name)
    base = np.asarray(sent, dtype=np.float32)
    if not stacks:
        return Unstacked(resolver_window, objectives, base.copy())
    if score is None:  # `_checked_together` let none through
        raise ValueError("a window staged from the batch's checks needs its scorer")
    rescore = routed_rescorer(
        sent,
        required(inputs, ORDER_MODEL_VERSION.name),
        resolver_window.candidates.shape[1],
        score,
    )
    staged = stage_checked(
        resolver_window,
        objectives,
        base=base,
        features=required(inputs, PAIR_FEATURES.name),
        created_at=created_at,
        rescore=rescore,
    )
    return staged.resolution if isinstance(staged, StackedResolution) else staged


def _same_orders(name: str, per_order: NDArray[Any], candidates: NDArray[Any]) -> None:
    """A per-order tensor must have one row per order of CANDIDATE_RIDER_INDEX."""
    if per_order.ndim < 1 or per_order.shape[0] != candidates.shape[0]:
        raise DispatchInputError(
            name,
            f"must have one row per order ({candidates.shape[0]}, as "
            f"{CANDIDATE_RIDER_INDEX.name}), got shape {list(per_order.shape)}",
            "shape",
        )
