"""A local S3-compatible server (moto) for testing a remote ``storage_path`` without a cloud account.

::

    with local_s3_server() as server:
        uri = server.bucket_uri("runs-test", "runs")   # s3://KEY:SECRET@runs-test/runs?endpoint_override=...
        # storage_path=<uri> now writes to the local server

The URIs carry dummy credentials (``s3://ACCESS:SECRET@bucket/...``), so processes that do not
share this one's environment (Ray workers started earlier) reach the server too; rayft masks
them wherever a URI is shown or written.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

DUMMY_ACCESS_KEY = "rayft-test-access"
DUMMY_SECRET_KEY = "rayft-test-secret-0123456789"
REGION = "us-east-1"


@dataclass(frozen=True)
class LocalS3:
    """A running local S3 server: where it listens, and URIs of buckets on it."""

    host: str
    port: int

    @property
    def endpoint(self) -> str:
        """``host:port``, as pyarrow's ``endpoint_override`` takes it."""
        return f"{self.host}:{self.port}"

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (a no-op if it exists)."""
        from pyarrow import fs

        s3 = fs.S3FileSystem(
            access_key=DUMMY_ACCESS_KEY, secret_key=DUMMY_SECRET_KEY, endpoint_override=self.endpoint,
            scheme="http", region=REGION, allow_bucket_creation=True,
        )  # fmt: skip
        s3.create_dir(bucket)

    def bucket_uri(self, bucket: str, prefix: str = "", *, create: bool = True) -> str:
        """The ``s3://`` URI of ``prefix`` in ``bucket`` on this server, credentials included."""
        if create:
            self.create_bucket(bucket)
        path = f"{bucket}/{prefix}".rstrip("/")
        query = f"endpoint_override={self.endpoint}&scheme=http&region={REGION}"
        return f"s3://{DUMMY_ACCESS_KEY}:{DUMMY_SECRET_KEY}@{path}?{query}"


@contextlib.contextmanager
def local_s3_server() -> Iterator[LocalS3]:
    """Run moto's S3 server on a free local port for the duration of the block.

    Needs ``moto[server]`` (in the ``dev`` extra).
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield LocalS3(host, int(port))
    finally:
        server.stop()
