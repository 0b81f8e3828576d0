"""Secrets out of what the CLI prints: terminals are logged, pasted into tickets and shared.
`gameday env status|up --json` print env.json's endpoints and tokens redacted unless
``--show-secrets`` is given, as ``kubectl`` and ``pulumi stack output`` do."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["REDACTED", "redact", "redact_url"]

REDACTED = "***"
# a key whose value is a secret, wherever it is in the document (tokens.projects.<name>,
# platform_info.db_password, ...): everything below it is redacted
_SECRET_KEY = re.compile(r"token|password|secret|credential", re.IGNORECASE)
# user:password@ in a URL or DSN
_URL_PASSWORD = re.compile(r"(//[^:/@\s]+:)[^@\s]+@")
# password=... in a libpq keyword DSN or a URL query
_KEYWORD_PASSWORD = re.compile(r"(\bpassword=)[^\s&]+", re.IGNORECASE)


def redact_url(text: str) -> str:
    """A URL or DSN with its password replaced (user and host kept: they say what it is)."""
    return _KEYWORD_PASSWORD.sub(rf"\g<1>{REDACTED}", _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", text))


def redact(doc: Any) -> Any:
    """A copy of ``doc`` with every secret replaced by ``***``: values under a secret-named key
    (tokens, passwords), and passwords inside URLs and DSNs. Structure and other values kept."""
    if isinstance(doc, dict):
        return {k: (_blank(v) if isinstance(k, str) and _SECRET_KEY.search(k) else redact(v))
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [redact(v) for v in doc]
    if isinstance(doc, str):
        return redact_url(doc)
    return doc


def _blank(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _blank(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return None if value is None else REDACTED
