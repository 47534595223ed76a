"""The Python-backend stubs of a server, read from a stand-in /proc, and which of those that
vanished died (dispatch_service.ops.stubs)."""

from __future__ import annotations

from pathlib import Path

from dispatch_service.core.repository_layout import (
    ENCODER_MODEL,
    FUSED_MODEL,
    RESOLVER_MODEL,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.ops.stubs import instance_count, stub_deaths, stub_models, stub_versions


def fake_proc(root: Path, pid: int, ppid: int, argv: list[str], state: str = "S") -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "stat").write_text(f"{pid} (triton python b) {state} {ppid} 1 1 0 -1\n")


def model_py(model: str) -> str:
    """The model.py a stub of ``model`` runs (its argv[1]): version 1's, in /repo."""
    return str(model_layout(Path("/repo"), model).python_model(1))


def test_stubs_of_one_server_are_mapped_to_their_models(tmp_path: Path) -> None:
    stub = "/b/python/triton_python_backend_stub"
    fake_proc(tmp_path, 11, 7, [stub, model_py(SCORING_MODEL), "r", "1"])
    fake_proc(tmp_path, 12, 7, [stub, model_py(FUSED_MODEL), "r", "1"])
    fake_proc(tmp_path, 13, 8, [stub, model_py(RESOLVER_MODEL), "r", "1"])  # other server
    fake_proc(tmp_path, 14, 7, [stub, model_py(ENCODER_MODEL)], state="Z")  # dead
    fake_proc(tmp_path, 15, 7, ["/usr/bin/python3", model_py("x")])
    assert stub_models(7, tmp_path) == {11: "dispatch_model", 12: "dispatch_fused"}
    assert stub_versions(7, tmp_path) == {11: ("dispatch_model", "1"), 12: ("dispatch_fused", "1")}


def test_instance_count_follows_the_instance_groups() -> None:
    assert instance_count({}) == 1
    assert instance_count({"instance_group": [{"kind": "KIND_CPU", "count": 2}]}) == 2
    groups = [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}, {"kind": "KIND_CPU"}]
    assert instance_count({"instance_group": groups}) == 5


ROUTER, MODEL = ("dispatch_router", "1"), ("dispatch_model", "2")


def test_a_killed_stub_of_a_ready_version_is_a_death() -> None:
    # Two router instances, one killed: the version is READY with one stub left.
    lost, alive = {21: ROUTER}, {22: ROUTER}
    assert stub_deaths(lost, alive, {ROUTER}, {"dispatch_router": 2}) == {"dispatch_router": [21]}


def test_stubs_replaced_by_a_config_reload_are_no_death() -> None:
    # deploy/rollback reload the router with new parameters: the new instances start, then
    # Triton ends the old ones. The version stays READY with its full count.
    lost, alive = {21: ROUTER, 22: ROUTER}, {31: ROUTER, 32: ROUTER}
    assert stub_deaths(lost, alive, {ROUTER}, {"dispatch_router": 2}) == {}


def test_a_new_instance_killed_beside_a_stale_old_one_is_a_death() -> None:
    """2.51 leaves the old instances of a model running after one of its stubs died and the
    model was reloaded. Counted as serving, such a stub made the next death of a new
    instance look like a retirement (two deaths 3 s apart: the second never healed)."""
    leftover, new_a, new_b = 21, 31, 32
    lost, alive = {new_a: ROUTER}, {leftover: ROUTER, new_b: ROUTER}
    instances = {"dispatch_router": 2}
    assert stub_deaths(lost, alive, {ROUTER}, instances) == {}  # the old rule: hidden
    assert stub_deaths(lost, alive, {ROUTER}, instances, {leftover}) == {"dispatch_router": [new_a]}
    # The stale stub going away at last is no death.
    assert (
        stub_deaths({leftover: ROUTER}, {31: ROUTER, 32: ROUTER}, {ROUTER}, instances, {21}) == {}
    )


def test_stubs_of_an_unloaded_version_are_no_death() -> None:
    # rollback --unload-canary: version 2 is no longer READY once its stub ends.
    assert stub_deaths({41: MODEL}, {}, {("dispatch_model", "1")}, {"dispatch_model": 1}) == {}
    # The whole model unloaded: no config to read (no instance count), not READY either.
    assert stub_deaths({41: MODEL}, {}, set(), {}) == {}
