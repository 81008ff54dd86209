"""Pure Kubernetes object semantics for the API server stand-in: patches, validation, managedFields.

The stand-in in `kube_standins.apiserver` must answer as a real kube-apiserver v1.36 does (see the
wire captures in the shared kube-apiserver fixtures). Everything here is a pure function of its
inputs (the live object, the request body, `now`), so the semantics can be tested without sockets
and the HTTP layer stays thin. Error answers are raised as `ApiError`, which carries the exact
`Status` body and HTTP code the real server sends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar, cast

JsonObj = dict[str, Any]
_T = TypeVar("_T")
FieldPath = tuple[str, ...]

# ---------------------------------------------------------------------------------------------
# Status bodies


class ApiError(Exception):
    """An error answer: the HTTP status and the `Status` object the real API server sends."""

    def __init__(self, code: int, body: JsonObj) -> None:
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body


def status_body(
    code: int,
    reason: str,
    message: str,
    details: JsonObj | None = None,
    *,
    with_details: bool = True,
) -> JsonObj:
    """A `metav1.Status` failure in the field order the API server encodes it."""
    body: JsonObj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if with_details:
        body["details"] = details if details is not None else {}
    body["code"] = code
    return body


def failure(
    code: int,
    reason: str,
    message: str,
    details: JsonObj | None = None,
    *,
    with_details: bool = True,
) -> ApiError:
    """The error answer with status `code` and its `Status` body (see `status_body`)."""
    return ApiError(code, status_body(code, reason, message, details, with_details=with_details))


def not_found(name: str) -> ApiError:
    return failure(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})


def already_exists(name: str) -> ApiError:
    return failure(
        409,
        "AlreadyExists",
        f'nodes "{name}" already exists',
        {"name": name, "kind": "nodes"},
    )


def conflict_modified(name: str) -> ApiError:
    return failure(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "kind": "nodes"},
    )


def bad_request(message: str) -> ApiError:
    # The API server's BadRequest Status has no `details` at all (fixtures 34, 35, 37).
    return failure(400, "BadRequest", message, with_details=False)


# Every failing JSON Patch operation gives this same body: nothing says which op failed.
JSON_PATCH_REJECTED: Final = "the server rejected our request due to an error in our request"


def json_patch_rejected() -> ApiError:
    return failure(422, "Invalid", JSON_PATCH_REJECTED)


def unsupported_media_type() -> ApiError:
    return failure(415, "UnsupportedMediaType", "415: Unsupported Media Type")


def apply_without_field_manager() -> ApiError:
    return failure(
        422,
        "Invalid",
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
        "is required for apply patch",
        {
            "group": "meta.k8s.io",
            "kind": "PatchOptions",
            "causes": [
                {
                    "reason": "FieldValueRequired",
                    "message": "Required value: is required for apply patch",
                    "field": "fieldManager",
                }
            ],
        },
    )


# ---------------------------------------------------------------------------------------------
# Go encoding/json syntax errors: the API server echoes them in 400 answers, so a client that
# logs them sees the same words as against a real cluster.


def _go_quote_char(c: str) -> str:
    if c == "'":
        return "'\\''"
    if c == '"':
        return "'\"'"
    quoted = json.dumps(c)
    return "'" + quoted[1:-1] + "'"


class _GoSyntaxError(Exception):
    pass


class _GoScanner:
    """A small recursive-descent JSON checker that fails with Go's encoding/json messages."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def _peek(self) -> str:
        self._ws()
        if self.i >= len(self.s):
            raise _GoSyntaxError("unexpected end of JSON input")
        return self.s[self.i]

    def _ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\r\n":
            self.i += 1

    def _fail(self, context: str) -> _GoSyntaxError:
        return _GoSyntaxError(f"invalid character {_go_quote_char(self.s[self.i])} {context}")

    def check(self) -> None:
        self._value()
        self._ws()
        if self.i < len(self.s):
            raise self._fail("after top-level value")

    def _value(self) -> None:
        c = self._peek()
        if c == "{":
            self._object()
        elif c == "[":
            self._array()
        elif c == '"':
            self._string()
        elif c == "-" or c.isdigit():
            self._number()
        elif c in "tfn":
            word = {"t": "true", "f": "false", "n": "null"}[c]
            for k, expected in enumerate(word):
                if self.i + k >= len(self.s):
                    raise _GoSyntaxError("unexpected end of JSON input")
                if self.s[self.i + k] != expected:
                    self.i += k
                    raise self._fail(f"in literal {word} (expecting {_go_quote_char(expected)})")
            self.i += len(word)
        else:
            raise self._fail("looking for beginning of value")

    def _object(self) -> None:
        self.i += 1
        if self._peek() == "}":
            self.i += 1
            return
        while True:
            if self._peek() != '"':
                raise self._fail("looking for beginning of object key string")
            self._string()
            if self._peek() != ":":
                raise self._fail("after object key")
            self.i += 1
            self._value()
            c = self._peek()
            self.i += 1
            if c == "}":
                return
            if c != ",":
                self.i -= 1
                raise self._fail("after object key:value pair")

    def _array(self) -> None:
        self.i += 1
        if self._peek() == "]":
            self.i += 1
            return
        while True:
            self._value()
            c = self._peek()
            self.i += 1
            if c == "]":
                return
            if c != ",":
                self.i -= 1
                raise self._fail("after array element")

    def _string(self) -> None:
        self.i += 1
        while True:
            if self.i >= len(self.s):
                raise _GoSyntaxError("unexpected end of JSON input")
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                return
            if c == "\\":
                self.i += 1
                if self.i >= len(self.s):
                    raise _GoSyntaxError("unexpected end of JSON input")
                if self.s[self.i] not in '"\\/bfnrtu':
                    raise self._fail("in string escape code")
            elif ord(c) < 0x20:
                raise self._fail("in string literal")
            self.i += 1

    def _number(self) -> None:
        m = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?").match(self.s, self.i)
        if m is None or m.end() == self.i:
            self.i += 1
            if self.i >= len(self.s):
                raise _GoSyntaxError("unexpected end of JSON input")
            raise self._fail("in numeric literal")
        self.i = m.end()


