"""Secrets out of what flowrl writes: state files, loggers' run configs, error lines.

`redact` replaces with *** the password (and user) of `scheme://user:pass@host` URLs, the values of query
parameters named like a credential (`?token=`, `&api_key=`, `sig=`, ...), strings shaped like well-known API
keys (OpenAI `sk-`, Hugging Face `hf_`, GitHub `ghp_`, Slack `xox?-`, AWS `AKIA`), and, in mappings, the string
values of keys named like a credential. Numbers and everything else pass unchanged.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
_WORDS = {"token", "secret", "password", "passwd", "pwd", "apikey", "credential", "credentials", "auth",
          "authorization", "sig", "signature", "bearer"}
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@?#]+@")
_QUERY = re.compile(r"(?P<name>[?&;](?P<key>[A-Za-z0-9_.-]+)=)(?P<value>[^&#\s'\"]+)")
_KEYS = re.compile(r"\b(?:sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|"
                   r"xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})\b")


def secret_name(name: str) -> bool:
    """`api_key`, `access_token`, `password`, `hf-token`, `sig`: a word of the name is a credential's."""
    words = re.split(r"[_.-]", name.lower())
    return bool(_WORDS.intersection(words)) or name.lower().endswith(("api_key", "access_key", "secret_key"))


def redact(value: Any) -> Any:
    """`value` (a string, or nested dicts and lists of them) with its secrets replaced by ***."""
    if isinstance(value, str):
        value = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", value)
        value = _QUERY.sub(lambda m: f"{m['name']}{MASK}" if secret_name(m["key"]) else m[0], value)
        return _KEYS.sub(MASK, value)
    if isinstance(value, dict):
        return {k: MASK if isinstance(v, str) and v and secret_name(str(k)) else redact(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value
