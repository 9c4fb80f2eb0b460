"""Tokens for the service tests, made in this process by the function ``goodput sched token add``
calls (its CLI, output and errors are tested in test_service.py): a CLI process per token cost the
suite over a minute."""

from __future__ import annotations

import time

from goodput.sched.live import tokens


def add_token(db: str, tenant: str, *extra: str) -> str:
    """``goodput sched token add TENANT --db DB *extra`` (``--admin``, ``--user U``, ``--expires Ns``)."""
    args = list(extra)
    admin, user, expires = False, "", None
    while args:
        flag = args.pop(0)
        if flag == "--admin":
            admin = True
        elif flag == "--user":
            user = args.pop(0)
        elif flag == "--expires" and args[0].endswith("s"):
            expires = time.time() + float(args.pop(0)[:-1])
        else:
            raise AssertionError(f"add_token does not take {flag!r} (--expires in seconds: 3s)")
    return tokens.add(db, tenant, admin=admin, user=user, expires=expires)
