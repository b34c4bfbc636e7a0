"""Checkpoints signed with a per-user key: a run folder from someone else is refused before anything loads.

A checkpoint's engine state is torch.distributed.checkpoint's, whose `.metadata` file is a pickle, and its
manifest is a list of sha256 sums anyone can regenerate. So `checkpoint.save` also writes `manifest.sig`, an
HMAC-SHA256 of the manifest under this user's key, and every resume or export checks it first (a file
edited afterwards no longer matches the manifest's sums; a manifest edited or written elsewhere no longer
matches the signature). The key is `$FLOWRL_KEY_FILE`, else `~/.config/flowrl/key` (XDG_CONFIG_HOME is
honoured), 32 random bytes made on first use, readable by the user alone. Every node of a multi-node run
needs the same key (a shared home, or FLOWRL_KEY_FILE pointing at one copy). `flowrl trust PATH` signs the
checkpoints of a folder you trust (one from before signatures, or copied from another machine).
"""

from __future__ import annotations

import hmac
import os
import secrets
from hashlib import sha256
from pathlib import Path

KEY_ENV = "FLOWRL_KEY_FILE"


def key_path() -> Path:
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "flowrl" / "key"


def key() -> bytes:
    """This user's key, made (mode 0600, atomically: ranks may race) the first time it is needed."""
    path = key_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # fails if another process made it first: theirs is kept
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    secret = path.read_bytes().strip()
    if len(secret) < 16:
        raise ValueError(f"signing key {path} ({KEY_ENV} or ~/.config/flowrl/key) holds {len(secret)} bytes: a key "
                         f"anyone can guess signs nothing; delete it (flowrl makes a new one) or put 32 random "
                         f"bytes in it")
    return secret


def sign(data: bytes) -> str:
    return hmac.new(key(), data, sha256).hexdigest()


def verify(data: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(data), signature.strip())
