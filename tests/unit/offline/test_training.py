"""Training on a tiny data set: a valid ONNX graph that matches the numpy forward pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dispatch_contract import (
    FEATURE_LAYOUT_VERSION,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    PAIR_FEATURE_NAMES,
    PAIR_FEATURES,
    PAIR_OBJECTIVES,
)
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ONNX_FILE, SCORING_MODEL, model_layout
from dispatch_service.domain.features import EncoderSettings
from dispatch_service.offline import training
from dispatch_service.offline.training.card import rounded

TINY = training.TrainConfig(
    seed=3,
    windows=6,
    holdout_windows=3,
    epochs=2,
    hidden=(16, 8),
    batch_size=256,
    map_variants=training.MapVariants(windows=3),
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> training.TrainResult:
    return training.train_and_export(TINY, tmp_path_factory.mktemp("tiny"), command="tiny")


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_export_passes_the_onnx_checker_with_the_contract_names(
    tiny: training.TrainResult,
) -> None:
    model = onnx.load(str(tiny.model_path))
    onnx.checker.check_model(model, full_check=True)
    assert [op.version for op in model.opset_import if op.domain in ("", "ai.onnx")] == [17]
    session = _session(tiny.model_path)
    (graph_in,) = session.get_inputs()
    (graph_out,) = session.get_outputs()
    assert graph_in.name == PAIR_FEATURES.name and graph_out.name == PAIR_OBJECTIVES.name
    assert isinstance(graph_in.shape[0], str) and graph_in.shape[1] == NUM_PAIR_FEATURES
    assert isinstance(graph_out.shape[0], str) and graph_out.shape[1] == len(OBJECTIVES)
    assert graph_in.type == "tensor(float)" and graph_out.type == "tensor(float)"


def test_onnxruntime_matches_the_numpy_forward_pass(tiny: training.TrainResult) -> None:
    rng = np.random.default_rng(0)
    for rows in (1, 7, 300):
        features = (rng.standard_normal((rows, NUM_PAIR_FEATURES)) * 5).astype(np.float32)
        ort_out = _session(tiny.model_path).run(None, {PAIR_FEATURES.name: features})[0]
        numpy_out = tiny.model.predict(features)
        assert ort_out.shape == (rows, 3) and ort_out.dtype == np.float32
        assert training.max_relative_difference(ort_out, numpy_out) < 1e-5
        assert (ort_out[:, 0] > 0).all() and (ort_out[:, 2] > 0).all()
        assert ((ort_out[:, 1] >= 0) & (ort_out[:, 1] <= 1)).all()


def test_extreme_features_stay_finite(tiny: training.TrainResult) -> None:
    features = np.full((2, NUM_PAIR_FEATURES), 1e6, dtype=np.float32)
    features[1] = -1e6
    out = _session(tiny.model_path).run(None, {PAIR_FEATURES.name: features})[0]
    assert np.isfinite(out).all()


def test_layout_and_card_are_written_next_to_the_model(tiny: training.TrainResult) -> None:
    folder = tiny.model_path.parent
    layout = json.loads((folder / "feature_layout.json").read_text())
    assert layout["version"] == FEATURE_LAYOUT_VERSION
    assert tuple(layout["features"]) == PAIR_FEATURE_NAMES
    assert tuple(layout["objectives"]) == OBJECTIVES
    assert layout["encoder_settings"]["candidates_per_order"] == (
        EncoderSettings().candidates_per_order
    )
    card = json.loads((folder / "model_card.json").read_text())
    assert card["seed"] == 3 and card["command"] == "tiny"
    assert card["data"]["train_windows"] == 6 and card["data"]["train_pairs"] > 0
    assert card["data"]["holdout_windows"] == 3 and card["data"]["holdout_pairs"] > 0
    assert card["data"]["map_variant_windows"] == 3 and card["data"]["map_variant_pairs"] > 0
    assert card["architecture"]["layers"] == [NUM_PAIR_FEATURES, 16, 8, 3]
    for key in ("eta_mae_minutes", "ontime_brier", "ontime_auc", "cost_mae_cny"):
        assert np.isfinite(card["holdout"][key]), key
    text = (folder / "MODEL_CARD.md").read_text()
    assert "ETA MAE" in text and "tiny" in text
    assert "- map variants: 3 more windows" in text


ARTIFACTS = ("model.onnx", "model_card.json", "MODEL_CARD.md", "feature_layout.json")


def test_same_seed_gives_the_same_files(tmp_path: Path, tiny: training.TrainResult) -> None:
    """Byte for byte, cards included: they are signed, so nothing measured may enter them."""
    again = training.train_and_export(TINY, tmp_path, command="tiny")
    for name in ARTIFACTS:
        assert (tmp_path / name).read_bytes() == (tiny.model_path.parent / name).read_bytes(), name
    card = json.loads((tmp_path / "model_card.json").read_text())
    assert not {"train_seconds", "wall_seconds", "host"} & set(card)
    assert again.seconds["wall"] > 0.0  # measured, but only returned and printed


@pytest.mark.parametrize("version", [1, 2])
def test_committed_cards_match_the_code(tiny: training.TrainResult, version: int) -> None:
    """The committed card has the keys the code writes and its Markdown renders from its JSON."""
    folder = model_layout(MODEL_REPOSITORY, SCORING_MODEL).version(version)
    committed = json.loads((folder / "model_card.json").read_text())
    assert set(tiny.card) <= set(committed), set(tiny.card) - set(committed)
    assert set(tiny.card["architecture"]) == set(committed["architecture"])
    assert training.render_card(committed) == (folder / "MODEL_CARD.md").read_text()
    # Rounded like the code rounds (compared as JSON text: NaN never equals itself).
    assert json.dumps(rounded(committed)) == json.dumps(committed)


def test_training_reduces_the_loss() -> None:
    config = training.TrainConfig(seed=1, windows=8, holdout_windows=1, epochs=4, hidden=(16,))
    data = training.build_dataset(
        np.random.default_rng(1),
        8,
        orders_range=(8, 16),
        riders_range=(40, 60),
        encoder=EncoderSettings(),
        cities=("shanghai",),
    )
    _, report = training.fit(data, config)
    assert len(report.loss_history) == 4
    assert report.loss_history[-1] < report.loss_history[0]


def test_dataset_labels_every_valid_pair() -> None:
    data = training.build_dataset(
        np.random.default_rng(2),
        3,
        orders_range=(5, 10),
        riders_range=(30, 40),
        encoder=EncoderSettings(candidates_per_order=4),
        cities=("shanghai", "chengdu"),
    )
    assert data.features.shape == (data.pairs, NUM_PAIR_FEATURES)
    assert data.features.dtype == np.float32
    assert 3 * 5 * 4 <= data.pairs <= 3 * 10 * 4
    assert (data.eta_minutes > 0).all() and (data.cost_cny > 0).all()
    assert set(np.unique(data.on_time).tolist()) <= {0.0, 1.0}


def test_map_variants_redraw_the_circuity_and_speeds_the_route_minutes_read() -> None:
    """Every variant pair's free-flow trip minutes are its road km (straight km plus the
    crossings' detour, times the drawn circuity 2.0) at half Shanghai's speed, by hand."""
    variants = training.MapVariants(windows=4, road_circuity=(2.0, 2.0), speed_scale=(0.5, 0.5))
    data = training.build_variant_dataset(
        np.random.default_rng(4),
        variants,
        orders_range=(5, 10),
        riders_range=(30, 40),
        encoder=EncoderSettings(candidates_per_order=4),
        cities=("shanghai",),
    )
    column = {name: data.features[:, PAIR_FEATURE_NAMES.index(name)] for name in PAIR_FEATURE_NAMES}
    shanghai_kmh = {"vehicle_ebike": 17.0, "vehicle_motorbike": 24.0, "vehicle_car": 30.0}
    speed = sum(column[name] * kmh for name, kmh in shanghai_kmh.items()) * 0.5
    road_km = (column["trip_distance_km"] + column["trip_detour_km"]) * 2.0
    np.testing.assert_allclose(column["trip_route_minutes"], road_km / speed * 60.0, rtol=0.02)
    assert data.windows == 4 and data.pairs > 0
    assert (data.eta_minutes > 0).all()


def test_auc() -> None:
    labels = np.asarray([0.0, 0.0, 1.0, 1.0])
    assert training.auc(labels, np.asarray([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert training.auc(labels, np.asarray([0.9, 0.8, 0.2, 0.1])) == 0.0
    assert training.auc(labels, np.full(4, 0.5)) == 0.5


def test_quick_cli_writes_model_card_with_policy_figures(tmp_path: Path) -> None:
    assert training.main(["--quick", "--seed", "5", "--out-dir", str(tmp_path)]) == 0
    card = json.loads((tmp_path / "model_card.json").read_text())
    assert "--quick" in card["command"] and "--seed 5" in card["command"]
    assert card["data"]["map_variant_windows"] == 12 and card["data"]["map_variant_pairs"] > 0
    cities = card["policy_evaluation"]["summary"]["cities"]
    assert list(cities) == ["shanghai", "beijing", "shenzhen", "chengdu"]  # per city
    policies = cities["chengdu"]["regimes"]["default"]["policies"]
    assert {"model", "nearest_rider", "distance_matching", "rule_eta", "oracle"} == set(policies)
    text = (tmp_path / "MODEL_CARD.md").read_text()
    assert "| nearest_rider |" in text and "Targets: model" in text
    assert "trained on shanghai, beijing, shenzhen; held out: chengdu" in text
    assert "## Held-out error by city" in text
    onnx.checker.check_model(onnx.load(str(tmp_path / ONNX_FILE)))
    # --card-only runs the policy evaluation again over the folder as it is: the bytes of
    # the full run's card, its policy section rewritten (here from a card that lost it).
    written = {name: (tmp_path / name).read_bytes() for name in ARTIFACTS}
    card.pop("policy_evaluation")
    (tmp_path / "model_card.json").write_text(json.dumps(card))
    (tmp_path / "MODEL_CARD.md").write_text("stale")
    argv = ["--quick", "--seed", "5", "--out-dir", str(tmp_path), "--card-only"]
    assert training.main(argv) == 0
    assert {name: (tmp_path / name).read_bytes() for name in ARTIFACTS} == written


def test_card_only_needs_a_card_and_refuses_check(tmp_path: Path) -> None:
    assert training.main(["--quick", "--out-dir", str(tmp_path), "--card-only"]) == 2
    with pytest.raises(SystemExit):
        training.main(["--card-only", "--check"])


def test_quick_mode_refuses_to_replace_the_served_model() -> None:
    with pytest.raises(SystemExit):
        training.main(["--quick"])


# ---- version 2: log features inside the graph, compared with a reference version ----------

TINY_V2 = training.TrainConfig(
    seed=3,
    windows=6,
    holdout_windows=3,
    epochs=2,
    hidden=(16, 8),
    log_features=True,
    map_variants=training.MapVariants(windows=3),
)


@pytest.fixture(scope="module")
def tiny_v2(
    tmp_path_factory: pytest.TempPathFactory, tiny: training.TrainResult
) -> training.TrainResult:
    return training.train_and_export(
        TINY_V2,
        tmp_path_factory.mktemp("tiny_v2") / "2",
        command="tiny v2",
        version=2,
        reference=tiny.model_path.parent,
    )


def test_log_features_are_computed_inside_the_graph(tiny_v2: training.TrainResult) -> None:
    session = _session(tiny_v2.model_path)
    (graph_in,) = session.get_inputs()
    assert graph_in.shape[1] == NUM_PAIR_FEATURES  # the served input is unchanged
    rng = np.random.default_rng(4)
    features = (rng.standard_normal((50, NUM_PAIR_FEATURES)) * 5).astype(np.float32)
    ort_out = session.run(None, {PAIR_FEATURES.name: features})[0]
    assert training.max_relative_difference(ort_out, tiny_v2.model.predict(features)) < 1e-5
    inputs = tiny_v2.model.inputs(features)
    assert inputs.shape == (50, NUM_PAIR_FEATURES + len(training.LOG_FEATURES))
    slack = features[:, PAIR_FEATURE_NAMES.index("slack_minutes")]
    overdue = inputs[:, NUM_PAIR_FEATURES + 4]
    np.testing.assert_allclose(overdue, np.log1p(np.maximum(-slack, 0)), rtol=1e-5, atol=1e-6)


def test_the_card_compares_with_the_reference_on_the_same_pairs(
    tiny_v2: training.TrainResult, tiny: training.TrainResult
) -> None:
    card = tiny_v2.card
    assert card["version"] == 2
    assert card["architecture"]["layers"][0] == (NUM_PAIR_FEATURES + len(training.LOG_FEATURES))
    comparison = card["comparison"]
    assert comparison["reference_label"] == f"version {tiny.model_path.parent.name}"
    # Same seed and held-out config: the reference is scored on exactly its own held-out set.
    assert comparison["holdout"] == pytest.approx(tiny.card["holdout"], rel=1e-5, abs=1e-4)
    for key, (mean, se) in comparison["paired"].items():
        assert mean == pytest.approx(card["holdout"][key] - comparison["holdout"][key], abs=1e-4)
        assert se > 0
    text = (tiny_v2.model_path.parent / "MODEL_CARD.md").read_text()
    assert text.startswith("# dispatch_model version 2")
    assert "Compared with version" in text and "paired SE" in text
