"""`reward.remote` entries as data: where each reward runs, checked when the config is built.

Kept apart from `diffusion_rl.remote_rewards` (the clients, workers and pools) so that the config can check
these entries without importing the reward machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mmreward.errors import ConfigError

_URL_KEYS = {"url", "token_env", "timeout_s", "retries", "backoff_s", "request_items"}
_POOL_KEYS = {"replicas", "devices", "start_timeout_s", "timeout_s", "retries", "backoff_s", "request_items", "engine",
              "num_gpus", "runtime_env"}


@dataclass(frozen=True)
class RemoteSpec:
    """Where one reward runs (`reward.remote[name]`), checked."""

    name: str
    urls: tuple[str, ...] = ()  # servers already running; empty: a local pool the trainer starts
    token_env: str = "MMREWARD_TOKEN"  # the environment variable holding the servers' bearer token
    timeout_s: float = 120.0  # per request
    retries: int = 2  # further tries of a request that a retry can fix
    backoff_s: float = 0.5  # first wait between tries, doubled each time
    request_items: int = 32  # items per request
    replicas: int = 1  # local pool: worker processes serving this reward
    devices: tuple[str, ...] = ("cpu",)  # local pool: the device of each replica (cycled)
    start_timeout_s: float = 300.0  # local pool: how long a worker may take to load its rewards
    engine: str = "process"  # local pool: 'process' (worker processes, no Ray) or 'ray' (Ray Serve replicas)
    num_gpus: float = 0.0  # engine 'ray': GPUs per replica (a fraction shares a GPU)
    runtime_env: dict[str, Any] | None = None  # engine 'ray': the replicas' Ray runtime_env (conflicting deps)

    @property
    def local(self) -> bool:
        return not self.urls


def _number(where: str, value: Any, kind: type, minimum: float) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ConfigError(f"{where} must be {'a whole number' if kind is int else 'a number'}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where} must be >= {minimum}, got {value!r}")
    return kind(value)


def parse_remote_spec(name: str, raw: Mapping[str, Any]) -> RemoteSpec:
    """`reward.remote.<name>` -> RemoteSpec, or a ConfigError naming the key and the fix."""
    where = f"reward.remote.{name}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping such as {{url: http://HOST:PORT}} or {{replicas: 2}}, got {raw!r}")
    allowed = _URL_KEYS if "url" in raw else _POOL_KEYS
    unknown = sorted(set(raw) - allowed)
    if unknown:
        kind = "a server url" if "url" in raw else "a local pool (no url)"
        raise ConfigError(f"{where}: unknown keys {unknown} for {kind}; the keys are {sorted(allowed)}")
    kw: dict[str, Any] = {"name": name}
    if "url" in raw:
        urls = raw["url"] if isinstance(raw["url"], (list, tuple)) else [raw["url"]]
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ConfigError(f"{where}.url must be an http(s):// URL or a list of them, got {raw['url']!r}")
        kw["urls"] = tuple(u.rstrip("/") for u in urls)
        if "token_env" in raw:
            if not isinstance(raw["token_env"], str) or not raw["token_env"]:
                raise ConfigError(f"{where}.token_env must name an environment variable, got {raw['token_env']!r}")
            kw["token_env"] = raw["token_env"]
    else:
        if "replicas" in raw:
            kw["replicas"] = _number(f"{where}.replicas", raw["replicas"], int, 1)
        if "devices" in raw:
            devices = raw["devices"] if isinstance(raw["devices"], (list, tuple)) else [raw["devices"]]
            if not devices or not all(isinstance(d, str) and d for d in devices):
                raise ConfigError(f"{where}.devices must be a device string or a list of them "
                                  f"(cpu, cuda:7), got {raw['devices']!r}")
            kw["devices"] = tuple(devices)
        if "start_timeout_s" in raw:
            kw["start_timeout_s"] = _number(f"{where}.start_timeout_s", raw["start_timeout_s"], float, 1)
        engine = kw["engine"] = raw.get("engine", "process")
        if engine not in ("process", "ray"):
            raise ConfigError(f"{where}.engine must be 'process' (worker processes) or 'ray' (Ray Serve replicas), "
                              f"got {engine!r}")
        ray_only = sorted({"num_gpus", "runtime_env"} & set(raw))
        if ray_only and engine != "ray":
            raise ConfigError(f"{where}: {ray_only} need engine: ray (Ray Serve replicas)")
        if engine == "ray" and len(kw.get("devices", ())) > 1:
            raise ConfigError(f"{where}.devices: Ray places the replicas on its GPUs (num_gpus each); give one device "
                              f"string for inside every replica (e.g. cuda), got {list(kw['devices'])}")
        if "num_gpus" in raw:
            kw["num_gpus"] = _number(f"{where}.num_gpus", raw["num_gpus"], float, 0)
        if "runtime_env" in raw:
            if not isinstance(raw["runtime_env"], Mapping):
                raise ConfigError(f"{where}.runtime_env must be a mapping (Ray runtime_env: pip, env_vars, ...), "
                                  f"got {raw['runtime_env']!r}")
            kw["runtime_env"] = dict(raw["runtime_env"])
    for key, kind, low in (("timeout_s", float, 0.001), ("retries", int, 0), ("backoff_s", float, 0),
                           ("request_items", int, 1)):
        if key in raw:
            kw[key] = _number(f"{where}.{key}", raw[key], kind, low)
    return RemoteSpec(**kw)


def parse_remote_specs(raw: Mapping[str, Any], used: set[Any] | None = None) -> dict[str, RemoteSpec]:
    """Every `reward.remote` entry checked; a name the run does not use is an error (a typo would
    otherwise silently load the reward in the trainer)."""
    if used is not None:
        unknown = sorted(set(raw) - {u for u in used if u})
        if unknown:
            raise ConfigError(f"reward.remote names rewards the run does not use: {unknown} (used: "
                              f"{sorted(u for u in used if u)}); remove them or add them to reward.rewards")
    return {name: parse_remote_spec(name, spec) for name, spec in raw.items()}
