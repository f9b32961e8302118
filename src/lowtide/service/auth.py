"""Shared-secret authentication: a mutual HMAC challenge at handshake, and the keys
that then protect every frame.

The client sends a nonce in its Hello; the server answers with its own nonce and
proves the secret with HMAC(secret, "server" | client nonce | server nonce | H); the
client checks that before it proves the secret in turn with HMAC(secret, "client" |
server nonce | client nonce | H). H is the SHA-256 of the Hello as the side computing
it has it: a Hello changed on the way (its graph, role, grid, shard, name) makes the
proofs disagree, so the client refuses the server's and the server the client's; what
either side relies on is the Hello it sent or read, proven equal. A server that does
not know the secret learns nothing it could use and is told nothing. The secret itself
never travels. Each direction's frames then carry an HMAC under a key derived from the
secret, both nonces and H (see :class:`lowtide.wire.frames.FrameSeal`), so the Welcome
that follows, and everything after it, is covered too.

>>> s, c, n, h = b"k" * 32, b"c" * 32, b"n" * 32, hello_digest(b"hello")
>>> verify(s, n, c, h, proof(s, n, c, h)), verify(s, n, c, h, b"x")
(True, False)
>>> verify(s, n, c, hello_digest(b"hellO"), proof(s, n, c, h))  # another Hello
False
>>> mine = server_proof(s, c, n, h)
>>> verify_server(s, c, n, h, mine), verify_server(s, c, n, h, proof(s, c, n, h))
(True, False)
>>> keys = frame_keys(s, c, n, h)
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


def hello_digest(hello: bytes) -> bytes:
    """H: what the proofs and frame keys say about the Hello (its encoded bytes)."""
    return hashlib.sha256(hello).digest()


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes, hello: bytes) -> bytes:
    # nonces and digests are 32 bytes each (checked before use): the parts cannot shift
    return hmac.new(secret, label + first + second + hello, hashlib.sha256).digest()


def proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, hello: bytes) -> bytes:
    """The client's proof; ``hello``: :func:`hello_digest` of the Hello it sent."""
    return _mac(secret, b"client", server_nonce, client_nonce, hello)


def verify(
    secret: bytes, server_nonce: bytes, client_nonce: bytes, hello: bytes, given: bytes
) -> bool:
    return hmac.compare_digest(proof(secret, server_nonce, client_nonce, hello), given)


def server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes, hello: bytes) -> bytes:
    """The server's proof: another label, so neither side's proof serves as the other's."""
    return _mac(secret, b"server", client_nonce, server_nonce, hello)


def verify_server(
    secret: bytes, client_nonce: bytes, server_nonce: bytes, hello: bytes, given: bytes
) -> bool:
    return hmac.compare_digest(server_proof(secret, client_nonce, server_nonce, hello), given)


@dataclass(frozen=True)
class FrameKeys:
    """One MAC key per direction of a connection, fresh for every connection."""

    client_to_server: bytes
    server_to_client: bytes


def frame_keys(secret: bytes, client_nonce: bytes, server_nonce: bytes, hello: bytes) -> FrameKeys:
    return FrameKeys(
        _mac(secret, b"frames client->server", client_nonce, server_nonce, hello),
        _mac(secret, b"frames server->client", client_nonce, server_nonce, hello),
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
