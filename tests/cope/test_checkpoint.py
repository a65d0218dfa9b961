"""CoPE adapter and training checkpoints that pass their checksum but hold the wrong things:
each is an AdapterError naming the file and the problem, never a raw traceback."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from agentcache.cope.checkpoint import (
    MAGIC,
    AdapterError,
    load_cope_adapter,
    read_payload,
    with_adapter,
    write_payload,
)
from agentcache.cope.train import Trainer, TrainSettings
from agentcache.model.cope import CoPEAdapter, CoPEConfig
from agentcache.model.loading import LoadedModel
from agentcache.testing import tiny_model

CONFIG = CoPEConfig(max_position=8, rank=2)
A_TENSOR = "layers.1.lora_a.q"


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_model()


def good(m: LoadedModel) -> dict[str, Any]:
    adapter = CoPEAdapter.init(m.forward, CONFIG, seed=3)
    tensors = {k: v.clone() for k, v in adapter.state_dict().items()}
    return {"model_id": m.model_id, "config": asdict(CONFIG), "tensors": tensors}


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        if value is KeyError:
            del p[key]
        else:
            p[key] = value

    return change


def _config(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda p: p["config"].update(fields)


def _tensor(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        if value is KeyError:
            del p["tensors"][name]
        else:
            p["tensors"][name] = value(p["tensors"][name]) if callable(value) else value

    return change


def _nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[3] = float("nan")
    return t


def _inf(t: torch.Tensor) -> torch.Tensor:
    return t + float("inf")


ADAPTERS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("model-id-missing", _set("model_id", KeyError), "trained for model 'None'"),
    ("model-id-other", _set("model_id", "other#123"), "trained for model 'other#123'"),
    ("model-id-int", _set("model_id", 5), "trained for model '5'"),
    ("config-missing", _set("config", KeyError), "config must be a dict"),
    ("config-list", _set("config", [8, False, 2]), "config must be a dict"),
    ("config-unknown-key", _config(heads=4), "config must be a dict"),
    ("config-rank-str", _config(rank="2"), "config rank = '2' has the wrong type"),
    ("config-rank-bool", _config(rank=True), "config rank = 'True' has the wrong type"),
    ("config-rank-float", _config(rank=2.0), "config rank = '2.0' has the wrong type"),
    ("config-rank-zero", _config(rank=0), "rank must be >= 1"),
    ("config-rank-huge", _config(rank=100000), "exceed the model's"),
    ("config-positions-huge", _config(max_position=10**9), "exceed the model's"),
    ("config-positions-zero", _config(max_position=0), "max_position must be >= 1"),
    ("config-alpha-negative", _config(alpha=-1.0), "alpha must be > 0"),
    ("config-alpha-str", _config(alpha="16"), "config alpha = '16' has the wrong type"),
    ("config-keep-rope-int", _config(keep_rope=1), "config keep_rope = '1' has the wrong type"),
    ("tensors-missing", _set("tensors", KeyError), "tensors must be a dict"),
    ("tensors-list", _set("tensors", [torch.zeros(2)]), "tensors must be a dict"),
    ("tensor-missing", _tensor(A_TENSOR, KeyError), "adapter tensors differ: missing"),
    ("tensor-extra", _tensor("layers.9.lora_a.q", torch.zeros(2, 64)), "extra"),
    ("tensor-shape", _tensor(A_TENSOR, lambda t: t[:, :-1]), f"{A_TENSOR}: shape"),
    ("tensor-transposed", _tensor(A_TENSOR, lambda t: t.t().contiguous()), f"{A_TENSOR}: shape"),
    ("tensor-float64", _tensor(A_TENSOR, lambda t: t.double()), "is torch.float64, adapters"),
    ("tensor-bfloat16", _tensor(A_TENSOR, lambda t: t.bfloat16()), "is torch.bfloat16"),
    ("tensor-int", _tensor(A_TENSOR, lambda t: t.long()), "is torch.int64"),
    ("tensor-nan", _tensor(A_TENSOR, _nan), f"{A_TENSOR} holds NaN or infinite"),
    ("tensor-inf", _tensor(A_TENSOR, _inf), f"{A_TENSOR} holds NaN or infinite"),
    ("tensor-list", _tensor(A_TENSOR, [[0.0, 1.0]]), f"tensor '{A_TENSOR}' is not a named"),
    ("tensor-none", _tensor(A_TENSOR, None), f"tensor '{A_TENSOR}' is not a named"),
]


@pytest.mark.parametrize(
    ("change", "message"), [c[1:] for c in ADAPTERS], ids=[c[0] for c in ADAPTERS]
)
def test_a_checksummed_but_malformed_adapter_is_refused_by_name(
    model: LoadedModel, tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    payload = good(model)
    change(payload)
    path = tmp_path / "x.adapter"
    write_payload(path, payload)
    with pytest.raises(AdapterError, match=message) as err:
        load_cope_adapter(model, path=path)
    assert str(path) in str(err.value)


def _raw_file(path: Path, payload: bytes) -> None:
    path.write_bytes(MAGIC + hashlib.sha256(payload).digest() + payload)


def _saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


RAW: list[tuple[str, Callable[[], bytes], str]] = [
    ("not-a-dict", lambda: _saved([1, 2, 3]), "unknown format 'list'"),
    ("other-format", lambda: _saved({"format": "other/9"}), "unknown format 'other/9'"),
    ("random-bytes", lambda: bytes(range(256)) * 4, "the payload does not load"),
    ("empty", lambda: b"", "the payload does not load"),
    ("pickled-object", lambda: _saved(CONFIG), "the payload does not load"),
]


@pytest.mark.parametrize(("payload", "message"), [c[1:] for c in RAW], ids=[c[0] for c in RAW])
def test_a_checksummed_payload_that_is_not_an_adapter_is_refused(
    model: LoadedModel, tmp_path: Path, payload: Callable[[], bytes], message: str
) -> None:
    path = tmp_path / "x.adapter"
    _raw_file(path, payload())
    with pytest.raises(AdapterError, match=message):
        load_cope_adapter(model, path=path)


SETTINGS = TrainSettings(steps=2, seq_len=16, warmup=1, eval_windows=1, cope=CONFIG)

TRAINING: list[tuple[str, str, Any, str]] = [
    ("train-missing", "train", KeyError, "not a training checkpoint"),
    ("train-list", "train", [1], "not a training checkpoint"),
    ("train-unknown-field", "train", {"colour": 1}, "not a training checkpoint"),
    ("step-str", "step", "two", "training state is malformed"),
    ("step-missing", "step", KeyError, "training state is malformed"),
    ("history-pairs", "history", [[1, 2, 3]], "training history is malformed"),
    ("history-int", "history", 7, "training history is malformed"),
    ("history-missing", "history", KeyError, "training history is malformed"),
    ("evals-list", "evals", [1.0], "training history is malformed"),
    ("evals-str-values", "evals", {"base": "x"}, "training history is malformed"),
    ("optimizer-str", "optimizer", "adam", "training state is malformed"),
    ("optimizer-empty", "optimizer", {}, "training state is malformed"),
]


@pytest.mark.parametrize(
    ("key", "value", "message"), [c[1:] for c in TRAINING], ids=[c[0] for c in TRAINING]
)
def test_a_malformed_training_checkpoint_is_refused_by_name(
    model: LoadedModel, tmp_path: Path, key: str, value: Any, message: str
) -> None:
    path = tmp_path / "c.train"
    with torch.enable_grad():
        trainer = Trainer(model, SETTINGS)
        trainer.checkpoint(path)
        payload = read_payload(path)
        if value is KeyError:
            del payload[key]
        else:
            payload[key] = value
        payload.pop("format")
        write_payload(path, payload)
        with pytest.raises(AdapterError, match=message) as err:
            Trainer(model, SETTINGS).restore(path)
    assert str(path) in str(err.value)


def test_adapters_differing_in_one_late_tensor_get_different_model_ids(
    model: LoadedModel,
) -> None:
    a = CoPEAdapter.init(model.forward, CONFIG, seed=3)
    b = CoPEAdapter.init(model.forward, CONFIG, seed=3)
    assert with_adapter(model, a).model_id == with_adapter(model, b).model_id
    b.state_dict()["layers.3.pos_emb"].view(-1)[-1] += 1e-3
    assert with_adapter(model, a).model_id != with_adapter(model, b).model_id


def test_plotting_a_checkpoint_without_a_history_is_refused_by_name(
    model: LoadedModel, tmp_path: Path
) -> None:
    from agentcache.cope.cli import plot_history

    path = tmp_path / "x.adapter"
    write_payload(path, good(model))  # an adapter file, not a training checkpoint
    with pytest.raises(AdapterError, match="training history is malformed") as err:
        plot_history(path, tmp_path / "loss.png")
    assert str(path) in str(err.value)
