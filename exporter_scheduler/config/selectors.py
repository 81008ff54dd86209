"""Label selectors as the API server parses them, checked before the scorer's watches use one.

A selector the API server rejects would fail every LIST of the watch, which the watch takes for
a passing fault and retries with backoff forever, accounting off; checked at start-up it stops
the process with one message instead. The grammar is apimachinery's (`labels.Parse`):
requirements joined by commas, each `key`, `!key`, `key=value`, `key==value`, `key!=value`,
`key in (v1,v2)` or `key notin (v1,v2)`.
"""

from __future__ import annotations

import re
from typing import Final

# A qualified key: an optional DNS-subdomain prefix of at most 253 and `/`, then a name of at
# most 63 (lengths checked apart, so that one pattern serves inside the larger ones).
_KEY: Final = r"(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE: Final = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_REQUIREMENT: Final = re.compile(
    rf"\s*(?:(?P<absent>!)\s*(?P<akey>{_KEY})"
    rf"|(?P<key>{_KEY})\s*(?:(?:==|!=|=)\s*(?P<value>{_VALUE})"
    rf"|\s(?:in|notin)\s*\(\s*(?P<values>{_VALUE}(?:\s*,\s*{_VALUE})*)\s*\))?)\s*(?:,|$)"
)
_MAX_NAME: Final = 63
_MAX_PREFIX: Final = 253


def selector_error(selector: str) -> str | None:
    """Why the API server would reject `selector`, or None when it would take it."""
    if not selector.strip():
        return "empty (leave the setting out to watch every bound pod)"
    position = 0
    while position < len(selector):
        match = _REQUIREMENT.match(selector, position)
        if match is None or match.end() == position:
            return f"cannot parse {selector[position:]!r} (position {position})"
        key = match["akey"] or match["key"]
        prefix, _, name = key.rpartition("/")
        if len(name) > _MAX_NAME or len(prefix) > _MAX_PREFIX:
            return f"label key {key!r} too long (name at most 63, prefix at most 253)"
        values = [match["value"]] if match["value"] is not None else []
        if match["values"] is not None:
            values += [v.strip() for v in match["values"].split(",")]
            if not any(values):
                return f"{key!r}: the values of `in` and `notin` cannot be empty"
        for value in values:
            if len(value) > _MAX_NAME:
                return f"label value {value!r} longer than 63"
        position = match.end()
        if selector[position - 1 : position] == "," and position == len(selector):
            return "ends with a comma"
    return None
