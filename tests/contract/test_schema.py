"""The annotation contract: round trip, bad values, and the original design's plain reader."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_contract.schema import (
    DEFAULT_KEYS,
    DEFAULT_PREFIX,
    MAX_HEALTH_DETAIL_CHARS,
    MAX_PER_GPU_VALUES,
    SCHEMA_VERSION,
    DecodedAnnotations,
    Field,
    GpuState,
    Health,
    Keys,
    NodeGpuState,
    PrefixError,
    decode,
    encode,
    merge_patch,
    normalize_model_name,
    parse_timestamp,
)

T0 = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)
K = DEFAULT_KEYS


def _state(**kwargs: object) -> NodeGpuState:
    base: dict[str, object] = {
        "health": Health.OK,
        "updated_at": T0,
        "utilization": 0.42,
        "utilization_max": 0.80,
        "memory_fragmentation": 0.25,
        "memory_free_mib": 300_000,
        "memory_largest_free_mib": 70_000,
        "temperature_c": 61,
        "gpu_model": "NVIDIA-A100-SXM4-80GB",
        "gpu_count": 8,
    }
    base.update(kwargs)
    return NodeGpuState(**base)  # type: ignore[arg-type]


_FRACTION = st.one_of(st.none(), st.floats(0, 1))
_COUNT = st.one_of(st.none(), st.integers(0, 10**7))
_GPUS = st.lists(
    st.builds(
        GpuState,
        utilization=_FRACTION,
        memory_free_mib=_COUNT,
        temperature_c=st.one_of(st.none(), st.integers(-40, 200)),
        allocated=st.one_of(st.none(), st.booleans()),
        dra_device=st.one_of(st.none(), st.sampled_from(["gpu-0", "gpu-12", "gpu-0-mig-9-0-1"])),
    ),
    max_size=10,
).map(tuple)
_STATES_WITHOUT_GPUS = st.builds(
    NodeGpuState,
    health=st.sampled_from(list(Health)),
    updated_at=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
    utilization=_FRACTION,
    utilization_max=_FRACTION,
    memory_fragmentation=_FRACTION,
    memory_free_mib=_COUNT,
    memory_largest_free_mib=_COUNT,
    temperature_c=st.one_of(st.none(), st.integers(-40, 200)),
    gpu_model=st.one_of(st.none(), st.sampled_from(["NVIDIA-H100-80GB-HBM3", "mixed", "Tesla-T4"])),
    gpu_count=st.one_of(st.none(), st.integers(0, 16)),
    health_detail=st.one_of(st.none(), st.text(min_size=1, max_size=300)),
)
# What the agent writes: a per-GPU table as long as gpu-count (or no gpu-count at all).
_STATES = (
    st.builds(
        lambda state, gpus, counted: replace(
            state, gpus=gpus, gpu_count=len(gpus) if counted else None
        ),
        _STATES_WITHOUT_GPUS,
        _GPUS,
        st.booleans(),
    )
    | _STATES_WITHOUT_GPUS
)


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 0.005 + 1e-9


def _assert_same_gpus(back: tuple[GpuState, ...], sent: tuple[GpuState, ...]) -> None:
    """Per GPU and field; a column no GPU measured is not written, so it reads back unknown."""
    if not back:
        # Device names alone are no reading: without a measured column there is no table.
        assert all(v is None for g in sent for v in g[:4])
        return
    assert len(back) == len(sent)
    for got, want in zip(back, sent, strict=True):
        assert _close(got.utilization, want.utilization)
        assert (got.memory_free_mib, got.temperature_c, got.allocated, got.dra_device) == (
            want.memory_free_mib,
            want.temperature_c,
            want.allocated,
            want.dra_device,
        )


@settings(max_examples=200)
@given(_STATES)
def test_round_trip(state: NodeGpuState) -> None:
    decoded = decode(encode(state))
    assert decoded.problems == ()
    assert decoded.schema_version == SCHEMA_VERSION
    back = decoded.state
    assert back is not None
    assert back.health is state.health
    assert back.updated_at == state.updated_at.replace(microsecond=0)
    for name in ("utilization", "utilization_max", "memory_fragmentation"):
        assert _close(getattr(back, name), getattr(state, name)), name
    for name in ("memory_free_mib", "memory_largest_free_mib", "temperature_c", "gpu_count"):
        assert getattr(back, name) == getattr(state, name), name
    assert back.gpu_model == state.gpu_model
    _assert_same_gpus(back.gpus, state.gpus)
    if state.health is Health.OK or not state.health_detail or not state.health_detail.strip():
        assert not back.health_detail
    else:
        assert back.health_detail is not None
        assert len(back.health_detail) <= MAX_HEALTH_DETAIL_CHARS


@given(_STATES)
def test_encode_values_are_plain_strings_under_the_prefix(state: NodeGpuState) -> None:
    annotations = encode(state)
    assert all(key.startswith(DEFAULT_PREFIX) for key in annotations)
    assert all(isinstance(value, str) for value in annotations.values())
    for f in (Field.UTILIZATION, Field.UTILIZATION_MAX, Field.MEMORY_FRAGMENTATION):
        value = annotations.get(K[f])
        if value is not None:
            assert len(value) == 4
            assert "e" not in value.lower()  # no exponent, ever


@given(_STATES)
def test_original_design_reader_works_on_what_encode_writes(state: NodeGpuState) -> None:
    """The first design's reader: float(utilization) and score (1 - u) x 100."""
    annotations = encode(state)
    text = annotations.get(DEFAULT_PREFIX + "utilization")
    if state.utilization is None:
        assert text is None  # unmeasured: omitted, never written as 0
        return
    assert text is not None
    utilization = float(text)
    score = (1 - utilization) * 100
    assert math.isfinite(score)
    assert 0.0 <= score <= 100.0


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(0.0, "0.00", id="zero"),
        pytest.param(1e-9, "0.00", id="tiny-no-exponent"),
        pytest.param(0.005, "0.01", id="half-hundredth"),
        pytest.param(0.42, "0.42", id="plain"),
        pytest.param(1.0, "1.00", id="one"),
        pytest.param(1.2, "1.00", id="above-one-clamped"),
        pytest.param(-0.3, "0.00", id="negative-clamped"),
    ],
)
def test_fraction_formatting(value: float, text: str) -> None:
    annotations = encode(_state(utilization=value))
    assert annotations[K[Field.UTILIZATION]] == text


