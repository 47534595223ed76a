"""Locust scenario: dispatch windows posted to Triton's HTTP endpoint.

Every user posts real requests, built once from simulator windows, to
`/v2/models/dispatch/infer` with no think time; `--body binary` uses the KServe v2
binary-tensor extension, `--body json` plain KServe v2 JSON. Bounded twice: locust's
`--run-time` and `--max-requests` (the run stops itself once that many were sent).
Loopback hosts only.

    .venv/bin/locust -f perf/locustfile.py --headless --host http://127.0.0.1:8000 \
        -u 16 -r 16 --run-time 30s --window-size small --body binary --max-requests 20000

(run from the repository root with PYTHONPATH=. so `perf` imports; `make bench` runs it.)
"""

from __future__ import annotations

import itertools
from typing import Any

from locust import FastHttpUser, events, task
from locust.env import Environment

from perf.bodies import TRITON_INFER_PATH, RequestBody, triton_binary_body, triton_json_body
from perf.loadgen import require_loopback
from perf.windows import SIZES, optional_inputs, simulated_windows

__all__ = [
    "DispatchUser",
]

_bodies: list[RequestBody] = []
_sent = itertools.count()
_limit = {"max_requests": 0}


# locust 2.18's event hooks and FastHttpSession.post carry no annotations.
@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _add_options(parser: Any) -> None:
    parser.add_argument("--window-size", choices=sorted(SIZES), default="small")
    parser.add_argument("--body", choices=("binary", "json"), default="binary")
    parser.add_argument("--max-requests", type=int, default=10000)


@events.init.add_listener  # type: ignore[untyped-decorator]
def _prepare(environment: Environment, **_: Any) -> None:
    require_loopback(environment.host or "")
    options = environment.parsed_options
    if options is None:
        raise RuntimeError("run this scenario from the locust command line")
    build = triton_binary_body if options.body == "binary" else triton_json_body
    windows = simulated_windows(SIZES[options.window_size], optional_inputs())
    _bodies[:] = [build(window) for window in windows]
    _limit["max_requests"] = int(options.max_requests)


class DispatchUser(FastHttpUser):
    """One closed-loop caller: the next window as soon as the previous answer arrived."""

    @task
    def dispatch(self) -> None:
        index = next(_sent)
        if index >= _limit["max_requests"]:
            runner = self.environment.runner
            if runner is not None:
                runner.quit()
            return
        body = _bodies[index % len(_bodies)]
        self.client.post(  # type: ignore[no-untyped-call]
            TRITON_INFER_PATH, data=body.data, headers=body.headers, name="dispatch"
        )
