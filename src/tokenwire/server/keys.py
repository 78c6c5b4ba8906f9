"""The API keys a server accepts: ``--api-key``'s, ``--admin-api-key``'s and those of
``--api-keys-file`` (re-read on SIGHUP), each with a name (for metrics and log lines), whether it
may call the admin routes, and its own priority and quotas.

The file is JSON, a list of keys (or ``{"keys": [...]}``), each::

    {"key": "sk-team-a", "name": "team-a", "admin": false, "priority": 0,
     "requests_per_minute": 600, "tokens_per_minute": 200000, "max_concurrent_requests": 16}

(only ``key`` is required); or plain text, one ``KEY [NAME]`` a line (``#`` starts a comment).
A key's ``priority`` is the most urgent its requests run at (vLLM's sense, lower is sooner): a
request's own ``priority`` is added to it, never below it. A file that cannot be read or parsed
on SIGHUP leaves the keys as they were (the reason is logged).
"""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenwire.server.security import ApiKey

__all__ = ["KeyLimits", "KeyRing", "parse_keys_file"]

log = logging.getLogger("tokenwire.server")


@dataclass(frozen=True)
class KeyLimits:
    """One key's rights and quotas (None: no limit)."""

    admin: bool = False
    #: The most urgent priority its requests run at (None: as they ask).
    priority: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None

    @property
    def limited(self) -> bool:
        return (
            self.requests_per_minute is not None
            or self.tokens_per_minute is not None
            or self.max_concurrent_requests is not None
        )


@dataclass(frozen=True)
class _Entry:
    bearer: bytes
    raw: bytes
    key: ApiKey
    limits: KeyLimits


_FIELDS = {
    "key",
    "name",
    "admin",
    "priority",
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrent_requests",
}


def _positive(item: dict[str, Any], field: str, where: str) -> int | None:
    value = item.get(field)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: {field} must be a whole number of at least 1, got {value!r}")
    return value


def parse_keys_file(
    text: str, source: str = "the keys file"
) -> list[tuple[str, str | None, KeyLimits]]:
    """``(secret, name, limits)`` for each key of a keys file (``ValueError`` naming the
    problem and where it is)."""
    stripped = text.lstrip()
    out: list[tuple[str, str | None, KeyLimits]] = []
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{source}: not valid JSON: {exc}") from None
        if isinstance(data, dict):
            data = data.get("keys")
        if not isinstance(data, list):
            raise ValueError(f'{source}: a list of keys, or {{"keys": [...]}}, is expected')
        for i, item in enumerate(data):
            where = f"{source}, key {i + 1}"
            if not isinstance(item, dict):
                raise ValueError(f"{where}: an object is expected")
            unknown = set(item) - _FIELDS
            if unknown:
                raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
            secret = item.get("key")
            if not isinstance(secret, str) or not secret:
                raise ValueError(f"{where}: key (a non-empty string) is required")
            name = item.get("name")
            if name is not None and (not isinstance(name, str) or not name):
                raise ValueError(f"{where}: name must be a non-empty string")
            admin = item.get("admin", False)
            if not isinstance(admin, bool):
                raise ValueError(f"{where}: admin must be true or false")
            priority = item.get("priority")
            if priority is not None and (
                not isinstance(priority, int) or isinstance(priority, bool)
            ):
                raise ValueError(f"{where}: priority must be an integer")
            limits = KeyLimits(
                admin=admin,
                priority=priority,
                requests_per_minute=_positive(item, "requests_per_minute", where),
                tokens_per_minute=_positive(item, "tokens_per_minute", where),
                max_concurrent_requests=_positive(item, "max_concurrent_requests", where),
            )
            out.append((secret, name, limits))
        return out
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"{source}, line {n}: KEY [NAME] is expected")
        out.append((parts[0], parts[1] if len(parts) > 1 else None, KeyLimits()))
    return out


class KeyRing:
    """The accepted keys (replaced as a whole on ``reload``)."""

    def __init__(
        self,
        api_keys: tuple[str, ...] | list[str] = (),
        admin_keys: tuple[str, ...] | list[str] = (),
        path: str | None = None,
    ) -> None:
        self._flag_keys = tuple(k for k in api_keys if k)
        self._admin_keys = tuple(k for k in admin_keys if k)
        self.path = path
        self._entries: tuple[_Entry, ...] = ()
        self._by_id: dict[str, _Entry] = {}
        self.required = False
        self.has_admin = False
        self._build(self._read() if path else [])

    def _read(self) -> list[tuple[str, str | None, KeyLimits]]:
        assert self.path is not None
        try:
            text = Path(self.path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read --api-keys-file {self.path}: {exc}") from None
        return parse_keys_file(text, self.path)

    def _build(self, from_file: list[tuple[str, str | None, KeyLimits]]) -> None:
        keys: dict[str, tuple[str | None, KeyLimits]] = {}
        for secret in self._flag_keys:
            keys[secret] = (None, KeyLimits())
        for secret, name, limits in from_file:
            keys[secret] = (name, limits)
        for secret in self._admin_keys:
            name, limits = keys.get(secret, (None, KeyLimits()))
            keys[secret] = (name or "admin-" + ApiKey.of(secret).name[4:], _admin(limits))
        entries = []
        names: dict[str, str] = {}
        for secret, (name, limits) in keys.items():
            key = ApiKey.of(secret, name)
            if key.name in names and names[key.name] != key.id:
                log.warning("two API keys are both named %r", key.name)
            names[key.name] = key.id
            entries.append(_Entry(("Bearer " + secret).encode(), secret.encode(), key, limits))
        self._entries = tuple(entries)
        self._by_id = {e.key.id: e for e in entries}
        self.has_admin = any(e.limits.admin for e in entries)
        # (--admin-api-key alone guards only the admin routes; a keys file, even an empty one,
        # guards every route)
        self.required = bool(self._flag_keys) or self.path is not None

    def reload(self) -> bool:
        """Read the keys file again (False, keys unchanged, when it cannot be used)."""
        if self.path is None:
            return False
        try:
            from_file = self._read()
        except ValueError as exc:
            log.error("keeping the API keys as they were: %s", exc)
            return False
        self._build(from_file)
        log.info("API keys reloaded from %s: %d key(s)", self.path, len(self._entries))
        return True

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, bearer: bytes | None, raw: bytes | None) -> ApiKey | None:
        """The key a request presents (``Authorization: Bearer <key>``, or ``x-api-key``), or
        None; every key is compared, so the time taken does not say which matched."""
        found = None
        for entry in self._entries:
            matched = bearer is not None and hmac.compare_digest(bearer, entry.bearer)
            matched |= raw is not None and hmac.compare_digest(raw, entry.raw)
            if matched and found is None:
                found = entry.key
        return found

    def limits(self, key: ApiKey | None) -> KeyLimits:
        entry = self._by_id.get(key.id) if key is not None else None
        return entry.limits if entry is not None else KeyLimits()

    def names(self) -> list[str]:
        return [e.key.name for e in self._entries]


def _admin(limits: KeyLimits) -> KeyLimits:
    return KeyLimits(
        admin=True,
        priority=limits.priority,
        requests_per_minute=limits.requests_per_minute,
        tokens_per_minute=limits.tokens_per_minute,
        max_concurrent_requests=limits.max_concurrent_requests,
    )
