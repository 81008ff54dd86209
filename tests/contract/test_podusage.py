"""The `pod-gpu-usage` key: round trip, size bounds, and a bad entry dropped alone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_contract import podusage
from gpu_contract.podusage import GpuShare, PodUsage
from gpu_contract.schema import DEFAULT_KEYS, Field, Health, NodeGpuState, decode, encode

_names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
_shares = st.lists(
    st.builds(
        GpuShare,
        st.integers(0, 7),
        st.one_of(st.none(), st.integers(0, 100).map(lambda n: n / 100)),
        st.one_of(st.none(), st.integers(0, 200_000)),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda share: share.gpu_index,
).map(lambda shares: tuple(sorted(shares)))
_pods = st.lists(
    st.builds(PodUsage, st.builds(podusage.pod_ref, _names, _names), _shares),
    max_size=12,
    unique_by=lambda usage: usage.pod,
)


@given(_pods)
def test_round_trip(pods: list[PodUsage]) -> None:
    encoded = podusage.encode(pods)
    assert encoded.left_out == 0
    decoded = podusage.decode(encoded.text, gpu_count=8)
    assert decoded.problems == ()
    assert decoded.pods == tuple(sorted(pods))


def test_the_documented_example() -> None:
    text = "default/infer-7d9f-abc=0:0.31:10240;train/job-0=2:0.97:70112,3:-:70010"
    assert podusage.decode(text, gpu_count=4).pods == (
        PodUsage("default/infer-7d9f-abc", (GpuShare(0, 0.31, 10240),)),
        PodUsage("train/job-0", (GpuShare(2, 0.97, 70112), GpuShare(3, None, 70010))),
    )
    assert podusage.encode(podusage.decode(text).pods).text == text


def test_no_pod_holding_a_gpu_removes_the_key() -> None:
    assert podusage.encode([]).text is None
    assert podusage.encode([PodUsage("a/b", ())]).text is None
    assert podusage.decode(None) == podusage.Decoded((), ())


def test_eight_gpus_with_many_time_sliced_pods_stay_within_the_bounds() -> None:
    pods = [
        PodUsage(podusage.pod_ref("inference-team", f"ranker-5f7b9c-{i:05d}"), (GpuShare(i % 8),))
        for i in range(200)
    ]
    encoded = podusage.encode(pods)
    assert encoded.text is not None
    assert len(encoded.text) <= podusage.MAX_VALUE_CHARS
    kept = podusage.decode(encoded.text, gpu_count=8).pods
    assert len(kept) == podusage.MAX_PODS
    assert encoded.left_out == 200 - podusage.MAX_PODS
    # The first pods in pod order are kept: the same set from one write to the next.
    assert [usage.pod for usage in kept] == sorted(usage.pod for usage in pods)[: len(kept)]


def test_long_names_are_bounded_by_characters() -> None:
    pods = [
        PodUsage(podusage.pod_ref("ns", f"{i:03d}" + "x" * 240), (GpuShare(0),)) for i in range(64)
    ]
    encoded = podusage.encode(pods)
    assert encoded.text is not None
    assert len(encoded.text) <= podusage.MAX_VALUE_CHARS
    assert 0 < encoded.left_out < 64


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        pytest.param("a/b=0:0.50:10;c/d=0:1.50:10", ["a/b"], id="utilization above 1"),
        pytest.param("a/b=0:0.50:10;c/d=9:0.10:10", ["a/b"], id="gpu index past gpu-count"),
        pytest.param("a/b=0:0.50:10;C/D=0:0.10:10", ["a/b"], id="not a pod reference"),
        pytest.param("a/b=0:0.50:10;c/d", ["a/b"], id="no shares"),
        pytest.param("a/b=0:0.50:10;c/d=0:0.1", ["a/b"], id="short share"),
        pytest.param("a/b=0:0.50:10;c/d=0:nan:1", ["a/b"], id="nan"),
        pytest.param("a/b=0:0.50:10;c/d=0:0.1:-5", ["a/b"], id="negative memory"),
        pytest.param("a/b=0:0.50:10;c/d=1:0.1:5,1:0.2:5", ["a/b"], id="gpu repeated"),
    ],
)
def test_a_bad_entry_is_dropped_alone(text: str, kept: list[str]) -> None:
    decoded = podusage.decode(text, gpu_count=4)
    assert [usage.pod for usage in decoded.pods] == kept
    assert decoded.problems == ("pod-gpu-usage invalid on 1 of its entries",)


def test_an_oversized_value_is_not_read() -> None:
    decoded = podusage.decode("a/b=0:0.1:1;" * 2000)
    assert decoded.pods == ()
    assert decoded.problems


@given(st.text(max_size=300))
def test_decode_never_raises(text: str) -> None:
    decoded = podusage.decode(text, gpu_count=8)
    assert len(decoded.pods) <= podusage.MAX_PODS


def test_the_node_annotations_carry_the_pods_and_a_bad_value_spares_the_rest() -> None:
    state = NodeGpuState(
        health=Health.OK,
        updated_at=datetime(2026, 12, 3, 9, 0, tzinfo=UTC),
        utilization=0.4,
        gpu_count=2,
        pods=(PodUsage("default/web-1", (GpuShare(1, 0.4, 2048),)),),
    )
    annotations = encode(state)
    key = DEFAULT_KEYS[Field.POD_GPU_USAGE]
    assert annotations[key] == "default/web-1=1:0.40:2048"
    assert decode(annotations).state == state
    annotations[key] = "default/web-1=5:0.40:2048"
    broken = decode(annotations)
    assert broken.state is not None
    assert broken.state.pods == ()
    assert broken.state.utilization == 0.4
    assert broken.problems == ("pod-gpu-usage invalid on 1 of its entries",)
