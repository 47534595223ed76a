"""Train the dispatch model on simulated windows and export it as ONNX with its card.

``python -m dispatch_service.offline.training`` regenerates the committed model in
``model_repository/dispatch_model/1``: deterministic from ``--seed`` (same seed, same
weights), pure numpy (no torch on the training path, no ONNX exporter magic), a few minutes
on two cores.

Data: windows drawn from the city simulator, encoded with ``features.encode_window`` (the
exact code the server runs, so training and serving cannot drift), and every valid
(order, candidate) pair labelled with one *noisy* realisation from
``simulator.sample_outcome``, as a real platform only ever observes what happened once.

Model: a multi-output MLP ``F -> hidden... -> 3`` with ReLU; heads are the log of the ETA
(minutes from dispatch, squared error on standardised log-minutes), the on-time logit
(binary cross-entropy) and the log of the cost (squared error on standardised log-CNY).
Log-space regression predicts a median; a smearing factor fitted on the training set turns
it back into a mean. Feature standardisation and all of that post-processing are part of the
exported graph, so the server feeds raw features and reads minutes, probability and CNY.

``--log-features`` (version 2) makes better use of the same 28 input columns: the graph
appends ``log(1 + max(a . x, 0))`` of a few linear combinations of them (distances, total
distance, slack, overdue minutes, promise, order age; ``LOG_FEATURES``). Travel time is a
product of distance and slowness and on-time is a normal CDF of log(budget / travel) in the
simulator, so these columns make the log-ETA and on-time heads close to additive. The served
input stays PAIR_FEATURES [batch, 28]: the router feeds every version the same tensor.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import onnx
import onnxruntime as ort
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper
from scipy.stats import rankdata

from dispatch_contract import (
    FEATURE_LAYOUT_VERSION,
    MODEL_INPUTS,
    MODEL_OUTPUTS,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    PAIR_FEATURE_NAMES,
)
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.offline import simulator

__all__ = [
    "DEFAULT_OUT_DIR",
    "IR_VERSION",
    "LOG_FEATURES",
    "MLP",
    "OPSET",
    "QUICK",
    "Dataset",
    "FitReport",
    "TrainConfig",
    "TrainResult",
    "append_policy_evaluation",
    "auc",
    "build_dataset",
    "config_from_args",
    "fit",
    "holdout_metrics",
    "log_feature_matrix",
    "main",
    "max_relative_difference",
    "ort_predict",
    "paired_differences",
    "render_card",
    "to_onnx",
    "train_and_export",
]

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]

DEFAULT_OUT_DIR: Final = MODEL_REPOSITORY / "dispatch_model" / "1"
# Derived input columns of --log-features: name -> coefficients of the raw features whose
# weighted sum s gives the column log(1 + max(s, 0)).
LOG_FEATURES: Final[tuple[tuple[str, tuple[tuple[str, float], ...]], ...]] = (
    ("log1p_pickup_distance_km", (("pickup_distance_km", 1.0),)),
    ("log1p_trip_distance_km", (("trip_distance_km", 1.0),)),
    ("log1p_total_distance_km", (("pickup_distance_km", 1.0), ("trip_distance_km", 1.0))),
    ("log1p_slack_minutes", (("slack_minutes", 1.0),)),
    ("log1p_overdue_minutes", (("slack_minutes", -1.0),)),
    ("log1p_promised_minutes", (("promised_minutes", 1.0),)),
    ("log1p_order_age_minutes", (("order_age_minutes", 1.0),)),
)


def log_feature_matrix() -> NDArray[np.float32]:
    """[F, len(LOG_FEATURES)]: column j holds the coefficients of derived feature j."""
    matrix = np.zeros((NUM_PAIR_FEATURES, len(LOG_FEATURES)), dtype=np.float32)
    for j, (_, terms) in enumerate(LOG_FEATURES):
        for feature, coefficient in terms:
            matrix[PAIR_FEATURE_NAMES.index(feature), j] = coefficient
    return matrix


OPSET: Final = 17
IR_VERSION: Final = 8  # opset 17's IR; loads in the ONNX Runtime of Triton 24.10 as well
# Independent random streams derived from the one seed.
_STREAM_TRAIN, _STREAM_HOLDOUT, _STREAM_INIT, _STREAM_SHUFFLE = range(4)
# Log-space clamps before Exp: a wild feature row yields a large but finite answer.
_LOG_ETA_RANGE: Final = (math.log(0.5), math.log(600.0))
_LOG_COST_RANGE: Final = (math.log(0.5), math.log(1000.0))


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained weights (wall time aside)."""

    seed: int = 7
    windows: int = 1500
    holdout_windows: int = 120
    orders_range: tuple[int, int] = (8, 64)
    riders_range: tuple[int, int] = (40, 300)
    hidden: tuple[int, ...] = (128, 64)
    epochs: int = 30
    batch_size: int = 1024
    learning_rate: float = 3e-3
    final_learning_rate: float = 1e-4
    log_features: bool = False  # append LOG_FEATURES inside the graph (version 2)
    encoder: EncoderSettings = field(default_factory=EncoderSettings)


