"""The dispatch service library: everything the Triton models and the tools run.

Layers, each importing only those below it (held by import-linter, `make lint`, and
tests/unit/test_architecture.py):

    ops       launcher, admin CLI, signing, verified loads, model control, warm-up, golden
    serving   Triton Python-backend adapters (pb_utils in, arrays out) | offline: simulator,
    offline   baselines, evaluation, profiling, training (never on the request path)
    pipeline  the steps as plain objects, the in-process pipeline, the fused model, ONNX Runtime
    routing   canary routing, shadow scoring, fallback chain
    domain    window validation, geo, pair features, Top-K and assignment
    core      errors, typed settings, metric vocabulary, paths

The tensor contract is its own package, `dispatch_contract` (numpy only), shared with the
client `dispatch_client`, which never imports this library.

Nothing is re-exported at this level: each layer package re-exports its own main names
(lazily), and importing `dispatch_service` itself must stay free for the Python-backend
stub and the launcher.
"""

__all__: list[str] = []
