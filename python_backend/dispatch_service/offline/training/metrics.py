"""Held-out errors of a model's predictions, and paired differences between two models."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import rankdata

from dispatch_service.offline.training.data import F64, Dataset

__all__ = [
    "auc",
    "holdout_metrics",
    "paired_differences",
]


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
