"""Render an adapter for one run: the harness's argv, environment and config files, from the run's values."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from polar.harness.adapters import TEMPLATE, AdapterSpec

# Variables the harness environment never inherits from the caller: only what the run sets.
BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME")


@dataclass(frozen=True)
class Endpoint:
    """Where the harness reaches the proxy, as seen from inside its sandbox."""

    host: str
    proxy_port: int  # HTTPS_PROXY listener
    base_url_port: int  # base-URL listener
    ca_cert: Path  # the proxy's CA certificate (PEM)
    ca_bundle: Path  # system CAs + the proxy CA (for SSL_CERT_FILE)


@dataclass(frozen=True)
class RunValues:
    instruction: str
    model: str
    home: Path
    workspace: Path
    session_id: str
    token: str
    way_in: str


@dataclass(frozen=True)
class Rendered:
    argv: tuple[str, ...]
    env: dict[str, str]
    files: dict[Path, str]  # absolute path -> content


def fill(text: str, values: Mapping[str, str]) -> str:
    return TEMPLATE.sub(lambda m: values[m.group(1)], text)


def _fill_data(value: Any, values: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return fill(value, values)
    if isinstance(value, dict):
        return {fill(str(k), values): _fill_data(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_data(v, values) for v in value]
    return value


def template_values(spec: AdapterSpec, run: RunValues, endpoint: Endpoint) -> dict[str, str]:
    proxy_url = f"http://{run.session_id}:{run.token}@{endpoint.host}:{endpoint.proxy_port}"
    if run.way_in == "base_url":
        base_url = f"http://{endpoint.host}:{endpoint.base_url_port}{spec.provider.base_path}"
    else:
        base_url = spec.provider.url
    return {
        "instruction": run.instruction, "model": run.model, "home": str(run.home),
        "workspace": str(run.workspace), "api_key": run.token, "session_id": run.session_id,
        "base_url": base_url, "proxy_url": proxy_url,
        "ca_cert": str(endpoint.ca_cert), "ca_bundle": str(endpoint.ca_bundle),
    }


def way_in_env(way_in: str, values: Mapping[str, str]) -> dict[str, str]:
    """What every harness needs for a way in (DESIGN.md §7): proxy + CA, or nothing (the adapter sets URLs)."""
    if way_in != "https_proxy":
        return {}
    proxy = values["proxy_url"]
    return {"HTTPS_PROXY": proxy, "https_proxy": proxy, "HTTP_PROXY": proxy, "http_proxy": proxy,
            "NODE_EXTRA_CA_CERTS": values["ca_cert"], "SSL_CERT_FILE": values["ca_bundle"]}


def base_env(home: Path, extra_path: list[Path]) -> dict[str, str]:
    """A clean environment: no API keys or proxies leak in from the caller."""
    env = {k: os.environ[k] for k in BASE_ENV_KEYS if k in os.environ}
    env["PATH"] = os.pathsep.join([str(p) for p in extra_path] + [env.get("PATH", "/usr/bin:/bin")])
    env.setdefault("LANG", "C.UTF-8")
    env.update(HOME=str(home), TERM="dumb", NO_COLOR="1", TMPDIR=str(home / ".tmp"))
    return env


def render(spec: AdapterSpec, run: RunValues, endpoint: Endpoint, extra_path: list[Path]) -> Rendered:
    if not spec.supports(run.way_in):
        raise ValueError(f"adapter {spec.name} does not support the {run.way_in} way in "
                         f"(it supports {', '.join(spec.ways_in)})")
    values = template_values(spec, run, endpoint)
    env = base_env(run.home, extra_path)
    env.update(way_in_env(run.way_in, values))
    env.update({k: fill(v, values) for k, v in spec.env.items()})
    env.update({k: fill(v, values) for k, v in spec.ways_in[run.way_in].items()})
    files: dict[Path, str] = {}
    for cf in spec.files:
        path = Path(fill(cf.path, values))
        path = path if path.is_absolute() else run.home / path
        if cf.text is not None:
            files[path] = fill(cf.text, values)
        else:
            files[path] = json.dumps(_fill_data(cf.json, values), indent=2) + "\n"
    argv = tuple(fill(a, values) for a in spec.command)
    return Rendered(argv, env, files)


def write_files(files: Mapping[Path, str]) -> None:
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def redact(env: Mapping[str, str], secret: str) -> dict[str, str]:
    """The environment as kept in the run folder: the session token replaced."""
    return {k: v.replace(secret, "<token>") for k, v in env.items()}
