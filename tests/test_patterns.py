"""Names read from a tenant, the network or storage are checked by anchored patterns. In Python's
``re`` a final ``$`` also matches before a trailing newline: ``goodput sched token add $'alice\\n'``
made a tenant called "alice\\n" (every submission of it then failed, blaming another field). Every
pattern anchored at the start ends in ``\\Z`` instead, read from the source so a new one is caught."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from goodput.ckpt.format import format as F
from goodput.sched.live import tokens

PKG = Path(__file__).resolve().parents[1] / "goodput"


def _anchored_patterns() -> list[tuple[str, str]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("re.compile", "re.match", "re.search")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value.startswith("^")
            ):
                out.append((f"{path.relative_to(PKG.parent)}:{node.lineno}", node.args[0].value))
    return out


def test_no_pattern_anchored_at_the_start_ends_in_a_dollar() -> None:
    found = _anchored_patterns()
    assert len(found) > 10  # the scan sees the patterns at all
    bad = [where for where, p in found if p.endswith("$")]
    assert bad == []


@pytest.mark.parametrize("name", ["alice\n", "alice\r\n", "\nalice"])
def test_a_tenant_name_with_a_newline_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        tokens.add(str(tmp_path / "state.db"), name)


def test_a_file_name_in_metadata_with_a_trailing_newline_is_refused() -> None:
    assert F._FILE_RE.match("data-0.bin") and not F._FILE_RE.match("data-0.bin\n")
    assert F.STEP_DIR.match("step_000000001") and not F.STEP_DIR.match("step_000000001\n")


def test_the_services_pydantic_patterns_refuse_a_trailing_newline_too() -> None:
    """pydantic's Rust engine has no ``\\Z``: the service hands it ``$``, which there means the end."""
    import pydantic

    from goodput.sched.live.service import JobSpec

    JobSpec(name="ok", command=["x"], key="k-1")
    for field in ({"name": "ok\n"}, {"key": "k-1\n"}, {"env": {"A\n": "1"}}):
        with pytest.raises(pydantic.ValidationError):
            JobSpec(command=["x"], **field)
