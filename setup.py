"""Builds goodput with the scheduler's hot modules compiled by mypyc, when it can.

The scheduler core (``NATIVE`` below) is plain, fully typed Python; mypyc compiles those modules
to C extensions that decide exactly as the sources do, about 1.7x faster (``goodput bench sched``
says which ran). Everything else is metadata in pyproject.toml. Where mypyc or a C compiler is
missing, or ``GOODPUT_PURE_PYTHON=1``, the install goes on with the pure-Python modules.

The build also writes ``goodput/sched/native.json``: the SHA-256 of each compiled source, so that
``goodput.sched.native`` (which names the modules) can tell when a source was edited after its extension was built (Python
imports the extension over the ``.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _load_native():
    """goodput/sched/native.py names the modules; it needs only the standard library."""
    spec = importlib.util.spec_from_file_location("_goodput_native", HERE / "goodput" / "sched" / "native.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    return mod


_NATIVE = _load_native()
NATIVE = [f"goodput/sched/{_NATIVE.source_of(m)}" for m in _NATIVE.MODULES]
MANIFEST = _NATIVE.MANIFEST


class OptionalBuildExt(build_ext):
    """A failed compile leaves the pure-Python modules in charge: slower, never wrong."""

    def build_extensions(self) -> None:
        """An extension's C files (mypyc writes one per module, ``multi_file``) compiled side by side,
        as many as the cores: distutils compiles one extension's sources one after another, and the
        scheduler's group is one extension. The first failure cancels the compiles not started."""
        if self.compiler.compiler_type == "unix":
            serial = self.compiler.compile
            jobs = os.cpu_count() or 1

            def compile_parallel(sources, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(jobs) as pool:
                    futures = [pool.submit(serial, [src], *args, **kwargs) for src in sources]
                    try:
                        return [obj for f in futures for obj in f.result()]
                    except BaseException:
                        for f in futures:
                            f.cancel()
                        raise

            self.compiler.compile = compile_parallel
        super().build_extensions()

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any compiler or toolchain failure
            _fallback(f"compiling the scheduler failed ({e})")

    def build_extension(self, ext) -> None:  # noqa: ANN001
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            _fallback(f"compiling {ext.name} failed ({e})")
            raise


def _fallback(why: str) -> None:
    """Extensions of an earlier build would be imported over the new sources: remove them too."""
    print(f"goodput: {why}; the scheduler runs as pure Python", file=sys.stderr)
    _remove_built()


def _remove_built() -> None:
    """Pure means pure: extensions left in place by an earlier build would still be imported."""
    MANIFEST.unlink(missing_ok=True)
    for m in _NATIVE.MODULES:
        src = HERE / "goodput" / "sched" / _NATIVE.source_of(m)
        for so in src.parent.glob(f"{src.stem}.*.so"):
            so.unlink()
    for so in HERE.glob("goodput_sched__mypyc.*.so"):
        so.unlink()


def _native_modules():
    if os.environ.get("GOODPUT_PURE_PYTHON") == "1":
        _remove_built()
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _fallback("mypyc is not installed")
        return []
    try:
        exts = mypycify(
            ["--ignore-missing-imports", "--follow-imports=silent", *NATIVE],
            opt_level="3",
            group_name="goodput_sched",
            multi_file=True,
        )
    except BaseException as e:  # noqa: BLE001 - mypy reports type errors by SystemExit
        _fallback(f"mypyc refused the sources (exit {e}: see the type errors above)")
        return []
    digests = {p: hashlib.sha256((HERE / p).read_bytes()).hexdigest() for p in NATIVE}
    MANIFEST.write_text(json.dumps({"compiler": "mypyc", "sources": digests}, indent=1, sort_keys=True) + "\n")
    return exts


setup(ext_modules=_native_modules(), cmdclass={"build_ext": OptionalBuildExt})
