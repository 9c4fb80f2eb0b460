"""One process of the hostile-checkpoint fuzz test (tests/ckpt/format/test_fuzz.py).

``python -m tests.ckpt.format.fuzz_child SEED TRIALS WORKDIR`` writes a small pristine checkpoint (in a
Checkpointer's layout: ``root/step_N`` and the ``latest`` pointer), then for each trial copies it,
damages the copy one way (a family below), and runs what a user runs: ``latest(root)``,
``open().read()`` of every tensor, ``verify`` and ``load``. Each trial has a 20 s alarm; every
file the process opens during a trial is recorded by an audit hook. It prints one JSON object:
the trials per family and the problems found. A problem is any outcome other than a
CheckpointError that names what is wrong, or data equal to the original; a read outside the
trial's directory; a hang. For the forged families (an attacker who rewrites the JSON or the
metadata and re-seals the manifest consistently) a successful load of other data is not a
problem: no checksum can tell a consistent forgery from a checkpoint; a crash, a hang or a read
outside still is.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

RAW = ["flip", "overwrite", "truncate", "append", "delete", "dir", "fifo", "symlink", "latest"]
FORGED = ["manifest_field", "metadata_field"]
FAMILIES = RAW + FORGED
HUGE = [0, -1, 1, 2**31, 2**40, 2**63 - 1, -(2**63), 2**64, 3000, 4095, 10**18]
JUNK: list[Any] = [*HUGE, None, "", "../../etc/passwd", "x" * 300, [], {}, 1.5, float("inf"), True, [1, 2], {"a": 1}]


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def pristine(root: Path) -> tuple[Path, dict[str, np.ndarray]]:
    import torch

    import goodput.ckpt as gc

    g = torch.Generator().manual_seed(5)
    state = {
        "w": torch.randn(33, 17, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "i": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "s": torch.tensor(2.5),
        "big": torch.randn(3000, generator=g),  # several checksum blocks
        "step": 7,
        "name": "fuzz",
    }
    ck = root / "step_000000001"
    gc.save(state, ck, step=1, user={"k": "v"})
    (root / "latest").write_text(ck.name)
    c = gc.open(ck)
    return ck, {n: c.read(n, raw=True) for n in c.keys()}  # noqa: SIM118 - a Checkpoint is not a dict


def targets(root: Path, ck: Path) -> list[Path]:
    return sorted(p for p in ck.iterdir() if p.is_file()) + [root / "latest"]


def mutate(fam: str, root: Path, ck: Path, rnd: random.Random) -> str:
    """Damage the copy; returns what was done, for the report."""
    import crc32c
    import msgspec

    from goodput.ckpt.format.format import MANIFEST, decode_manifest, decode_metadata, encode_manifest, encode_metadata

    files = targets(root, ck)
    f = rnd.choice(files)
    raw = f.read_bytes() if f.exists() else b""
    if fam == "flip" and raw:
        i = rnd.randrange(len(raw))
        b = bytearray(raw)
        b[i] ^= 1 << rnd.randrange(8)
        f.write_bytes(bytes(b))
        return f"flip {f.name}[{i}]"
    if fam == "overwrite" and raw:
        i = rnd.randrange(len(raw))
        n = rnd.randint(1, 64)
        b = bytearray(raw)
        b[i : i + n] = bytes(rnd.randrange(256) for _ in range(len(b[i : i + n])))
        f.write_bytes(bytes(b))
        return f"overwrite {f.name}[{i}:{i + n}]"
    if fam == "truncate":
        n = rnd.randrange(len(raw) + 1)
        f.write_bytes(raw[:n])
        return f"truncate {f.name} to {n}"
    if fam == "append":
        f.write_bytes(raw + bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 5000))))
        return f"append to {f.name}"
    if fam == "delete":
        f.unlink()
        return f"delete {f.name}"
    if fam in ("dir", "fifo", "symlink"):
        f.unlink()
        if fam == "dir":
            f.mkdir()
        elif fam == "fifo":
            os.mkfifo(f)
        else:
            outside = root.parent / "outside"
            outside.write_bytes(raw)  # the same bytes, outside the checkpoint: still refused
            f.symlink_to(outside)
        return f"{fam} in place of {f.name}"
    if fam == "latest":
        p = root / "latest"
        choice = rnd.randrange(5)
        if choice == 0:
            p.write_bytes(bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 40))))
        elif choice == 1:
            p.write_text("step_000000009")
            (root / "step_000000009").symlink_to(ck)  # a link to a checkpoint: not this run's
        elif choice == 2:
            p.unlink()
            p.symlink_to("/etc/passwd")
        elif choice == 3:
            p.unlink()
            os.mkfifo(p)
        else:
            p.write_text("../" + ck.name)
        return f"latest pointer #{choice}"
    if fam == "manifest_field":
        obj = json.loads((ck / MANIFEST).read_bytes())
        obj.pop("crc32c", None)
        key = rnd.choice(
            [
                "step",
                "save_id",
                "world_size",
                "data_bytes",
                "num_files",
                "user",
                "created",
                "metadata",
                "format",
                "version",
            ]
        )
        if key == "metadata" and rnd.random() < 0.7:
            obj["metadata"][rnd.choice(["name", "bytes", "crc32c"])] = rnd.choice(JUNK)
        else:
            obj[key] = rnd.choice(JUNK)
        body = json.dumps(obj, separators=(",", ":")).encode()
        seal = rnd.random() < 0.8
        (ck / MANIFEST).write_bytes(body[:-1] + b',"crc32c":%d}' % crc32c.crc32c(body) if seal else body)
        return f"manifest {key} forged (sealed={seal})"
    if fam == "metadata_field":
        m = decode_manifest((ck / MANIFEST).read_bytes(), "manifest")
        md = decode_metadata((ck / m.metadata.name).read_bytes(), "metadata", m)
        what = rnd.choice(["shape", "dtype", "block_bytes", "file_name", "file_bytes", "column", "values"])
        t = rnd.choice(md.tensors)
        if what == "shape":
            t.shape = [rnd.choice(HUGE[1:]) for _ in range(rnd.randint(0, 3))]
        elif what == "dtype":
            t.dtype = rnd.choice(["float32", "int32", "bfloat16", "complex128", "uint8", "pickle"])
        elif what == "block_bytes":
            md.block_bytes = rnd.choice([1, 3000, 4096, 1 << 20, 1 << 30, 8192])
        elif what == "file_name":
            md.files[0].name = rnd.choice(["../outside", "/etc/passwd", "MANIFEST.json", "latest", "x" * 250])
        elif what == "file_bytes":
            md.files[0].bytes = rnd.choice(HUGE[:8])
        elif what == "column":
            col = rnd.choice(list(md.cols))
            arr = md.cols[col].copy()
            if arr.size:
                flat = arr.reshape(-1)
                info = np.iinfo(arr.dtype)
                flat[rnd.randrange(flat.size)] = rnd.choice([info.min, info.max, 0, 1, -1 if info.min < 0 else 1, 4096])
            md.cols[col] = arr
        else:
            md.values = {"step": {"__tuple__": "no"}, "x": {"__float__": "zzz"}}
        try:
            new = encode_metadata(md)
        except (ValueError, TypeError, OverflowError, msgspec.EncodeError) as e:
            return f"metadata {what}: not encodable ({type(e).__name__})"
        (ck / m.metadata.name).write_bytes(new)
        m.metadata.bytes, m.metadata.crc32c = len(new), crc32c.crc32c(new)
        (ck / MANIFEST).write_bytes(encode_manifest(m))
        return f"metadata {what} forged"
    return f"{fam}: nothing to do on {f.name}"


def names_something(msg: str, ck: Path, tensors: list[str]) -> bool:
    return bool(msg) and (
        str(ck) in msg
        or re.search(r"(MANIFEST|metadata|data-|latest|manifest|checkpoint)", msg) is not None
        or any(repr(t) in msg for t in tensors)
    )


def check(fam: str, what: str, root: Path, ck: Path, original: dict[str, np.ndarray]) -> list[str]:
    import torch

    import goodput.ckpt as gc

    forged = fam in FORGED
    problems: list[str] = []

    def bad(step: str, e: BaseException | None, detail: str = "") -> None:
        tb = "" if e is None else "".join(traceback.format_exception_only(type(e), e)).strip()
        problems.append(f"{fam} ({what}) / {step}: {tb or detail}")

    def guarded(step: str, fn: Any) -> Any:
        try:
            return fn()
        except gc.CheckpointError as e:
            if not names_something(str(e), ck, list(original)):
                bad(step, e, "an error that names nothing")
        except Hang:
            bad(step, None, "hang (20 s)")
        except BaseException as e:  # noqa: BLE001 - anything else is what the test hunts
            bad(step, e)
        return None

    def latest_ok() -> None:
        p = gc.latest(root)
        if p is not None and Path(p).resolve().parent != root.resolve():
            bad("latest", None, f"latest() left the root: {p}")

    guarded("latest", latest_ok)

    def read_all() -> None:
        c = gc.open(ck)
        said = (c.step, c.manifest.user, c.values)
        if not forged and said != (1, {"k": "v"}, {"step": 7, "name": "fuzz"}):
            bad("read", None, f"step, user or values read back as {said!r} without an error")
        for n in c.keys():  # noqa: SIM118 - a Checkpoint is not a dict
            got = c.read(n, raw=True)
            if not forged and (n not in original or not np.array_equal(got, original[n])):
                bad("read", None, f"{n!r} read back different data without an error")

    guarded("read", read_all)
    guarded("verify", lambda: gc.verify(ck))

    def load() -> None:
        target = {n: torch.zeros(a.shape, dtype=torch.float32) for n, a in original.items() if n in ("w", "big")}
        gc.load(target, ck, strict=False)
        for n, t in target.items():
            if not forged and not np.array_equal(t.numpy().view(original[n].dtype), original[n]):
                bad("load", None, f"{n!r} loaded different data without an error")

    guarded("load", load)
    return problems


def main(seed: int, n: int, work: Path) -> None:
    import warnings

    import goodput.ckpt as gc  # noqa: F401 - imported before the audit hook, as a user's process would

    warnings.simplefilter("ignore")
    base = work / "pristine"
    base.mkdir(parents=True)
    ck0, original = pristine(base)
    rnd = random.Random(seed)
    current: dict[str, Path] = {}
    outside: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event == "open" and current and isinstance(args[0], (str, bytes, os.PathLike)):
            p = os.fsdecode(args[0])
            if p.startswith((sys.prefix, sys.base_prefix)) or "/site-packages/" in p or p.endswith((".py", ".pyc")):
                return  # the interpreter's own imports
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            if flags & getattr(os, "O_NOFOLLOW", 0):  # a link in the last place is refused, not followed
                q = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
            else:
                q = os.path.realpath(p)
            if not q.startswith(str(current["dir"].resolve()) + os.sep):
                outside.append(f"{current['what']}: opened {p}")

    sys.addaudithook(audit)
    signal.signal(signal.SIGALRM, _alarm)
    counts = dict.fromkeys(FAMILIES, 0)
    problems: list[str] = []
    for i in range(n):
        fam = FAMILIES[i % len(FAMILIES)] if i < len(FAMILIES) else rnd.choice(FAMILIES)
        counts[fam] += 1
        d = work / f"t{i}"
        root = d / "root"
        shutil.copytree(base, root, symlinks=True)
        ck = root / ck0.name
        what = mutate(fam, root, ck, rnd)
        current.update(dir=root, what=f"trial {i} ({what})")
        signal.alarm(20)
        try:
            problems += check(fam, what, root, ck, original)
        except Hang:
            problems.append(f"trial {i} ({fam}): hang outside the guarded calls")
        finally:
            signal.alarm(0)
            current.clear()
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps({"counts": counts, "problems": problems, "outside": outside}))


if __name__ == "__main__":
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a forged size must not be allocated
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
