"""dispatch_client.keys: the client's names for the shared key rules (`dispatch_contract.keys`)."""

from __future__ import annotations

from dispatch_client import keys as client_keys
from dispatch_contract import keys as contract_keys


def test_the_client_names_the_contracts_key_rules() -> None:
    assert client_keys.__all__ == contract_keys.__all__
    for name in contract_keys.__all__:
        assert getattr(client_keys, name) is getattr(contract_keys, name), name
