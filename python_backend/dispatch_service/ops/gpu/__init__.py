"""The GPU monitor of the launcher and the device-level fallback (L1 / L2 / L3) it drives.

`sampling` reads the devices (NVML, or recorded readings in tests), `health` turns readings
into a per-GPU state with the consecutive-sample rule and hysteresis, `fallback` turns the
states into a `dispatch_model` configuration loaded through the repository API, `monitor`
runs them off the request path and exports the state to Prometheus.
"""

__all__: list[str] = []
