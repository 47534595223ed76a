"""A stub's setup without the garbage collector (dispatch_service.serving.stub_gc): each
model's `model.py` pauses it before its imports, the adapter resumes it once the instance
is loaded, what the setup made frozen. Each case runs in a child process: a freeze is for
the life of the process, and this one's collector stays as it is."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import model_layout

UNIT_TESTS = Path(__file__).resolve().parents[1]

# The stub's steps, outside Triton: `triton_python_backend_utils` stood in by pb_stand_in,
# the model's `model.py` imported, `TritonPythonModel().initialize(args)` with its config;
# the collector's state read as the adapter says it is loaded, and once set up.
STUB = textwrap.dedent(
    """
    import gc, importlib.util, json, sys, types
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from pb_stand_in import FakePbUtils
    from dispatch_service.core.model_config import read_config_dict
    from dispatch_service.serving import responder

    model_py, config_path = Path(sys.argv[1]), Path(sys.argv[2])
    pb = FakePbUtils()
    module = types.ModuleType("triton_python_backend_utils")
    for name in ("Tensor", "TritonError", "InferenceResponse", "get_input_tensor_by_name"):
        setattr(module, name, getattr(pb, name))
    module.Logger, module.MetricFamily = pb.Logger, pb.MetricFamily
    sys.modules["triton_python_backend_utils"] = module

    seen = {}
    loaded = responder.TritonResponder.loaded

    def watched(self):
        seen["collector_on_while_setting_up"] = gc.isenabled()
        loaded(self)

    responder.TritonResponder.loaded = watched
    spec = importlib.util.spec_from_file_location("model", model_py)
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    seen["collector_on_after_import"] = gc.isenabled()
    name = model_py.parent.parent.name
    config = read_config_dict(config_path)
    args = {
        "model_config": json.dumps({**config, "name": name}),
        "model_name": name,
        "model_version": model_py.parent.name,
        "model_instance_name": f"{name}_0_0",
        "model_repository": str(model_py.parent.parent),
    }
    model.TritonPythonModel().initialize(args)
    seen["collector_on_once_loaded"] = gc.isenabled()
    seen["frozen"] = gc.get_freeze_count()
    print(json.dumps(seen))
    """
)


def set_up_like_a_stub(model: str) -> dict[str, object]:
    layout = model_layout(MODEL_REPOSITORY, model)
    done = subprocess.run(
        [sys.executable, "-c", STUB, str(layout.python_model(1)), str(layout.config), UNIT_TESTS],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    seen: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return seen


# One model of each kind of `model.py`: the rendered entry point, the three step adapters'
# shapes (a step, the scoring model) and the router.
@pytest.mark.parametrize(
    "model", ["dispatch_fused", "topk_resolver", "dispatch_model", "dispatch_router"]
)
def test_a_model_sets_up_without_the_collector_and_turns_it_back_on_once_loaded(
    model: str,
) -> None:
    seen = set_up_like_a_stub(model)
    assert seen["collector_on_after_import"] is True  # importing model.py changes nothing
    assert seen["collector_on_while_setting_up"] is False
    assert seen["collector_on_once_loaded"] is True
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 10_000  # the setup's objects


def in_child(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_resume_without_pause_changes_nothing() -> None:
    assert in_child(
        """
        import gc, json
        from dispatch_service.serving import stub_gc
        stub_gc.resume()
        print(json.dumps({"on": gc.isenabled(), "frozen": gc.get_freeze_count()}))
        """
    ) == {"on": True, "frozen": 0}


def test_pause_and_resume() -> None:
    assert in_child(
        """
        import gc, json
        from dispatch_service.serving import stub_gc
        stub_gc.pause()
        paused = [gc.isenabled(), stub_gc.paused()]
        stub_gc.resume()
        again = [gc.isenabled(), stub_gc.paused(), gc.get_freeze_count() > 0]
        stub_gc.resume()  # once only
        print(json.dumps({"paused": paused, "resumed": again, "on": gc.isenabled()}))
        """
    ) == {"paused": [False, True], "resumed": [True, False, True], "on": True}


def test_a_collector_someone_else_turned_off_stays_off() -> None:
    assert in_child(
        """
        import gc, json
        from dispatch_service.serving import stub_gc
        gc.disable()
        stub_gc.pause()
        stub_gc.resume()
        print(json.dumps({"on": gc.isenabled(), "frozen": gc.get_freeze_count()}))
        """
    ) == {"on": False, "frozen": 0}
