"""A stub's first steps (dispatch_service.serving.stub_setup): the ``stub_nice`` parameter
(applied once the instance is loaded), BLAS on one thread, and the priority of every
thread, each read back in a child process (a process cannot take its niceness back, so
this one is never changed); niceness relative to the one the child inherits."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from dispatch_service.core.settings import SettingsError
from dispatch_service.routing.settings import FusedSettings, RouterSettings
from dispatch_service.serving import stub_setup
from dispatch_service.serving.responder import TritonResponder
from dispatch_service.serving.stub_setup import DEFAULT_STUB_NICE, stub_nice
from pb_stand_in import FakePbUtils


def test_stub_nice_defaults_and_bounds() -> None:
    assert stub_nice({}) == DEFAULT_STUB_NICE == 10
    assert stub_nice({"stub_nice": " 0 "}) == 0
    assert stub_nice({"stub_nice": "19"}) == 19
    for bad in ("20", "-1", "ten", "1.5"):
        with pytest.raises(SettingsError, match=f"stub_nice: a whole number 0..19, got '{bad}'"):
            stub_nice({"stub_nice": bad})


def test_the_settings_classes_leave_stub_nice_to_the_stub() -> None:
    FusedSettings.from_parameters({"stub_nice": "5"})
    RouterSettings.from_parameters({"stub_nice": "5"})


CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    from pathlib import Path
    from dispatch_service.serving.stub_setup import lower_cpu_priority

    def nice_of(tid):  # field 19 of /proc/self/task/<tid>/stat
        stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        return int(stat[stat.rfind(")") + 2 :].split()[16])

    main = threading.get_native_id()
    base = os.getpriority(os.PRIO_PROCESS, main)  # the test process's (inherited)
    idle = threading.Event()
    before = threading.Thread(target=idle.wait)
    before.start()
    if int(sys.argv[1]):
        os.setpriority(os.PRIO_PROCESS, main, base + int(sys.argv[1]))
    changed = lower_cpu_priority(base + 4)
    seen = {"main": nice_of(main) - base, "before": nice_of(before.native_id) - base}
    after = threading.Thread(
        target=lambda: seen.update(later=nice_of(threading.get_native_id()) - base)
    )
    after.start()
    after.join()
    idle.set()
    before.join()
    seen.update(main_changed=main in changed, before_changed=before.native_id in changed)
    print(json.dumps(seen))
    """
)


def run_child(start: int) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(start)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_every_thread_and_every_later_one_runs_at_the_stubs_niceness() -> None:
    seen = run_child(0)
    assert seen == {
        "main": 4, "before": 4, "later": 4, "main_changed": True, "before_changed": True
    }  # fmt: skip


def test_a_thread_already_below_that_priority_is_left_there() -> None:
    seen = run_child(6)
    assert seen["main"] == 6 and seen["later"] == 6 and seen["before"] == 4
    assert not seen["main_changed"] and seen["before_changed"]


BLAS_CHILD = textwrap.dedent(
    """
    import json
    import numpy
    from threadpoolctl import threadpool_info
    from dispatch_service.serving.stub_setup import single_threaded_blas

    single_threaded_blas()
    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    print(json.dumps([pool["num_threads"] for pool in blas]))
    """
)


def test_a_stub_runs_numpys_blas_on_one_thread() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLAS_CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    threads = json.loads(done.stdout)
    assert threads and set(threads) == {1}, threads


def test_the_priority_drops_once_the_instance_is_loaded_not_while_it_sets_up(
    stub_priorities: list[int],
) -> None:
    """A restart's stubs set up at the server's priority (the module docstring)."""
    pb = FakePbUtils()
    config = json.dumps({"parameters": {"stub_nice": {"string_value": "7"}}})
    stub_setup.prepare_stub(pb, {"model_name": "m", "model_config": config})
    assert stub_priorities == []  # set up at the server's priority
    responder = TritonResponder(pb, "m")
    responder.loaded()
    assert stub_priorities == [7]
    responder.loaded()  # once per stub: nothing more to lower
    TritonResponder(pb, "other").loaded()
    assert stub_priorities == [7]
