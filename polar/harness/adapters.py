"""Adapter specs: one YAML file per harness (adapters/*.yaml) loaded into a frozen, validated AdapterSpec.

Format and how to add a harness: adapters/README.md. Every error names the file and the field.
Templates use `{{ variable }}` (VARIABLES below); every other brace is literal, so JSON and TOML read as is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

ADAPTERS_DIR = Path(__file__).resolve().parents[2] / "adapters"
WAYS_IN = ("https_proxy", "base_url")
APIS = ("openai_chat", "openai_responses", "anthropic", "gemini")
# What a template may use; the runner fills them per run (polar/harness/render.py).
VARIABLES = frozenset({
    "instruction", "model", "home", "workspace", "api_key", "session_id",
    "base_url", "proxy_url", "ca_cert", "ca_bundle",
})
TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
FILE_BASE = re.compile(r"^\{\{\s*(home|workspace)\s*\}\}/")  # where a config file may land, besides HOME
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TOP_KEYS = {"name", "description", "package", "api", "model", "shell_tool", "provider", "ways_in",
            "command", "env", "files", "side_traffic"}


class AdapterError(ValueError):
    """A malformed adapter file; the message names the file and the field."""


@dataclass(frozen=True)
class Package:
    """Where the harness comes from: an npm package (scripts/harnesses/package.json) or a PyPI one (its own
    venv, scripts/install_python_harnesses.sh); exactly one of the two."""

    npm: str | None
    version: str
    bin: str
    pypi: str | None = None


@dataclass(frozen=True)
class ShellTool:
    name: str  # the harness's own shell tool, as it appears in the request's tool list
    argument: str  # the argument holding the command


@dataclass(frozen=True)
class Provider:
    url: str  # the real endpoint, called through HTTPS_PROXY (the https_proxy way in)
    base_path: str  # appended to the proxy's base-URL listener (the base_url way in)


@dataclass(frozen=True)
class ConfigFile:
    path: str  # template; relative paths are under the harness's HOME, else it starts {{ home }}/ or {{ workspace }}/
    text: str | None = None  # template text
    json: Any = None  # data whose strings are templates, written as JSON


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    description: str
    api: str
    model: str
    provider: Provider
    ways_in: Mapping[str, Mapping[str, str]]  # way in -> extra env for it
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    files: tuple[ConfigFile, ...] = ()
    package: Package | None = None
    shell_tool: ShellTool | None = None
    side_traffic: str = ""
    source: str = ""  # the file it was loaded from

    def supports(self, way_in: str) -> bool:
        return way_in in self.ways_in


def adapter_path(name_or_path: str | Path, adapters_dir: Path = ADAPTERS_DIR) -> Path:
    """`codex` -> adapters/codex.yaml; a path to a .yaml file is taken as is."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        return Path(text)
    return adapters_dir / f"{text}.yaml"


def available(adapters_dir: Path = ADAPTERS_DIR) -> list[str]:
    return sorted(p.stem for p in adapters_dir.glob("*.yaml"))