def decode_json(data: bytes) -> Any:
    """Decode a request body, raising `ValueError` with Go's error text when it is not JSON."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError("invalid character in string literal") from exc
    try:
        _GoScanner(text).check()
    except _GoSyntaxError as exc:
        raise ValueError(str(exc)) from None
    return json.loads(text)


def go_json_type(value: Any) -> str:
    """The word Go's `UnmarshalTypeError` uses for a JSON value's kind."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return "object"


# ---------------------------------------------------------------------------------------------
# Canonical Node encoding: Go encodes struct fields in declaration order and map keys sorted.

_STRUCT: Final = "struct"
_MAP: Final = "map"
_LIST: Final = "list"

# (kind, field order, children) per position; unknown fields keep their place after known ones.
_Schema = tuple[str, tuple[str, ...], dict[str, Any]]

_MANAGED_ENTRY: _Schema = (
    _STRUCT,
    ("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1", "subresource"),
    {},
)
_NODE_SCHEMA: _Schema = (
    _STRUCT,
    ("kind", "apiVersion", "metadata", "spec", "status"),
    {
        "metadata": (
            _STRUCT,
            (
                "name",
                "generateName",
                "namespace",
                "selfLink",
                "uid",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "labels",
                "annotations",
                "ownerReferences",
                "finalizers",
                "managedFields",
            ),
            {
                "labels": (_MAP, (), {}),
                "annotations": (_MAP, (), {}),
                "managedFields": (_LIST, (), {"item": _MANAGED_ENTRY}),
            },
        ),
        "spec": (
            _STRUCT,
            (
                "podCIDR",
                "podCIDRs",
                "providerID",
                "unschedulable",
                "taints",
                "configSource",
                "externalID",
            ),
            {
                "taints": (
                    _LIST,
                    (),
                    {"item": (_STRUCT, ("key", "value", "effect", "timeAdded"), {})},
                )
            },
        ),
        "status": (
            _STRUCT,
            (
                "capacity",
                "allocatable",
                "phase",
                "conditions",
                "addresses",
                "daemonEndpoints",
                "nodeInfo",
                "images",
                "volumesInUse",
                "volumesAttached",
                "config",
                "runtimeHandlers",
                "features",
            ),
            {
                "capacity": (_MAP, (), {}),
                "allocatable": (_MAP, (), {}),
                "conditions": (
                    _LIST,
                    (),
                    {
                        "item": (
                            _STRUCT,
                            (
                                "type",
                                "status",
                                "lastHeartbeatTime",
                                "lastTransitionTime",
                                "reason",
                                "message",
                            ),
                            {},
                        )
                    },
                ),
                "addresses": (_LIST, (), {"item": (_STRUCT, ("type", "address"), {})}),
                "images": (_LIST, (), {"item": (_STRUCT, ("names", "sizeBytes"), {})}),
                "nodeInfo": (
                    _STRUCT,
                    (
                        "machineID",
                        "systemUUID",
                        "bootID",
                        "kernelVersion",
                        "osImage",
                        "containerRuntimeVersion",
                        "kubeletVersion",
                        "kubeProxyVersion",
                        "operatingSystem",
                        "architecture",
                        "swap",
                    ),
                    {},
                ),
            },
        ),
    },
)