def test_updated_at_is_rfc3339_utc_seconds() -> None:
    moment = datetime(2026, 11, 30, 15, 19, 24, 987_000, tzinfo=UTC) + timedelta(0)
    annotations = encode(_state(updated_at=moment))
    assert annotations[K[Field.UPDATED_AT]] == "2026-11-30T15:19:24Z"


def test_unmeasured_fields_are_omitted() -> None:
    annotations = encode(
        NodeGpuState(health=Health.UNAVAILABLE, updated_at=T0, health_detail="nvml: driver lost")
    )
    assert set(annotations) == {
        K[Field.HEALTH],
        K[Field.HEALTH_DETAIL],
        K[Field.UPDATED_AT],
        K[Field.SCHEMA_VERSION],
    }


def test_health_detail_only_when_not_ok() -> None:
    assert K[Field.HEALTH_DETAIL] not in encode(_state(health_detail="something"))
    degraded = encode(_state(health=Health.DEGRADED, health_detail="gpu 3:\n lost"))
    assert degraded[K[Field.HEALTH_DETAIL]] == "gpu 3: lost"


BAD_VALUES = [
    pytest.param(Field.UTILIZATION, "nan", id="utilization-nan"),
    pytest.param(Field.UTILIZATION, "NaN", id="utilization-NaN"),
    pytest.param(Field.UTILIZATION, "inf", id="utilization-inf"),
    pytest.param(Field.UTILIZATION, "-inf", id="utilization-minus-inf"),
    pytest.param(Field.UTILIZATION, "-0.01", id="utilization-negative"),
    pytest.param(Field.UTILIZATION, "1.01", id="utilization-above-one"),
    pytest.param(Field.UTILIZATION, "42%", id="utilization-percent"),
    pytest.param(Field.UTILIZATION, "", id="utilization-empty"),
    pytest.param(Field.UTILIZATION_MAX, "2", id="utilization-max-above-one"),
    pytest.param(Field.MEMORY_FRAGMENTATION, "nan", id="fragmentation-nan"),
    pytest.param(Field.MEMORY_FREE_MIB, "-5", id="memory-negative"),
    pytest.param(Field.MEMORY_FREE_MIB, "1.5", id="memory-fraction"),
    pytest.param(Field.MEMORY_LARGEST_FREE_MIB, "40Gi", id="memory-unit"),
    pytest.param(Field.MEMORY_LARGEST_FREE_MIB, "٤٠", id="memory-non-ascii-digits"),
    pytest.param(Field.TEMPERATURE, "61.5", id="temperature-fraction"),
    pytest.param(Field.TEMPERATURE, "hot", id="temperature-word"),
    pytest.param(Field.TEMPERATURE, "99999", id="temperature-absurd"),
    pytest.param(Field.GPU_COUNT, "eight", id="count-word"),
]


