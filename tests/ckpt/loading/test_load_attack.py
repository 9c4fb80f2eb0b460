"""The load path under a hostile review: tied weights (one name saved for two targets that are one
tensor), what ``strict=False`` leaves unfilled, dtype casts that would lose the values in
silence, and a file passed where a directory belongs. Real files, real processes (gloo), nothing
mocked."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file, save_model

import goodput.ckpt as gc
from tests.distributed import run_ranks


class Tied(torch.nn.Module):
    """A causal LM's shape in miniature with ``tie_word_embeddings=True``: ``lm_head.weight`` is
    ``embed_tokens.weight`` (one Parameter), so ``save_pretrained`` writes one of the two names."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(101, 48)
        self.norm = torch.nn.LayerNorm(48)
        self.lm_head = torch.nn.Linear(48, 101, bias=False)
        self.lm_head.weight = self.embed_tokens.weight


def _tied(seed: int) -> Tied:
    torch.manual_seed(seed)
    return Tied()


def _hf_dir(d: Path, drop: str | None = None) -> Path:
    """The model as Hugging Face's ``save_pretrained`` writes it: shared tensors once
    (``safetensors.torch.save_model`` is what it calls); ``drop`` leaves one more tensor out."""
    d.mkdir()
    m = _tied(0)
    save_model(m, str(d / "model.safetensors"))
    if drop is not None:
        from safetensors.torch import load_file

        kept = {k: v for k, v in load_file(d / "model.safetensors").items() if k != drop}
        save_file(kept, d / "model.safetensors")
    return d


