"""Who may call the server, and from which web pages.

- ``--api-key KEY [KEY ...]`` (or ``TOKENWIRE_API_KEY``) and ``--api-keys-file`` (``keys``):
  every route but the probes (``/health``, ``/live``, ``/ready``) and ``/metrics`` needs
  ``Authorization: Bearer <key>`` or (as Anthropic's clients send it) ``x-api-key: <key>`` with
  one of the keys, compared in constant time; otherwise a 401 in the API's error shape. The key a
  request presented is put in its ASGI scope under ``KEY_SCOPE`` as an ``ApiKey`` (a stable id
  derived from the key, and a name for logs and metrics), so what a client stores can be scoped
  to the key that made it.
- A request body in one of the content types a web page may send to any site without a CORS
  preflight (``text/plain``, ``application/x-www-form-urlencoded``, ``multipart/form-data``) is
  refused with 415, so no page can drive the server from a visitor's browser; a request with no
  ``Content-Type`` (curl, most clients' defaults) is accepted as JSON.
- A request whose ``Host`` names none of the server's own names and addresses is refused with
  400 (a page that rebinds its DNS name to this server sends its own name there): the names are
  ``--allowed-hosts`` (``*`` for any, ``.example.com`` for a domain and its subdomains), by default
  the loopback names and addresses and the address the request reached the server on
  (``/health`` and ``/metrics`` answer whatever the ``Host``).
- A request with a body from a web page of another origin (its ``Origin`` header, which browsers
  always send on such a request, names neither this server, as its ``Host`` names it once that is
  allowed, nor an allowed origin) is refused with 403, whatever its content type (``fetch`` with
  ``mode: "no-cors"`` and a Blob body sends none).
- CORS, off by default, with vLLM's options: ``--allowed-origins``, ``--allowed-methods``,
  ``--allowed-headers``, ``--allow-credentials``.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenwire.messages.errors import (
    ForbiddenError,
    TokenwireError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
    ValidationError,
)

if TYPE_CHECKING:
    from tokenwire.server.keys import KeyRing

__all__ = [
    "ApiKey",
    "KEY_SCOPE",
    "OPEN_PATHS",
    "Security",
    "SecurityConfig",
    "client_key",
    "host_name",
    "request_key",
]

#: The ASGI scope entry that holds the ``ApiKey`` a request was admitted with (absent when the
#: server requires no key).
KEY_SCOPE = "tokenwire.api_key"

#: Routes that answer without an API key (probes and scrapers).
OPEN_PATHS = frozenset({"/health", "/metrics", "/live", "/ready"})
#: Content types a browser sends cross-site without a preflight.
_SIMPLE_TYPES = frozenset(
    {b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"}
)
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True)
class ApiKey:
    """One accepted API key, as the rest of the server sees it: never the secret itself."""

    #: Stable across restarts and key-list order: the first 16 hex digits of the key's SHA-256.
    id: str
    #: What logs and metrics call it.
    name: str

    @classmethod
    def of(cls, secret: str, name: str | None = None) -> ApiKey:
        digest = hashlib.sha256(secret.encode()).hexdigest()[:16]
        return cls(id=digest, name=name or "key-" + digest[:8])


def request_key(scope: dict) -> ApiKey | None:
    """The key a request was admitted with, or None when the server requires none."""
    return scope.get(KEY_SCOPE)


def client_key(scope: dict | None) -> str | None:
    """Who a request is from, for fairness between clients: its API key's id when keys are
    required, else its peer's address (None when neither is known)."""
    if scope is None:
        return None
    key = request_key(scope)
    if key is not None:
        return "key:" + key.id
    peer = scope.get("client")
    return None if not peer else "peer:" + str(peer[0])


@dataclass(frozen=True)
class SecurityConfig:
    """The server's access settings (no key is required while ``api_keys`` is empty; CORS is
    off while ``allowed_origins`` is empty)."""

    api_keys: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    #: ``--allowed-hosts``: the names and addresses a request's ``Host`` may give (``*``: any;
    #: ``.example.com``: that domain and its subdomains); empty: the loopback ones and the
    #: address each request reached the server on.
    allowed_hosts: tuple[str, ...] = ()


