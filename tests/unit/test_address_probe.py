"""``--address HEAD:6379``: the CLI, the driver and the Ray runtime each check the cluster before they
need it; one command asks the GCS once."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import pytest

from rayft.errors import ClusterError
from rayft.runtime import check_address, forget_checked_addresses


class CountingGcs:
    """A gRPC server that answers ``NodeInfoGcsService.GetClusterId`` as a Ray head's GCS does, and
    counts the calls."""

    def __init__(self) -> None:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

        self.calls = 0
        outer = self

        class NodeInfo(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
            def GetClusterId(self, request: Any, context: Any) -> Any:
                outer.calls += 1
                return gcs_service_pb2.GetClusterIdReply(cluster_id=b"\x01" * 28)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(NodeInfo(), self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


@pytest.fixture
def gcs() -> Iterator[CountingGcs]:
    forget_checked_addresses()
    server = CountingGcs()
    yield server
    server.server.stop(grace=None)
    forget_checked_addresses()


def test_one_command_probes_the_gcs_once(gcs: CountingGcs) -> None:
    for _ in range(3):  # the --address option, the driver's check before its lock, ray_runtime's join
        assert check_address(gcs.address) == gcs.address
    assert gcs.calls == 1
    forget_checked_addresses()  # as ray_runtime does when it leaves the cluster
    check_address(gcs.address)
    assert gcs.calls == 2


def test_an_address_that_did_not_answer_is_probed_again(gcs: CountingGcs) -> None:
    gcs.server.stop(grace=None).wait()
    for _ in range(2):
        with pytest.raises(ClusterError, match=rf"--address {gcs.address}: no Ray head answered"):
            check_address(gcs.address)