# Fields a Go Node always encodes (no omitempty), so every Node the server returns has them.
_NODE_INFO_FIELDS: Final = (
    "machineID",
    "systemUUID",
    "bootID",
    "kernelVersion",
    "osImage",
    "containerRuntimeVersion",
    "kubeletVersion",
    "kubeProxyVersion",
    "operatingSystem",
    "architecture",
)


def _ordered(value: Any, schema: _Schema | None) -> Any:
    if schema is None:
        return value
    kind, order, children = schema
    if kind == _LIST and isinstance(value, list):
        item = children.get("item")
        return [_ordered(v, item) for v in value]
    if not isinstance(value, dict):
        return value
    if kind == _MAP:
        return {k: value[k] for k in sorted(value)}
    out: JsonObj = {}
    for key in order:
        if key in value:
            out[key] = _ordered(value[key], children.get(key))
    for key, v in value.items():
        if key not in out:
            out[key] = v
    return out


def clone(value: _T) -> _T:
    """A deep copy of a JSON tree (dicts, lists, scalars), several times faster than deepcopy."""
    return cast(_T, _clone(value))


def _clone(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def canonical_node(node: Mapping[str, Any]) -> JsonObj:
    """A deep copy of `node` as the API server would store and encode it.

    Adds `kind`/`apiVersion`, the always-encoded empty `spec`, `daemonEndpoints` and `nodeInfo`,
    drops empty label/annotation maps (Go omits them), and orders every key like Go's encoder.
    """
    obj: JsonObj = clone(dict(node))
    obj["kind"] = "Node"
    obj["apiVersion"] = "v1"
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    for key in ("labels", "annotations", "managedFields"):
        if key in meta and not meta[key]:
            del meta[key]
    if not isinstance(obj.get("spec"), dict):
        obj["spec"] = {}
    status = obj.get("status")
    if not isinstance(status, dict):
        status = obj["status"] = {}
    endpoints = status.setdefault("daemonEndpoints", {})
    if isinstance(endpoints, dict):
        endpoints.setdefault("kubeletEndpoint", {"Port": 0})
    info = status.setdefault("nodeInfo", {})
    if isinstance(info, dict):
        for key in _NODE_INFO_FIELDS:
            info.setdefault(key, "")
    for key in ("capacity", "allocatable"):
        if key in status and not status[key]:
            del status[key]
    ordered: JsonObj = _ordered(obj, _NODE_SCHEMA)
    return ordered


_META_SCHEMA: Final = _NODE_SCHEMA[2]["metadata"]
_TOP_ORDER: Final = ("kind", "apiVersion", "metadata", "spec", "status")


def ordered_meta(meta: Mapping[str, Any]) -> JsonObj:
    """`metadata` in the order ObjectMeta encodes (every kind shares it)."""
    ordered: JsonObj = _ordered(dict(meta), _META_SCHEMA)
    return ordered


def _canonical(obj: Mapping[str, Any], kind: str) -> JsonObj:
    out: JsonObj = clone(dict(obj))
    out["kind"] = kind
    out["apiVersion"] = "v1"
    meta = out.get("metadata")
    meta = clone(meta) if isinstance(meta, dict) else {}
    if not meta.get("name"):
        raise ValueError(f"a {kind} needs metadata.name")
    for key in ("labels", "annotations", "managedFields"):
        if key in meta and not meta[key]:
            del meta[key]
    out["metadata"] = meta
    for key in ("spec", "status"):
        if not isinstance(out.get(key), dict):
            out[key] = {}
    ordered: JsonObj = _ordered(out, (_STRUCT, _TOP_ORDER, {"metadata": _META_SCHEMA}))
    return ordered


def canonical_pod(pod: Mapping[str, Any]) -> JsonObj:
    """A deep copy of `pod` as the server stores it: kind/apiVersion, `namespace: default` when
    none is given, `status.phase: Pending` when unset (the pod strategy's create default), the
    top level and metadata in Go's field order. spec and status keep the order given."""
    out = _canonical(pod, "Pod")
    out["metadata"].setdefault("namespace", "default")
    out["metadata"] = ordered_meta(out["metadata"])
    out["status"].setdefault("phase", "Pending")
    return out


def canonical_namespace(namespace: Mapping[str, Any]) -> JsonObj:
    """A deep copy of `namespace` as the server stores it: the `kubernetes.io/metadata.name`
    label (set on every write since v1.21), `spec.finalizers: [kubernetes]` and `status.phase:
    Active` when unset."""
    out = _canonical(namespace, "Namespace")
    meta = out["metadata"]
    meta["labels"] = dict(
        sorted({**meta.get("labels", {}), "kubernetes.io/metadata.name": meta["name"]}.items())
    )
    out["metadata"] = ordered_meta(meta)
    out["spec"].setdefault("finalizers", ["kubernetes"])
    out["status"].setdefault("phase", "Active")
    return out


def with_resource_version(obj: JsonObj, rv: int) -> JsonObj:
    """Set metadata.resourceVersion in place, keeping metadata's encoded field order."""
    meta = dict(obj.get("metadata") or {})
    meta["resourceVersion"] = str(rv)
    obj["metadata"] = _ordered(meta, _NODE_SCHEMA[2]["metadata"])
    return obj


def encode(obj: Any) -> bytes:
    """Compact JSON as Go's encoder writes it (no spaces, UTF-8)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def format_time(now: datetime) -> str:
    """RFC 3339 UTC at one-second resolution, as metav1.Time encodes."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# Patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, `null` deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    result: JsonObj = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Lists that strategic merge patch merges by key (Node's `patchMergeKey`s); other lists replace.
_MERGE_KEYS: Final[dict[FieldPath, str]] = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("spec", "taints"): "key",
}


