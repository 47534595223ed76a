"""Reference services the benchmark compares against; not part of the product.

Run as modules (`python -m perf.baselines.fastapi_service`): nothing is re-exported here.
"""

__all__: list[str] = []