@pytest.mark.parametrize(("bad_field", "text"), BAD_VALUES)
def test_a_bad_value_drops_that_field_alone(bad_field: Field, text: str) -> None:
    annotations = encode(_state())
    annotations[K[bad_field]] = text
    decoded = decode(annotations)
    assert decoded.state is not None
    assert f"{bad_field.value} invalid" in decoded.problems
    attribute = {
        Field.UTILIZATION: "utilization",
        Field.UTILIZATION_MAX: "utilization_max",
        Field.MEMORY_FRAGMENTATION: "memory_fragmentation",
        Field.MEMORY_FREE_MIB: "memory_free_mib",
        Field.MEMORY_LARGEST_FREE_MIB: "memory_largest_free_mib",
        Field.TEMPERATURE: "temperature_c",
        Field.GPU_COUNT: "gpu_count",
    }[bad_field]
    assert getattr(decoded.state, attribute) is None
    assert decoded.state.gpu_model == "NVIDIA-A100-SXM4-80GB"  # the rest stays usable


WHOLE_RECORD = [
    pytest.param({}, "no gpu annotations", id="no-annotations"),
    pytest.param({"other.io/x": "1"}, "no gpu annotations", id="only-foreign-keys"),
    pytest.param({K[Field.SCHEMA_VERSION]: "2"}, "unknown schema-version '2'", id="version-2"),
    pytest.param({K[Field.SCHEMA_VERSION]: "v1"}, "unknown schema-version 'v1'", id="version-v1"),
    pytest.param({K[Field.UPDATED_AT]: None}, "updated-at missing", id="updated-at-absent"),
    pytest.param({K[Field.UPDATED_AT]: "soon"}, "updated-at unparsable", id="updated-at-word"),
    pytest.param(
        {K[Field.UPDATED_AT]: "2026-11-30T14:00:00"}, "updated-at unparsable",
        id="updated-at-without-offset",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "problem"), WHOLE_RECORD)
def test_record_level_problems_make_the_data_missing(
    changes: dict[str, str | None], problem: str
) -> None:
    annotations = encode(_state()) if changes and all(k in K.by_key for k in changes) else {}
    for key, value in changes.items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    decoded = decode(annotations)
    assert decoded.state is None
    assert decoded.problems == (problem,)


def test_original_design_record_without_version_reads_as_version_1() -> None:
    # What a writer of the original design put on a Node (as in the real scheduler captures).
    decoded = decode({K[Field.UTILIZATION]: "0.95", K[Field.UPDATED_AT]: "2026-11-30T13:59:11Z"})
    assert decoded.state is not None
    assert decoded.state.utilization == 0.95
    assert decoded.state.health is Health.OK
    assert decoded.problems == ("schema-version missing (read as 1)",)


def test_version_absent_and_updated_at_absent_is_missing() -> None:
    decoded = decode({K[Field.UTILIZATION]: "0.95"})
    assert decoded.state is None
    assert decoded.problems == ("schema-version missing (read as 1)", "updated-at missing")


