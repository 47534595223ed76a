"""Does the model dispatch better than nearest-rider? Judged in the simulator, on held-out windows.

Two policies see the same windows and the same luck:

- ``model``: the serving path -- ``features.encode_window``, the ONNX model in onnxruntime,
  ``resolver.resolve`` with the default objective weights and settings;
- ``nearest_rider``: ``baseline.nearest_rider_assignment``.

Each window's assignment is realised by ``simulator.evaluate_assignment`` with a generator
seeded per window, identical for both policies, so each order draws the same noise whichever
rider it gets (common random numbers: differences come from the decisions, not the dice).
Window seeds come from a stream the training script never uses.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.domain.resolver import ResolverSettings, resolve
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline import baseline, simulator
from dispatch_service.pipeline.onnx_runner import OnnxScorer

__all__ = [
    "COMMITTED_MODEL",
    "EVAL_STREAM",
    "EvaluationConfig",
    "Policy",
    "PolicyMetrics",
    "card_section",
    "evaluate_policies",
    "evaluate_policy",
    "evaluation_windows",
    "format_table",
    "main",
    "model_policy",
    "oracle_policy",
]

Policy = Callable[[DispatchWindow], NDArray[np.int32]]

COMMITTED_MODEL: Final = MODEL_REPOSITORY / "dispatch_model" / "1" / "model.onnx"
# Training derives its streams from [seed, 0..3]; evaluation windows use [EVAL_STREAM, i].
EVAL_STREAM: Final = 0xE7A1


@dataclass(frozen=True)
class EvaluationConfig:
    seed: int = 2024
    windows: int = 32
    num_orders: int = 64
    num_riders: int = 200
    encoder: EncoderSettings = field(default_factory=EncoderSettings)
    resolver: ResolverSettings = field(default_factory=ResolverSettings)


@dataclass(frozen=True)
class PolicyMetrics:
    """Pooled over all windows: each order counts once."""

    mean_delivery_minutes: float  # assigned orders, from creation to delivery
    ontime_rate: float  # over all orders; unassigned orders are late
    mean_cost_cny: float
    assigned_share: float
    orders: int


def model_policy(
    model_path: str | Path,
    encoder: EncoderSettings | None = None,
    resolver: ResolverSettings | None = None,
) -> Policy:
    """The served decision: encode, score with onnxruntime (CPU), resolve with default weights."""
    encoder = encoder or EncoderSettings()
    resolver = resolver or ResolverSettings()
    scorer = OnnxScorer(model_path)  # the served session options: one thread, CPU

    def decide(window: DispatchWindow) -> NDArray[np.int32]:
        encoded = encode_window(window, encoder)
        objectives = scorer.infer(encoded.pair_features)
        return _assign(window, encoded.candidate_rider_index, objectives, resolver)

    return decide


def _assign(
    window: DispatchWindow,
    candidates: NDArray[np.int32],
    objectives: NDArray[np.float32],
    resolver: ResolverSettings,
) -> NDArray[np.int32]:
    """The resolver's assignment of one window's scored pairs, with the default weights."""
    resolution = resolve(
        objectives=objectives,
        candidate_rider_index=candidates,
        rider_ids=window.rider_ids,
        rider_load=window.rider_load,
        rider_capacity=window.rider_capacity,
        weights=np.asarray(DEFAULT_OBJECTIVE_WEIGHTS, dtype=np.float64),
        settings=resolver,
    )
    return np.asarray(resolution.assigned_rider_index, dtype=np.int32)


def oracle_policy(
    encoder: EncoderSettings | None = None,
    resolver: ResolverSettings | None = None,
    city: simulator.CityConfig = simulator.DEFAULT_CITY,
) -> Policy:
    """The same pipeline scored by the simulator's own noise-free expectation.

    Not a deployable policy (it reads the ground truth): it shows how much of the
    available gain the learned model captures.
    """
    encoder = encoder or EncoderSettings()
    resolver = resolver or ResolverSettings()

    def decide(window: DispatchWindow) -> NDArray[np.int32]:
        encoded = encode_window(window, encoder)
        candidates = encoded.candidate_rider_index
        flat = candidates.reshape(-1)
        valid = np.flatnonzero(flat >= 0)
        objectives = np.zeros((flat.size, 3), dtype=np.float32)
        expected = simulator.expected_outcome(
            window, valid // candidates.shape[1], flat[valid], city
        )
        objectives[valid] = np.stack(expected, axis=1)
        return _assign(window, candidates, objectives, resolver)

    return decide


def evaluation_windows(config: EvaluationConfig) -> list[tuple[DispatchWindow, int]]:
    """(window, noise seed) pairs; deterministic from ``config.seed``."""
    out = []
    for i in range(config.windows):
        rng = np.random.default_rng([EVAL_STREAM, config.seed, i])
        window = simulator.generate_window(rng, config.num_orders, config.num_riders)
        out.append((window, int(rng.integers(0, 2**63 - 1))))
    return out


def evaluate_policy(policy: Policy, windows: Sequence[tuple[DispatchWindow, int]]) -> PolicyMetrics:
    minutes_sum = cost_sum = 0.0
    on_time = assigned = orders = 0.0
    for window, noise_seed in windows:
        result = simulator.evaluate_assignment(
            window, policy(window), np.random.default_rng(noise_seed)
        )
        n_assigned = result["assigned"]
        if n_assigned:
            minutes_sum += result["mean_delivery_minutes"] * n_assigned
            cost_sum += result["mean_cost_cny"] * n_assigned
        on_time += result["ontime_rate"] * result["orders"]
        assigned += n_assigned
        orders += result["orders"]
    return PolicyMetrics(
        mean_delivery_minutes=minutes_sum / assigned if assigned else float("nan"),
        ontime_rate=on_time / orders,
        mean_cost_cny=cost_sum / assigned if assigned else float("nan"),
        assigned_share=assigned / orders,
        orders=int(orders),
    )


def evaluate_policies(
    model_path: str | Path = COMMITTED_MODEL,
    config: EvaluationConfig | None = None,
    include_oracle: bool = False,
) -> dict[str, PolicyMetrics]:
    """Metrics of the model policy and of nearest-rider on the same windows and noise.

    ``include_oracle`` adds the ground-truth-scored reference (see ``oracle_policy``).
    """
    config = config or EvaluationConfig()
    windows = evaluation_windows(config)
    results = {
        "model": evaluate_policy(
            model_policy(model_path, config.encoder, config.resolver), windows
        ),
        "nearest_rider": evaluate_policy(baseline.nearest_rider_assignment, windows),
    }
    if include_oracle:
        results["oracle_reference"] = evaluate_policy(
            oracle_policy(config.encoder, config.resolver), windows
        )
    return results


def format_table(results: dict[str, PolicyMetrics]) -> str:
    """A Markdown table of the policies' figures."""
    lines = [
        "| policy | mean delivery minutes | on-time rate | mean cost CNY | assigned |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, m in results.items():
        lines.append(
            f"| {name} | {m.mean_delivery_minutes:.2f} | {m.ontime_rate:.3f} | "
            f"{m.mean_cost_cny:.2f} | {m.assigned_share:.3f} |"
        )
    return "\n".join(lines)


def card_section(results: dict[str, PolicyMetrics], config: EvaluationConfig) -> dict[str, Any]:
    """The model card's policy section (figures plus a ready Markdown rendering)."""
    model, base = results["model"], results["nearest_rider"]
    setup = (
        f"{config.windows} held-out windows of {config.num_orders} orders x "
        f"{config.num_riders} riders (evaluation seed {config.seed}), same noise for both "
        "policies; model = encode_window + onnxruntime + resolver.resolve with default "
        "weights 0.45/0.35/0.20 and settings."
    )
    summary = (
        f"Model vs nearest-rider: {model.mean_delivery_minutes - base.mean_delivery_minutes:+.2f} "
        f"minutes mean delivery, {100.0 * (model.ontime_rate - base.ontime_rate):+.1f} points "
        "on-time rate."
    )
    if "oracle_reference" in results:
        summary += (
            " `oracle_reference` is the same pipeline scored by the simulator's noise-free"
            " expectation (not deployable: it reads the ground truth): what perfect predictions"
            " would give with the same resolver."
        )
    return {
        "setup": {
            "seed": config.seed,
            "windows": config.windows,
            "num_orders": config.num_orders,
            "num_riders": config.num_riders,
        },
        "policies": {name: asdict(m) for name, m in results.items()},
        "markdown": "\n\n".join([setup, format_table(results), summary]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_service.offline.evaluation",
        description="Compare the ONNX model policy with nearest-rider dispatch in the simulator.",
    )
    parser.add_argument("--model", default=str(COMMITTED_MODEL))
    parser.add_argument("--seed", type=int, default=EvaluationConfig.seed)
    parser.add_argument("--windows", type=int, default=EvaluationConfig.windows)
    parser.add_argument("--orders", type=int, default=EvaluationConfig.num_orders)
    parser.add_argument("--riders", type=int, default=EvaluationConfig.num_riders)
    parser.add_argument(
        "--oracle", action="store_true", help="also score the ground-truth reference policy"
    )
    args = parser.parse_args(argv)
    config = EvaluationConfig(
        seed=args.seed, windows=args.windows, num_orders=args.orders, num_riders=args.riders
    )
    print(format_table(evaluate_policies(args.model, config, include_oracle=args.oracle)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
