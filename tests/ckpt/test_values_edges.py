"""Non-tensor values at their edges: what a save must refuse (naming the key) because no load
could read it back, and what must come back as it was saved.

The header limit is lowered in some tests (``format.MAX_HEADER_BYTES``, read by the writer and
the reader alike) so that a header too large for a reader is megabytes, not 256 MiB; one slow
test runs at the real limit."""

from __future__ import annotations

import collections
import json
import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format import format as F
from tests.distributed import run_ranks


def _files(d: Path) -> list[str]:
    return sorted(os.listdir(d)) if d.exists() else []


# --------------------------------------------------------------------------- the header's size


def test_values_too_large_for_the_header_are_refused_before_the_commit(tmp_path: Path, monkeypatch) -> None:
    """Each value fits, all of them do not: rank 0 refuses at the commit, naming the largest
    values and the limit, and nothing is left that a load (or latest) could take."""
    monkeypatch.setattr(F, "MAX_HEADER_BYTES", 1 << 20)
    state = {"w": torch.ones(4), "loader": {f"part{i}": os.urandom(300_000 + i) for i in range(4)}}
    with pytest.raises(gc.SaveError) as e:
        gc.save(state, tmp_path / "ck", step=1)
    msg = str(e.value)
    assert "nothing was committed" in msg and f"{1 << 20:,}" in msg
    assert "'loader.part3' (400,020 bytes)" in msg  # the largest first, with its encoded size
    assert msg.index("loader.part3") < msg.index("loader.part0")
    assert "io.BytesIO" in msg  # how to save it instead
    assert _files(tmp_path / "ck") == []


def test_one_value_too_large_for_any_header_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(F, "MAX_HEADER_BYTES", 1 << 20)
    with pytest.raises(gc.SaveError, match=r"'blob': a bytes value of 1,398,104 encoded bytes cannot fit"):
        gc.save({"w": torch.ones(4), "blob": os.urandom(1 << 20)}, tmp_path / "ck")
    with pytest.raises(gc.SaveError, match=r"'text': a string of 1,100,000 encoded bytes"):
        gc.save({"text": "x" * 1_100_000}, tmp_path / "ck")
    assert _files(tmp_path / "ck") == []


def test_a_large_blob_saved_as_bytesio_is_not_limited_by_the_header(tmp_path: Path, monkeypatch) -> None:
    import io

    monkeypatch.setattr(F, "MAX_HEADER_BYTES", 1 << 20)
    blob = os.urandom(3 << 20)
    gc.save({"blob": io.BytesIO(blob)}, tmp_path / "ck")
    got = io.BytesIO()
    gc.load({"blob": got}, tmp_path / "ck")
    assert got.getvalue() == blob


def _two_ranks_over_the_limit(rank: int, world: int, path: str) -> str:
    F.MAX_HEADER_BYTES = 1 << 20  # each rank's values fit; the two together, in rank 0's header, do not
    try:
        gc.save({"w": torch.ones(4), f"loader_{rank}": os.urandom(600_000)}, path, step=1)
    except gc.SaveError as e:
        return str(e)
    return "committed"


def test_values_of_all_ranks_over_the_header_limit_fail_the_save_on_every_rank(tmp_path: Path) -> None:
    outs = run_ranks(_two_ranks_over_the_limit, 2, str(tmp_path / "ck"), timeout=300)
    for o in outs:
        assert "metadata header would be" in o and "'loader_0'" in o and "'loader_1'" in o, o
    assert not (tmp_path / "ck" / F.MANIFEST).exists()
    assert not any(f.startswith(("data-", "metadata-")) for f in _files(tmp_path / "ck"))


@pytest.mark.slow
def test_a_value_over_the_real_header_limit_is_refused(tmp_path: Path) -> None:
    """195 MiB of bytes is 260 MiB of base64: once committed, no reader would open it."""
    with pytest.raises(gc.SaveError, match="'dataloader.dp_rank_0': a bytes value of 272,629,760 encoded bytes"):
        gc.save({"w": torch.ones(4), "dataloader": {"dp_rank_0": bytes(195 << 20)}}, tmp_path / "ck", step=1)
    assert _files(tmp_path / "ck") == []


# --------------------------------------------------------------------------- ints of any size


