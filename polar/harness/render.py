"""Render an adapter for one run: the harness's argv, environment and config files, from the run's values."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

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
    """What every harness needs for a way in (docs/design.md §7): proxy + CA, or nothing (the adapter sets URLs)."""
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
    for i, cf in enumerate(spec.files):
        path = _landing(spec, i, Path(fill(cf.path, values)), (run.home, run.workspace))
        if cf.text is not None:
            files[path] = fill(cf.text, values)
        else:
            files[path] = json.dumps(_fill_data(cf.json, values), indent=2) + "\n"
    argv = tuple(fill(a, values) for a in spec.command)
    return Rendered(argv, env, files)


def _landing(spec: AdapterSpec, i: int, path: Path, bases: Sequence[Path]) -> Path:
    """Where config file i lands: under HOME (relative paths) or the workspace, never elsewhere, whatever a
    template filled in (an instruction or a model name may hold `../`)."""
    path = Path(os.path.normpath(bases[0] / path))  # an absolute path stays itself
    if not any(path != b and path.is_relative_to(os.path.normpath(b)) for b in bases):
        raise ValueError(f"adapter {spec.name}: files[{i}].path: {spec.files[i].path!r} lands at {path}, outside the "
                         "sample's HOME and workspace")
    return path


def write_files(files: Mapping[Path, str], under: Sequence[Path]) -> None:
    """Each file beneath one of `under` (the sample's HOME, its workspace), no link followed on the way: a task's
    workspace may hold `.config -> /etc`, and these files are written by the host."""
    for path, content in files.items():
        base = next((b for b in under if path.is_relative_to(b) and path != b), None)
        if base is None:
            raise ValueError(f"{path}: a harness config file outside the sample's HOME and workspace")
        parts = path.relative_to(base).parts
        base.mkdir(parents=True, exist_ok=True)  # Polar's own folder
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    pass
                fd, parent = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), fd
                os.close(parent)
            out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666, dir_fd=fd)
        except OSError as e:
            raise ValueError(f"{path}: cannot write a harness config file there without following a link: "
                             f"{e.strerror}") from e
        finally:
            os.close(fd)
        with os.fdopen(out, "w") as f:
            f.write(content)


def redact(env: Mapping[str, str], secret: str) -> dict[str, str]:
    """The environment as kept in the run folder: the session token replaced."""
    return {k: v.replace(secret, "<token>") for k, v in env.items()}
