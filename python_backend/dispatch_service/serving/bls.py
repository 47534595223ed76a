"""BLS calls of the scoring model from inside a Python model: the request of one version's
objectives for some pairs, and its answer read back."""

from __future__ import annotations

from typing import Any

from numpy.typing import NDArray

from dispatch_contract import PAIR_FEATURES, PAIR_OBJECTIVES
from dispatch_service.routing.engine import ModelCallError

__all__ = ["scored_objectives", "scoring_request"]


def scoring_request(
    pb_utils: Any, model: str, version: int, features: NDArray[Any], timeout_us: int = 0
) -> Any:
    """A BLS request of one version of the scoring model: PAIR_FEATURES in, objectives out;
    ``timeout_us`` > 0: refused once it has waited that long in the model's queue."""
    options = {"timeout": timeout_us} if timeout_us > 0 else {}
    return pb_utils.InferenceRequest(
        model_name=model,
        model_version=int(version),
        inputs=[pb_utils.Tensor(PAIR_FEATURES.name, features)],
        requested_output_names=[PAIR_OBJECTIVES.name],
        **options,
    )


def scored_objectives(pb_utils: Any, response: Any) -> NDArray[Any]:
    """A BLS answer's PAIR_OBJECTIVES; an error answer raises ModelCallError."""
    if response.has_error():
        raise ModelCallError(response.error().message())
    tensor = pb_utils.get_output_tensor_by_name(response, PAIR_OBJECTIVES.name)
    if tensor is None:
        raise ModelCallError(f"the answer lacks {PAIR_OBJECTIVES.name}")
    scores: NDArray[Any] = tensor.as_numpy()
    return scores
