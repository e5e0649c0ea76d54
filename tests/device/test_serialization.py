"""torch.save / torch.load of spyre tensors, with and without map_location; bad files."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

import torch_spyre


def saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture
def payload():
    torch.manual_seed(0)
    cpu = {
        "f32": torch.randn(5, 70),
        "f16": torch.randn(3, 9).half(),
        "bf16": torch.randn(4).bfloat16(),
        "i64": torch.arange(10),
        "mask": torch.tensor([True, False]),
    }
    # What the card holds (fp16/bf16 rounded through DLFloat16).
    card = {k: v.to("spyre") for k, v in cpu.items()}
    expected = {k: v.cpu() for k, v in card.items()}
    card["view"] = card["f32"][1:3, 5:]
    expected["view"] = expected["f32"][1:3, 5:]
    return card, expected


def test_save_writes_host_format_and_loads_on_cpu(payload):
    card, expected = payload
    loaded = torch.load(io.BytesIO(saved(card)), map_location="cpu")
    for k, v in expected.items():
        assert loaded[k].device.type == "cpu" and loaded[k].dtype == v.dtype
        assert torch.equal(loaded[k], v), k


def test_save_of_spyre_equals_save_of_cpu_values(payload):
    card, expected = payload
    a = torch.load(io.BytesIO(saved(card["f16"])), map_location="cpu")
    b = torch.load(io.BytesIO(saved(expected["f16"])), map_location="cpu")
    assert torch.equal(a, b)


def test_load_without_map_location_restores_on_spyre(payload):
    card, expected = payload
    loaded = torch.load(io.BytesIO(saved(card)))
    for k, v in expected.items():
        assert loaded[k].device == torch.device("spyre:0"), k
        assert torch.equal(loaded[k].cpu(), v), k
    # a restored view still shares its storage with its base
    assert loaded["view"].untyped_storage().data_ptr() == loaded["f32"].untyped_storage().data_ptr()
    loaded["f32"][1, 5] = 42.0
    assert loaded["view"][0, 0].item() == 42.0
    # fp16 is re-encoded as DLFloat16 on the card once its dtype is known
    lay = torch_spyre.get_layout(loaded["f16"])
    assert lay.device_dtype == "dlfloat16"
    assert (loaded["f16"] * 2).cpu().equal(expected["f16"] * 2)


def test_load_with_map_location_spyre_of_a_cpu_file():
    data = saved({"w": torch.arange(6.0).reshape(2, 3)})
    loaded = torch.load(io.BytesIO(data), map_location="spyre")
    assert loaded["w"].device.type == "spyre" and loaded["w"].cpu().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_module_state_dict_round_trip():
    model = torch.nn.Linear(4, 3).to("spyre")
    state = torch.load(io.BytesIO(saved(model.state_dict())))
    fresh = torch.nn.Linear(4, 3).to("spyre")
    fresh.load_state_dict(state)
    assert torch.equal(fresh.weight.cpu(), model.weight.cpu())


def test_truncated_file_is_a_clear_error_and_leaks_nothing(settled):
    data = saved({"w": torch.randn(100).to("spyre")})
    base = settled()
    with pytest.raises(RuntimeError, match="corrupted|zip archive|failed"):
        torch.load(io.BytesIO(data[: len(data) // 2]))
    assert settled() == base


def test_corrupt_file_is_a_clear_error(settled):
    data = bytearray(saved({"w": torch.randn(100).to("spyre")}))
    base = settled()
    start = data.find(b"data.pkl") + 40
    data[start:start + 30] = b"\xff" * 30
    with pytest.raises((RuntimeError, pickle.UnpicklingError, EOFError, ValueError)):
        torch.load(io.BytesIO(bytes(data)))
    assert settled() == base


def test_file_saved_on_a_card_that_does_not_exist(run_python, tmp_path):
    path = tmp_path / "two_cards.pt"
    r = run_python(f"import torch, torch_spyre; torch.save(torch.ones(3).to('spyre:1'), {str(path)!r})",
                   env={"TORCH_SPYRE_NUM_CARDS": "2"})
    assert r.returncode == 0, r.stderr
    with pytest.raises(RuntimeError, match="spyre:1.*1 card.*map_location"):
        torch.load(path)
    assert torch.load(path, map_location="spyre:0").cpu().tolist() == [1.0, 1.0, 1.0]


def test_float64_in_a_file_cannot_land_on_the_card():
    data = saved(torch.ones(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="cannot hold float64"):
        torch.load(io.BytesIO(data), map_location="spyre")