def strategic_merge_patch(target: Any, patch: Any, path: FieldPath = ()) -> Any:
    """Strategic merge patch for Nodes: maps merge like a merge patch (null deletes), the few
    keyed lists of a Node merge by their key, `$`-directives are ignored, other lists replace."""
    if not isinstance(patch, dict):
        return clone(patch)
    result: JsonObj = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        sub = (*path, key)
        if value is None:
            result.pop(key, None)
        elif sub in _MERGE_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_keyed_list(result[key], value, _MERGE_KEYS[sub], sub)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, sub)
    return result


def _merge_keyed_list(live: list[Any], patch: list[Any], key: str, path: FieldPath) -> list[Any]:
    out = clone(live)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            out.append(clone(item))
            continue
        if item.get("$patch") == "delete":
            out = [o for o in out if not (isinstance(o, dict) and o.get(key) == item[key])]
            continue
        for i, existing in enumerate(out):
            if isinstance(existing, dict) and existing.get(key) == item[key]:
                out[i] = strategic_merge_patch(existing, item, path)
                break
        else:
            out.append(strategic_merge_patch({}, item, path))
    return out


class JsonPatchError(Exception):
    """A JSON Patch operation failed; the API server answers all of these with the same 422."""


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise JsonPatchError(f"bad path {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise JsonPatchError(f"missing path element {part!r}")
    return cur


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise JsonPatchError(f"missing {last!r}")


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise JsonPatchError("bad index")
    else:
        raise JsonPatchError("parent is not a container")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise JsonPatchError("cannot remove the root")
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise JsonPatchError(f"cannot remove missing {last!r}")
    return doc


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test) on a deep copy of `doc`."""
    result = clone(doc)
    for op in ops:
        if not isinstance(op, dict):
            raise JsonPatchError("operation is not an object")
        kind = op.get("op")
        parts = _pointer(op.get("path"))
        if kind in ("add", "replace", "test") and "value" not in op:
            raise JsonPatchError("missing value")
        if kind == "add":
            result = _add(result, parts, clone(op["value"]))
        elif kind == "remove":
            result = _remove(result, parts)
        elif kind == "replace":
            _get(result, parts)
            result = _add(_remove(result, parts), parts, clone(op["value"]))
        elif kind == "test":
            if _get(result, parts) != op["value"]:
                raise JsonPatchError("test failed")
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = clone(_get(result, source))
            if kind == "move":
                result = _remove(result, source)
            result = _add(result, parts, value)
        else:
            raise JsonPatchError(f"unknown op {kind!r}")
    return result


# ---------------------------------------------------------------------------------------------
# Validation


_NAME_PART: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_NAME_PART_MSG: Final = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_QUALIFIED_MSG: Final = (
    "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS "
    "subdomain prefix and '/' (e.g. 'example.com/MyName')"
)
_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
TOTAL_ANNOTATION_SIZE_LIMIT_B: Final = 256 * 1024


def qualified_name_errors(key: str) -> list[str]:
    """apimachinery's IsQualifiedName, message for message."""
    errors: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errors.append("prefix part must be no more than 253 characters")
            if not _DNS_SUBDOMAIN.match(prefix):
                errors.append("prefix part " + _SUBDOMAIN_MSG)
    else:
        return [_QUALIFIED_MSG]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if name and not _NAME_PART.match(name):
        errors.append(_NAME_PART_MSG)
    return errors