@dataclass(frozen=True)
class Dataset:
    """Pair features and their noisy labels (ETA minutes, on time 0/1, cost CNY)."""

    features: F32
    eta_minutes: F64
    on_time: F64
    cost_cny: F64
    expected: F64  # [n, 3] the simulator's noise-free expectation, for the card only
    windows: int

    @property
    def pairs(self) -> int:
        return int(self.features.shape[0])


def build_dataset(
    rng: np.random.Generator,
    windows: int,
    orders_range: tuple[int, int],
    riders_range: tuple[int, int],
    encoder: EncoderSettings,
    city: simulator.CityConfig = simulator.DEFAULT_CITY,
) -> Dataset:
    """Simulate, encode and label ``windows`` windows (one Python iteration per window)."""
    feats: list[F32] = []
    labels: list[tuple[F64, F64, F64]] = []
    expected: list[F64] = []
    for _ in range(windows):
        num_orders = int(rng.integers(orders_range[0], orders_range[1] + 1))
        num_riders = int(rng.integers(riders_range[0], riders_range[1] + 1))
        window = simulator.generate_window(rng, num_orders, num_riders, config=city)
        encoded = encode_window(window, encoder)
        candidates = encoded.candidate_rider_index
        flat = candidates.reshape(-1)
        valid = np.flatnonzero(flat >= 0)
        orders = valid // candidates.shape[1]
        riders = flat[valid]
        minutes, on_time, cost = simulator.sample_outcome(window, orders, riders, rng, city)
        feats.append(encoded.pair_features[valid])
        labels.append((minutes, on_time.astype(np.float64), cost))
        expected.append(np.stack(simulator.expected_outcome(window, orders, riders, city), axis=1))
    return Dataset(
        features=np.concatenate(feats).astype(np.float32),
        eta_minutes=np.concatenate([lab[0] for lab in labels]),
        on_time=np.concatenate([lab[1] for lab in labels]),
        cost_cny=np.concatenate([lab[2] for lab in labels]),
        expected=np.concatenate(expected),
        windows=windows,
    )


# ----------------------------------------------------------------------------------- model


