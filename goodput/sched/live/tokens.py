"""Bearer tokens of the live service: how one is made and what the store keeps of it.

Apart from the service so that ``goodput sched token add`` (run by an operator, a provisioning
script, every test) makes a token without importing the HTTP stack. Only a token's sha256 and its
first 11 characters are stored: a leaked store grants nothing."""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}\Z")  # a tenant's or a job's name


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(store: Any, tenant: str, role: str = "tenant", job: str = "", *, expires: float | None = None) -> str:
    """A fresh random token for ``tenant``; only its hash (and its first 11 characters, for ``token
    ls`` and ``token revoke``) is stored."""
    if not NAME.match(tenant):
        raise ValueError(f"tenant {tenant!r}: letters, digits, '-' and '_' only (at most 48)")
    tok = f"gp_{secrets.token_urlsafe(32)}"
    store.add_token(digest(tok), tenant, role, job, prefix=tok[:11], expires=expires)
    return tok


def add(db: str, tenant: str, *, admin: bool = False, user: str = "", expires: float | None = None) -> str:
    """What ``goodput sched token add`` does: a token of ``tenant`` in the store at ``db`` (which the
    service may hold open), its jobs run as ``user`` when given (a user this machine knows, now),
    valid until the epoch time ``expires`` when given. Raises ValueError, StoreError or RunAsError."""
    from .runas import resolve
    from .store import open_store

    if not NAME.match(tenant):
        raise ValueError(f"tenant {tenant!r}: letters, digits, '-' and '_' only (at most 48)")
    if user:
        resolve(user)
    with open_store(db) as store:
        if user:
            store.set_tenant_user(tenant, user)
        return new_token(store, tenant, "admin" if admin else "tenant", expires=expires)
