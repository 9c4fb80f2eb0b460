"""A checkpoint written by an earlier build loads, bit for bit, with this one (format version 1)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from tests.ckpt.format import old_format as old

DATA = Path(__file__).parent / "data" / "v1-5fe0497"
pytestmark = pytest.mark.filterwarnings("ignore::goodput.ckpt.loading.reader.UnsealedManifestWarning")


@pytest.fixture
def ck(tmp_path: Path) -> Path:
    """A copy: a test must never be able to change the kept checkpoint."""
    dst = tmp_path / "old"
    shutil.copytree(DATA, dst)
    return dst


def _blank_like(state: dict) -> dict:
    out: dict = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out[k] = _blank_like(v)
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)
        elif isinstance(v, np.ndarray):
            out[k] = np.zeros_like(v)
        else:
            out[k] = None
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def test_old_checkpoint_loads_whole(ck: Path) -> None:
    want = old.replicated_state()
    got = _blank_like(want)
    got["tp"] = torch.zeros(old.GLOBAL)
    got["zero"] = torch.zeros(old.FLAT_N)
    res = gc.load(got, ck)
    assert res.step == old.STEP
    for k, t in want["model"].items():
        assert torch.equal(got["model"][k], t), k
        assert got["model"][k].dtype == t.dtype
    assert np.array_equal(got["np"], want["np"])
    for k in ("step", "lr", "nan", "pair", "groups", "name", "none"):
        assert _same(got[k], want[k]), k
    assert torch.equal(got["tp"], old.global_sharded())
    assert torch.equal(got["zero"], old.global_flat())


def test_old_checkpoint_loads_resharded(ck: Path) -> None:
    """Into three ranks' worth of shards, none of them the layout it was saved with."""
    full, flat = old.global_sharded(), old.global_flat()
    for r in range(3):
        cols = slice(r * 4, min(10, r * 4 + 4))
        width = cols.stop - cols.start
        lo, hi = r * 13, min(old.FLAT_N, r * 13 + 13)
        state = {
            "tp": gc.LocalShard(torch.zeros(old.GLOBAL[0], width), old.GLOBAL, (0, cols.start)),
            "zero": gc.FlatShard(torch.zeros(hi - lo), (old.FLAT_N,), lo),
        }
        gc.load(state, ck, strict=False)
        assert torch.equal(state["tp"].tensor, full[:, cols])
        assert torch.equal(state["zero"].tensor, flat[lo:hi])


def test_old_checkpoint_verifies_and_reads_without_torch_types(ck: Path) -> None:
    assert gc.verify(ck) > 0
    c = gc.open(ck)
    assert c.step == old.STEP
    assert c.manifest.user == old.USER
    assert np.array_equal(c.read("model.i64"), old.replicated_state()["model"]["i64"].numpy())
    assert np.array_equal(c.read("tp"), old.global_sharded().numpy())
    assert gc.latest(ck.parent) is None or gc.latest(ck.parent) == ck


TAG_KEYS = Path(__file__).parent / "data" / "v1-5fe0497-tagkeys"


def test_version_1_dicts_keyed_by_later_tag_names_load_as_the_dicts_saved_when_no_tag_reads_them(
    tmp_path: Path,
) -> None:
    """Version 1 wrote a user's ``{"__bytes__": ...}`` as it was (the name was no tag then), and
    goodput from 2096bf8 to the version bump wrote real bytes that way under version 1 too. The
    one that is a well-formed later tag reads as the tag, said in a warning (the common checkpoint,
    a torchtitan loader's bytes, must load right); the malformed ones load as the dicts saved, and
    none makes the checkpoint unreadable."""
    import numpy as np

    from goodput.ckpt.format.format import AmbiguousValueWarning

    ck = tmp_path / "old"
    shutil.copytree(TAG_KEYS, ck)
    saved = old.tag_keyed_values()
    want = {
        "blobs": [b"hi", {"__bytes__": "not base64!"}],
        "big": [12345678901234567890123, {"__int__": "x"}],
        "pair": (np.int32(3), torch.float32),
        "groups": [complex(1.0, 2.0), torch.Size([2, 3])],
        "escaped": saved["escaped"],  # version 1's own tags, escaped when a user's: the dicts saved
    }
    got: dict = {"w": torch.zeros(2, 3), **dict.fromkeys(want)}
    with pytest.warns(AmbiguousValueWarning, match="2096bf8") as caught:
        res = gc.load(got, ck)
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, AmbiguousValueWarning))
    for name, i in (("blobs", 0), ("big", 0), ("pair", 0), ("pair", 1), ("groups", 0), ("groups", 1)):
        assert f"{name}'[{i}]" in said or f"{name}[{i}]" in said, (name, i, said[:300])
    assert "blobs'[1]" not in said and "blobs[1]" not in said  # the malformed one is a dict, said nowhere
    assert res.step == old.TAG_KEYS_STEP
    assert torch.equal(got["w"], old.tag_keys_tensor())
    for k, v in want.items():
        assert got[k] == v and type(got[k]) is type(v), (k, got[k])
    assert type(got["pair"][0]) is np.int32
    c = gc.open(ck)
    assert c.manifest.version == 1 and c.metadata.version == 1 and c.manifest.user == old.TAG_KEYS_USER
    assert c.metadata.values["blobs"] == saved["blobs"]  # as stored: where the warning points a dict's owner


def test_version_2_decodes_the_tags_a_version_1_checkpoint_keeps_as_dicts(tmp_path: Path) -> None:
    """The same names saved today are tags (escaped when they are a user's dict): both round-trip."""
    state = {"blob": [b"hi", {"__bytes__": "aGk="}], "big": [2**80, {"__int__": "7"}]}
    gc.save(state, tmp_path / "new")
    got = {"blob": None, "big": None}
    gc.load(got, tmp_path / "new")
    assert got == state and gc.open(tmp_path / "new").metadata.version == 2


def test_metadata_and_manifest_of_different_versions_are_refused(tmp_path: Path) -> None:
    from goodput.ckpt.format.format import MANIFEST, decode_manifest, encode_manifest

    ck = tmp_path / "old"
    shutil.copytree(TAG_KEYS, ck)
    m = decode_manifest((ck / MANIFEST).read_bytes(), "m")
    m.version = 2  # a version-2 reader would then decode version-1 values with the new tags
    (ck / MANIFEST).write_bytes(encode_manifest(m))
    with pytest.raises(gc.CheckpointError, match="metadata is format version 1, its manifest version 2"):
        gc.load({"w": torch.zeros(2, 3)}, ck, strict=False)
