"""Client for the Triton `dispatch` ensemble: window JSON <-> tensors, transports, results.

from dispatch_client import DispatchClient, window_from_json

with DispatchClient.http("localhost:8000") as client:
    result = client.dispatch(window_from_json(text))
print(result.to_json_dict())
"""

from dispatch_client.client import (
    DEFAULT_MODEL_NAME,
    Candidate,
    DispatchClient,
    DispatchResult,
    OrderResult,
    parse_dispatch_outputs,
)
from dispatch_client.connect import ProtocolName, make_transport
from dispatch_client.errors import (
    DispatchConnectionError,
    DispatchError,
    DispatchServerError,
    WindowJSONError,
)
from dispatch_client.priority import PriorityMap
from dispatch_client.retry import NO_RETRY, RetryPolicy
from dispatch_client.transport import (
    GrpcTransport,
    HttpTransport,
    Transport,
)
from dispatch_client.window_json import (
    window_from_dict,
    window_from_json,
    window_to_dict,
    window_to_json,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "NO_RETRY",
    "Candidate",
    "DispatchClient",
    "DispatchConnectionError",
    "DispatchError",
    "DispatchResult",
    "DispatchServerError",
    "GrpcTransport",
    "HttpTransport",
    "OrderResult",
    "PriorityMap",
    "ProtocolName",
    "RetryPolicy",
    "Transport",
    "WindowJSONError",
    "make_transport",
    "parse_dispatch_outputs",
    "window_from_dict",
    "window_from_json",
    "window_to_dict",
    "window_to_json",
]