@dataclass
class MLP:
    """Weights plus the affine maps around them; ``predict`` is the exported graph in numpy."""

    feature_mean: F32
    feature_scale: F32  # 1 / std
    weights: list[F32]
    biases: list[F32]
    # Output column c: log-value = z_c * out_scale_c + out_offset_c (column 1: a logit).
    out_scale: F32
    out_offset: F32
    derived: F32 | None = None  # [F, k] LOG_FEATURES coefficients; None: raw features only

    @staticmethod
    def inputs_of(x: F32, derived: F32) -> F32:
        """``x`` followed by the columns log(1 + max(x @ derived, 0)), in float32."""
        logs = np.log(np.float32(1.0) + np.maximum(x @ derived, np.float32(0.0)))
        out: F32 = np.concatenate([x, logs.astype(np.float32)], axis=1)
        return out

    def inputs(self, x: F32) -> F32:
        """The network's input columns: the raw features, then any derived log columns."""
        return x if self.derived is None else self.inputs_of(x, self.derived)

    def hidden_forward(self, x: F32) -> tuple[list[F32], F32]:
        """Activations of every hidden layer and the raw output z (standardised heads)."""
        h = (self.inputs(x) - self.feature_mean) * self.feature_scale
        acts = [h]
        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            h = np.maximum(h @ w + b, np.float32(0.0))
            acts.append(h)
        z = acts[-1] @ self.weights[-1] + self.biases[-1]
        return acts, z

    def predict(self, x: F32) -> F32:
        """[n, F] raw features -> [n, 3] ETA minutes, on-time probability, cost CNY."""
        _, z = self.hidden_forward(np.asarray(x, dtype=np.float32))
        y = z * self.out_scale + self.out_offset
        eta = np.exp(np.clip(y[:, 0], *_LOG_ETA_RANGE))
        ontime = 1.0 / (1.0 + np.exp(-y[:, 1]))
        cost = np.exp(np.clip(y[:, 2], *_LOG_COST_RANGE))
        out: F32 = np.stack([eta, ontime, cost], axis=1).astype(np.float32)
        return out

    @property
    def parameter_count(self) -> int:
        return int(sum(w.size + b.size for w, b in zip(self.weights, self.biases, strict=True)))


@dataclass(frozen=True)
class FitReport:
    epochs: int
    final_loss: float
    loss_history: tuple[float, ...]
    seconds: float


def _standardise(x: F32) -> tuple[F32, F32]:
    mean = x.astype(np.float64).mean(axis=0)
    std = x.astype(np.float64).std(axis=0)
    scale = np.where(std > 1e-6, 1.0 / np.maximum(std, 1e-6), 1.0)  # constant column: pass
    return mean.astype(np.float32), scale.astype(np.float32)


