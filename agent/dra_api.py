"""The agent's DRA calls: its node's ResourceSlices and its DeviceTaintRules, over the API client.

Kept beside `agent.kube` rather than in it: these calls go through the client object that
`agent.kube.api_client_for` builds (`ApiClient.call_api`, raw paths and JSON bodies), so this
module never imports the kubernetes package itself, and it classifies failures with the same
`agent.kube.classify`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agent.kube import NotFoundError, Timeouts, classify
from gpu_contract.schema import FIELD_MANAGER

DRA_GROUP: Final = "resource.k8s.io"
# Newest first: DeviceTaintRule is v1 from Kubernetes 1.37; in 1.36 it is v1beta2, off by default
# (feature gates DRADeviceTaints and DRADeviceTaintRules, runtime-config resource.k8s.io/v1beta2),
# and v1alpha3 before that.
DRA_VERSIONS: Final = ("v1", "v1beta2", "v1beta1", "v1alpha3")
APPLY_PATCH: Final = "application/apply-patch+yaml"


@dataclass(frozen=True, slots=True)
class DraApi:
    """Where this API server serves the two DRA resources the agent uses."""

    slices_version: str
    rules_version: str


class DraApiMissing(Exception):  # noqa: N818  (an answer, not a failure of the agent)
    """The API server serves no ResourceSlices or no DeviceTaintRules; the message says which."""


class DraClient:
    """Reads the node's ResourceSlices and writes the agent's DeviceTaintRules.

    The kubernetes client has no typed models for DeviceTaintRule in every version the agent
    meets, so every call goes through `ApiClient.call_api` with a path and a JSON body, like the
    Node patch. Rules are written by server-side apply (one idempotent request whether the rule
    exists or not, no 409 on create) under the agent's field manager, and deleted by name (a 404
    is success: the rule is gone either way).
    """

    def __init__(
        self, api_client: Any, *, node_name: str, timeouts: Timeouts | None = None
    ) -> None:
        self._api_client = api_client
        self.node_name = node_name
        self._timeouts = timeouts or Timeouts()

    def _call(
        self,
        method: str,
        path: str,
        *,
        action: str,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> Any:
        try:
            response = self._api_client.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=(self._timeouts.connect_s, self._timeouts.read_s),
            )
            data = response.data
            return json.loads(data) if data else None
        except Exception as exc:
            raise classify(exc, node_name=self.node_name, action=action) from exc

    def discover(self) -> DraApi:
        """The newest served version of each resource; raises `DraApiMissing` or `ApiError`.

        One request for the group's versions (a 404: no DRA at all), then one per served version,
        newest first, until both resources are found: a cluster without DRA costs one request
        per resync, one without DeviceTaintRules two.
        """
        try:
            group = self._call(
                "GET", f"/apis/{DRA_GROUP}", action=f"reading the API discovery of {DRA_GROUP}"
            )
        except NotFoundError:
            raise DraApiMissing(
                f"the API server serves no {DRA_GROUP} (no Dynamic Resource Allocation)"
            ) from None
        versions = group.get("versions", []) if isinstance(group, dict) else []
        served_versions = {v.get("version") for v in versions if isinstance(v, dict)}
        found: dict[str, str] = {}
        for version in DRA_VERSIONS:
            if version not in served_versions:
                continue
            listing = self._call(
                "GET",
                f"/apis/{DRA_GROUP}/{version}",
                action=f"reading the API discovery of {DRA_GROUP}/{version}",
            )
            resources = listing.get("resources", []) if isinstance(listing, dict) else []
            names = {r.get("name") for r in resources if isinstance(r, dict)}
            for resource in ("resourceslices", "devicetaintrules"):
                if resource in names:
                    found.setdefault(resource, version)
            if len(found) == 2:
                break
        if "resourceslices" not in found:
            raise DraApiMissing(f"the API server serves no {DRA_GROUP} ResourceSlices (no DRA)")
        if "devicetaintrules" not in found:
            raise DraApiMissing(
                f"the API server serves no {DRA_GROUP} DeviceTaintRules (Kubernetes 1.37+, or 1.36 "
                "with the DRADeviceTaints and DRADeviceTaintRules feature gates and "
                "resource.k8s.io/v1beta2)"
            )
        return DraApi(found["resourceslices"], found["devicetaintrules"])

    def node_uid(self) -> str | None:
        """This Node's UID (the owner of the agent's rules); None when it cannot be read."""
        node = self._call(
            "GET", f"/api/v1/nodes/{self.node_name}", action=f"reading node {self.node_name!r}"
        )
        metadata = node.get("metadata") if isinstance(node, dict) else None
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        return uid if isinstance(uid, str) and uid else None

    def list_slices(self, api: DraApi, *, driver: str) -> list[object]:
        """The ResourceSlices of `driver` on this node (the server filters by field)."""
        listing = self._call(
            "GET",
            f"/apis/{DRA_GROUP}/{api.slices_version}/resourceslices",
            action=f"listing the ResourceSlices of node {self.node_name!r}",
            query=[("fieldSelector", f"spec.nodeName={self.node_name},spec.driver={driver}")],
        )
        items = listing.get("items") if isinstance(listing, dict) else None
        return list(items) if isinstance(items, list) else []

    def list_rules(self, api: DraApi, *, label_selector: str) -> list[object]:
        listing = self._call(
            "GET",
            f"/apis/{DRA_GROUP}/{api.rules_version}/devicetaintrules",
            action="listing DeviceTaintRules",
            query=[("labelSelector", label_selector)],
        )
        items = listing.get("items") if isinstance(listing, dict) else None
        return list(items) if isinstance(items, list) else []

    def apply_rule(self, api: DraApi, body: Mapping[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        self._call(
            "PATCH",
            f"/apis/{DRA_GROUP}/{api.rules_version}/devicetaintrules/{name}",
            action=f"applying DeviceTaintRule {name!r}",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body=dict(body),
            content_type=APPLY_PATCH,
        )

    def delete_rule(self, api: DraApi, name: str) -> None:
        try:
            self._call(
                "DELETE",
                f"/apis/{DRA_GROUP}/{api.rules_version}/devicetaintrules/{name}",
                action=f"deleting DeviceTaintRule {name!r}",
            )
        except NotFoundError:
            return