def load_adapter(name_or_path: str | Path, adapters_dir: Path = ADAPTERS_DIR) -> AdapterSpec:
    path = adapter_path(name_or_path, adapters_dir)
    if not path.is_file():
        raise AdapterError(f"{path}: no such adapter (available: {', '.join(available(adapters_dir)) or 'none'})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:  # one line, as task files say it: FILE:LINE: problem
        mark = getattr(e, "problem_mark", None)
        raise AdapterError(f"{path}:{mark.line + 1 if mark else 1}: not valid YAML: "
                           f"{getattr(e, 'problem', None) or e}") from e
    return parse_adapter(data, str(path))


def parse_adapter(data: Any, source: str = "<adapter>") -> AdapterSpec:
    f = _Fields(source)
    data = f.mapping(data, "")
    f.known(data, TOP_KEYS, "")
    spec = AdapterSpec(
        name=f.name(data, "name"),
        description=f.string(data, "description", default=""),
        api=f.choice(data, "api", APIS),
        model=f.string(data, "model"),
        provider=_provider(f, data),
        ways_in=_ways_in(f, data),
        command=_command(f, data),
        env=MappingProxyType(f.env(data.get("env", {}), "env")),
        files=_files(f, data.get("files", [])),
        package=_package(f, data.get("package")),
        shell_tool=_shell_tool(f, data.get("shell_tool")),
        side_traffic=f.string(data, "side_traffic", default=""),
        source=source,
    )
    _check_templates(f, spec)
    return spec


class _Fields:
    """Typed field readers that raise AdapterError("<file>: <field>: <why>")."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, why: str) -> AdapterError:
        return AdapterError(f"{self.source}: {where or 'top level'}: {why}")

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        return value

    def known(self, data: dict[str, Any], keys: set[str], where: str) -> None:
        unknown = sorted(set(map(str, data)) - keys)
        if unknown:
            raise self.fail(where, f"unknown key(s) {unknown}; expected some of {sorted(keys)}")

    def string(self, data: dict[str, Any], key: str, where: str = "", default: str | None = None) -> str:
        where = f"{where}.{key}" if where else key
        if key not in data:
            if default is None:
                raise self.fail(where, "missing")
            return default
        value = data[key]
        if not isinstance(value, str) or (default is None and not value.strip()):
            raise self.fail(where, f"expected a non-empty string, got {value!r}")
        return value

    def name(self, data: dict[str, Any], key: str) -> str:
        value = self.string(data, key)
        if not _NAME.fullmatch(value):
            raise self.fail(key, f"{value!r}: use lowercase letters, digits, '.', '_' and '-'")
        return value

    def choice(self, data: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
        value = self.string(data, key)
        if value not in choices:
            raise self.fail(key, f"{value!r} is not one of {list(choices)}")
        return value

    def env(self, value: Any, where: str) -> dict[str, str]:
        value = self.mapping(value if value is not None else {}, where)
        out: dict[str, str] = {}
        for key, item in value.items():
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                raise self.fail(where, f"{key!r} is not an environment variable name")
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise self.fail(f"{where}.{key}", f"expected a string, got {item!r} (quote it)")
            out[key] = str(item)
        return out


def _provider(f: _Fields, data: dict[str, Any]) -> Provider:
    raw = f.mapping(data.get("provider"), "provider")
    f.known(raw, {"url", "base_path"}, "provider")
    url = f.string(raw, "url", "provider")
    if not url.startswith("https://"):
        raise f.fail("provider.url", f"{url!r}: expected the provider's https:// URL")
    base_path = f.string(raw, "base_path", "provider", default="")
    if base_path and not base_path.startswith("/"):
        raise f.fail("provider.base_path", f"{base_path!r}: expected a path starting with '/' (or empty)")
    return Provider(url.rstrip("/"), base_path.rstrip("/"))


def _ways_in(f: _Fields, data: dict[str, Any]) -> Mapping[str, Mapping[str, str]]:
    raw = f.mapping(data.get("ways_in"), "ways_in")
    if not raw:
        raise f.fail("ways_in", f"name at least one of {list(WAYS_IN)}")
    out: dict[str, dict[str, str]] = {}
    for way, extra in raw.items():
        if way not in WAYS_IN:
            raise f.fail("ways_in", f"{way!r} is not one of {list(WAYS_IN)}")
        extra = f.mapping(extra if extra is not None else {}, f"ways_in.{way}")
        f.known(extra, {"env"}, f"ways_in.{way}")
        out[way] = MappingProxyType(f.env(extra.get("env", {}), f"ways_in.{way}.env"))
    return MappingProxyType(out)


def _command(f: _Fields, data: dict[str, Any]) -> tuple[str, ...]:
    raw = data.get("command")
    if not isinstance(raw, list) or not raw or not all(isinstance(a, str) for a in raw):
        raise f.fail("command", f"expected a non-empty list of strings (argv), got {raw!r}")
    return tuple(raw)


def _files(f: _Fields, raw: Any) -> tuple[ConfigFile, ...]:
    if not isinstance(raw, list):
        raise f.fail("files", f"expected a list, got {type(raw).__name__}")
    out = []
    for i, item in enumerate(raw):
        where = f"files[{i}]"
        item = f.mapping(item, where)
        f.known(item, {"path", "text", "json"}, where)
        path = _file_path(f, f.string(item, "path", where), f"{where}.path")
        if ("text" in item) == ("json" in item):
            raise f.fail(where, "give exactly one of 'text' (a template) or 'json' (data written as JSON)")
        if "text" in item and not isinstance(item["text"], str):
            raise f.fail(f"{where}.text", "expected a string")
        if "json" in item and not isinstance(item["json"], (dict, list)):
            raise f.fail(f"{where}.json", "expected a mapping or a list")
        out.append(ConfigFile(path, item.get("text"), item.get("json")))
    return tuple(out)


def _file_path(f: _Fields, path: str, where: str) -> str:
    """A config file lands under the sample's HOME or workspace only: a relative path (no `..`) or one that starts
    with {{ home }}/ or {{ workspace }}/; render.py checks the filled path again and writes without links."""
    rest = FILE_BASE.sub("", path, count=1)
    if not rest or rest.startswith("/") or ".." in Path(rest).parts:
        raise f.fail(where, f"{path!r}: a config file lands under the sample's HOME or workspace: give a path relative "
                            "to HOME, or one starting {{ home }}/ or {{ workspace }}/, without '..'")
    return path


def _package(f: _Fields, raw: Any) -> Package | None:
    if raw is None:
        return None
    raw = f.mapping(raw, "package")
    f.known(raw, {"npm", "pypi", "version", "bin"}, "package")
    if ("npm" in raw) == ("pypi" in raw):
        raise f.fail("package", "give exactly one of 'npm' or 'pypi' (the registry the harness comes from)")
    version = raw.get("version")
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+\.\d+\S*", version):
        raise f.fail("package.version", f"{version!r}: expected a pinned version like '1.2.3' (quoted)")
    npm = f.string(raw, "npm", "package") if "npm" in raw else None
    pypi = f.string(raw, "pypi", "package") if "pypi" in raw else None
    return Package(npm, version, f.string(raw, "bin", "package"), pypi)


def _shell_tool(f: _Fields, raw: Any) -> ShellTool | None:
    if raw is None:
        return None
    raw = f.mapping(raw, "shell_tool")
    f.known(raw, {"name", "argument"}, "shell_tool")
    return ShellTool(f.string(raw, "name", "shell_tool"), f.string(raw, "argument", "shell_tool"))


def template_names(text: str) -> set[str]:
    return {m.group(1) for m in TEMPLATE.finditer(text)}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _check_templates(f: _Fields, spec: AdapterSpec) -> None:
    places: list[tuple[str, list[str]]] = [("command", list(spec.command)), ("env", list(spec.env.values()))]
    places += [(f"ways_in.{w}.env", list(env.values())) for w, env in spec.ways_in.items()]
    for i, cf in enumerate(spec.files):
        places.append((f"files[{i}]", [cf.path] + _strings(cf.text if cf.text is not None else cf.json)))
    used: set[str] = set()
    for where, texts in places:
        for text in texts:
            unknown = template_names(text) - VARIABLES
            if unknown:
                raise f.fail(where, f"unknown template variable(s) {sorted(unknown)}; known: {sorted(VARIABLES)}")
            used |= template_names(text)
    if "instruction" not in used:
        raise f.fail("command", "the instruction is never passed: use {{ instruction }} in command, env or files")