@functools.lru_cache(maxsize=1024)
def host_name(value: bytes) -> str:
    """The host of a ``Host`` header (or an origin's ``host[:port]``), without its port,
    lowercased, brackets and a trailing dot removed."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text[1:]
    if text.count(":") == 1:
        text = text.partition(":")[0]
    return text.rstrip(".")


@functools.lru_cache(maxsize=1024)
def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


class _ConfigKeys:
    """The keys of a ``SecurityConfig`` (``keys.KeyRing``'s interface: the server's own set
    adds names, admin rights and quotas, and a file re-read on SIGHUP)."""

    def __init__(self, api_keys: tuple[str, ...]) -> None:
        #: (``Bearer <key>``, ``<key>``, its ``ApiKey``) per accepted key
        self._keys = tuple(
            (("Bearer " + k).encode(), k.encode(), ApiKey.of(k)) for k in dict.fromkeys(api_keys)
        )
        self.required = bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, bearer: bytes | None, raw: bytes | None) -> ApiKey | None:
        found = None
        for bearer_key, raw_key, key in self._keys:
            matched = bearer is not None and hmac.compare_digest(bearer, bearer_key)
            matched |= raw is not None and hmac.compare_digest(raw, raw_key)
            if matched and found is None:
                found = key
        return found


class Security:
    """The checks of one ``SecurityConfig``, on ASGI scopes (no I/O); ``keys``: the accepted
    keys (a ``keys.KeyRing``; default: ``config.api_keys``)."""

    def __init__(self, config: SecurityConfig, keys: KeyRing | None = None) -> None:
        self.config = config
        self.keys: KeyRing | _ConfigKeys = (
            keys if keys is not None else _ConfigKeys(config.api_keys)
        )
        self._any_origin = "*" in config.allowed_origins
        self._origins = frozenset(o.encode() for o in config.allowed_origins)
        hosts = tuple(h.strip().lower().rstrip(".") for h in config.allowed_hosts if h.strip())
        self._any_host = "*" in hosts
        self._hosts = frozenset(h.strip("[]") for h in hosts if not h.startswith("."))
        self._domains = tuple(h for h in hosts if h.startswith("."))
        self._methods = ", ".join(
            ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
            if "*" in config.allowed_methods
            else config.allowed_methods
        ).encode()

    def check(self, scope: dict) -> TokenwireError | None:
        """Why this request may not proceed (400 for a Host it does not answer to, 401, 403,
        415), or None."""
        host = _header(scope, b"host")
        open_path = scope["path"] in OPEN_PATHS  # (probes and scrapers, wherever they call from)
        if host is not None and not open_path and not self.host_allowed(scope, host):
            return ValidationError(
                f"the Host header names {host.decode('latin-1')[:60]!r}, which this server does "
                "not answer to (--allowed-hosts)",
                param=None,
            )
        keys = self.keys
        if keys.required and not open_path:
            key = self._presented(scope)
            if key is None:
                return UnauthorizedError(
                    "a valid API key is required (Authorization: Bearer ..., or x-api-key)"
                )
            scope[KEY_SCOPE] = key
        elif len(keys):  # (admin keys only: a key is looked at, not required)
            key = self._presented(scope)
            if key is not None:
                scope[KEY_SCOPE] = key
        if scope["method"] in _BODY_METHODS:
            origin = _header(scope, b"origin")
            if origin is not None and not self._origin_allowed(scope, origin):
                return ForbiddenError(
                    f"requests from the web page at {origin.decode('latin-1')[:60]!r} are not "
                    "allowed (--allowed-origins)"
                )
            ctype = _header(scope, b"content-type")
            if ctype is not None and ctype.split(b";")[0].strip().lower() in _SIMPLE_TYPES:
                return UnsupportedMediaTypeError(
                    f"Content-Type {ctype.split(b';')[0].decode('latin-1')[:60]!r} is not "
                    "accepted: send application/json"
                )
        return None

    def host_allowed(self, scope: dict, host: bytes) -> bool:
        """Whether ``host`` (a ``Host`` header) names this server: one of ``--allowed-hosts``,
        or by default a loopback name or address or the address the request reached."""
        if self._any_host:
            return True
        name = host_name(host)
        if self._hosts or self._domains:
            return name in self._hosts or any(
                name.endswith(d) or name == d[1:] for d in self._domains
            )
        if _is_loopback(name):
            return True
        server = scope.get("server")
        if not server or server[1] is None:  # a Unix socket: no browser page reaches it
            return True
        return name == str(server[0]).lower().strip("[]")

    def _origin_allowed(self, scope: dict, origin: bytes) -> bool:
        """Whether a page at ``origin`` may send this request: CORS allows it, or it is this
        server's own origin (the ``Host`` the request was sent to, which ``check`` has found to
        be one of the server's names)."""
        if self._any_origin or origin in self._origins:
            return True
        host = _header(scope, b"host")
        _, _, rest = origin.partition(b"://")
        return host is not None and rest.lower() == host.lower() and self.host_allowed(scope, host)

    def _presented(self, scope: dict) -> ApiKey | None:
        """The accepted key the request carries (as a bearer token, or in ``x-api-key``), or
        None. Every key is compared, so the time taken does not say which one matched."""
        return self.keys.find(_header(scope, b"authorization"), _header(scope, b"x-api-key"))

    def _origin(self, scope: dict) -> bytes | None:
        """The request's Origin when CORS allows it."""
        if not self._origins:
            return None
        origin = _header(scope, b"origin")
        if origin is None or not (self._any_origin or origin in self._origins):
            return None
        return origin

    def is_preflight(self, scope: dict) -> bool:
        return (
            scope["method"] == "OPTIONS"
            and bool(self._origins)
            and _header(scope, b"access-control-request-method") is not None
        )

    def preflight(self, scope: dict) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The answer to a CORS preflight: 200 with the allowances, or 400 for an origin that
        is not allowed."""
        origin = self._origin(scope)
        if origin is None:
            return 400, [(b"content-type", b"text/plain"), (b"vary", b"Origin")]
        cfg = self.config
        if "*" in cfg.allowed_headers:
            allow_headers = _header(scope, b"access-control-request-headers") or b"*"
        else:
            allow_headers = ", ".join(cfg.allowed_headers).encode()
        headers = self._allow(origin) + [
            (b"access-control-allow-methods", self._methods),
            (b"access-control-allow-headers", allow_headers),
            (b"access-control-max-age", b"600"),
        ]
        return 200, headers

    def cors_headers(self, scope: dict) -> list[tuple[bytes, bytes]]:
        """Headers to add to the response of an actual (not preflight) request."""
        origin = self._origin(scope)
        return [] if origin is None else self._allow(origin)

    def _allow(self, origin: bytes) -> list[tuple[bytes, bytes]]:
        credentials = self.config.allow_credentials
        echo = credentials or not self._any_origin
        out = [(b"access-control-allow-origin", origin if echo else b"*")]
        if echo:
            out.append((b"vary", b"Origin"))
        if credentials:
            out.append((b"access-control-allow-credentials", b"true"))
        return out