def fit(data: Dataset, config: TrainConfig, log: bool = False) -> tuple[MLP, FitReport]:
    """Adam on minibatches; deterministic for a given config and data."""
    started = time.perf_counter()
    init_rng = np.random.default_rng([config.seed, _STREAM_INIT])
    shuffle_rng = np.random.default_rng([config.seed, _STREAM_SHUFFLE])
    x = data.features
    derived = log_feature_matrix() if config.log_features else None
    mean, scale = _standardise(
        x if derived is None else MLP.inputs_of(x, derived)  # statistics of every input column
    )
    log_eta = np.log(np.maximum(data.eta_minutes, 1e-3))
    log_cost = np.log(np.maximum(data.cost_cny, 1e-3))
    eta_mu, eta_sd = float(log_eta.mean()), float(max(log_eta.std(), 1e-6))
    cost_mu, cost_sd = float(log_cost.mean()), float(max(log_cost.std(), 1e-6))
    targets = np.stack(
        [(log_eta - eta_mu) / eta_sd, data.on_time, (log_cost - cost_mu) / cost_sd], axis=1
    ).astype(np.float32)

    sizes = (int(mean.shape[0]), *config.hidden, len(OBJECTIVES))
    weights = [
        (init_rng.standard_normal((a, b)) * math.sqrt(2.0 / a)).astype(np.float32)
        for a, b in itertools.pairwise(sizes)
    ]
    biases = [np.zeros(b, dtype=np.float32) for b in sizes[1:]]
    model = MLP(
        feature_mean=mean,
        feature_scale=scale,
        weights=weights,
        biases=biases,
        out_scale=np.ones(3, dtype=np.float32),
        out_offset=np.zeros(3, dtype=np.float32),
        derived=derived,
    )
    params = [*weights, *biases]
    moment1 = [np.zeros_like(p) for p in params]
    moment2 = [np.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    n = x.shape[0]
    steps_per_epoch = max(1, math.ceil(n / config.batch_size))
    total_steps = steps_per_epoch * config.epochs
    step = 0
    history: list[float] = []
    for epoch in range(config.epochs):
        order = shuffle_rng.permutation(n)
        epoch_loss = 0.0
        for start in range(0, n, config.batch_size):
            rows = order[start : start + config.batch_size]
            acts, z = model.hidden_forward(x[rows])
            t = targets[rows]
            m = np.float32(rows.size)
            prob = 1.0 / (1.0 + np.exp(-z[:, 1]))
            grad = np.empty_like(z)
            grad[:, 0] = 2.0 * (z[:, 0] - t[:, 0]) / m
            grad[:, 1] = (prob - t[:, 1]) / m
            grad[:, 2] = 2.0 * (z[:, 2] - t[:, 2]) / m
            bce = np.logaddexp(0.0, z[:, 1]) - t[:, 1] * z[:, 1]
            loss = float(np.mean((z[:, 0] - t[:, 0]) ** 2 + bce + (z[:, 2] - t[:, 2]) ** 2))
            epoch_loss += loss * rows.size
            grads_w: list[F32] = []
            grads_b: list[F32] = []
            upstream = grad
            for layer in range(len(weights) - 1, -1, -1):
                grads_w.append(acts[layer].T @ upstream)
                grads_b.append(upstream.sum(axis=0))
                if layer:
                    upstream = (upstream @ weights[layer].T) * (acts[layer] > 0)
            grads = [*reversed(grads_w), *reversed(grads_b)]
            step += 1
            progress = step / total_steps
            lr = config.final_learning_rate + 0.5 * (
                config.learning_rate - config.final_learning_rate
            ) * (1.0 + math.cos(math.pi * progress))
            bias1 = 1.0 - beta1**step
            bias2 = 1.0 - beta2**step
            for p, g, m1, m2 in zip(params, grads, moment1, moment2, strict=True):
                m1 *= beta1
                m1 += (1.0 - beta1) * g
                m2 *= beta2
                m2 += (1.0 - beta2) * g * g
                p -= (lr / bias1) * m1 / (np.sqrt(m2 / bias2) + eps)
        history.append(epoch_loss / n)
        if log:
            print(f"epoch {epoch + 1:3d}/{config.epochs}  loss {history[-1]:.4f}", flush=True)

    # Back to natural units, with a smearing factor so exp(mean log) estimates the mean.
    model.out_scale = np.asarray([eta_sd, 1.0, cost_sd], dtype=np.float32)
    model.out_offset = np.asarray([eta_mu, 0.0, cost_mu], dtype=np.float32)
    fitted = model.predict(x)
    eta_smear = math.log(float(data.eta_minutes.mean()) / float(fitted[:, 0].mean()))
    cost_smear = math.log(float(data.cost_cny.mean()) / float(fitted[:, 2].mean()))
    model.out_offset = np.asarray([eta_mu + eta_smear, 0.0, cost_mu + cost_smear], dtype=np.float32)
    report = FitReport(
        epochs=config.epochs,
        final_loss=history[-1] if history else float("nan"),
        loss_history=tuple(history),
        seconds=time.perf_counter() - started,
    )
    return model, report


# ------------------------------------------------------------------------------------ ONNX


def to_onnx(model: MLP, doc: str = "") -> onnx.ModelProto:
    """The MLP as an opset-17 graph: PAIR_FEATURES [batch, F] -> PAIR_OBJECTIVES [batch, 3]."""
    in_name, out_name = MODEL_INPUTS[0].name, MODEL_OUTPUTS[0].name
    inits: list[TensorProto] = []

    def const(name: str, value: NDArray[Any]) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    nodes = []
    columns = in_name
    if model.derived is not None:  # x -> [x, log(1 + relu(x @ derived))]
        columns = "x_all"
        nodes += [
            helper.make_node("MatMul", [in_name, const("derived", model.derived)], ["d_lin"]),
            helper.make_node("Relu", ["d_lin"], ["d_pos"]),
            helper.make_node("Add", [const("one", np.asarray(1.0, np.float32)), "d_pos"], ["d_1p"]),
            helper.make_node("Log", ["d_1p"], ["d_log"]),
            helper.make_node("Concat", [in_name, "d_log"], [columns], axis=1),
        ]
    nodes += [
        helper.make_node("Sub", [columns, const("feature_mean", model.feature_mean)], ["x_c"]),
        helper.make_node("Mul", ["x_c", const("feature_scale", model.feature_scale)], ["h0"]),
    ]
    last = len(model.weights) - 1
    current = "h0"
    for i, (w, b) in enumerate(zip(model.weights, model.biases, strict=True)):
        if i == last:  # fold the output affine map into the last layer
            w = w * model.out_scale[None, :]
            b = b * model.out_scale + model.out_offset
        gemm_out = "heads" if i == last else f"a{i + 1}"
        nodes.append(
            helper.make_node(
                "Gemm",
                [current, const(f"w{i + 1}", w.astype(np.float32)), const(f"b{i + 1}", b)],
                [gemm_out],
            )
        )
        if i != last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"h{i + 1}"]))
            current = f"h{i + 1}"

    def column(c: int) -> str:
        nodes.append(
            helper.make_node(
                "Slice",
                [
                    "heads",
                    const(f"start_{c}", np.asarray([c], dtype=np.int64)),
                    const(f"end_{c}", np.asarray([c + 1], dtype=np.int64)),
                    const(f"axis_{c}", np.asarray([1], dtype=np.int64)),
                ],
                [f"col_{c}"],
            )
        )
        return f"col_{c}"

    def clipped_exp(c: int, bounds: tuple[float, float]) -> str:
        low = const(f"low_{c}", np.asarray(bounds[0], dtype=np.float32))
        high = const(f"high_{c}", np.asarray(bounds[1], dtype=np.float32))
        nodes.append(helper.make_node("Clip", [column(c), low, high], [f"clip_{c}"]))
        nodes.append(helper.make_node("Exp", [f"clip_{c}"], [f"out_{c}"]))
        return f"out_{c}"

    eta = clipped_exp(0, _LOG_ETA_RANGE)
    nodes.append(helper.make_node("Sigmoid", [column(1)], ["out_1"]))
    cost = clipped_exp(2, _LOG_COST_RANGE)
    nodes.append(helper.make_node("Concat", [eta, "out_1", cost], [out_name], axis=1))

    graph = helper.make_graph(
        nodes,
        "dispatch_mlp",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, ["batch", NUM_PAIR_FEATURES])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["batch", len(OBJECTIVES)])],
        initializer=inits,
    )
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="dispatch_service.offline.training",
        doc_string=doc,
    )
    onnx_model.ir_version = IR_VERSION
    helper.set_model_props(
        onnx_model,
        {
            "feature_layout_version": FEATURE_LAYOUT_VERSION,
            "pair_feature_names": ",".join(PAIR_FEATURE_NAMES),
            "objectives": ",".join(OBJECTIVES),
        },
    )
    onnx.checker.check_model(onnx_model, full_check=True)
    return onnx_model