@pytest.mark.parametrize("digits_limit", [4300, 640])
def test_ints_up_to_max_int_digits_round_trip_whatever_the_str_digits_limit(tmp_path: Path, digits_limit: int) -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(digits_limit)
    try:
        ints = {
            "a": 10**5000 + 12345,
            "b": -(10 ** (F.MAX_INT_DIGITS - 2)) - 7,  # the sign counts: 100,000 characters
            "c": 7**100_000,
            "d": 10**F.MAX_INT_DIGITS - 1,
        }
        gc.save(ints, tmp_path / "ck")
        got = {k: None for k in ints}
        gc.load(got, tmp_path / "ck")
        assert got == ints
        assert gc.open(tmp_path / "ck").values["d"] == ints["d"]
    finally:
        sys.set_int_max_str_digits(old)


def test_an_int_beyond_max_int_digits_is_refused_naming_its_key(tmp_path: Path) -> None:
    with pytest.raises(gc.SaveError, match=r"'opt.count': an int of more than 100,000 decimal digits"):
        gc.save({"opt": {"count": -(10 ** (F.MAX_INT_DIGITS - 1))}}, tmp_path / "ck")
    with pytest.raises(gc.SaveError, match=r"'opt.count\[1\]': an int of more than"):
        gc.save({"opt": {"count": (1, 1 << 400_000)}}, tmp_path / "ck")


def test_a_stored_int_of_many_digits_opens_verifies_loads_and_inspects(tmp_path: Path) -> None:
    """Within MAX_INT_DIGITS but beyond Python's str-digits limit: read, never a bare ValueError."""
    from crc32c import crc32c
    from typer.testing import CliRunner

    from goodput.cli.main import app

    d = tmp_path / "ck"
    gc.save({"w": torch.ones(4), "v": 1}, d, step=1)
    m = F.decode_manifest((d / F.MANIFEST).read_bytes(), "x")
    md = F.decode_metadata((d / m.metadata.name).read_bytes(), "x", m)
    md.values["v"] = {"__int__": "9" * F.MAX_INT_DIGITS}
    raw = F.encode_metadata(md)
    (d / m.metadata.name).write_bytes(raw)
    m.metadata.bytes, m.metadata.crc32c = len(raw), crc32c(raw)
    (d / F.MANIFEST).write_bytes(F.encode_manifest(m))
    assert gc.open(d).values["v"] == 10**F.MAX_INT_DIGITS - 1
    gc.verify(d)
    st = {"w": torch.zeros(4), "v": 0}
    gc.load(st, d)
    assert st["v"] == 10**F.MAX_INT_DIGITS - 1
    r = CliRunner().invoke(app, ["ckpt", "inspect", str(d)])
    assert r.exit_code == 0, r.output
    assert re.search(r"v=<int of about 100,00\d digits>", r.output), r.output


# --------------------------------------------------------------------------- refused, naming the key


def test_a_lone_surrogate_in_a_key_or_a_value_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(gc.SaveError, match=r"'cfg.name': the string 'a\\udc80' is not valid Unicode"):
        gc.save({"cfg": {"name": "a\udc80"}}, tmp_path / "ck")
    with pytest.raises(gc.SaveError, match=r"key 'cfg.a\\udc80' is not valid Unicode"):
        gc.save({"cfg": {"a\udc80": 1}}, tmp_path / "ck")
    with pytest.raises(gc.SaveError, match=r"\"cfg\[1\]\['b\\\\udc80'\]\": the key 'b\\udc80'"):
        gc.save({"cfg": [1, {"b\udc80": 2}]}, tmp_path / "ck")
    assert _files(tmp_path / "ck") == []


def _nested(depth: int) -> list:
    v: list = [1]
    for _ in range(depth - 1):
        v = [v]
    return v


def test_nesting_beyond_max_value_depth_is_refused_naming_the_key(tmp_path: Path) -> None:
    ok = {"v": _nested(F.MAX_VALUE_DEPTH)}
    gc.save(ok, tmp_path / "ok")
    got = {"v": None}
    gc.load(got, tmp_path / "ok")
    assert got == ok
    for depth in (F.MAX_VALUE_DEPTH + 1, 400, 5000):  # 400 and more: deeper than Python's stack
        with pytest.raises(gc.SaveError, match=r"'v(\[0\])*': nested (more than 100 levels|too) deep"):
            gc.save({"v": _nested(depth)}, tmp_path / "ck")
    assert _files(tmp_path / "ck") == []


