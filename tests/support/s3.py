"""A real S3-compatible server on loopback for the object-store tier's tests: moto's server mode, the server
s3fs's own test suite runs against (Debian's radosgw needs a one-node Ceph: monitors, an OSD on a block
device and systemd, which this machine and CI lack).

The server runs in its own process (so a test can kill it mid-save) with request signing enforced
(``INITIAL_NO_AUTH_ACTION_COUNT``: the first few requests, which create the test's user, its access key and
its policy, are the only unauthenticated ones): wrong credentials are refused as a real store refuses them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

# Requests the server answers without a signature: creating the user, its inline policy, its access key.
_UNSIGNED = 3


@dataclass
class S3Server:
    endpoint: str
    key: str
    secret: str
    process: subprocess.Popen[bytes]
    buckets: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """The environment a run reaches the store with (as a user's shell would have it)."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def options(self) -> dict[str, str]:
        return {"key": self.key, "secret": self.secret, "endpoint_url": self.endpoint}

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(
            key=self.key,
            secret=self.secret,
            endpoint_url=self.endpoint,
            use_listings_cache=False,
            skip_instance_cache=True,
        )

    def bucket(self, name: str) -> str:
        self.fs().mkdir(name)
        self.buckets.append(name)
        return name

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(port: int | None = None, host: str = "127.0.0.1") -> S3Server:
    """Start a server on ``host`` (the test Slurm cluster's jobs reach its controller's address, not this
    machine's loopback) and make a user whose credentials it accepts (every other request must be signed)."""
    import boto3

    port = port or _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_UNSIGNED)}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        env.pop(name, None)
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://{host}:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not start on {endpoint}") from None
            time.sleep(0.1)
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    iam.create_user(UserName="hpctrain-test")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="hpctrain-test", PolicyName="s3", PolicyDocument=json.dumps(policy))
    made = iam.create_access_key(UserName="hpctrain-test")["AccessKey"]
    return S3Server(endpoint, made["AccessKeyId"], made["SecretAccessKey"], process)
