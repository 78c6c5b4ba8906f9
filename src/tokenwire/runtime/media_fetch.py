"""Media bytes from a request's URL, with the server's rules (vLLM's flags and environment
names): ``data:`` URLs; ``file://`` only under ``--allowed-local-media-path``; ``http(s)://``
only to ``--allowed-media-domains`` when set, and never to a private, loopback, link-local or
otherwise non-public address unless its host is allowed by name (no SSRF: the address checked
is the one connected to, so DNS cannot rebind it, and every redirect is checked again), within
a byte cap and a deadline (``VLLM_IMAGE_FETCH_TIMEOUT`` ...). Every refusal is a 400 naming the
field. Runs in the media workers (blocking I/O)."""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass

from tokenwire.messages.errors import ValidationError
from tokenwire.multimodal.media import decode_data_url

__all__ = ["FetchRules", "fetch_media"]

_TIMEOUT_ENV = {
    "image": ("VLLM_IMAGE_FETCH_TIMEOUT", 5),
    "video": ("VLLM_VIDEO_FETCH_TIMEOUT", 30),
    "audio": ("VLLM_AUDIO_FETCH_TIMEOUT", 10),
}


@dataclass(frozen=True)
class FetchRules:
    """Where media may come from, and how long and large a download may be."""

    allowed_media_domains: tuple[str, ...] = ()
    allowed_local_media_path: str | None = None
    max_bytes: int = 64 * 1024 * 1024
    max_redirects: int = 5
    allow_redirects: bool = True
    timeouts: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_env(cls, **kwargs: object) -> FetchRules:
        """The rules with vLLM's environment variables for timeouts and redirects."""
        timeouts = tuple(
            (m, float(os.environ.get(name, default))) for m, (name, default) in _TIMEOUT_ENV.items()
        )
        allow = os.environ.get("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "1").lower() in ("1", "true")
        return cls(timeouts=timeouts, allow_redirects=allow, **kwargs)  # type: ignore[arg-type]

    def timeout(self, modality: str) -> float:
        return dict(self.timeouts).get(modality, float(_TIMEOUT_ENV[modality][1]))


def fetch_media(url: str, modality: str, rules: FetchRules, where: str, param: str) -> bytes:
    """The bytes ``url`` names (a 400 for anything the rules refuse or that fails)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "data":
        _, data = decode_data_url(url, where, param)
        if len(data) > rules.max_bytes:
            raise ValidationError(
                f"{where}: the media is over {rules.max_bytes} bytes", param=param
            )
        return data
    if scheme == "file":
        return _local(url, rules, where, param)
    if scheme in ("http", "https"):
        return _download(url, modality, rules, where, param)
    raise ValidationError(
        f"{where}: the URL must be http(s)://, data: or file:// (got {scheme!r})", param=param
    )


def _local(url: str, rules: FetchRules, where: str, param: str) -> bytes:
    if not rules.allowed_local_media_path:
        raise ValidationError(
            f"{where}: file:// URLs need the server's --allowed-local-media-path", param=param
        )
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ValidationError(f"{where}: a file:// URL must name a local file", param=param)
    path = os.path.realpath(urllib.parse.unquote(parsed.path))
    root = os.path.realpath(rules.allowed_local_media_path)
    if os.path.commonpath([path, root]) != root:
        raise ValidationError(
            f"{where}: the file is not under the server's --allowed-local-media-path", param=param
        )
    try:
        size = os.path.getsize(path)
        if size > rules.max_bytes:
            raise ValidationError(f"{where}: the file is over {rules.max_bytes} bytes", param=param)
        with open(path, "rb") as f:
            return f.read(rules.max_bytes + 1)
    except OSError as exc:
        raise ValidationError(
            f"{where}: cannot read the file ({exc.strerror})", param=param
        ) from None


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _resolve(host: str, port: int, allowed: bool, where: str, param: str) -> str:
    """An address of ``host`` to connect to: a public one, or any when the host is allowed by
    name."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise ValidationError(f"{where}: cannot resolve the host {host!r}", param=param) from None
    for *_, addr in infos:
        ip = ipaddress.ip_address(addr[0].split("%")[0])
        if allowed or _public(ip):
            return str(ip)
    raise ValidationError(
        f"{where}: the host {host!r} is a private, loopback or link-local address, refused "
        "(name it in --allowed-media-domains to allow it)",
        param=param,
    )


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address, with the certificate and SNI of the URL's host."""

    def __init__(self, host: str, ip: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._ip = ip

    def connect(self) -> None:
        sock = socket.create_connection((self._ip, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, ip: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._ip = ip

    def connect(self) -> None:
        self.sock = socket.create_connection((self._ip, self.port), self.timeout)


def _download(url: str, modality: str, rules: FetchRules, where: str, param: str) -> bytes:
    deadline = time.monotonic() + rules.timeout(modality)
    for _hop in range(rules.max_redirects + 1):
        parsed = urllib.parse.urlsplit(url)
        host = parsed.hostname
        if not host:
            raise ValidationError(f"{where}: the URL has no host", param=param)
        named = host.lower() in {d.lower() for d in rules.allowed_media_domains}
        if rules.allowed_media_domains and not named:
            raise ValidationError(
                f"{where}: the URL's host {host!r} is not one of --allowed-media-domains",
                param=param,
            )
        secure = parsed.scheme == "https"
        port = parsed.port or (443 if secure else 80)
        ip = _resolve(host, port, named, where, param)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn_cls = _PinnedHTTPS if secure else _PinnedHTTP
        conn = conn_cls(host, ip, port, left)
        try:
            path = parsed.path or "/"
            if parsed.query:
                path += "?" + parsed.query
            conn.request("GET", path, headers={"User-Agent": "tokenwire", "Accept": "*/*"})
            resp = conn.getresponse()
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                if not rules.allow_redirects or not location:
                    raise ValidationError(
                        f"{where}: the URL redirects (status {resp.status}), not followed",
                        param=param,
                    )
                url = urllib.parse.urljoin(url, location)
                if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                    raise ValidationError(f"{where}: a redirect to a non-HTTP URL", param=param)
                continue
            if resp.status != 200:
                raise ValidationError(
                    f"{where}: fetching the URL answered HTTP {resp.status}", param=param
                )
            length = resp.getheader("Content-Length")
            if length and length.isdigit() and int(length) > rules.max_bytes:
                raise ValidationError(
                    f"{where}: the media is over {rules.max_bytes} bytes", param=param
                )
            chunks, size = [], 0
            while True:
                if time.monotonic() > deadline:
                    raise ValidationError(
                        f"{where}: fetching the URL took longer than {rules.timeout(modality):g} s",
                        param=param,
                    )
                chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > rules.max_bytes:
                    raise ValidationError(
                        f"{where}: the media is over {rules.max_bytes} bytes", param=param
                    )
                chunks.append(chunk)
            return b"".join(chunks)
        except ValidationError:
            raise
        except TimeoutError:
            raise ValidationError(
                f"{where}: fetching the URL took longer than {rules.timeout(modality):g} s",
                param=param,
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ValidationError(f"{where}: cannot fetch the URL ({exc})", param=param) from None
        finally:
            conn.close()
    if time.monotonic() >= deadline:
        raise ValidationError(
            f"{where}: fetching the URL took longer than {rules.timeout(modality):g} s",
            param=param,
        )
    raise ValidationError(f"{where}: too many redirects", param=param)