@dataclass(frozen=True, slots=True)
class FieldError:
    field: str
    reason: str  # FieldValueInvalid, FieldValueTooLong, ...
    detail: str  # the cause message, e.g. 'Invalid value: "x": ...'


def _go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def validate_node_meta(node: Mapping[str, Any]) -> list[FieldError]:
    """Annotation and label rules of ObjectMeta validation that a Node patch can break."""
    meta = node.get("metadata") or {}
    errors: list[FieldError] = []
    annotations = meta.get("annotations") or {}
    total = 0
    for key, value in annotations.items():
        for msg in qualified_name_errors(key.lower()):
            errors.append(
                FieldError(
                    "metadata.annotations",
                    "FieldValueInvalid",
                    f"Invalid value: {_go_quote(key)}: {msg}",
                )
            )
        total += len(key.encode()) + len(str(value).encode())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT_B:
        errors.append(
            FieldError(
                "metadata.annotations",
                "FieldValueTooLong",
                f"Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT_B} bytes",
            )
        )
    for key, value in (meta.get("labels") or {}).items():
        for msg in qualified_name_errors(key):
            errors.append(
                FieldError(
                    "metadata.labels",
                    "FieldValueInvalid",
                    f"Invalid value: {_go_quote(key)}: {msg}",
                )
            )
        if value and (len(value) > 63 or not _NAME_PART.match(value)):
            errors.append(
                FieldError(
                    "metadata.labels",
                    "FieldValueInvalid",
                    f"Invalid value: {_go_quote(value)}: a valid label must be an empty string or "
                    "consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                    "with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
                    "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                )
            )
    return errors


# The real server runs ObjectMeta validation several times on a Node update and reports every
# run's causes: each cause appears 4 times in the Status while the message lists it once.
_CAUSE_REPEATS: Final = 4


def invalid_node(name: str, errors: list[FieldError]) -> ApiError:
    """The 422 `Invalid` Status for a Node, as in the invalid-key and too-large captures."""
    texts: list[str] = []
    for err in errors:
        text = f"{err.field}: {err.detail}"
        if text not in texts:
            texts.append(text)
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    causes = [
        {"reason": err.reason, "message": err.detail, "field": err.field}
        for _ in range(_CAUSE_REPEATS)
        for err in errors
    ]
    return failure(
        422,
        "Invalid",
        f'Node "{name}" is invalid: {summary}',
        {"name": name, "kind": "Node", "causes": causes},
    )


def _go_sorted_on_patch_path(obj: Any, patch: Any) -> Any:
    # The merge-patch library re-encodes the maps it walked into (sorted keys) and keeps the rest
    # of the document's bytes as they were, which is what the 422 message below embeds.
    if not isinstance(obj, dict) or not isinstance(patch, dict):
        return obj
    return {k: _go_sorted_on_patch_path(obj[k], patch.get(k)) for k in sorted(obj)}


def non_string_map_value(patched: Mapping[str, Any], patch: Any) -> ApiError | None:
    """The odd 422 the server gives when a patch leaves a non-string label/annotation value."""
    meta = patched.get("metadata") or {}
    for field in ("annotations", "labels"):
        values = meta.get(field)
        if not isinstance(values, dict):
            continue
        for value in values.values():
            if isinstance(value, str):
                continue
            doc = _go_sorted_on_patch_path(dict(patched), patch)
            embedded = encode(doc).decode("utf-8")
            reason = (
                f"json: cannot unmarshal {go_json_type(value)} into Go struct field "
                f"ObjectMeta.metadata.{field} of type string"
            )
            detail = f"Invalid value: {_go_quote(embedded)}: {reason}"
            return failure(
                422,
                "Invalid",
                f' "" is invalid: patch: {detail}',
                {"causes": [{"reason": "FieldValueInvalid", "message": detail, "field": "patch"}]},
            )
    return None


# ---------------------------------------------------------------------------------------------
# managedFields (server-side apply field sets), enough for a Node's maps and keyed lists.

# Fields no manager ever owns (apimachinery strips them before computing field sets).
_UNOWNED: Final[frozenset[FieldPath]] = frozenset(
    {
        ("apiVersion",),
        ("kind",),
        ("metadata", "name"),
        ("metadata", "namespace"),
        ("metadata", "uid"),
        ("metadata", "resourceVersion"),
        ("metadata", "generation"),
        ("metadata", "creationTimestamp"),
        ("metadata", "deletionTimestamp"),
        ("metadata", "deletionGracePeriodSeconds"),
        ("metadata", "managedFields"),
        ("metadata", "selfLink"),
    }
)
# Structs (no "." entry of their own); every other object is a map and gets "." when created.
_STRUCTS: Final[frozenset[FieldPath]] = frozenset(
    {
        (),
        ("metadata",),
        ("spec",),
        ("status",),
        ("status", "nodeInfo"),
        ("status", "daemonEndpoints"),
        ("status", "daemonEndpoints", "kubeletEndpoint"),
        ("status", "config"),
        ("spec", "configSource"),
    }
)
# Associative lists and the fields that key their items.
_LIST_KEYS: Final[dict[FieldPath, tuple[str, ...]]] = {
    ("status", "conditions"): ("type",),
    ("status", "addresses"): ("type",),
    ("spec", "taints"): ("effect", "key"),
}
DOT: Final = "."


def _flatten(
    value: Any,
    schema_path: FieldPath,
    set_path: FieldPath,
    out: dict[FieldPath, Any],
    *,
    dots: bool,
) -> None:
    if isinstance(value, dict) and (schema_path in _STRUCTS or schema_path not in _LIST_KEYS):
        is_map = schema_path not in _STRUCTS
        if is_map and set_path and dots:
            out[(*set_path, DOT)] = True
        for key, child in value.items():
            if (*schema_path, key) in _UNOWNED:
                continue
            _flatten(child, (*schema_path, key), (*set_path, f"f:{key}"), out, dots=dots)
        return
    if isinstance(value, list) and schema_path in _LIST_KEYS:
        keys = _LIST_KEYS[schema_path]
        if dots:
            out[(*set_path, DOT)] = True
        for item in value:
            if not isinstance(item, dict):
                continue
            ident = json.dumps(
                {k: item.get(k) for k in keys if k in item}, separators=(",", ":"), sort_keys=True
            )
            item_path = (*set_path, f"k:{ident}")
            out[(*item_path, DOT)] = True
            for key, child in item.items():
                _flatten(child, (*schema_path, "[]", key), (*item_path, f"f:{key}"), out, dots=dots)
        return
    out[set_path] = value


def field_values(obj: Mapping[str, Any], *, dots: bool = True) -> dict[FieldPath, Any]:
    """Every owned field of `obj` (fieldsV1 paths) with its value; `.` marks a map/list itself."""
    out: dict[FieldPath, Any] = {}
    _flatten(dict(obj), (), (), out, dots=dots)
    return out


def fields_v1(paths: Iterable[FieldPath]) -> JsonObj:
    """Render a field set as the nested `fieldsV1` object, keys sorted as the server sorts them."""
    tree: JsonObj = {}
    for path in paths:
        node = tree
        for part in path:
            node = node.setdefault(part, {})

    def _sorted(node: JsonObj) -> JsonObj:
        return {k: _sorted(node[k]) for k in sorted(node)}

    return _sorted(tree)


def paths_of(fields: Mapping[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    """The field set a `fieldsV1` object encodes."""
    out: set[FieldPath] = set()
    for key, child in fields.items():
        path = (*prefix, key)
        if isinstance(child, dict) and child:
            out |= paths_of(child, path)
        else:
            out.add(path)
    return out


def path_string(path: FieldPath) -> str:
    """A field path as structured-merge-diff prints it: `.metadata.annotations.a/b`."""
    text = ""
    for part in path:
        if part.startswith("f:"):
            text += "." + part[2:]
        elif part.startswith("k:"):
            keys = json.loads(part[2:])
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]"
    return text


@dataclass(frozen=True, slots=True)
class Manager:
    """Identity of one managedFields entry."""

    manager: str
    operation: str  # "Update" | "Apply"
    subresource: str  # "" for the main resource


def _entries(obj: Mapping[str, Any]) -> list[tuple[Manager, JsonObj, set[FieldPath]]]:
    out = []
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        ident = Manager(
            str(entry.get("manager", "")),
            str(entry.get("operation", "Update")),
            str(entry.get("subresource", "")),
        )
        out.append((ident, entry, paths_of(entry.get("fieldsV1") or {})))
    return out


def _entry(ident: Manager, time: str, paths: set[FieldPath]) -> JsonObj:
    entry: JsonObj = {
        "manager": ident.manager,
        "operation": ident.operation,
        "apiVersion": "v1",
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(paths),
    }
    if ident.subresource:
        entry["subresource"] = ident.subresource
    return entry


def _sort_entries(entries: list[JsonObj]) -> list[JsonObj]:
    # apimachinery sorts by operation ("Apply" < "Update"), then time, then manager name.
    return sorted(
        entries,
        key=lambda e: (e["operation"], e.get("time", ""), e["manager"], e.get("subresource", "")),
    )


def updated_managed_fields(
    old: Mapping[str, Any], new: Mapping[str, Any], ident: Manager, now: datetime
) -> list[JsonObj]:
    """managedFields after an Update-operation write by `ident` that changed `old` into `new`.

    The writer takes every field it added or changed (from other managers too: updates always
    force), removed fields leave every set, and only the writer's `time` moves.
    """
    before = field_values(old)
    after = field_values(new)
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    removed = set(before) - set(after)
    entries: list[JsonObj] = []
    mine: set[FieldPath] = set()
    for other, entry, paths in _entries(old):
        if other == ident:
            mine = paths - removed
            continue
        kept = paths - removed - changed
        if kept:
            entries.append({**entry, "fieldsV1": fields_v1(kept)})
    mine |= changed
    if mine:
        entries.append(_entry(ident, format_time(now), mine))
    return _sort_entries(entries)


def created_managed_fields(new: Mapping[str, Any], ident: Manager, now: datetime) -> list[JsonObj]:
    """managedFields of a freshly created object: its creator owns everything it set."""
    paths = set(field_values(new))
    return [_entry(ident, format_time(now), paths)] if paths else []


@dataclass(frozen=True, slots=True)
class ApplyResult:
    obj: JsonObj
    managed_fields: list[JsonObj]


def _encoded_manager(ident: Manager) -> str:
    text = json.dumps(ident.manager)
    if ident.subresource:
        text += f" with subresource {json.dumps(ident.subresource)}"
    if ident.operation == "Update":
        text += " using v1"
    return text


def apply_conflicts(conflicts: list[tuple[Manager, FieldPath]]) -> ApiError:
    """The 409 of a server-side apply that would take fields from other managers."""
    ordered = sorted(conflicts, key=lambda c: (c[0].manager, path_string(c[1])))
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {_encoded_manager(m)}",
            "field": path_string(p),
        }
        for m, p in ordered
    ]
    if len(ordered) == 1:
        m, p = ordered[0]
        message = (
            f"Apply failed with 1 conflict: conflict with {_encoded_manager(m)}: {path_string(p)}"
        )
    else:
        lines: list[str] = []
        seen: list[Manager] = []
        for m, _ in ordered:
            if m not in seen:
                seen.append(m)
        for m in seen:
            lines.append(f"conflicts with {_encoded_manager(m)}:")
            lines.extend(f"- {path_string(p)}" for mm, p in ordered if mm == m)
        message = f"Apply failed with {len(ordered)} conflicts: " + "\n".join(lines)
    return failure(409, "Conflict", message, {"causes": causes})


