"""The dispatch service's wire contract: tensor names, dtypes, shapes, limits and enums.

A package of its own with numpy as its only dependency, so that the client (and any
co-located feature service) can speak the contract without installing the server.
Everything `contracts` exports is exported here; its `__all__` is the one list.
"""

from dispatch_contract import contracts
from dispatch_contract.contracts import *  # noqa: F403

__all__ = list(contracts.__all__)
