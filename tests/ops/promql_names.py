"""The metric names a PromQL expression selects, for checking them against what is exported.

promtool parses expressions but does not list what they select, so this reads just enough of
PromQL's lexical structure: it drops string literals, label matchers (`{...}`), ranges and
subqueries (`[...]`) and the label lists of `by`/`without`/`on`/`ignoring`/`group_left`/
`group_right`; then every identifier left that is not a keyword and not called as a function is
a metric name. A name given only as `{__name__=...}` is refused rather than missed.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)


def metric_names(expr: str) -> set[str]:
    if "__name__" in expr:
        raise ValueError(f"selects a metric by __name__, which is not read: {expr}")
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub("", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names