def _delete_path(obj: JsonObj, path: FieldPath) -> None:
    # Only plain field/map-key paths are removed (what an apply of annotations/labels needs).
    cur: Any = obj
    for part in path[:-1]:
        if not part.startswith("f:") or not isinstance(cur, dict):
            return
        cur = cur.get(part[2:])
    last = path[-1]
    if isinstance(cur, dict) and last.startswith("f:"):
        cur.pop(last[2:], None)


def server_side_apply(
    live: Mapping[str, Any],
    applied: Mapping[str, Any],
    ident: Manager,
    now: datetime,
    *,
    force: bool,
) -> ApplyResult:
    """Server-side apply of `applied` by `ident` (an Apply manager) onto `live`.

    Fields the config sets to a value that differs from live and another manager owns are
    conflicts (409) unless `force`; forced fields move to the applier. Fields the applier set
    before and no longer sets are removed when no one else owns them.
    """
    declared_values = field_values(applied)
    # An apply owns the maps' entries, not the maps themselves; list items keep their ".".
    declared = {p for p in declared_values if not _is_map_dot(p)}
    live_values = field_values(live)
    entries = _entries(live)
    conflicts: list[tuple[Manager, FieldPath]] = []
    for other, _, paths in entries:
        if other == ident:
            continue
        for p in declared & paths:
            if p[-1] == DOT:
                continue
            if p in live_values and live_values[p] != declared_values[p]:
                conflicts.append((other, p))
    if conflicts and not force:
        raise apply_conflicts(conflicts)
    taken = {p for _, p in conflicts}
    previous: set[FieldPath] = set()
    for other, _, paths in entries:
        if other == ident:
            previous = paths
    applied_obj = {k: v for k, v in applied.items() if k not in ("apiVersion", "kind")}
    merged = strategic_merge_patch(live, _without_nulls(applied_obj))
    others_own: set[FieldPath] = set()
    for other, _, paths in entries:
        if other != ident:
            others_own |= paths - taken
    for p in sorted(previous - declared - others_own, key=len, reverse=True):
        if p[-1] != DOT:
            _delete_path(merged, p)
    new_entries: list[JsonObj] = []
    for other, entry, paths in entries:
        if other == ident:
            continue
        kept = paths - taken
        if kept:
            new_entries.append(entry if kept == paths else {**entry, "fieldsV1": fields_v1(kept)})
    new_entries.append(_entry(ident, format_time(now), declared))
    return ApplyResult(merged, _sort_entries(new_entries))


def _is_map_dot(path: FieldPath) -> bool:
    return path[-1] == DOT and not (len(path) >= 2 and path[-2].startswith("k:"))


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value
