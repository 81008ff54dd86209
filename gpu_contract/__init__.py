"""The annotation contract shared by the agent and the scorer (see `gpu_contract.schema`)."""

from gpu_contract.schema import (
    DEFAULT_KEYS,
    DEFAULT_PREFIX,
    FIELD_MANAGER,
    SCHEMA_VERSION,
    DecodedAnnotations,
    Field,
    Health,
    Keys,
    NodeGpuState,
    PrefixError,
    decode,
    encode,
    merge_patch,
    normalize_model_name,
    normalize_prefix,
    parse_timestamp,
)

__all__ = [
    "DEFAULT_KEYS",
    "DEFAULT_PREFIX",
    "FIELD_MANAGER",
    "SCHEMA_VERSION",
    "DecodedAnnotations",
    "Field",
    "Health",
    "Keys",
    "NodeGpuState",
    "PrefixError",
    "decode",
    "encode",
    "merge_patch",
    "normalize_model_name",
    "normalize_prefix",
    "parse_timestamp",
]
