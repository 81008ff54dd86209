"""Media types the agent and the scorer ask the Kubernetes API server for.

A metadata-only LIST or WATCH asks for `PartialObjectMetadata`, as client-go's metadata client
does, with whole objects as the fallback of a server that cannot: each object's metadata alone,
where a Node's status (conditions, capacity, addresses, images) or a Pod's spec is most of its
bytes. The agent lists pods' metadata; the scorer lists and watches Nodes' metadata.
"""

from __future__ import annotations

from typing import Final

JSON: Final = "application/json"
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io," + JSON
METADATA_WATCH: Final = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io," + JSON
