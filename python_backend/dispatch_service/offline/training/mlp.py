"""The multi-output MLP and its trainer (pure numpy Adam; deterministic for a config and data)."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from dispatch_contract import OBJECTIVES
from dispatch_service.offline.training.config import (
    LOG_COST_RANGE,
    LOG_ETA_RANGE,
    STREAM_INIT,
    STREAM_SHUFFLE,
    TrainConfig,
    log_feature_matrix,
)
from dispatch_service.offline.training.data import F32, Dataset

__all__ = [
    "MLP",
    "FitReport",
    "fit",
]


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
    derived: F32 | None = None  # [F, k] LOG_FEATURES coefficients; None: no log columns

    @staticmethod
    def inputs_of(x: F32, derived: F32 | None) -> F32:
        """``x``, then the columns log(1 + max(x @ derived, 0))."""
        if derived is None:
            return x
        logs = np.log(np.float32(1.0) + np.maximum(x @ derived, np.float32(0.0)))
        out: F32 = np.concatenate([x, logs.astype(np.float32)], axis=1)
        return out

    def inputs(self, x: F32) -> F32:
        """The network's input columns: the raw features, then any derived columns."""
        return self.inputs_of(x, self.derived)

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
        eta = np.exp(np.clip(y[:, 0], *LOG_ETA_RANGE))
        ontime = 1.0 / (1.0 + np.exp(-y[:, 1]))
        cost = np.exp(np.clip(y[:, 2], *LOG_COST_RANGE))
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
    init_rng = np.random.default_rng([config.seed, STREAM_INIT])
    shuffle_rng = np.random.default_rng([config.seed, STREAM_SHUFFLE])
    x = data.features
    derived = log_feature_matrix() if config.log_features else None
    mean, scale = _standardise(MLP.inputs_of(x, derived))  # every input column
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
