"""The feature_encoder step: a window's tensors in, its candidate pairs and their features out.

Validates the window (`domain.window_wire`), locates it (addresses geocoded, its city found),
selects each order's candidate riders and builds the pair features; `encode_batch` does the
windows of one Triton `execute` together. The same object runs in the Triton model
(`serving.step_adapters`), in dispatch_fused and in the in-process pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
)
from dispatch_contract.keys import read_key_file
from dispatch_service.core.batches import isolated_outcomes
from dispatch_service.core.settings import load_settings, reject_unknown
from dispatch_service.domain.cities import City, CityRegistry, CitySettings, default_registry
from dispatch_service.domain.features import (
    EncoderSettings,
    EncoderThreads,
    encode_pairs,
    encode_pairs_batch,
    window_candidates,
    windows_candidates,
)
from dispatch_service.domain.window import DispatchWindow, WindowLimits
from dispatch_service.domain.window_batch import windows_from_wire
from dispatch_service.domain.window_wire import (
    window_from_wire,
)
from dispatch_service.geocoding.chain import GeocoderSettings
from dispatch_service.geocoding.locations import WindowGeocoder
from dispatch_service.pipeline.small_window import one_order_candidates
from dispatch_service.pipeline.step_io import Arrays

__all__ = ["FeatureEncoderStep", "geocoder_settings"]

# A window the encoder validated and located: the window, its city, its candidates and
# where each of its points came from.
Selected = tuple[DispatchWindow, City, NDArray[np.int32], NDArray[Any]]


def geocoder_settings(parameters: Mapping[str, str]) -> GeocoderSettings:
    """The encoder's geocoding settings, each provider's key read from its key file when
    one is named (a key belongs in a file or a Secret, not in the repository's config).
    Raises SettingsError or KeyFileError (a ValueError): the model must not load."""
    settings = load_settings(GeocoderSettings, parameters)
    if settings.geocoder_primary_key_file:
        key = read_key_file(Path(settings.geocoder_primary_key_file))
        settings = replace(settings, geocoder_primary_key=key, geocoder_primary_key_file="")
    if settings.geocoder_secondary_key_file:
        key = read_key_file(Path(settings.geocoder_secondary_key_file))
        settings = replace(settings, geocoder_secondary_key=key, geocoder_secondary_key_file="")
    return settings


@dataclass(frozen=True)
class FeatureEncoderStep:
    limits: WindowLimits = field(default_factory=WindowLimits)
    encoder: EncoderSettings = field(default_factory=EncoderSettings)
    threads: EncoderThreads = field(default_factory=EncoderThreads)
    # Orders that came with an address instead of coordinates.
    geocoder: WindowGeocoder = field(default_factory=WindowGeocoder, compare=False)
    # Where each window is served: its city's clock and map (`domain.cities`).
    cities: CityRegistry = field(default_factory=default_registry, compare=False)
    input_names: ClassVar[tuple[str, ...]] = tuple(spec.name for spec in ENCODER_INPUTS)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> FeatureEncoderStep:
        """The step a model instance serves; its geocoder is built now, not on the first
        address (that would cost the window its deadline)."""
        reject_unknown(
            parameters,
            WindowLimits,
            EncoderSettings,
            EncoderThreads,
            GeocoderSettings,
            CitySettings,
        )
        return cls(
            limits=load_settings(WindowLimits, parameters),
            encoder=load_settings(EncoderSettings, parameters),
            threads=load_settings(EncoderThreads, parameters),
            geocoder=WindowGeocoder(geocoder_settings(parameters)).warm(),
            cities=load_settings(CitySettings, parameters).registry(),
        )

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> Arrays:
        return self.encode(inputs)[2]

    def encode(
        self, inputs: Mapping[str, NDArray[Any] | None], *, small_windows: bool = False
    ) -> tuple[DispatchWindow, City, Arrays]:
        """`run`, with the validated (and located) window it encoded and the city serving
        it: dispatch_fused hands the window to the resolver instead of unpacking and checking
        the same tensors again, and routes it with its city's settings. ``small_windows``
        (dispatch_fused's straight path): a one-order window's candidates ranked directly
        (`small_window.one_order_candidates`: the same lists)."""
        window, city, candidates, sources = self._select(inputs, small_windows)
        features = encode_pairs(window, candidates, self.encoder, city)
        return window, city, self._tensors(features, candidates, sources, city)

    def encode_batch(
        self, batch: Sequence[Mapping[str, NDArray[Any] | None]]
    ) -> list[tuple[DispatchWindow, City, Arrays] | Exception]:
        """`encode` of several windows (one Triton `execute` of dispatch_fused), each
        window's result as it gets it alone: the windows are validated
        (`windows_from_wire`), given their candidates (`windows_candidates`) and their pair
        features (`encode_pairs_batch`) together, and located one by one (geocoded, then
        their city found). A window that fails gets its exception (DispatchInputError for
        bad input) in its place; the others their window, city and tensors."""
        located = isolated_outcomes(windows_from_wire(batch, self.limits), self._locate)
        ready = [item[0] for item in located if not isinstance(item, Exception)]
        threads = self.threads.selection_threads
        chosen: list[NDArray[np.int32] | Exception]
        try:
            chosen = [*windows_candidates(ready, self.encoder, threads, widen_scarce=True)]
        except Exception:  # whichever window failed, it fails alone, the others are answered
            chosen = isolated_outcomes(
                ready, lambda w: window_candidates(w, self.encoder, threads, widen_scarce=True)
            )
        candidates = iter(chosen)
        selected: list[Selected | Exception] = []
        for item in located:
            if isinstance(item, Exception):
                selected.append(item)
                continue
            got = next(candidates)
            window, city, sources = item
            selected.append(got if isinstance(got, Exception) else (window, city, got, sources))
        good = [item for item in selected if not isinstance(item, Exception)]
        features = iter(
            encode_pairs_batch(
                [(w, c) for w, _, c, _ in good], self.encoder, [city for _, city, _, _ in good]
            )
        )
        return [
            item
            if isinstance(item, Exception)
            else (item[0], item[1], self._tensors(next(features), item[2], item[3], item[1]))
            for item in selected
        ]

    def _locate(self, window: DispatchWindow) -> tuple[DispatchWindow, City, NDArray[Any]]:
        """The window with its addresses geocoded, the city serving it (DispatchInputError
        naming the first point no registered city serves) and where each point came from."""
        located, sources = self.geocoder.locate(window)
        return located, self.cities.locate(located), sources

    def _select(
        self, inputs: Mapping[str, NDArray[Any] | None], small_windows: bool = False
    ) -> Selected:
        """The validated, located window, its city, its candidates and where each point
        came from."""
        window, city, sources = self._locate(window_from_wire(inputs, self.limits))
        candidates = one_order_candidates(window, self.encoder) if small_windows else None
        if candidates is None:
            candidates = window_candidates(
                window, self.encoder, self.threads.selection_threads, widen_scarce=True
            )
        return window, city, candidates, sources

    @staticmethod
    def _tensors(
        features: NDArray[np.float32],
        candidates: NDArray[np.int32],
        sources: NDArray[Any],
        city: City,
    ) -> Arrays:
        pair_features, candidate_index, located, window_city = ENCODER_OUTPUTS
        return {
            pair_features.name: features,
            candidate_index.name: candidates,
            located.name: sources,
            window_city.name: np.array([city.id.encode("ascii")], dtype=object),
        }

    def close(self) -> None:
        self.geocoder.close()
