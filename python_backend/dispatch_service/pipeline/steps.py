"""The three pipeline steps as plain objects: arrays in, arrays out.

Each step is what one Triton model runs (`serving.step_adapters` wraps it); the same objects
run in one process in `pipeline.DispatchPipeline` (evaluation, benchmarks' in-process
limit). One module each: `encoder_step`, `model_step`, `resolver_step`; what they share is
`step_io`. This module names them together for the callers that use all three.
"""

from __future__ import annotations

from dispatch_service.pipeline.encoder_step import FeatureEncoderStep, geocoder_settings
from dispatch_service.pipeline.model_step import DispatchModelStep
from dispatch_service.pipeline.resolver_step import TopKResolverStep
from dispatch_service.pipeline.step_io import Arrays, Step

__all__ = [
    "Arrays",
    "DispatchModelStep",
    "FeatureEncoderStep",
    "Step",
    "TopKResolverStep",
    "geocoder_settings",
]