# --------------------------------------------------------------------------- tuples and types


def test_numpy_and_python_rng_states_load_back_as_dcp_loads_them(tmp_path: Path) -> None:
    """``np.random.get_state()`` is a tuple of a str, an array and scalars: the array is filled
    in place, the scalars are values, and the tuple is rebuilt in its dict."""
    np.random.seed(1)
    np.random.rand(3)
    random.seed(2)
    state = {"np_rng": np.random.get_state(), "py_rng": random.getstate()}
    want = (np.random.rand(), random.random())
    gc.save(state, tmp_path / "ck")
    np.random.seed(999)
    random.seed(5)
    target = {"np_rng": np.random.get_state(), "py_rng": random.getstate()}
    gc.load(target, tmp_path / "ck")
    assert type(target["np_rng"]) is tuple and target["np_rng"][2:] == state["np_rng"][2:]
    np.random.set_state(target["np_rng"])
    random.setstate(target["py_rng"])
    assert (np.random.rand(), random.random()) == want


Pair = collections.namedtuple("Pair", "arr meta")


def test_tuples_holding_arrays_are_rebuilt_up_to_a_mutable_parent_and_keep_their_type(tmp_path: Path) -> None:
    saved = {
        "nested": [(np.arange(3.0), (5, np.ones(2), "x"))],
        "pair": Pair(np.arange(4), {"step": 7, "tag": (1, 2)}),
        "top": (torch.ones(2), 3),
    }
    gc.save(saved, tmp_path / "ck")
    target = {
        "nested": [(np.zeros(3), (0, np.zeros(2), ""))],
        "pair": Pair(np.zeros(4, np.int64), {"step": 0, "tag": None}),
        "top": (torch.zeros(2), 0),
    }
    arr = target["nested"][0][0]
    gc.load(target, tmp_path / "ck")
    inner = target["nested"][0]
    assert inner[0] is arr and arr.tolist() == [0.0, 1.0, 2.0]  # filled in place, the tuple rebuilt around it
    assert inner[1][0] == 5 and inner[1][2] == "x" and inner[1][1].tolist() == [1.0, 1.0]
    assert type(target["pair"]) is Pair and target["pair"].meta == {"step": 7, "tag": (1, 2)}
    assert target["pair"].arr.tolist() == [0, 1, 2, 3]
    assert target["top"][1] == 3 and target["top"][0].tolist() == [1.0, 1.0]


def test_types_json_cannot_name_come_back_as_the_target_holds_them(tmp_path: Path) -> None:
    """A namedtuple is saved as a tuple, an np.str_ as a str, an np.bytes_ as bytes: a load into
    a state dict that holds them keeps their type; into None, the saved type (docs/FORMAT.md)."""
    nt = collections.namedtuple("NT", "a b")
    saved = {
        "nt": nt(1, 2),
        "nps": np.str_("s"),
        "npb": np.bytes_(b"b"),
        "ba": bytearray(b"x"),
        "deep": {"inner": [nt(3, np.str_("t"))]},
    }
    gc.save(saved, tmp_path / "ck")
    typed = {
        "nt": nt(0, 0),
        "nps": np.str_(""),
        "npb": np.bytes_(b""),
        "ba": bytearray(),
        "deep": {"inner": [nt(0, np.str_(""))]},
    }
    gc.load(typed, tmp_path / "ck")
    assert typed == saved
    assert type(typed["nt"]) is nt and type(typed["nps"]) is np.str_ and type(typed["npb"]) is np.bytes_
    assert type(typed["ba"]) is bytearray
    assert type(typed["deep"]["inner"][0]) is nt and type(typed["deep"]["inner"][0].b) is np.str_
    untyped: dict = {k: None for k in ("nt", "nps", "npb", "ba")}
    gc.load(untyped, tmp_path / "ck")
    assert [type(untyped[k]) for k in ("nt", "nps", "npb", "ba")] == [tuple, str, bytes, bytes]