def max_relative_difference(a: F32, b: F32) -> float:
    """max |a - b| / max(|b|, 1): absolute for probabilities, relative for minutes and CNY."""
    if a.size == 0:
        return 0.0
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.max(diff / np.maximum(np.abs(b.astype(np.float64)), 1.0)))


def ort_predict(model_bytes: bytes, features: F32) -> F32:
    """Run a serialized model on the CPU exactly as the serving path would."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        model_bytes, sess_options=options, providers=["CPUExecutionProvider"]
    )
    out = session.run([MODEL_OUTPUTS[0].name], {MODEL_INPUTS[0].name: features})[0]
    return np.asarray(out, dtype=np.float32)


# ------------------------------------------------------------------------------- metrics


def auc(labels: F64, scores: F64) -> float:
    """Area under the ROC curve (Mann-Whitney with average ranks for ties)."""
    positives = labels > 0.5
    n_pos = int(positives.sum())
    n_neg = int(labels.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def holdout_metrics(predicted: F64, data: Dataset) -> dict[str, float]:
    """Errors of [n, 3] predictions against the noisy held-out labels."""
    p = np.clip(predicted[:, 1], 1e-7, 1.0 - 1e-7)
    y = data.on_time
    return {
        "eta_mae_minutes": float(np.mean(np.abs(predicted[:, 0] - data.eta_minutes))),
        "eta_bias_minutes": float(np.mean(predicted[:, 0] - data.eta_minutes)),
        "ontime_brier": float(np.mean((predicted[:, 1] - y) ** 2)),
        "ontime_log_loss": float(np.mean(-(y * np.log(p) + (1.0 - y) * np.log(1.0 - p)))),
        "ontime_auc": auc(y, predicted[:, 1]),
        "cost_mae_cny": float(np.mean(np.abs(predicted[:, 2] - data.cost_cny))),
    }


def paired_differences(predicted: F64, reference: F64, data: Dataset) -> dict[str, list[float]]:
    """Per-pair loss differences (this model minus the reference) on the same labels.

    metric -> [mean, standard error]: the mean is the change of that held-out error, the
    standard error says whether it is more than the luck of which pairs were held out.
    """
    y = data.on_time

    def losses(p: F64) -> dict[str, F64]:
        prob = np.clip(p[:, 1], 1e-7, 1.0 - 1e-7)
        return {
            "eta_mae_minutes": np.abs(p[:, 0] - data.eta_minutes),
            "ontime_brier": (p[:, 1] - y) ** 2,
            "ontime_log_loss": -(y * np.log(prob) + (1.0 - y) * np.log(1.0 - prob)),
            "cost_mae_cny": np.abs(p[:, 2] - data.cost_cny),
        }

    mine, theirs = losses(predicted), losses(reference)
    out: dict[str, list[float]] = {}
    for key, loss in mine.items():
        diff = loss - theirs[key]
        se = float(diff.std(ddof=1) / math.sqrt(diff.size)) if diff.size > 1 else float("nan")
        out[key] = [float(diff.mean()), se]
    return out


# ---------------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class TrainResult:
    model: MLP
    model_path: Path
    card: dict[str, Any]


def _layout(encoder: EncoderSettings) -> dict[str, Any]:
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
        f"Seed {card['seed']}; training wall time {card['train_seconds']:.1f} s, "
        f"whole run {card['wall_seconds']:.1f} s on {card['host']}.",
        "",
        "## Data",
        "",
        f"- training: {data['train_windows']} windows, {data['train_pairs']} pairs "
        f"({data['orders_range'][0]}-{data['orders_range'][1]} orders, "
        f"{data['riders_range'][0]}-{data['riders_range'][1]} riders per window)",
        f"- held out: {data['holdout_windows']} windows, {data['holdout_pairs']} pairs "
        "(an independent random stream of the same seed)",
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


def _command(args: argparse.Namespace) -> str:
    parts = [
        ".venv/bin/python",
        "-m",
        "dispatch_service.offline.training",
        "--seed",
        str(args.seed),
    ]
    if args.quick:
        parts.append("--quick")
    for flag in ("windows", "holdout_windows", "epochs", "batch_size", "eval_windows"):
        value = getattr(args, flag)
        if value is not None:
            parts += ["--" + flag.replace("_", "-"), str(value)]
    if args.hidden is not None:
        parts += ["--hidden", args.hidden]
    if args.log_features:
        parts.append("--log-features")
    if args.version != 1:
        parts += ["--version", str(args.version)]
    if args.compare_with is not None:
        parts += ["--compare-with", _display_path(Path(args.compare_with))]
    if args.no_eval:
        parts.append("--no-eval")
    if args.out_dir != str(_version_dir(args.version)):
        parts += ["--out-dir", args.out_dir]
    return " ".join(shlex.quote(p) for p in parts)


def train_and_export(
    config: TrainConfig,
    out_dir: Path,
    command: str = "",
    log: bool = False,
    version: int = 1,
    reference: Path | None = None,
) -> TrainResult:
    """Simulate, train, check and write model.onnx, feature_layout.json and the card.

    ``reference``: a served version's folder; its model.onnx is scored on the same held-out
    pairs and the card compares the two.
    """
    started = time.perf_counter()
    train = build_dataset(
        np.random.default_rng([config.seed, _STREAM_TRAIN]),
        config.windows,
        config.orders_range,
        config.riders_range,
        config.encoder,
    )
    holdout = build_dataset(
        np.random.default_rng([config.seed, _STREAM_HOLDOUT]),
        config.holdout_windows,
        config.orders_range,
        config.riders_range,
        config.encoder,
    )
    if log:
        print(
            f"data: {train.pairs} training pairs, {holdout.pairs} held-out pairs "
            f"({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
    model, report = fit(train, config, log=log)
    onnx_model = to_onnx(model, doc=f"dispatch MLP, seed {config.seed}")
    model_bytes = onnx_model.SerializeToString()
    numpy_out = model.predict(holdout.features)
    ort_out = ort_predict(model_bytes, holdout.features)
    max_diff = max_relative_difference(ort_out, numpy_out)
    if max_diff > 1e-5:
        raise RuntimeError(f"onnxruntime and numpy disagree (max relative diff {max_diff:.3g})")

    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "model.onnx"
    model_path.write_bytes(model_bytes)
    (out_dir / "feature_layout.json").write_text(
        json.dumps(_layout(config.encoder), indent=2) + "\n"
    )

    card: dict[str, Any] = {
        "model": "dispatch_model",
        "seed": config.seed,
        "command": command,
        "feature_layout_version": FEATURE_LAYOUT_VERSION,
        "features": list(PAIR_FEATURE_NAMES),
        "objectives": list(OBJECTIVES),
        "data": {
            "train_windows": train.windows,
            "train_pairs": train.pairs,
            "holdout_windows": holdout.windows,
            "holdout_pairs": holdout.pairs,
            "orders_range": list(config.orders_range),
            "riders_range": list(config.riders_range),
            "label": "one noisy realisation per pair (simulator.sample_outcome)",
        },
        "architecture": {
            "layers": [int(model.feature_mean.size), *config.hidden, len(OBJECTIVES)],
            "activation": "relu",
            "parameters": model.parameter_count,
            "epochs": config.epochs,
            "batch_size": config.batch_size,
            "learning_rate": config.learning_rate,
            "final_learning_rate": config.final_learning_rate,
            "final_train_loss": report.final_loss,
            "derived_features": [name for name, _ in LOG_FEATURES] if config.log_features else [],
        },
        "onnx": {
            "opset": OPSET,
            "ir_version": IR_VERSION,
            "bytes": len(model_bytes),
            "max_rel_diff_vs_numpy": max_diff,
        },
        "holdout": holdout_metrics(numpy_out.astype(np.float64), holdout),
        "noise_floor": holdout_metrics(holdout.expected, holdout),
        "train_seconds": report.seconds,
        "host": f"{platform.machine()}, {_cpu_count()} CPUs, Python {platform.python_version()}",
    }
    card["version"] = version
    if reference is not None:
        reference_out = ort_predict((reference / "model.onnx").read_bytes(), holdout.features)
        card["comparison"] = {
            "reference_label": f"version {reference.name}",
            "reference_model": _display_path(reference / "model.onnx"),
            "holdout": holdout_metrics(reference_out.astype(np.float64), holdout),
            "paired": paired_differences(
                numpy_out.astype(np.float64), reference_out.astype(np.float64), holdout
            ),
        }
    card["wall_seconds"] = time.perf_counter() - started
    _write_card(out_dir, card)
    return TrainResult(model=model, model_path=model_path, card=card)


def _display_path(path: Path) -> str:
    """A path relative to the checkout where it lies inside it (cards stay machine-neutral)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _write_card(out_dir: Path, card: dict[str, Any]) -> None:
    (out_dir / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    (out_dir / "MODEL_CARD.md").write_text(render_card(card))


def append_policy_evaluation(out_dir: Path, card: dict[str, Any], policy: dict[str, Any]) -> None:
    """Add the model-vs-nearest-rider figures to an existing card and rewrite both files."""
    card["policy_evaluation"] = policy
    _write_card(out_dir, card)


# -------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_service.offline.training",
        description="Train the dispatch MLP on simulated windows and export ONNX + model card.",
    )
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--windows", type=int, help=f"training windows ({TrainConfig.windows})")
    parser.add_argument(
        "--holdout-windows", type=int, help=f"held-out windows ({TrainConfig.holdout_windows})"
    )
    parser.add_argument("--epochs", type=int, help=f"epochs ({TrainConfig.epochs})")
    parser.add_argument("--batch-size", type=int, help=f"minibatch ({TrainConfig.batch_size})")
    parser.add_argument("--hidden", help="hidden layer widths, e.g. 128,64")
    parser.add_argument(
        "--log-features",
        action="store_true",
        help="append the LOG_FEATURES columns inside the graph (version 2)",
    )
    parser.add_argument(
        "--version",
        type=int,
        default=1,
        help="the dispatch_model version this run produces (card title, default folder)",
    )
    parser.add_argument(
        "--compare-with",
        help="a served version's folder (e.g. model_repository/dispatch_model/1): score it on "
        "the same held-out pairs and policy windows and compare in the card",
    )
    parser.add_argument(
        "--out-dir",
        help=f"where model.onnx and its card go (default {MODEL_REPOSITORY}/dispatch_model/"
        "<version>)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny data and few epochs: for tests, not serving"
    )
    parser.add_argument("--eval-windows", type=int, help="policy evaluation windows (32)")
    parser.add_argument(
        "--no-eval", action="store_true", help="skip the model-vs-nearest-rider evaluation"
    )
    return parser


