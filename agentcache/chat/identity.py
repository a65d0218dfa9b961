"""Who a request belongs to: its tenant and its conversation, both decided by the server.

    tenant       = H(api-key digest, cache_salt)            ("" with neither: one tenant)
    token        = "c1." + id + "." + HMAC(secret, tenant, id)    id: 128 random bits
    prefix scope = H(tenant, role and text of every segment before this one)

A conversation's id is random and issued by the server; the client gets it back as a signed
token and echoes it. A token verifies only with the secret it was signed with and for the
tenant it was issued to, so a client can neither forge one nor use another tenant's. A shared
segment's scope names everything before it: the segmenter tokenizes segment by segment, so
equal roles and texts before it mean equal tokens before it, at equal positions, and KV found
under that scope is exactly what this prompt would compute.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

TOKEN_VERSION = "c1"
ID_HEX = 32  # 128 random bits
MAC_HEX = 32  # HMAC-SHA256, truncated to 128 bits
TOKEN_CHARS = len(TOKEN_VERSION) + ID_HEX + MAC_HEX + 2


def digest(*parts: str) -> str:
    """A 128-bit hex digest of `parts`, unambiguous in how they split."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def tenant_id(key_digest: str | None, cache_salt: str | None) -> str:
    """The tenant of a request: its API key (as a digest) and optional cache salt."""
    if not key_digest and not cache_salt:
        return ""
    return digest("tenant", key_digest or "", cache_salt or "")


def prefix_scope(tenant: str, preceding: Iterable[tuple[str, str]]) -> str:
    """The scope of a shared segment behind the (role, text) segments `preceding`."""
    flat = [part for role_text in preceding for part in role_text]
    return "prefix-" + digest("prefix", tenant, *flat)


class ConversationTokens:
    """Issues and verifies conversation tokens. `secret` (>= 16 bytes) makes tokens survive a
    restart; by default each instance draws its own, and its tokens die with it."""

    def __init__(self, secret: bytes | None = None) -> None:
        if secret is not None and len(secret) < 16:
            raise ValueError("a conversation secret must be at least 16 bytes")
        self._secret = secret or secrets.token_bytes(32)

    def issue(self, tenant: str) -> tuple[str, str]:
        """A new conversation: (id, token)."""
        cid = secrets.token_hex(ID_HEX // 2)
        return cid, self.sign(cid, tenant)

    def sign(self, cid: str, tenant: str) -> str:
        return f"{TOKEN_VERSION}.{cid}.{self._mac(cid, tenant)}"

    def verify(self, token: str, tenant: str) -> str | None:
        """The conversation id `token` names, or None when it was not issued to `tenant` by
        this secret (forged, altered, another tenant's, or not a token at all)."""
        if len(token) != TOKEN_CHARS or not token.isascii():
            return None
        version, _, rest = token.partition(".")
        cid, _, mac = rest.partition(".")
        if version != TOKEN_VERSION or len(cid) != ID_HEX:
            return None
        return cid if hmac.compare_digest(mac, self._mac(cid, tenant)) else None

    def _mac(self, cid: str, tenant: str) -> str:
        msg = f"{tenant}\x1f{cid}".encode("utf-8", "surrogatepass")
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()[:MAC_HEX]
