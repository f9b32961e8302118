"""Shared-secret authentication: a mutual HMAC challenge at handshake, and the keys
that then protect every frame.

The client sends a nonce in its Hello; the server answers with its own nonce and
proves the secret with HMAC(secret, "server" | client nonce | server nonce); the client
checks that before it proves the secret in turn with HMAC(secret, "client" | server
nonce | client nonce). A server that does not know the secret learns nothing it could
use and is told nothing. The secret itself never travels. Each direction's frames then
carry an HMAC under a key derived from the secret and both nonces (see
:class:`lowtide.wire.frames.FrameSeal`).

>>> s, c, n = b"k" * 32, b"c" * 32, b"n" * 32
>>> verify(s, n, c, proof(s, n, c)), verify(s, n, c, b"x")
(True, False)
>>> verify_server(s, c, n, server_proof(s, c, n)), verify_server(s, c, n, proof(s, c, n))
(True, False)
>>> keys = frame_keys(s, c, n)
>>> keys.client_to_server != keys.server_to_client
True
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

NONCE_BYTES = 32
ENV_VAR = "LOWTIDE_SECRET"
MIN_SECRET_BYTES = 16


def nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The client's proof."""
    return _mac(secret, b"client", server_nonce, client_nonce)


def verify(secret: bytes, server_nonce: bytes, client_nonce: bytes, given: bytes) -> bool:
    return hmac.compare_digest(proof(secret, server_nonce, client_nonce), given)


def server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """The server's proof: another label, so neither side's proof serves as the other's."""
    return _mac(secret, b"server", client_nonce, server_nonce)


def verify_server(secret: bytes, client_nonce: bytes, server_nonce: bytes, given: bytes) -> bool:
    return hmac.compare_digest(server_proof(secret, client_nonce, server_nonce), given)


@dataclass(frozen=True)
class FrameKeys:
    """One MAC key per direction of a connection, fresh for every connection."""

    client_to_server: bytes
    server_to_client: bytes


def frame_keys(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> FrameKeys:
    return FrameKeys(
        _mac(secret, b"frames client->server", client_nonce, server_nonce),
        _mac(secret, b"frames server->client", client_nonce, server_nonce),
    )


def web_token(secret: bytes) -> str:
    """The web view's login token: derived from the secret under a label of its own,
    so it opens the (read-only) page and nothing else, and does not reveal the secret.

    >>> web_token(b"k" * 32) == web_token(b"k" * 32) != web_token(b"j" * 32)
    True
    """
    return hmac.new(secret, b"lowtide web view", hashlib.sha256).hexdigest()


def is_nonce(value: bytes) -> bool:
    return len(value) == NONCE_BYTES


def load_secret(path: str | Path | None = None, env: str = ENV_VAR) -> bytes | None:
    """The secret from ``path`` (stripped of surrounding whitespace), else from the
    environment variable ``env``, else None. A file that group or others may read
    is refused: the secret is all that stands between a peer and the tracker."""
    if path is not None:
        try:
            mode = os.stat(path).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ValueError(
                    f"secret file {path} is open to group or others ({stat.filemode(mode)}): "
                    f"run chmod 600 {path}"
                )
            raw = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"cannot read secret file {path}: {exc.strerror}") from None
    else:
        value = os.environ.get(env)
        if not value:
            return None
        raw = value.strip().encode()
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"a shared secret needs at least {MIN_SECRET_BYTES} bytes")
    return raw


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