def _version_dir(version: int) -> Path:
    return MODEL_REPOSITORY / "dispatch_model" / str(version)


def _policy_versus(results: dict[str, Any], ref_name: str, version: int) -> str:
    model, ref = results["model"], results[ref_name]
    return (
        f"Version {version} (`model`) vs {ref_name.replace('_', ' ')}: "
        f"{model.mean_delivery_minutes - ref.mean_delivery_minutes:+.2f} minutes mean delivery, "
        f"{100.0 * (model.ontime_rate - ref.ontime_rate):+.1f} points on-time rate, "
        f"{model.mean_cost_cny - ref.mean_cost_cny:+.2f} CNY mean cost."
    )


QUICK: Final = {"windows": 24, "holdout_windows": 8, "epochs": 3, "eval_windows": 4}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    base = TrainConfig(seed=args.seed)
    overrides: dict[str, Any] = {}
    if args.quick:
        overrides.update({k: v for k, v in QUICK.items() if k != "eval_windows"})
    for name in ("windows", "holdout_windows", "epochs", "batch_size"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.hidden is not None:
        overrides["hidden"] = tuple(int(part) for part in args.hidden.split(",") if part)
    if args.log_features:
        overrides["log_features"] = True
    config = TrainConfig(**{**asdict(base), **overrides, "encoder": base.encoder})
    if config.windows < 1 or config.holdout_windows < 1 or config.epochs < 1:
        raise SystemExit("--windows, --holdout-windows and --epochs must be >= 1")
    return config


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version < 1:
        parser.error("--version must be >= 1")
    if args.out_dir is None:
        if args.quick:
            parser.error("--quick needs --out-dir: a toy model must not replace the served one")
        args.out_dir = str(_version_dir(args.version))
    reference = None if args.compare_with is None else Path(args.compare_with)
    if reference is not None and not (reference / "model.onnx").is_file():
        parser.error(f"--compare-with: no model.onnx in {reference}")
    config = config_from_args(args)
    out_dir = Path(args.out_dir)
    started = time.perf_counter()
    result = train_and_export(
        config,
        out_dir,
        command=_command(args),
        log=True,
        version=args.version,
        reference=reference,
    )
    card = result.card
    print(f"wrote {result.model_path} ({card['onnx']['bytes']} bytes)")
    print("held-out:", json.dumps(card["holdout"], indent=None))
    if not args.no_eval:
        from dispatch_service.offline import evaluation

        eval_windows = args.eval_windows
        if eval_windows is None:
            eval_windows = QUICK["eval_windows"] if args.quick else None
        eval_config = (
            evaluation.EvaluationConfig()
            if eval_windows is None
            else evaluation.EvaluationConfig(windows=eval_windows)
        )
        comparison = evaluation.evaluate_policies(
            result.model_path, eval_config, include_oracle=True
        )
        if reference is not None:  # the reference version on the same windows and noise
            ref_name = f"version_{reference.name}"
            ref = evaluation.evaluate_policies(reference / "model.onnx", eval_config)["model"]
            comparison = {"model": comparison.pop("model"), ref_name: ref, **comparison}
        print(evaluation.format_table(comparison))
        card["wall_seconds"] = time.perf_counter() - started
        section = evaluation.card_section(comparison, eval_config)
        if reference is not None:
            section["markdown"] += "\n\n" + _policy_versus(comparison, ref_name, args.version)
        append_policy_evaluation(out_dir, card, section)
    print(f"wall time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
