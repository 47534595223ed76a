"""The model card (model_card.json + MODEL_CARD.md) and the feature layout file.

Cards are signed with the model, so they hold only what the seed and the code determine:
no wall times, no host; floats are rounded to ``CARD_DIGITS`` significant digits so that
last-bit differences of a BLAS or thread count cannot change the signed bytes.
Run times are printed by the training command instead.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

from dispatch_contract import (
    FEATURE_LAYOUT_VERSION,
    MODEL_INPUTS,
    MODEL_OUTPUTS,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    PAIR_FEATURE_NAMES,
)
from dispatch_service.domain.features import EncoderSettings

__all__ = [
    "CARD_DIGITS",
    "append_policy_evaluation",
    "layout",
    "render_card",
    "rounded",
    "write_card",
]

CARD_DIGITS: Final = 6


def rounded(value: Any) -> Any:
    """``value`` with every float rounded to CARD_DIGITS significant digits (recursively)."""
    if isinstance(value, float):
        return float(f"{value:.{CARD_DIGITS}g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(item) for item in value]
    return value


def layout(encoder: EncoderSettings) -> dict[str, Any]:
    return {
        "version": FEATURE_LAYOUT_VERSION,
        "features": list(PAIR_FEATURE_NAMES),
        "num_features": NUM_PAIR_FEATURES,
        "objectives": list(OBJECTIVES),
        "input": MODEL_INPUTS[0].name,
        "output": MODEL_OUTPUTS[0].name,
        "encoder_settings": asdict(encoder),
    }


def _fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def render_card(card: dict[str, Any]) -> str:
    """MODEL_CARD.md from the same dict as model_card.json."""
    data, arch, ho, floor = card["data"], card["architecture"], card["holdout"], card["noise_floor"]
    lines = [
        f"# dispatch_model version {card.get('version', 1)}: model card",
        "",
        "Scores one order-rider pair of a dispatch window: predicted ETA (minutes from",
        "dispatch to delivery), probability of delivering within the promise, and cost (CNY).",
        "Trained on the city simulator (`dispatch_service.offline.simulator`) with noisy outcomes.",
        "",
        "## Reproduce",
        "",
        "```",
        card["command"],
        "```",
        "",
        f"Seed {card['seed']}; the same command reproduces model.onnx and this card byte for "
        "byte (`make model-check`). Run times are printed by the command, not kept here.",
        "",
        "## Data",
        "",
        f"- training: {data['train_windows']} windows, {data['train_pairs']} pairs "
        f"({data['orders_range'][0]}-{data['orders_range'][1]} orders, "
        f"{data['riders_range'][0]}-{data['riders_range'][1]} riders per window)",
        *(
            [
                f"- map variants: {data['map_variant_windows']} more windows, "
                f"{data['map_variant_pairs']} pairs, each in the world the simulator builds for "
                "a new city from its registry entry (`simulator.entry_world`), from a training "
                "city's entry with its road circuity drawn from "
                f"[{data['map_variant_road_circuity'][0]}, {data['map_variant_road_circuity'][1]}]"
                " and its free-flow speeds scaled by a factor from "
                f"[{data['map_variant_speed_scale'][0]}, {data['map_variant_speed_scale'][1]}] "
                "(the training cities' own circuity and speeds barely differ)",
            ]
            if data.get("map_variant_windows")
            else []
        ),
        f"- held out: {data['holdout_windows']} windows, {data['holdout_pairs']} pairs "
        "(an independent random stream of the same seed)",
        f"- cities: {', '.join(data['cities'])} (windows drawn in turn); every other "
        "registered city is held out",
        "- labels: one noisy realisation per pair from `simulator.sample_outcome`",
        f"- features: layout {card['feature_layout_version']}, {len(card['features'])} columns "
        "(see feature_layout.json), encoded by `features.encode_window`",
        "",
        "## Architecture",
        "",
        f"- MLP {' -> '.join(str(s) for s in arch['layers'])}, ReLU, "
        f"{arch['parameters']} parameters; Adam, {arch['epochs']} epochs, batch "
        f"{arch['batch_size']}, cosine learning rate {arch['learning_rate']} -> "
        f"{arch['final_learning_rate']}",
        *(
            [
                f"- inputs: the {NUM_PAIR_FEATURES} features plus, computed inside the graph, "
                f"log(1 + max(s, 0)) of: {', '.join(arch['derived_features'])}",
            ]
            if arch.get("derived_features")
            else []
        ),
        "- heads: log ETA (squared error, smearing-corrected), on-time logit (cross-entropy),",
        "  log cost (squared error, smearing-corrected); standardisation inside the graph",
        f"- ONNX opset {card['onnx']['opset']}, IR {card['onnx']['ir_version']}, "
        f"{card['onnx']['bytes']} bytes; onnxruntime vs numpy forward pass: max difference "
        f"{card['onnx']['max_rel_diff_vs_numpy']:.1e} (relative; absolute for probabilities)",
        "",
        "## Held-out error (against noisy outcomes)",
        "",
        "| output | model | simulator's own expectation (noise floor) |",
        "| --- | --- | --- |",
        f"| ETA MAE, minutes | {_fmt(ho['eta_mae_minutes'])} | {_fmt(floor['eta_mae_minutes'])} |",
        f"| ETA bias, minutes | {_fmt(ho['eta_bias_minutes'])} | "
        f"{_fmt(floor['eta_bias_minutes'])} |",
        f"| on-time Brier score | {_fmt(ho['ontime_brier'], 4)} | "
        f"{_fmt(floor['ontime_brier'], 4)} |",
        f"| on-time log-loss | {_fmt(ho['ontime_log_loss'], 4)} | "
        f"{_fmt(floor['ontime_log_loss'], 4)} |",
        f"| on-time AUC | {_fmt(ho['ontime_auc'], 4)} | {_fmt(floor['ontime_auc'], 4)} |",
        f"| cost MAE, CNY | {_fmt(ho['cost_mae_cny'])} | {_fmt(floor['cost_mae_cny'])} |",
        "",
        "The noise floor column scores the simulator's noise-free expectation, which no model",
        "that sees only the pair features can beat on average.",
    ]
    by_city = card.get("holdout_by_city")
    if by_city:
        lines += [
            "",
            "## Held-out error by city",
            "",
            "| city | trained on | pairs | ETA MAE, minutes | ETA bias, minutes | "
            "on-time Brier | on-time AUC | cost MAE, CNY |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for city, m in by_city.items():
            lines.append(
                f"| {city} | {'yes' if m['trained'] else 'no (held out)'} | {m['pairs']} | "
                f"{_fmt(m['eta_mae_minutes'])} | {_fmt(m['eta_bias_minutes'])} | "
                f"{_fmt(m['ontime_brier'], 4)} | {_fmt(m['ontime_auc'], 4)} | "
                f"{_fmt(m['cost_mae_cny'])} |"
            )
    comparison = card.get("comparison")
    if comparison:
        lines += ["", *_comparison_lines(card, comparison)]
    policy = card.get("policy_evaluation")
    if policy:
        lines += ["", "## Dispatch policy in the simulator", "", policy["markdown"]]
    return "\n".join(lines) + "\n"


_COMPARED: Final = (  # (key, label, digits, lower is better)
    ("eta_mae_minutes", "ETA MAE, minutes", 3, True),
    ("eta_bias_minutes", "ETA bias, minutes", 3, None),
    ("ontime_brier", "on-time Brier score", 4, True),
    ("ontime_log_loss", "on-time log-loss", 4, True),
    ("ontime_auc", "on-time AUC", 4, False),
    ("cost_mae_cny", "cost MAE, CNY", 3, True),
)


def _comparison_lines(card: dict[str, Any], comparison: dict[str, Any]) -> list[str]:
    this, ref = card["holdout"], comparison["holdout"]
    label = comparison["reference_label"]
    lines = [
        f"## Compared with {label} on the same held-out pairs",
        "",
        f"Both models scored the {card['data']['holdout_pairs']} held-out pairs above "
        f"(`{comparison['reference_model']}`, run in onnxruntime like this one).",
        "",
        f"| output | version {card.get('version', 1)} | {label} | change | paired SE |",
        "| --- | --- | --- | --- | --- |",
    ]
    paired = comparison.get("paired", {})
    for key, name, digits, lower_better in _COMPARED:
        delta = this[key] - ref[key]
        verdict = ""
        if lower_better is not None and delta != 0.0:
            verdict = " (better)" if (delta < 0.0) == lower_better else " (worse)"
        se = f"{paired[key][1]:.{digits + 1}f}" if key in paired else "-"
        lines.append(
            f"| {name} | {_fmt(this[key], digits)} | {_fmt(ref[key], digits)} | "
            f"{delta:+.{digits}f}{verdict} | {se} |"
        )
    lines += [
        "",
        "Paired SE: standard error of the mean per-pair difference of that error between the",
        "two models (same pairs, same labels); a change of several SE is not held-out luck.",
    ]
    return lines


def write_card(out_dir: Path, card: dict[str, Any]) -> None:
    """Write model_card.json and MODEL_CARD.md from the same (rounded) dict."""
    card = rounded(card)
    (out_dir / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    (out_dir / "MODEL_CARD.md").write_text(render_card(card))


def append_policy_evaluation(out_dir: Path, card: dict[str, Any], policy: dict[str, Any]) -> None:
    """Add the policy evaluation to an existing card and rewrite both files."""
    card["policy_evaluation"] = policy
    write_card(out_dir, card)
