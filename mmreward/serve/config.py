"""The reward server's configuration (`mmreward serve` flags)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from mmreward.errors import ConfigError


def new_token() -> str:
    """A fresh bearer token (192 bits). Hex, not urlsafe base64: a urlsafe token starts with '-' one time in 64,
    and `--token -x...` then reads as a flag to argparse, curl and most shells' tools."""
    return secrets.token_hex(24)


@dataclass
class ServeConfig:
    reward: str = "mock"  # registered name or source
    checkpoint: str | None = None  # weights (default: the reward's own)
    weights: str = "pretrained"  # 'random' only for demos and tests
    options: dict[str, Any] = field(default_factory=dict)  # extra loader options
    device: str | None = None  # device inside each replica
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 8000
    token: str | None = None  # bearer token; generated when None and auth is on
    auth: bool = True  # False serves without a token (explicit opt-out)
    max_batch_size: int = 32  # items merged into one reward call by the MicroBatcher
    batch_wait_timeout_s: float = 0.01  # how long a batch waits to fill
    max_request_items: int = 256  # items (or pairs) per request
    max_request_bytes: int = 64 * 2**20  # request body size
    num_replicas: int = 1
    num_gpus: float = 0.0  # per replica
    num_cpus: float = 1.0  # per replica
    runtime_env: dict[str, Any] | None = None  # Ray runtime_env of each replica (pip, env_vars): conflicting deps
    # the HTTP front end (mmreward.serve_http): what an unauthenticated client can make the server hold
    max_header_line_bytes: int = 8192  # request line and each header line (414 / 431)
    max_headers: int = 100  # header fields per request (431)
    max_header_bytes: int = 64 * 1024  # the whole request head (431)
    header_timeout_s: float = 10.0  # first byte to end of head (408, slowloris)
    idle_timeout_s: float = 5.0  # a connection with no request in flight is closed after this
    body_timeout_s: float = 120.0  # the whole body must arrive within this (408)
    max_connections: int = 256  # served at once; one more is answered 503
    # "ray": Ray Serve replicas behind the front end (num_replicas, num_gpus); "local": the reward in this
    # process, no Ray (one replica on one device: the lightest way to put a reward on its own GPU)
    engine: str = "ray"

    def __post_init__(self) -> None:
        if self.engine not in ("ray", "local"):
            raise ConfigError(f"engine must be 'ray' (Ray Serve replicas) or 'local' (no Ray), got {self.engine!r}")
        self.http_limits()  # validates the front end's limits now, not when the server starts
        if self.max_batch_size < 1 or self.max_request_items < 1 or self.max_request_bytes < 1:
            raise ConfigError("max_batch_size, max_request_items and max_request_bytes must be >= 1")
        if self.batch_wait_timeout_s < 0:
            raise ConfigError(f"batch_wait_timeout_s must be >= 0, got {self.batch_wait_timeout_s}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.num_replicas < 1:
            raise ConfigError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.auth and not self.token:
            self.token = new_token()


    def http_limits(self):
        from mmreward.serve_http import HTTPLimits

        return HTTPLimits(max_line_bytes=self.max_header_line_bytes, max_headers=self.max_headers,
                          max_header_bytes=self.max_header_bytes, max_body_bytes=self.max_request_bytes,
                          header_timeout_s=self.header_timeout_s, idle_timeout_s=self.idle_timeout_s,
                          body_timeout_s=self.body_timeout_s, max_connections=self.max_connections)
