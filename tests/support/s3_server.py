"""An S3-compatible server on loopback (moto's server mode) for s3fs-backed stores."""

from __future__ import annotations

import os
import uuid
from typing import Any

from moto.server import ThreadedMotoServer

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    def __init__(self) -> None:
        for key, value in CREDENTIALS.items():
            os.environ.setdefault(key, value)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)

    def start(self) -> S3Server:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": CREDENTIALS["AWS_ACCESS_KEY_ID"], "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                "client_kwargs": {"endpoint_url": self.endpoint},
                "skip_instance_cache": True}

    def new_bucket(self) -> str:
        import s3fs

        name = f"b-{uuid.uuid4().hex[:16]}"
        s3fs.S3FileSystem(**self.storage_options).mkdir(name)
        return name
