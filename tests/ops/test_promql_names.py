"""The metric-name reader of the dashboard check, on named cases."""

from __future__ import annotations

import pytest

from tests.ops.promql_names import metric_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        pytest.param("up", {"up"}, id="bare"),
        pytest.param('a_total{code=~"4..|5..", x="by (y)"}', {"a_total"}, id="matchers"),
        pytest.param("rate(a_total[5m:1m] offset 1h)", {"a_total"}, id="range-subquery-offset"),
        pytest.param(
            "histogram_quantile(0.99, sum by (le, verb) (rate(a_bucket[5m])))",
            {"a_bucket"},
            id="functions-and-grouping",
        ),
        pytest.param("sum(a) without (instance) / on (job) group_left (node) b", {"a", "b"}),
        pytest.param("a > 1e3 and bool b or unless_c unless d", {"a", "b", "unless_c", "d"}),
        pytest.param('label_replace(a, "dst", "$1", "src", "(.*)")', {"a"}, id="strings"),
        pytest.param("vector(1) + time() - Inf", set(), id="no-metric"),
        pytest.param("namespace:a:rate5m", {"namespace:a:rate5m"}, id="recording-rule-name"),
    ],
)
def test_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_name_given_as_a_label_is_refused() -> None:
    with pytest.raises(ValueError, match="__name__"):
        metric_names('{__name__=~"gpu_.*"}')
