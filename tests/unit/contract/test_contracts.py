"""Every config.pbtxt and the ONNX graph agree with contracts.py, the one definition."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from tritonclient.grpc import model_config_pb2

import dispatch_contract.contracts as contracts
from dispatch_contract import TensorSpec
from dispatch_service.core.model_config import read_model_config
from dispatch_service.core.repository_layout import (
    DISPATCH_ENSEMBLE,
    ENCODER_MODEL,
    RESOLVER_MODEL,
    ROUTER_MODEL,
    SCORING_MODEL,
    model_layout,
    models_in,
)
from dispatch_service.core.settings import (
    load_settings,
    parameters_from_model_config,
    reject_unknown,
)
from dispatch_service.ops.entry_point_configs import ENTRY_POINTS
from dispatch_service.pipeline.onnx_runner import OrtSettings
from dispatch_service.pipeline.steps import FeatureEncoderStep, TopKResolverStep
from dispatch_service.routing.settings import (
    FUSED_MODEL_NAME,
    NODE_PARAMETERS,
    FusedSettings,
    RouterSettings,
)

REPO = Path(__file__).resolve().parents[3] / "model_repository"
SCORING = model_layout(REPO, SCORING_MODEL)
# The scoring model's two config files: config.pbtxt and the gpu profile's.
SCORING_CONFIGS = [SCORING.config, SCORING.profile("gpu")]


def _in_scoring_folder(path: Path) -> str:
    return path.relative_to(SCORING.folder).as_posix()


def load_config(path: Path) -> model_config_pb2.ModelConfig:
    config: model_config_pb2.ModelConfig = read_model_config(path)
    return config


def io_of(tensors: object) -> list[tuple[str, str, tuple[int, ...], bool]]:
    rows = []
    for t in tensors:  # type: ignore[attr-defined]
        dtype = model_config_pb2.DataType.Name(t.data_type).removeprefix("TYPE_")
        dtype = "BYTES" if dtype == "STRING" else dtype
        rows.append((t.name, dtype, tuple(t.dims), bool(getattr(t, "optional", False))))
    return rows


def spec_rows(specs: tuple[TensorSpec, ...], drop_batch: bool = False) -> list[object]:
    return [
        (s.name, s.triton_dtype, s.dims[1:] if drop_batch else s.dims, s.optional) for s in specs
    ]


def params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


@pytest.mark.parametrize("folder", sorted(p.name for p in REPO.iterdir() if p.is_dir()))
def test_folder_name_equals_model_name(folder: str) -> None:
    assert load_config(model_layout(REPO, folder).config).name == folder


WINDOW_LEVEL = (
    "feature_encoder",
    "dispatch_router",
    "topk_resolver",
    "dispatch_fused",
    "dispatch_priority",
    "dispatch",
    "dispatch_features",
)


@pytest.mark.parametrize("model", WINDOW_LEVEL)
def test_window_level_models_batch_one_window_per_request(model: str) -> None:
    """Contract v2: at most 9 tensors each way (8 in), max_batch_size > 0, ragged batching and
    dynamic batching on every Python model (an ensemble batches through its steps)."""
    config = load_config(model_layout(REPO, model).config)
    assert config.max_batch_size == contracts.MAX_WINDOW_BATCH
    # topk_resolver, an internal step, also takes the request's ORDER_IDS (its tie-break) and
    # what the ensemble's decision records need (ORDER_TEXT, WINDOW_CITY, WINDOW_FIELDS,
    # ORDER_FALLBACK_LEVEL): tensors between steps, none on the wire.
    extra = 5 if model == "topk_resolver" else 0
    assert len(config.input) <= contracts.MAX_WIRE_TENSORS + extra
    assert len(config.output) <= contracts.MAX_WIRE_TENSORS
    if config.platform == "ensemble":
        for step in config.ensemble_scheduling.step:
            step_config = load_config(model_layout(REPO, step.model_name).config)
            assert step_config.max_batch_size >= config.max_batch_size, step.model_name
        return
    assert config.HasField("dynamic_batching")
    for tensor in config.input:
        assert tensor.allow_ragged_batch == (-1 in tensor.dims), tensor.name


@pytest.mark.parametrize(
    "model", [m for m in WINDOW_LEVEL if m not in ("dispatch", "dispatch_features")]
)
def test_every_queue_is_bounded_with_deadlines_and_bulk_is_shed_first(model: str) -> None:
    """Priorities 2 standard (default), 3 bulk, and 1, which any caller may claim: it holds a
    few windows at most, so a flood of it is refused at once instead of starving level 2
    (the entitlement is the priority key, on the lane, which has no level 1: one place,
    expired at once, no override). Each level's queue is bounded and refuses at once
    (REJECT) after its timeout, which a caller may shorten or lengthen."""
    batching = load_config(model_layout(REPO, model).config).dynamic_batching
    assert batching.priority_levels == 3 and batching.default_priority_level == 2
    policies = {level: batching.priority_queue_policy[level] for level in (1, 2, 3)}
    open_level_one = all(e.open_level_one for e in ENTRY_POINTS if e.name == model)
    for level, policy in ((2, batching.default_queue_policy), *policies.items()):
        assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
        assert 0 < policy.max_queue_size <= 256
        assert 0 < policy.default_timeout_microseconds <= 5_000_000
        if level == 1 and not open_level_one:
            assert not policy.allow_timeout_override
            assert policy.max_queue_size == 1 and policy.default_timeout_microseconds == 1
        else:
            assert policy.allow_timeout_override
    assert policies[2] == batching.default_queue_policy
    sizes = [policies[level].max_queue_size for level in (1, 2, 3)]
    timeouts = [policies[level].default_timeout_microseconds for level in (1, 2, 3)]
    assert sizes[0] <= 4 and sizes[2] < sizes[1] and max(sizes) == sizes[1]
    assert timeouts[2] < timeouts[1]
    if open_level_one:
        assert timeouts == sorted(timeouts, reverse=True)


# Every config file of the repository: each model's config.pbtxt and its profiles.
CONFIG_FILES = [layout.config for layout in models_in(REPO)] + sorted(
    path for layout in models_in(REPO) for path in layout.profiles.glob("*.pbtxt")
)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda path: str(path.relative_to(REPO)))
def test_a_model_with_queue_policies_has_two_instances_or_more(path: Path) -> None:
    """Triton 2.51 with priority levels or a queue policy (either alone) waits for a free
    instance with a wake-up that can come before the instance is free, then sleeps up to
    0.5 s unless a new request arrives: a request waited ~0.5 s in an idle single instance's
    queue (1.5 % of sequential requests; none with plain dynamic batching), and under
    overload (a full queue admits no new request) the entry point needs four instances
    (docs/security.md). Another instance takes the next request meanwhile."""
    config = load_config(path)
    batching = config.dynamic_batching
    policies = (
        batching.priority_levels > 0
        or batching.HasField("default_queue_policy")
        or len(batching.priority_queue_policy) > 0
    )
    if policies:
        counts = [group.count for group in config.instance_group]
        least = 4 if config.name == FUSED_MODEL_NAME else 2
        assert counts and sum(counts) >= least, f"{path}: instance counts {counts}"


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda path: str(path.relative_to(REPO)))
def test_a_model_with_several_cpu_instances_names_one_warm_instance(path: Path) -> None:
    """Triton (run with --rate-limit=execution_count) gives a batch to the free instance with
    the fewest executions x priority: one instance of priority 1 and the others of a priority
    far above any execution count keep low load on the one warm instance."""
    groups = [g for g in load_config(path).instance_group if g.kind == g.KIND_CPU]
    if sum(group.count for group in groups) < 2:
        return
    warm, *overflow = groups
    assert (warm.count, warm.rate_limiter.priority) == (1, 1), f"{path}: first group {warm}"
    assert overflow, f"{path}: no overflow group"
    for group in overflow:
        assert group.rate_limiter.priority >= 1_000_000, f"{path}: overflow group {group}"
        assert not group.rate_limiter.resources, f"{path}: resources would rate-limit"
    assert not warm.rate_limiter.resources, f"{path}: resources would rate-limit"


def test_the_wire_column_layouts_are_documented_and_packed_in_order() -> None:
    assert contracts.ORDER_FIELDS.dims == (-1, len(contracts.ORDER_FIELD_COLUMNS))
    assert contracts.RIDER_FIELDS.dims == (-1, len(contracts.RIDER_FIELD_COLUMNS))
    assert contracts.WINDOW_FIELDS.dims == (len(contracts.WINDOW_FIELD_COLUMNS),)
    assert contracts.TOPK_OBJECTIVES.dims[-1] == len(contracts.TOPK_OBJECTIVE_COLUMNS)
    assert contracts.TOPK_OBJECTIVE_COLUMNS[1:] == tuple(
        name.replace("_cny", "") for name in contracts.OBJECTIVES
    )
    window = {
        "ORDER_IDS": np.array([b"o1", b"o2"], dtype=object),
        "ORDER_USER_IDS": np.array([b"u1", b"u2"], dtype=object),
        "ORDER_PICKUP": np.array([[31.0, 121.0], [31.5, 121.5]]),
        "ORDER_DROPOFF": np.array([[32.0, 122.0], [32.5, 122.5]]),
        "ORDER_CREATED_AT": np.array([100, 200], dtype=np.int64),
        "ORDER_PROMISED_MINUTES": np.array([30, 45], dtype=np.float32),
        "ORDER_CONSTRAINTS": np.array([1, 8], dtype=np.int32),
        "RIDER_IDS": np.array([b"r1"], dtype=object),
        "RIDER_POSITION": np.array([[31.1, 121.1]]),
        "RIDER_LOAD": np.array([2], dtype=np.int32),
        "RIDER_CAPACITY": np.array([3], dtype=np.int32),
        "RIDER_VEHICLE": np.array([1], dtype=np.int32),
        "RIDER_EQUIPMENT": np.array([1], dtype=np.int32),
        "COORD_SYSTEM": np.array([b"GCJ02"], dtype=object),
        "DISPATCH_TIME": np.array([300], dtype=np.int64),
    }
    wire = contracts.pack_window(window)
    assert set(wire) == {spec.name for spec in contracts.WIRE_WINDOW_INPUTS if not spec.optional}
    # hand-written rows, in the documented column order
    assert wire["ORDER_FIELDS"].tolist() == [
        [31.0, 121.0, 32.0, 122.0, 100.0, 30.0, 1.0],
        [31.5, 121.5, 32.5, 122.5, 200.0, 45.0, 8.0],
    ]
    assert wire["RIDER_FIELDS"].tolist() == [[31.1, 121.1, 2.0, 3.0, 1.0, 1.0]]
    assert wire["WINDOW_FIELDS"].tolist() == [300.0, 1.0]
    assert contracts.batched(wire)["ORDER_FIELDS"].shape == (1, 2, 7)
    assert contracts.wire_shape(contracts.ORDER_FIELDS) == "[1, *, 7]"


def test_feature_encoder_declares_the_window_and_encoder_outputs() -> None:
    config = load_config(model_layout(REPO, ENCODER_MODEL).config)
    assert io_of(config.input) == spec_rows(contracts.ENCODER_INPUTS)
    assert io_of(config.output) == spec_rows(contracts.ENCODER_OUTPUTS)
    FeatureEncoderStep.from_parameters(params(config))


def test_topk_resolver_declares_its_inputs_and_the_dispatch_outputs() -> None:
    config = load_config(model_layout(REPO, RESOLVER_MODEL).config)
    assert [row[0] for row in io_of(config.input)] == list(TopKResolverStep.input_names)
    assert io_of(config.input) == spec_rows(contracts.RESOLVER_INPUTS)
    assert io_of(config.output) == spec_rows(contracts.RESOLVER_OUTPUTS)
    TopKResolverStep.from_parameters(params(config))


@pytest.mark.parametrize("config_file", SCORING_CONFIGS, ids=_in_scoring_folder)
def test_both_dispatch_model_profiles_declare_the_same_tensors(config_file: Path) -> None:
    config = load_config(config_file)
    assert config.name == "dispatch_model"
    assert config.max_batch_size >= contracts.MAX_PAIRS
    assert config.HasField("dynamic_batching")
    assert io_of(config.input) == spec_rows(contracts.MODEL_INPUTS, drop_batch=True)
    assert io_of(config.output) == spec_rows(contracts.MODEL_OUTPUTS, drop_batch=True)


def test_profiles_differ_only_in_how_the_model_runs() -> None:
    cpu = load_config(model_layout(REPO, SCORING_MODEL).config)
    gpu = load_config(model_layout(REPO, SCORING_MODEL).profile("gpu"))
    assert cpu.backend == "python"
    assert gpu.backend == "onnxruntime"
    assert [g.kind for g in gpu.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]
    assert cpu.version_policy == gpu.version_policy
    reject_unknown(params(cpu), OrtSettings)
    load_settings(OrtSettings, params(cpu))


def test_ensemble_chains_the_three_steps_over_the_contract() -> None:
    config = load_config(model_layout(REPO, DISPATCH_ENSEMBLE).config)
    assert config.platform == "ensemble"
    ensemble_inputs = contracts.declared_by_ensemble(contracts.DISPATCH_ENSEMBLE_INPUTS)
    assert io_of(config.input) == spec_rows(ensemble_inputs)
    assert io_of(config.output) == spec_rows(contracts.DISPATCH_ENSEMBLE_OUTPUTS)
    steps = [step.model_name for step in config.ensemble_scheduling.step]
    assert steps == ["feature_encoder", "dispatch_router", "topk_resolver"]
    available = {t.name for t in config.input}
    for step in config.ensemble_scheduling.step:
        step_config = load_config(model_layout(REPO, step.model_name).config)
        declared = {t.name for t in step_config.input}
        assert set(step.input_map) <= declared
        required = {t.name for t in step_config.input if not t.optional}
        assert required <= set(step.input_map), step.model_name
        assert set(step.input_map.values()) <= available, step.model_name
        assert set(step.output_map) == {t.name for t in step_config.output}
        available |= set(step.output_map.values())
    assert {t.name for t in config.output} <= available


SERVED_VERSIONS = (1, 2)


def test_router_declares_the_routing_contract_and_valid_settings() -> None:
    config = load_config(model_layout(REPO, ROUTER_MODEL).config)
    assert config.backend == "python"
    assert io_of(config.input) == spec_rows(contracts.ROUTER_INPUTS)
    assert io_of(config.output) == spec_rows(contracts.ROUTER_OUTPUTS)
    settings = RouterSettings.from_parameters(params(config))
    # Before a fleet revision: version 1 serves everyone, version 2 is the canary at 0 %.
    assert (settings.stable_version, settings.canary_version) == SERVED_VERSIONS
    assert settings.canary_percent == 0
    assert settings.city_routes == ()  # every city routes alike until a deploy --city
    # The city the router routes a window by is the one the encoder found (WINDOW_CITY).
    (city,) = (spec for spec in contracts.ROUTER_INPUTS if spec.name == "WINDOW_CITY")
    assert city.optional and contracts.WINDOW_CITY in contracts.ENCODER_OUTPUTS


@pytest.mark.parametrize("config_file", SCORING_CONFIGS, ids=_in_scoring_folder)
def test_both_profiles_serve_versions_1_and_2_side_by_side(config_file: Path) -> None:
    config = load_config(config_file)
    assert tuple(config.version_policy.specific.versions) == SERVED_VERSIONS
    for version in SERVED_VERSIONS:
        folder = SCORING.version(version)
        for path in (
            SCORING.onnx(version),
            SCORING.python_model(version),
            folder / "feature_layout.json",
            folder / "model_card.json",
        ):
            assert path.is_file(), str(path)
    v1, v2 = ((model_layout(REPO, SCORING_MODEL).python_model(v)).read_text() for v in (1, 2))
    assert v1 == v2, "every version runs the same adapter"


@pytest.mark.parametrize("version", SERVED_VERSIONS)
def test_onnx_graph_matches_the_contract(version: int) -> None:
    model = onnx.load(str(model_layout(REPO, SCORING_MODEL).onnx(version)))
    onnx.checker.check_model(model)
    (graph_in,) = model.graph.input
    (graph_out,) = model.graph.output
    assert graph_in.name == contracts.PAIR_FEATURES.name
    assert graph_out.name == contracts.PAIR_OBJECTIVES.name
    in_dims = graph_in.type.tensor_type.shape.dim
    out_dims = graph_out.type.tensor_type.shape.dim
    assert in_dims[0].dim_param  # dynamic batch
    assert in_dims[1].dim_value == contracts.NUM_PAIR_FEATURES
    assert out_dims[1].dim_value == len(contracts.OBJECTIVES)
    assert graph_in.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert max(op.version for op in model.opset_import if op.domain in ("", "ai.onnx")) >= 17


@pytest.mark.parametrize("version", SERVED_VERSIONS)
def test_feature_layout_shipped_with_the_model_matches(version: int) -> None:
    folder = SCORING.version(version)
    layout = json.loads((folder / "feature_layout.json").read_text())
    assert layout["version"] == contracts.FEATURE_LAYOUT_VERSION
    assert tuple(layout["features"]) == contracts.PAIR_FEATURE_NAMES
    # Trained on the features the served encoder computes (zone precision, candidates, local
    # time): a version trained under other settings would score features it never saw.
    config = load_config(model_layout(REPO, ENCODER_MODEL).config)
    encoder = FeatureEncoderStep.from_parameters(params(config)).encoder
    assert layout["encoder_settings"] == dataclasses.asdict(encoder)


def test_parameters_from_model_config_reads_string_values() -> None:
    config = {"parameters": {"top_k": {"string_value": "7"}}}
    assert parameters_from_model_config(json.dumps(config)) == {"top_k": "7"}


@pytest.mark.parametrize(
    ("ensemble", "specs"),
    [
        ("dispatch", contracts.DISPATCH_ENSEMBLE_INPUTS),
        (contracts.FEATURE_ENTRY_MODEL_NAME, contracts.FEATURE_ENTRY_INPUTS),
    ],
)
def test_every_input_a_client_must_send_is_required_by_a_step_of_the_ensemble(
    ensemble: str, specs: tuple[TensorSpec, ...]
) -> None:
    """The ensemble declares all inputs optional (declared_by_ensemble), so what refuses a
    missing one by name is the step that requires it: each required tensor needs one."""
    config = load_config(model_layout(REPO, ensemble).config)
    required_by_steps = set()
    for step in config.ensemble_scheduling.step:
        step_config = load_config(model_layout(REPO, step.model_name).config)
        required = {t.name for t in step_config.input if not t.optional}
        required_by_steps |= {outer for inner, outer in step.input_map.items() if inner in required}
    must_send = {spec.name for spec in specs if not spec.optional}
    assert must_send <= required_by_steps
    assert [t.name for t in config.input if not t.optional] == []


def test_an_ensemble_declares_the_same_tensors_all_optional() -> None:
    declared = contracts.declared_by_ensemble(contracts.DISPATCH_ENSEMBLE_INPUTS)
    for spec, as_declared in zip(contracts.DISPATCH_ENSEMBLE_INPUTS, declared, strict=True):
        assert (as_declared.name, as_declared.triton_dtype) == (spec.name, spec.triton_dtype)
        assert as_declared.dims == spec.dims and as_declared.optional
    # What a client must send is unchanged.
    assert [s.name for s in contracts.DISPATCH_ENSEMBLE_INPUTS if not s.optional] == [
        "ORDER_IDS", "ORDER_TEXT", "ORDER_FIELDS", "RIDER_IDS", "RIDER_FIELDS", "WINDOW_FIELDS",
    ]  # fmt: skip


def _assert_steps_chain(config: model_config_pb2.ModelConfig) -> set[str]:
    """Every step reads only tensors available before it; returns all tensors produced."""
    available = {t.name for t in config.input}
    for step in config.ensemble_scheduling.step:
        step_config = load_config(model_layout(REPO, step.model_name).config)
        declared = {t.name for t in step_config.input}
        assert set(step.input_map) <= declared, step.model_name
        required = {t.name for t in step_config.input if not t.optional}
        assert required <= set(step.input_map), step.model_name
        assert set(step.input_map.values()) <= available, step.model_name
        assert set(step.output_map) == {t.name for t in step_config.output}, step.model_name
        available |= set(step.output_map.values())
    return available


def test_feature_entry_ensemble_declares_the_feature_contract() -> None:
    config = load_config(model_layout(REPO, contracts.FEATURE_ENTRY_MODEL_NAME).config)
    assert config.name == contracts.FEATURE_ENTRY_MODEL_NAME
    assert config.platform == "ensemble"
    ensemble_inputs = contracts.declared_by_ensemble(contracts.FEATURE_ENTRY_INPUTS)
    assert io_of(config.input) == spec_rows(ensemble_inputs)
    assert io_of(config.output) == spec_rows(contracts.FEATURE_ENTRY_OUTPUTS)
    assert {t.name for t in config.output} <= _assert_steps_chain(config)


def test_feature_entry_skips_only_the_encoder_of_dispatch() -> None:
    features, candidates, *rest = contracts.FEATURE_ENTRY_INPUTS
    assert features.name == contracts.PAIR_FEATURES.name
    assert (features.triton_dtype, features.dims) == ("FP32", (-1, contracts.NUM_PAIR_FEATURES))
    assert candidates == contracts.CANDIDATE_RIDER_INDEX
    window = {spec.name: spec for spec in contracts.WIRE_DISPATCH_INPUTS}
    for spec in rest:  # everything else is a tensor `dispatch` takes, declared the same
        declared = window[spec.name]
        assert (spec.triton_dtype, spec.dims) == (declared.triton_dtype, declared.dims)
        # only the orders' creation times (ORDER_FIELDS) are optional here
        assert spec.optional == (declared.optional or spec.name == "ORDER_FIELDS"), spec.name
    dispatch = load_config(model_layout(REPO, DISPATCH_ENSEMBLE).config)
    entry = load_config(model_layout(REPO, contracts.FEATURE_ENTRY_MODEL_NAME).config)
    # `dispatch`'s answer without what only the encoder knows (how the points were found,
    # the city that served the window)
    located, city = contracts.ORDER_LOCATION_SOURCE.name, contracts.WINDOW_CITY.name
    assert list(entry.output) == [o for o in dispatch.output if o.name not in (located, city)]
    # the steps after the encoder, mapped exactly as in `dispatch`, but for the order ids
    # `dispatch` hands its resolver as the tie-break between orders (a feature-entry request
    # carries none: its orders are rows) and the window's city its router (none either: the
    # global routing settings)
    after_encoder = list(dispatch.ensemble_scheduling.step)[1:]
    router, resolver = after_encoder
    assert router.model_name == "dispatch_router"
    assert router.input_map.pop(city) == city
    assert resolver.model_name == "topk_resolver"
    assert resolver.input_map.pop("ORDER_IDS") == "ORDER_IDS"
    # nor what the decision records need (a feature-entry window has no decision time)
    for name in ("ORDER_TEXT", city, "WINDOW_FIELDS", "ORDER_FALLBACK_LEVEL"):
        assert resolver.input_map.pop(name) == name
    assert list(entry.ensemble_scheduling.step) == after_encoder
    encoder = dispatch.ensemble_scheduling.step[0]
    assert encoder.model_name == "feature_encoder"
    assert set(encoder.output_map.values()) == {features.name, candidates.name, located, city}


def test_fused_entry_declares_what_dispatch_declares() -> None:
    fused = load_config(model_layout(REPO, FUSED_MODEL_NAME).config)
    dispatch = load_config(model_layout(REPO, DISPATCH_ENSEMBLE).config)
    assert fused.backend == "python"
    assert fused.max_batch_size == dispatch.max_batch_size
    assert io_of(fused.input) == spec_rows(contracts.DISPATCH_ENSEMBLE_INPUTS)
    # The same tensors as the ensemble (which never batches itself); only the ensemble
    # declares its required ones optional (contracts.declared_by_ensemble).
    assert [row[:3] for row in io_of(fused.input)] == [row[:3] for row in io_of(dispatch.input)]
    assert list(fused.output) == list(dispatch.output)
    settings = FusedSettings.from_parameters(params(fused))
    router = RouterSettings.from_parameters(
        params(load_config(model_layout(REPO, ROUTER_MODEL).config))
    )
    assert settings.routing == router
    assert settings.scoring_model == "dispatch_model"
    # Before a fleet revision both route by the initial routing, whose every version the
    # scoring model serves in every profile.
    for path in SCORING.folder.glob("**/*.pbtxt"):
        policy = load_config(path).version_policy.specific.versions
        assert set(settings.served_versions()) <= set(policy), path
    for version in settings.served_versions():
        assert (model_layout(REPO, settings.scoring_model).onnx(version)).is_file()


ROUTING_PARAMETERS = sorted(
    {f.name for f in dataclasses.fields(RouterSettings)} - set(NODE_PARAMETERS)
)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda path: str(path.relative_to(REPO)))
def test_no_model_config_routes(path: Path) -> None:
    """Routing is a fleet revision's (docs/fleet.md): no config names a routing field."""
    assert set(params(load_config(path))).isdisjoint(ROUTING_PARAMETERS), path
