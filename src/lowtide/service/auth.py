"""Shared-secret authentication: an HMAC challenge at handshake, both ways.

The client sends a nonce in its Hello; the server answers with its own nonce; the
client proves it knows the secret with HMAC(secret, "client" | server nonce | client
nonce). The secret itself never travels.

>>> s = b"k" * 32
>>> verify(s, b"n1", b"n2", proof(s, b"n1", b"n2")), verify(s, b"n1", b"n2", b"x")
(True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from pathlib import Path

NONCE_BYTES = 32
ENV_VAR = "LOWTIDE_SECRET"
MIN_SECRET_BYTES = 16


def nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"client" + server_nonce + client_nonce, hashlib.sha256).digest()


def verify(secret: bytes, server_nonce: bytes, client_nonce: bytes, given: bytes) -> bool:
    return hmac.compare_digest(proof(secret, server_nonce, client_nonce), given)


def load_secret(path: str | Path | None = None, env: str = ENV_VAR) -> bytes | None:
    """The secret from ``path`` (stripped of surrounding whitespace), else from the
    environment variable ``env``, else None."""
    if path is not None:
        raw = Path(path).read_bytes().strip()
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
