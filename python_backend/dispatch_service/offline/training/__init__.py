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

One graph serves every city: positions are relative to the window's own city and the map's
columns (barriers crossed, detours, free-flow route minutes) are features the encoder reads
from the city registry, so no city constant sits in the graph. Training draws its windows
from ``TrainConfig.cities``; the other registered cities are never seen in training.
``--variant-windows`` (``MapVariants``) adds windows in worlds built from those cities'
entries with their road circuity and speeds redrawn, so the model learns what a city's roads
do to its minutes from more than three nearly alike cities.

``--log-features`` (version 2) makes better use of the same input columns: the graph
appends ``log(1 + max(a . x, 0))`` of a few linear combinations of them (distances, total
distance, slack, overdue minutes, promise, order age; ``LOG_FEATURES``). Travel time is a
product of distance and slowness and on-time is a normal CDF of log(budget / travel) in the
simulator, so these columns make the log-ETA and on-time heads close to additive. The served
input stays PAIR_FEATURES: the router feeds every version the same tensor.

The package splits along the concerns of a run: ``config`` (what determines the weights),
``data`` (simulated, encoded, labelled pairs), ``mlp`` (the network and its trainer),
``export`` (ONNX graph and its check against numpy),
``metrics`` (held-out errors), ``card`` (model card and layout files), ``run`` (one run end
to end) and ``cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.offline.training.card import append_policy_evaluation, render_card
    from dispatch_service.offline.training.cli import QUICK, config_from_args, main
    from dispatch_service.offline.training.config import (
        LOG_FEATURES,
        MapVariants,
        TrainConfig,
        log_feature_matrix,
    )
    from dispatch_service.offline.training.data import Dataset, build_dataset, build_variant_dataset
    from dispatch_service.offline.training.export import (
        IR_VERSION,
        OPSET,
        max_relative_difference,
        ort_predict,
        to_onnx,
    )
    from dispatch_service.offline.training.metrics import auc, holdout_metrics, paired_differences
    from dispatch_service.offline.training.mlp import MLP, FitReport, fit
    from dispatch_service.offline.training.run import TrainResult, train_and_export

__all__ = [
    "IR_VERSION",
    "LOG_FEATURES",
    "MLP",
    "OPSET",
    "QUICK",
    "Dataset",
    "FitReport",
    "MapVariants",
    "TrainConfig",
    "TrainResult",
    "append_policy_evaluation",
    "auc",
    "build_dataset",
    "build_variant_dataset",
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

# Lazy (module __getattr__): `python -m dispatch_service.offline.training` pins the numerics
# before numpy loads (`numerics`), so importing the package must load none of its modules.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "card": ("append_policy_evaluation", "render_card"),
            "cli": ("QUICK", "config_from_args", "main"),
            "config": ("LOG_FEATURES", "MapVariants", "TrainConfig", "log_feature_matrix"),
            "data": ("Dataset", "build_dataset", "build_variant_dataset"),
            "export": ("IR_VERSION", "OPSET", "max_relative_difference", "ort_predict", "to_onnx"),
            "metrics": ("auc", "holdout_metrics", "paired_differences"),
            "mlp": ("MLP", "FitReport", "fit"),
            "run": ("TrainResult", "train_and_export"),
        },
    )
