"""kube-scheduler calls the scorer over mutual TLS, as the chart's `scorer.tls` wires it.

The scorer serves HTTPS with a certificate from the cluster CA and requires a client certificate
signed by it (`--tls-client-ca-file`); the real kube-scheduler's extender config carries
`enableHTTPS` and a `tlsConfig` with the CA and its client certificate, and binds a pod through
it. A scheduler without the client certificate, and a plain client, are turned away.
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loopback_cluster.control_plane import (
    ControlPlane,
    ExtenderConfig,
    ExtenderTls,
    SchedulerConfig,
    free_port,
)
from loopback_cluster.workload import (
    gpu_pod,
    gpu_state,
    pod_node,
    publish,
    scorer_process,
    wait_for,
)
from tests.e2e.support import Scope, wait_failed_scheduling


@dataclass
class TlsScorer:
    url: str
    port: int
    ca: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def tls_scorer(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsScorer]:
    pki = control_plane.pki
    cert, key = pki.issue_serving_cert("scorer-serving", ["127.0.0.1", "localhost"])
    client_cert, client_key = pki.issue_client_cert("scheduler-extender-client", "gpu-scheduler")
    port = free_port()
    scorer = scorer_process(
        tmp_path_factory.mktemp("tls-scorer"),
        kubeconfig=control_plane.admin_kubeconfig,
        port=port,
        extra_args=[
            f"--tls-cert-file={cert}",
            f"--tls-key-file={key}",
            f"--tls-client-ca-file={pki.ca_cert}",
        ],
        name="gpu-scorer-tls",
    )
    scorer.start()
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(client_cert), str(client_key))

    def ready() -> bool:
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=2)
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    try:
        wait_for("the TLS scorer", ready, timeout_s=30)
        yield TlsScorer(f"https://127.0.0.1:{port}", port, pki.ca_cert, client_cert, client_key)
    finally:
        scorer.kill()


def test_a_client_without_the_certificate_is_turned_away(tls_scorer: TlsScorer) -> None:
    context = ssl.create_default_context(cafile=str(tls_scorer.ca))
    connection = http.client.HTTPSConnection(
        "127.0.0.1", tls_scorer.port, context=context, timeout=5
    )

    def call() -> int:
        # TLS 1.3 reports a missing client certificate after the handshake: on the write or
        # on the first read, depending on timing.
        connection.request("POST", "/filter", body=b"{}")
        return connection.getresponse().status

    with pytest.raises((ssl.SSLError, ConnectionError)):
        call()
    connection.close()


def test_the_real_scheduler_binds_through_the_tls_extender(
    control_plane: ControlPlane, tls_scorer: TlsScorer, scope: Scope
) -> None:
    api = scope.api
    cool, hot = scope.node("cool"), scope.node("hot")
    publish(api, cool, gpu_state(utilization=0.10))
    publish(api, hot, gpu_state(utilization=0.97))
    extender = ExtenderConfig(
        tls_scorer.url,
        node_cache_capable=True,
        tls=ExtenderTls(
            ca_file=tls_scorer.ca,
            cert_file=tls_scorer.client_cert,
            key_file=tls_scorer.client_key,
            server_name="127.0.0.1",
        ),
    )
    control_plane.start_scheduler(SchedulerConfig("gpu-tls", extender), name="kube-scheduler-tls")
    try:
        scope.settle()
        pod = scope.pod(gpu_pod(scope.name("via-tls"), scheduler_name="gpu-tls"))
        assert wait_for("the pod to bind", lambda: pod_node(api, pod), timeout_s=30) == cool
    finally:
        control_plane.stop_scheduler("kube-scheduler-tls")


def test_a_scheduler_without_the_client_certificate_cannot_use_it(
    control_plane: ControlPlane, tls_scorer: TlsScorer, scope: Scope
) -> None:
    api = scope.api
    publish(api, scope.node("only"), gpu_state(utilization=0.10))
    extender = ExtenderConfig(
        tls_scorer.url,
        node_cache_capable=True,
        ignorable=False,
        tls=ExtenderTls(ca_file=tls_scorer.ca, server_name="127.0.0.1"),
    )
    control_plane.start_scheduler(
        SchedulerConfig("gpu-tls-nocert", extender), name="kube-scheduler-tls-nocert"
    )
    try:
        pod = scope.pod(gpu_pod(scope.name("no-cert"), scheduler_name="gpu-tls-nocert"))
        # The scorer ends the handshake without a client certificate; Go reports the call
        # (an earlier attempt may have failed otherwise, before the scheduler saw the Node).
        wait_failed_scheduling(api, pod, starting_with=f'Post "{tls_scorer.url}/filter"')
        assert pod_node(api, pod) is None
    finally:
        control_plane.stop_scheduler("kube-scheduler-tls-nocert")