def test_an_enum_member_is_refused_naming_its_key_not_saved_changed(tmp_path: Path) -> None:
    """An IntEnum came back a plain int, and a str-mixin member was saved as str(member), its
    name ("Phase.WARM"), not its value: both are refused, naming the key and what to save."""
    import enum

    class Level(enum.IntEnum):
        LOW = 1

    class Phase(str, enum.Enum):
        WARM = "warm"

    for key, member in (("level", Level.LOW), ("phase", Phase.WARM)):
        with pytest.raises(gc.SaveError, match=rf"'trainer.{key}': an enum member .*save its \.value"):
            gc.save({"w": torch.ones(1), "trainer": {key: member}}, tmp_path / key)
    gc.save({"phase": Phase.WARM.value}, tmp_path / "ok")  # its value is what to save
    back: dict = {"phase": None}
    gc.load(back, tmp_path / "ok")
    assert back["phase"] == "warm" and Phase(back["phase"]) is Phase.WARM


def test_a_subclass_of_str_int_or_float_is_saved_as_its_characters_and_number(tmp_path: Path) -> None:
    """What is saved is the value, not what a subclass's __str__ or __int__ says it is."""

    class Shout(str):
        def __str__(self) -> str:
            return self.upper()

    class Off(int):
        def __int__(self) -> int:
            return 0

    class Half(float):
        def __float__(self) -> float:
            return 0.5

    gc.save({"s": Shout("quiet"), "i": Off(7), "f": Half(2.0)}, tmp_path / "ck")
    back: dict = {"s": None, "i": None, "f": None}
    gc.load(back, tmp_path / "ck")
    assert back == {"s": "quiet", "i": 7, "f": 2.0}


def test_saved_entries_a_nested_dict_lacks_are_reported_not_dropped_in_silence(tmp_path: Path, caplog) -> None:
    """A load fills what the state dict holds (as DCP). Below its top level, a saved entry the
    caller's dict lacks (a data loader's state built fresh, a counter keyed by name) is named
    in the result and in a warning; a partial load at the top level is not."""
    import logging

    saved = {
        "w": torch.ones(2),
        "data": {"pos": {"shard-a": 10, "shard-b": 20}, "epoch": 3},
        "counts": collections.Counter("aab"),
        "optim": {"lr": 0.1},
    }
    gc.save(saved, tmp_path / "ck")
    fresh = {"w": torch.zeros(2), "data": {"pos": {}, "epoch": 0}, "counts": collections.Counter()}
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt.loading.loader"):
        got = gc.load(fresh, tmp_path / "ck")
    assert got.unloaded == ["counts.a", "counts.b", "data.pos.shard-a", "data.pos.shard-b"]
    assert fresh["data"]["epoch"] == 3
    assert "left 4 saved entries" in caplog.text and "data.pos.shard-a" in caplog.text
    caplog.clear()
    whole = {"w": torch.zeros(2), "data": {"pos": {"shard-a": 0, "shard-b": 0}, "epoch": 0}}
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt.loading.loader"):
        got = gc.load(whole, tmp_path / "ck")  # "counts" and "optim" left out at the top: a partial load
    assert got.unloaded == [] and "left" not in caplog.text
    assert whole["data"]["pos"] == {"shard-a": 10, "shard-b": 20}


# --------------------------------------------------------------------------- Hugging Face values file


@pytest.mark.parametrize("name", ["goodput_values.json", "model.safetensors.index.json"])
def test_a_deeply_nested_json_beside_a_hf_checkpoint_is_a_checkpoint_error_naming_it(tmp_path: Path, name: str) -> None:
    from safetensors.torch import save_file

    save_file({"w": torch.ones(10)}, str(tmp_path / "model.safetensors"))
    deep = "[" * 200_000 + "]" * 200_000
    doc = (
        '{"format":"goodput.values","version":2,"values":{"deep":' + deep + '},"blobs":{}}'
        if name == "goodput_values.json"
        else '{"weight_map":' + deep + "}"
    )
    (tmp_path / name).write_text(doc)
    with pytest.raises(gc.CheckpointError, match=f"{name}' is nested too deeply"):
        gc.load({"w": torch.zeros(10)}, tmp_path)
    json.loads("[1]")  # the json module still works after the exhausted recursion