def test_health_missing_reads_as_degraded() -> None:
    annotations = encode(_state())
    del annotations[K[Field.HEALTH]]
    decoded = decode(annotations)
    assert decoded.state is not None
    assert decoded.state.health is Health.DEGRADED
    assert "health missing" in decoded.problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2026-11-30T14:00:00Z", T0, id="zulu"),
        pytest.param("2026-11-30t14:00:00z", T0, id="lowercase"),
        pytest.param("2026-11-30T15:00:00+01:00", T0, id="offset"),
        pytest.param("2026-11-30T14:00:00.5Z", T0 + timedelta(milliseconds=500), id="fraction"),
        pytest.param("2026-11-30 14:00:00Z", None, id="space-separator"),
        pytest.param("2026-11-30T14:00:00", None, id="naive"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_timestamp(text: str, expected: datetime | None) -> None:
    assert parse_timestamp(text) == expected


_CONTRACT_KEYS = st.sampled_from([K[f] for f in Field])
_ANNOTATIONS = st.dictionaries(
    st.one_of(_CONTRACT_KEYS, st.text(max_size=40)),
    st.one_of(
        st.sampled_from(["1", "0.5", "nan", "ok", "2026-11-30T14:00:00Z", "-7", " 12 "]),
        st.text(max_size=60),
    ),
    max_size=16,
)


@settings(max_examples=300)
@given(_ANNOTATIONS)
def test_decode_never_raises(annotations: dict[str, str]) -> None:
    decoded = decode(annotations)
    assert isinstance(decoded, DecodedAnnotations)
    state = decoded.state
    if state is not None:
        for value in (state.utilization, state.utilization_max, state.memory_fragmentation):
            assert value is None or (math.isfinite(value) and 0.0 <= value <= 1.0)
        for count in (state.memory_free_mib, state.memory_largest_free_mib, state.gpu_count):
            assert count is None or count >= 0
        assert state.updated_at.tzinfo is not None


@settings(max_examples=100)
@given(_ANNOTATIONS)
def test_decode_never_raises_with_a_valid_version(annotations: dict[str, str]) -> None:
    annotations[K[Field.SCHEMA_VERSION]] = "1"
    annotations.setdefault(K[Field.UPDATED_AT], "2026-11-30T14:00:00Z")
    assert isinstance(decode(annotations), DecodedAnnotations)


# Inputs at the edges of Python's int and datetime parsers: decode's promise is a dropped field
# or a missing record, never an exception.
EXTREME_VALUES = [
    pytest.param(Field.MEMORY_FREE_MIB, "9" * 5000, id="count-longer-than-int-digit-limit"),
    pytest.param(Field.UPDATED_AT, "0001-01-01T00:00:00+01:00", id="timestamp-before-year-1-utc"),
    pytest.param(Field.UPDATED_AT, "9999-12-31T23:59:59-01:00", id="timestamp-after-9999-utc"),
]


@pytest.mark.parametrize(("bad_field", "text"), EXTREME_VALUES)
def test_decode_contains_extreme_values(bad_field: Field, text: str) -> None:
    annotations = encode(_state())
    annotations[K[bad_field]] = text
    decoded = decode(annotations)
    assert decoded.problems


def test_merge_patch_deletes_unmeasured_and_stale_keys_only() -> None:
    annotations = encode(_state(temperature_c=None))
    current = {K[Field.TEMPERATURE]: "60", DEFAULT_PREFIX + "old-key": "x", "other.io/a": "b"}
    body = merge_patch(annotations, current=current)["metadata"]["annotations"]
    assert body[K[Field.TEMPERATURE]] is None
    assert body[DEFAULT_PREFIX + "old-key"] is None
    assert "other.io/a" not in body
    assert body[K[Field.UTILIZATION]] == "0.42"


@pytest.mark.parametrize(
    ("prefix", "normalized"),
    [
        pytest.param("gpu.acme.io", "gpu.acme.io/", id="adds-slash"),
        pytest.param("gpu.acme.io/", "gpu.acme.io/", id="keeps-slash"),
    ],
)
def test_prefix_normalized(prefix: str, normalized: str) -> None:
    assert Keys.for_prefix(prefix).prefix == normalized


@pytest.mark.parametrize("prefix", ["", "/", "GPU.acme.io", "gpu_acme.io", "-gpu.io", "a" * 254])
def test_bad_prefix_rejected(prefix: str) -> None:
    with pytest.raises(PrefixError, match="DNS subdomain"):
        Keys.for_prefix(prefix)


def test_model_name_normalized_like_the_node_label() -> None:
    assert normalize_model_name(" NVIDIA  A100-SXM4-80GB ") == "NVIDIA-A100-SXM4-80GB"


def test_encode_never_turns_nan_into_a_number() -> None:
    annotations = encode(_state(utilization=float("nan")))
    assert K[Field.UTILIZATION] not in annotations


# ---------------------------------------------------------------------------- per-GPU keys

PER_GPU_STATE = _state(
    gpu_count=4,
    gpus=(
        GpuState(0.12, 81251, 54, True),
        GpuState(0.95, 1024, 71, True),
        GpuState(None, None, None, None),
        GpuState(0.0, 80000, 49, False),
    ),
)


def test_per_gpu_values_are_short_readable_lists() -> None:
    annotations = encode(PER_GPU_STATE)
    assert annotations[K[Field.PER_GPU_UTILIZATION]] == "0.12,0.95,-,0.00"
    assert annotations[K[Field.PER_GPU_MEMORY_FREE_MIB]] == "81251,1024,-,80000"
    assert annotations[K[Field.PER_GPU_TEMPERATURE]] == "54,71,-,49"
    assert annotations[K[Field.PER_GPU_ALLOCATED]] == "1,1,-,0"


def test_dra_device_names_are_published_per_gpu_and_read_back() -> None:
    named = replace(
        PER_GPU_STATE,
        gpus=tuple(
            g._replace(dra_device=name)
            for g, name in zip(PER_GPU_STATE.gpus, ["gpu-3", "gpu-1", None, "gpu-0"], strict=True)
        ),
    )
    annotations = encode(named)
    assert annotations[K[Field.PER_GPU_DRA_DEVICE]] == "gpu-3,gpu-1,-,gpu-0"
    assert K[Field.PER_GPU_DRA_DEVICE] not in encode(PER_GPU_STATE)
    decoded = decode(annotations)
    assert decoded.state is not None
    assert decoded.problems == ()
    assert [g.dra_device for g in decoded.state.gpus] == ["gpu-3", "gpu-1", None, "gpu-0"]


def test_a_dra_device_name_that_is_no_dns_label_is_dropped_alone() -> None:
    annotations = encode(PER_GPU_STATE)
    annotations[K[Field.PER_GPU_DRA_DEVICE]] = "gpu-0,GPU 1,gpu-2,-"
    decoded = decode(annotations)
    assert decoded.state is not None
    assert "per-gpu-dra-device invalid on gpu 1" in decoded.problems
    assert [g.dra_device for g in decoded.state.gpus] == ["gpu-0", None, "gpu-2", None]
    # The writer never writes one: a name that could break the list is written as unknown.
    odd = replace(PER_GPU_STATE, gpus=(PER_GPU_STATE.gpus[0]._replace(dra_device="a,b"),) * 4)
    assert K[Field.PER_GPU_DRA_DEVICE] not in encode(odd)


def test_dra_device_names_alone_are_no_per_gpu_table() -> None:
    annotations = encode(_state(gpu_count=2))
    annotations[K[Field.PER_GPU_DRA_DEVICE]] = "gpu-0,gpu-1"
    decoded = decode(annotations)
    assert decoded.state is not None
    assert decoded.state.gpus == ()


def test_eight_gpus_stay_readable_in_describe_output() -> None:
    gpus = tuple(GpuState(0.99, 143771, 100, True) for _ in range(8))
    annotations = encode(_state(gpu_count=8, gpus=gpus))
    per_gpu = [v for k, v in annotations.items() if "per-gpu-" in k]
    assert max(len(v) for v in per_gpu) <= 8 * 7 - 1


@pytest.mark.parametrize(
    ("state", "absent"),
    [
        pytest.param(_state(), list(Field)[-4:], id="no-table"),
        pytest.param(
            _state(gpu_count=2, gpus=(GpuState(0.5, 1, 40), GpuState(0.5, 2, 41))),
            [Field.PER_GPU_ALLOCATED],
            id="allocations-unknown-key-absent-not-dashes",
        ),
        pytest.param(
            _state(gpu_count=3, gpus=(GpuState(0.5, 1, 40, True),)),
            list(Field)[-4:],
            id="table-disagreeing-with-gpu-count-never-written",
        ),
    ],
)
def test_unknown_per_gpu_columns_are_left_out(state: NodeGpuState, absent: list[Field]) -> None:
    annotations = encode(state)
    for f in absent:
        assert K[f] not in annotations
    body = merge_patch(annotations)["metadata"]["annotations"]
    for f in absent:
        assert body[K[f]] is None  # and removed from the Node


BAD_PER_GPU = [
    pytest.param(
        Field.PER_GPU_UTILIZATION,
        "0.1,0.2,0.3",
        "per-gpu-utilization invalid (3 values for 4 gpus)",
        None,
        id="too-few",
    ),
    pytest.param(
        Field.PER_GPU_TEMPERATURE,
        "1,2,3,4,5",
        "per-gpu-temperature invalid (5 values for 4 gpus)",
        None,
        id="too-many",
    ),
    pytest.param(
        Field.PER_GPU_UTILIZATION,
        "0.1,nan,0.3,1.5",
        "per-gpu-utilization invalid on 2 gpus (first gpu 1)",
        (0.1, None, 0.3, None),
        id="bad-values-dropped-alone",
    ),
    pytest.param(
        Field.PER_GPU_ALLOCATED,
        "1,yes,0,-",
        "per-gpu-allocated invalid on gpu 1",
        (True, None, False, None),
        id="allocated-not-0-or-1",
    ),
    pytest.param(
        Field.PER_GPU_MEMORY_FREE_MIB,
        "1,2,,4",
        "per-gpu-memory-free-mib invalid on gpu 2",
        (1, 2, None, 4),
        id="empty-item",
    ),
    pytest.param(
        Field.PER_GPU_MEMORY_FREE_MIB,
        ",".join(["1"] * (MAX_PER_GPU_VALUES + 1)),
        f"per-gpu-memory-free-mib invalid (more than {MAX_PER_GPU_VALUES} values)",
        None,
        id="absurdly-long",
    ),
]


@pytest.mark.parametrize(("bad_field", "text", "problem", "column"), BAD_PER_GPU)
def test_bad_per_gpu_values(
    bad_field: Field, text: str, problem: str, column: tuple[object, ...] | None
) -> None:
    annotations = encode(PER_GPU_STATE)
    annotations[K[bad_field]] = text
    decoded = decode(annotations)
    assert decoded.state is not None
    assert problem in decoded.problems
    attribute = {
        Field.PER_GPU_UTILIZATION: 0,
        Field.PER_GPU_MEMORY_FREE_MIB: 1,
        Field.PER_GPU_TEMPERATURE: 2,
        Field.PER_GPU_ALLOCATED: 3,
    }[bad_field]
    gpus = decoded.state.gpus
    assert len(gpus) == 4  # the other keys still give the table
    expected = column if column is not None else (None,) * 4
    assert tuple(g[attribute] for g in gpus) == expected
    assert gpus[0].temperature_c == (54 if bad_field is not Field.PER_GPU_TEMPERATURE else None)


def test_without_gpu_count_the_first_per_gpu_key_sets_the_length() -> None:
    annotations = encode(replace(PER_GPU_STATE, gpu_count=None))
    annotations[K[Field.PER_GPU_ALLOCATED]] = "1,0"
    decoded = decode(annotations)
    assert decoded.state is not None
    assert len(decoded.state.gpus) == 4
    assert "per-gpu-allocated invalid (2 values for 4 gpus)" in decoded.problems


def test_old_reader_ignores_per_gpu_keys() -> None:
    """A reader of version 1 before per-GPU keys reads the same node state from them."""
    with_table = decode(encode(PER_GPU_STATE)).state
    without = decode(encode(replace(PER_GPU_STATE, gpus=()))).state
    assert with_table is not None
    assert without is not None
    assert replace(with_table, gpus=()) == without
