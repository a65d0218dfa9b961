from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentcache import fsutil
from agentcache.cope.checkpoint import (
    AdapterError,
    adapter_path,
    load_cope_adapter,
    read_payload,
    save_adapter,
)
from agentcache.cope.data import Document, Split, documents, split_windows
from agentcache.cope.train import Trainer, TrainSettings, eval_windows, train
from agentcache.model.cope import CoPEAdapter, CoPEConfig, CoPEForward
from agentcache.testing import tiny_model

SETTINGS = TrainSettings(
    steps=4, seq_len=32, lr=1e-2, warmup=1, checkpoint_every=2, eval_windows=2,
    cope=CoPEConfig(max_position=8, rank=2),
)  # fmt: skip


@pytest.fixture(autouse=True)
def _grad() -> object:  # training needs autograd (the suite's default is no_grad)
    with torch.enable_grad():
        yield


def _split() -> Split:
    text = "the quick brown fox jumps over the lazy dog. " * 40
    docs = [Document("essay", f"d{i}", f"{i} {text}") for i in range(12)]
    m = tiny_model()
    return split_windows(docs, m.tokenizer, SETTINGS.seq_len)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return read_payload(path)["tensors"]


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path: Path) -> None:
    split, m = _split(), tiny_model()
    full = train(m, split, SETTINGS, tmp_path / "a.train", tmp_path / "a.adapter")
    # the interrupted run: 2 steps (a checkpoint), then a fresh process resumes to 4
    half = Trainer(m, SETTINGS)
    for _ in range(2):
        half.train_step(split.train)
    half.checkpoint(tmp_path / "b.train")
    resumed = train(
        m,
        split,
        SETTINGS,
        tmp_path / "b.train",
        tmp_path / "b.adapter",
        resume=True,
    )
    assert resumed.resumed_from == 2 and resumed.steps == full.steps == 4
    a, b = _tensors(tmp_path / "a.adapter"), _tensors(tmp_path / "b.adapter")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert read_payload(tmp_path / "b.train")["step"] == 4
    assert full.ppl_trained < full.ppl_untrained  # 4 steps on repeated text already help


def test_resume_refuses_other_settings(tmp_path: Path) -> None:
    m = tiny_model()
    t = Trainer(m, SETTINGS)
    t.checkpoint(tmp_path / "c.train")
    other = Trainer(m, TrainSettings(steps=4, seq_len=16, cope=SETTINGS.cope))
    with pytest.raises(AdapterError, match="seq_len"):
        other.restore(tmp_path / "c.train")


def test_adapter_loads_by_model_id(tmp_path: Path) -> None:
    m = tiny_model()
    adapter = CoPEAdapter.init(m.forward, CoPEConfig(rank=2), seed=4)
    save_adapter(adapter_path(tmp_path, m.model_id), adapter, m.model_id)
    cope = load_cope_adapter(m, cache_dir=tmp_path)
    assert isinstance(cope.forward, CoPEForward)
    assert cope.model_id.startswith(m.model_id + "+cope-") and cope.model_id != m.model_id
    loaded = cope.forward.adapter.state_dict()
    assert all(torch.equal(v, loaded[k]) for k, v in adapter.state_dict().items())


def test_adapter_of_another_model_is_refused_naming_both(tmp_path: Path) -> None:
    m, other = tiny_model(seed=0), tiny_model(seed=1)
    path = tmp_path / "x.adapter"
    save_adapter(path, CoPEAdapter.init(m.forward, CoPEConfig(rank=2)), m.model_id)
    with pytest.raises(AdapterError) as err:
        load_cope_adapter(other, path=path)
    assert m.model_id in str(err.value) and other.model_id in str(err.value)


def test_missing_adapter_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="train-cope"):
        load_cope_adapter(tiny_model(), cache_dir=tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "header"])
def test_corrupted_or_partial_file_is_refused(tmp_path: Path, damage: str) -> None:
    m = tiny_model()
    path = tmp_path / "y.adapter"
    save_adapter(path, CoPEAdapter.init(m.forward, CoPEConfig(rank=2)), m.model_id)
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "flip":
        raw[-100] ^= 0xFF
    else:
        raw = raw[:20]
    path.write_bytes(bytes(raw))
    with pytest.raises(AdapterError, match=r"corrupted|truncated|not a CoPE"):
        load_cope_adapter(m, path=path)


def test_checkpoint_write_leaves_no_partial_file_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = tiny_model()
    path = tmp_path / "z.adapter"
    save_adapter(path, CoPEAdapter.init(m.forward, CoPEConfig(rank=2)), m.model_id)
    before = path.read_bytes()

    def crash(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(fsutil.os, "replace", crash)  # killed between write and rename
    with pytest.raises(OSError, match="disk full"):
        save_adapter(path, CoPEAdapter.init(m.forward, CoPEConfig(rank=2), seed=9), m.model_id)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["z.adapter"]


def test_package_corpus_has_three_sources_and_a_held_out_split() -> None:
    docs = documents()
    assert {d.source for d in docs} == {"essay", "chat", "tools"}
    split = split_windows(docs[:60], tiny_model().tokenizer, 64)
    assert len(split.held_out) > 0 and len(split.train) > 5 * len(split.held_out)


def test_settings_validate_and_schedule() -> None:
    with pytest.raises(ValueError):
        TrainSettings(steps=0)
    s = TrainSettings(steps=100, warmup=10, lr=1.0)
    assert s.lr_at(0) == pytest.approx(0.1) and s.lr_at(10) == pytest.approx(1.0)
    assert s.lr_at(100) == pytest.approx(0.1)


def test_eval_windows_spread_over_the_split() -> None:
    held = torch.arange(100).view(100, 1)
    picked = eval_windows(held, 5).flatten().tolist()
    assert picked == [0, 25, 50, 74, 99]
    assert eval_windows(held[:3], 5).flatten().tolist() == [0, 1, 2]
