"""The names-only scorer's Node watch, on the real API server: each Node's metadata alone.

A Node's status (conditions, capacity, addresses, the kubelet's list of images) is most of its
bytes, and the scorer reads none of it; a 5,000-node cluster's Node watch sends every one of
the kubelets' and agents' writes. So the `NodeCache` asks for `PartialObjectMetadata`, as
client-go's metadata client does, with whole Nodes as the fallback of a server that cannot.
"""

from __future__ import annotations

import json

import pytest

from exporter_scheduler.edges.nodecache import NodeCache
from exporter_scheduler.serving.metrics import ScorerMetrics
from gpu_contract.media import METADATA_LIST, METADATA_WATCH
from gpu_contract.schema import FIELD_MANAGER
from kube_standins.nodes import gpu_node
from loopback_cluster.control_plane import ControlPlane, KubeApi
from loopback_cluster.workload import register_node

pytestmark = pytest.mark.e2e

NODE = "metadata-watch-node"
ONLY_IT = f"fieldSelector=metadata.name%3D{NODE}"
UTILIZATION = "gpu-scheduler.example.com/utilization"


def agent_write(api: KubeApi, utilization: str) -> None:
    """An annotation written as the agent writes (its field manager, so a managedFields entry
    whose time dates the node's data)."""
    body = {"metadata": {"annotations": {UTILIZATION: utilization}}}
    api.merge_patch(f"/api/v1/nodes/{NODE}", body, field_manager=FIELD_MANAGER)


def test_the_node_watch_reads_each_nodes_metadata_alone(
    control_plane: ControlPlane, admin: KubeApi
) -> None:
    register_node(admin, gpu_node(NODE))
    try:
        agent_write(admin, "0.25")
        whole = len(admin.raw("GET", f"/api/v1/nodes/{NODE}")[1])
        status, body = admin.raw("GET", f"/api/v1/nodes?{ONLY_IT}", accept=METADATA_LIST)
        assert status == 200
        listed = json.loads(body)
        assert listed["kind"] == "PartialObjectMetadataList"
        (item,) = listed["items"]
        assert set(item) == {"kind", "apiVersion", "metadata"}
        assert item["metadata"]["annotations"][UTILIZATION] == "0.25"
        # What dates the node's data: the agent's managedFields entry, metadata too.
        assert FIELD_MANAGER in {m["manager"] for m in item["metadata"]["managedFields"]}
        metadata_bytes = len(json.dumps(item, separators=(",", ":")))
        assert metadata_bytes < whole / 2, (metadata_bytes, whole)

        agent_write(admin, "0.5")
        since = listed["metadata"]["resourceVersion"]
        # The stream ends at timeoutSeconds; the event is sent as soon as the watch opens.
        watched = f"/api/v1/nodes?watch=true&{ONLY_IT}&resourceVersion={since}&timeoutSeconds=3"
        status, stream = admin.raw("GET", watched, accept=METADATA_WATCH)
        assert status == 200
        events = [json.loads(line) for line in stream.splitlines() if line.strip()]
        assert [(e["type"], e["object"]["kind"]) for e in events] == [
            ("MODIFIED", "PartialObjectMetadata")
        ]
        assert events[0]["object"]["metadata"]["annotations"][UTILIZATION] == "0.5"

        # The scorer's own cache, from those metadata-only pages and events.
        with NodeCache(
            kubeconfig=str(control_plane.admin_kubeconfig), metrics=ScorerMetrics()
        ) as cache:
            assert cache.wait_until(lambda c: c.ready(), 30)
            (node,) = cache.lookup([NODE])
            assert node.annotations.get(UTILIZATION) == "0.5"
            assert node.agent_write_time is not None
            agent_write(admin, "0.75")
            assert cache.wait_until(
                lambda c: c.lookup([NODE])[0].annotations.get(UTILIZATION) == "0.75", 30
            )
    finally:
        admin.raw("DELETE", f"/api/v1/nodes/{NODE}")
