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
- A request with a body from a web page of another origin (its ``Origin`` header, which browsers
  always send on such a request, names neither this server nor an allowed origin) is refused
  with 403, whatever its content type (``fetch`` with ``mode: "no-cors"`` and a Blob body sends
  none).
- CORS, off by default, with vLLM's options: ``--allowed-origins``, ``--allowed-methods``,
  ``--allowed-headers``, ``--allow-credentials``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenwire.messages.errors import (
    ForbiddenError,
    TokenwireError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)

if TYPE_CHECKING:
    from tokenwire.server.keys import KeyRing

__all__ = ["ApiKey", "KEY_SCOPE", "SecurityConfig", "Security", "OPEN_PATHS", "request_key"]

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


@dataclass(frozen=True)
class SecurityConfig:
    """The server's access settings (no key is required while ``api_keys`` is empty; CORS is
    off while ``allowed_origins`` is empty)."""

    api_keys: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False


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
        self._methods = ", ".join(
            ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
            if "*" in config.allowed_methods
            else config.allowed_methods
        ).encode()

    def check(self, scope: dict) -> TokenwireError | None:
        """Why this request may not proceed (401, 415), or None."""
        keys = self.keys
        if keys.required and scope["path"] not in OPEN_PATHS:
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

    def _origin_allowed(self, scope: dict, origin: bytes) -> bool:
        """Whether a page at ``origin`` may send this request: CORS allows it, or it is this
        server's own origin (the ``Host`` the request was sent to)."""
        if self._any_origin or origin in self._origins:
            return True
        host = _header(scope, b"host")
        _, _, rest = origin.partition(b"://")
        return host is not None and rest.lower() == host.lower()

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