def _saved_names(d: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(d / "model.safetensors", framework="pt") as f:
        return set(f.keys())


# ---------------------------------------------------------------------------------- tied weights


def test_tied_weights_load_strictly_from_a_hugging_face_directory(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path / "hf")
    assert len(_saved_names(d) & {"lm_head.weight", "embed_tokens.weight"}) == 1  # really one of the two
    m = _tied(1234)
    got = gc.load(m.state_dict(), d)  # strict, as a fine-tuning user loads
    ref = _tied(0).state_dict()
    for k, v in m.state_dict().items():
        assert torch.equal(v, ref[k]), k
    assert m.lm_head.weight is m.embed_tokens.weight and got.missing == []


def test_a_genuinely_missing_tensor_beside_tied_ones_is_still_an_error(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path / "hf", drop="norm.weight")
    with pytest.raises(gc.CheckpointError, match=r"tensor 'norm\.weight' is not in the checkpoint"):
        gc.load(_tied(1).state_dict(), d)
    sd = _tied(1).state_dict()
    got = gc.load(sd, d, strict=False)
    assert got.missing == ["norm.weight"]  # the tied name is filled, not missing


def test_the_same_tensor_object_twice_and_a_shared_view_load_from_a_goodput_checkpoint(tmp_path: Path) -> None:
    w = torch.randn(6, 4)
    gc.save({"a": w}, tmp_path / "ck")
    t = torch.zeros(6, 4)
    sd = {"a": t, "b": t, "c": t.view(6, 4)}  # the object itself, and a view of the same bytes
    assert gc.load(sd, tmp_path / "ck").missing == []
    assert torch.equal(sd["b"], w) and torch.equal(sd["c"], w)
    # a numpy array sharing an array's memory
    arr = np.zeros(5, np.float32)
    gc.save({"x": np.arange(5, dtype=np.float32)}, tmp_path / "np")
    assert gc.load({"x": arr, "y": arr.view()}, tmp_path / "np").missing == []
    assert arr.tolist() == [0, 1, 2, 3, 4]


def test_sharing_storage_is_not_enough_the_view_must_be_the_same(tmp_path: Path) -> None:
    gc.save({"a": torch.arange(12.0).view(3, 4)}, tmp_path / "ck")
    base = torch.zeros(3, 4)
    # the same bytes seen otherwise (transposed; a row) are not the same tensor: they stay missing
    for other in (base.t(), base[1], base.view(12)):
        shape = tuple(other.shape)
        with pytest.raises(gc.CheckpointError, match=r"tensor 'b' is not in the checkpoint"):
            gc.load({"a": base, "b": other}, tmp_path / "ck")
        assert gc.load({"a": base, "b": other}, tmp_path / "ck", strict=False).missing == ["b"], shape
    # equal values in other memory are not tied either
    with pytest.raises(gc.CheckpointError, match=r"tensor 'b' is not in the checkpoint"):
        gc.load({"a": torch.zeros(3, 4), "b": torch.zeros(3, 4)}, tmp_path / "ck")
    # both names missing, though tied to each other: nothing loads them
    with pytest.raises(gc.CheckpointError, match=r"tensor '[bc]' is not in the checkpoint"):
        gc.load({"b": base, "c": base}, tmp_path / "ck")


def _fsdp2_tied(seed: int) -> Tied:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    m = _tied(seed)
    fully_shard(m, mesh=init_device_mesh("cpu", (2,)))
    return m


def _load_fsdp2_tied(rank: int, world: int, hf: str, hf_short: str) -> dict:
    m = _fsdp2_tied(1234)
    sd = m.state_dict()
    kinds = {k: type(v).__name__ for k, v in sd.items()}
    missing = gc.load(sd, hf).missing
    ref = _tied(0).state_dict()
    equal = {k: bool(torch.equal(v.full_tensor(), ref[k])) for k, v in m.state_dict().items()}
    try:
        gc.load(_fsdp2_tied(1).state_dict(), hf_short)
        short = "loaded"
    except gc.CheckpointError as e:
        short = str(e)
    partial = gc.load(_fsdp2_tied(1).state_dict(), hf_short, strict=False).missing
    return {"kinds": kinds, "missing": missing, "equal": equal, "short": short, "partial": partial}


def test_tied_fsdp2_dtensors_load_strictly_from_a_hugging_face_directory(tmp_path: Path) -> None:
    hf = _hf_dir(tmp_path / "hf")
    short = _hf_dir(tmp_path / "short", drop="norm.bias")
    for r in run_ranks(_load_fsdp2_tied, 2, str(hf), str(short)):
        assert r["kinds"]["lm_head.weight"] == r["kinds"]["embed_tokens.weight"] == "DTensor"
        assert r["missing"] == [] and all(r["equal"].values()), r
        assert "tensor 'norm.bias' is not in the checkpoint" in r["short"], r["short"]
        assert r["partial"] == ["norm.bias"]


# ---------------------------------------------------------------------------------- strict=False


def test_a_partial_load_lists_what_it_left_unfilled(tmp_path: Path) -> None:
    gc.save({"model": {"w": torch.ones(3)}, "step": 3}, tmp_path / "ck")
    sd = {
        "model": {"w": torch.zeros(3), "extra": torch.zeros(2)},
        "step": 0,
        "epoch": 1,
        "blob": io.BytesIO(),
    }
    got = gc.load(sd, tmp_path / "ck", strict=False)
    assert got.missing == ["blob", "epoch", "model.extra"]
    assert got.unloaded == [] and torch.equal(sd["model"]["w"], torch.ones(3)) and sd["step"] == 3
    # DCP's spelling of the same
    got = gc.load({"model": {"w": torch.zeros(3), "x": torch.zeros(1)}}, tmp_path / "ck", allow_partial_load=True)
    assert got.missing == ["model.x"]
    assert gc.load({"model": {"w": torch.zeros(3)}}, tmp_path / "ck").missing == []


# ---------------------------------------------------------------------------------- dtype casts


def test_a_floating_tensor_never_loads_into_an_integer_or_bool_target(tmp_path: Path) -> None:
    gc.save({"w": torch.randn(4, dtype=torch.float64), "h": torch.randn(4).bfloat16()}, tmp_path / "ck")
    for target, want in [
        (torch.zeros(4, dtype=torch.int64), "int64"),
        (torch.zeros(4, dtype=torch.bool), "bool"),
        (np.zeros(4, np.int32), "int32"),
    ]:
        with pytest.raises(gc.CheckpointError, match=rf"tensor 'w': saved as float64, loading into {want}"):
            gc.load({"w": target}, tmp_path / "ck")
        assert not np.asarray(target).any()  # nothing written
    with pytest.raises(gc.CheckpointError, match=r"tensor 'h': saved as bfloat16, loading into int16"):
        gc.load({"h": torch.zeros(4, dtype=torch.int16)}, tmp_path / "ck")
    # from a Hugging Face directory too
    save_file({"w": torch.randn(4)}, tmp_path / "model.safetensors")
    with pytest.raises(gc.CheckpointError, match=r"tensor 'w': saved as float32, loading into int64"):
        gc.load({"w": torch.zeros(4, dtype=torch.int64)}, tmp_path)


def test_a_complex_tensor_never_loads_into_a_real_target(tmp_path: Path) -> None:
    gc.save({"z": torch.randn(3, dtype=torch.complex64)}, tmp_path / "ck")
    for target, want in [(torch.zeros(3), "float32"), (np.zeros(3, np.float64), "float64")]:
        with pytest.raises(gc.CheckpointError, match=rf"tensor 'z': saved as complex64, loading into {want}"):
            gc.load({"z": target}, tmp_path / "ck")


def test_the_documented_casts_still_load(tmp_path: Path) -> None:
    f32 = torch.randn(5)
    gc.save(
        {"f32": f32, "bf16": f32.bfloat16(), "i32": torch.arange(5, dtype=torch.int32), "b": torch.ones(5) > 0},
        tmp_path / "ck",
    )
    sd = {
        "f32": torch.zeros(5, dtype=torch.bfloat16),  # narrower float
        "bf16": torch.zeros(5),  # wider float
        "i32": torch.zeros(5, dtype=torch.float64),  # integer into floating
        "b": torch.zeros(5, dtype=torch.int64),  # bool into integer
    }
    gc.load(sd, tmp_path / "ck")
    assert torch.equal(sd["f32"], f32.bfloat16()) and torch.equal(sd["bf16"], f32.bfloat16().float())
    assert sd["i32"].tolist() == [0, 1, 2, 3, 4] and sd["b"].tolist() == [1] * 5
    z = {"i32": torch.zeros(5, dtype=torch.complex64)}  # real into complex
    gc.load(z, tmp_path / "ck", strict=False)
    assert z["i32"].real.tolist() == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------------- a file for a directory


def test_a_safetensors_file_or_a_manifest_passed_for_its_directory_says_which_to_pass(tmp_path: Path) -> None:
    save_file({"w": torch.randn(2)}, tmp_path / "model.safetensors")
    with pytest.raises(gc.CheckpointError, match=r"pass the directory holding the safetensors files.*" + str(tmp_path)):
        gc.load({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model.safetensors"}}')
    with pytest.raises(gc.CheckpointError, match=r"pass the directory holding the safetensors files"):
        gc.load({"w": torch.zeros(2)}, tmp_path / "model.safetensors.index.json")
    gc.save({"w": torch.ones(2)}, tmp_path / "ck")
    with pytest.raises(gc.CheckpointError, match=r"pass the checkpoint directory.*" + str(tmp_path / "ck")):
        gc.load({"w": torch.zeros(2)}, tmp_path / "ck" / "MANIFEST.json")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(gc.CheckpointError, match=r"it is not a directory"):
        gc.load({"w": torch.zeros(2)}, tmp_path / "notes.txt")


def test_an_integer_cast_that_does_not_fit_its_target_is_refused_naming_the_value(tmp_path) -> None:
    """int64 300 loaded into int8 became 44, -5 into uint8 became 251, 2 into bool became True,
    in silence (DCP's copy_ does the same). A narrowing cast whose values all fit still loads;
    bf16 and other floats are not checked (their casts round, by design)."""
    gc.save(
        {
            "big": torch.tensor([1, 300, -5]),
            "small": torch.tensor([1, 2, 3]),
            "two": torch.tensor([0, 2]),
            "h": torch.ones(3, dtype=torch.bfloat16),
        },
        tmp_path / "ck",
    )
    got = {"small": torch.zeros(3, dtype=torch.int8), "h": torch.zeros(3)}
    gc.load(got, tmp_path / "ck", strict=False)
    assert got["small"].tolist() == [1, 2, 3] and got["h"].tolist() == [1.0, 1.0, 1.0]
    for target, value in ((torch.zeros(3, dtype=torch.int8), 300), (torch.zeros(3, dtype=torch.uint8), -5)):
        with pytest.raises(gc.CheckpointError, match=rf"tensor 'big': saved as int64, loading into .*value {value}"):
            gc.load({"big": target}, tmp_path / "ck", strict=False)
    with pytest.raises(gc.CheckpointError, match="tensor 'two'.*value 2 does not fit"):
        gc.load({"two": torch.zeros(2, dtype=torch.bool)}, tmp_path / "ck", strict=False)
    with pytest.raises(gc.CheckpointError, match="tensor 'big'.*value 300"):
        gc.load({"big": np.zeros(3, dtype=np.int8)}, tmp_path / "ck", strict=False)
    wide = {"big": np.zeros(3, dtype=np.int16)}
    gc.load(wide, tmp_path / "ck", strict=False)
    assert wide["big"].tolist() == [1, 300, -5]


class _Raises:
    """A Stateful whose own methods fail, as a data loader's may."""

    def __init__(self, on_save: bool) -> None:
        self.on_save = on_save

    def state_dict(self) -> dict:
        if self.on_save:
            raise RuntimeError("loader exploded")
        return {"pos": 1}

    def load_state_dict(self, sd: dict) -> None:
        raise ValueError("cannot take it")


def test_a_statefuls_own_exception_names_its_key(tmp_path) -> None:
    """The exception a Stateful raises is kept (a loop may catch its type) and says which entry
    of the state raised: a save holds many objects, and the message alone did not say."""
    with pytest.raises(gc.SaveError, match=r"loader exploded \(goodput: raised by the state_dict\(\) of 'loader'"):
        gc.save({"m": torch.ones(2), "loader": _Raises(True)}, tmp_path / "a")
    gc.save({"m": torch.ones(2), "loader": _Raises(False)}, tmp_path / "b")
    with pytest.raises(ValueError, match="cannot take it") as e:
        gc.load({"m": torch.ones(2), "loader": _Raises(False)}, tmp_path / "b")
    assert "load_state_dict() of 'loader' (_Raises)" in e.value.__notes__[0]
    ck = gc.Checkpointer(tmp_path / "ck", interval=1, mode="thread")
    try:
        with pytest.raises(RuntimeError, match="loader exploded") as e:
            ck.save(1, {"m": torch.ones(2)}, data=_Raises(True))
        assert "the Checkpointer's data (_Raises)" in e.value.__notes__[0]
    finally:
        ck.close()
