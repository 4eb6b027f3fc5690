"""Where a SystemOne server answers: its decision path, and the check of a server's base URL (`--endpoint`) that
`run --backend http` and `quantbench load` share, with the URL as it may be printed or stored."""

from __future__ import annotations

from urllib.parse import urlsplit

from quantbench.errors import ConfigError

PATH = "/v1/systemone"  # a decision request is POSTed here; GET /healthz beside it
API_KEY_ENV = "QUANTBENCH_API_KEY"
EXAMPLE = "give the server's base URL, e.g. http://127.0.0.1:8000"


def shown_url(url: str) -> str:
    """`url` as it may be printed or stored: a user name or password in it replaced by ***."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"


def checked_endpoint(endpoint: str) -> str:
    """The server's base URL from `--endpoint` (the full /v1/systemone URL is accepted too), or a ConfigError
    naming the flag, the URL with any password masked, and the fix."""
    url = endpoint.strip().rstrip("/")
    shown = shown_url(url)
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--endpoint {shown!r} must start with http:// or https://, e.g. http://127.0.0.1:8000")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - it raises for a port that is not a number from 0 to 65535 (was a traceback)
    except ValueError as e:  # also an unclosed IPv6 bracket
        raise ConfigError(f"--endpoint {shown!r}: {e}; {EXAMPLE}") from None
    if parts.username is not None or parts.password is not None:
        # it would be stored with the run (its spec, its provenance) and printed in every error naming the URL
        raise ConfigError(f"--endpoint {shown!r}: a user or password in the URL would be stored with the run and "
                          f"printed; give the key as --api-key or ${API_KEY_ENV} (sent as a Bearer token)")
    if not parts.hostname or parts.query or parts.fragment:
        # a query took /healthz and /v1/systemone into itself: every request went to the same path (404s measured)
        raise ConfigError(f"--endpoint {shown!r}: a host (and port), with no query or fragment; {EXAMPLE}")
    return url.removesuffix(PATH)


def key_in_clear(url: str, api_key: str | None) -> str | None:
    """A warning when an API key would travel to `url` unencrypted over a network: http:// to a host that is not
    this machine (a key on plain HTTP can be read by anyone on the path). None otherwise."""
    import ipaddress

    parts = urlsplit(url)
    if not api_key or parts.scheme != "http" or parts.hostname is None:
        return None
    host = parts.hostname
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host == "localhost" or host.endswith(".localhost")
    if local:
        return None
    return (f"warning: the API key goes to {shown_url(url)} over plain HTTP (not https://, not this machine): anyone "
            "on the network path can read it; use an https:// endpoint or a tunnel")
