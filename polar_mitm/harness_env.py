"""The environment a harness needs to talk to the proxy, either way in (docs/design.md §7)."""
from __future__ import annotations

from pathlib import Path

from polar_traj import atomic

SYSTEM_CA_FILES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def write_ca_bundle(ca: Path, out: Path) -> Path:
    """System CAs + the proxy CA: SSL_CERT_FILE replaces the trust store for some clients (codex)."""
    parts = [Path(p).read_text() for p in SYSTEM_CA_FILES if Path(p).exists()][:1]
    parts.append(ca.read_text())
    return atomic.write_text(out, "\n".join(parts))


def harness_env(host: str, proxy_port: int, base_url_port: int, ca: Path, bundle: Path,
                session: str = "SESSION", token: str = "TOKEN") -> dict[str, str]:
    base = f"http://{host}:{base_url_port}"
    return {
        # way in 1: HTTPS_PROXY with TLS interception (closed binaries)
        "HTTPS_PROXY": f"http://{session}:{token}@{host}:{proxy_port}",
        "NODE_EXTRA_CA_CERTS": str(ca),
        "SSL_CERT_FILE": str(bundle),
        "CODEX_CA_CERTIFICATE": str(ca),
        # way in 2: base URL, the token as API key
        "OPENAI_BASE_URL": f"{base}/v1",
        "OPENAI_API_KEY": token,
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": token,
        "GOOGLE_GEMINI_BASE_URL": base,
        "GEMINI_API_KEY": token,
    }
