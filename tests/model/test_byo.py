"""Bringing your own model: a local Hugging Face folder of each family loads, converted to
fp32 from its dtype, and gives transformers' logits; a folder that does not fit is refused
with an error naming the file and the tensor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentcache.errors import ModelLoadError
from agentcache.model.loading import load_folder
from agentcache.model.tokenizer import HFTokenizer
from agentcache.testing import TINY_FAMILY_CONFIGS, tiny_family_hf_model


def _save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<|endoftext|>": 1, **{f"w{i}": i + 2 for i in range(200)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|endoftext|>"
    )
    fast.save_pretrained(folder)


def _folder(tmp_path: Path, variant: str, dtype: torch.dtype = torch.float32) -> tuple[Any, Path]:
    hf = tiny_family_hf_model(variant, seed=3)
    folder = tmp_path / variant
    hf.to(dtype).save_pretrained(folder)
    _save_tokenizer(folder)
    return hf.to(torch.float32), folder


@pytest.mark.parametrize("variant", list(TINY_FAMILY_CONFIGS))
def test_a_local_folder_of_each_family_loads_and_matches_transformers(
    tmp_path: Path, variant: str
) -> None:
    hf, folder = _folder(tmp_path, variant)
    model = load_folder(folder)
    ids = torch.tensor([5, 17, 3, 99, 42, 7, 250, 1, 64, 128] * 4)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    assert (model.forward.forward(ids).logits - want).abs().max().item() <= 1e-4
    assert isinstance(model.tokenizer, HFTokenizer)
    assert model.model_id.startswith(f"{variant}#")


def test_bf16_weights_are_converted_to_fp32(tmp_path: Path) -> None:
    hf, folder = _folder(tmp_path, "qwen3", torch.bfloat16)
    model = load_folder(folder)
    w = model.forward.weights.layers[0].wq
    assert w.dtype == torch.float32
    assert torch.equal(w, hf.model.layers[0].self_attn.q_proj.weight.to(torch.bfloat16).float())


def _edit_weights(folder: Path, edit: Any) -> Path:
    path = folder / "model.safetensors"
    sd = load_file(path)
    edit(sd)
    save_file(sd, path, metadata={"format": "pt"})
    return path


def test_an_unknown_tensor_name_is_refused_naming_the_file(tmp_path: Path) -> None:
    _, folder = _folder(tmp_path, "llama3")
    path = _edit_weights(folder, lambda sd: sd.update({"model.vision.proj": torch.zeros(2)}))
    with pytest.raises(ModelLoadError, match=f"{path}: tensor 'model.vision.proj' is not one"):
        load_folder(folder)


def test_a_missing_tensor_is_refused_naming_it(tmp_path: Path) -> None:
    _, folder = _folder(tmp_path, "qwen3")
    _edit_weights(folder, lambda sd: sd.pop("model.layers.1.self_attn.q_norm.weight"))
    with pytest.raises(ModelLoadError, match=r"lack model\.layers\.1\.self_attn\.q_norm\.weight"):
        load_folder(folder)


def test_weights_not_matching_the_config_are_refused(tmp_path: Path) -> None:
    _, folder = _folder(tmp_path, "mistral")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: tensor .*mlp.* has shape"):
        load_folder(folder)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float64])
def test_weights_of_another_dtype_are_refused_naming_the_tensor(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    _, folder = _folder(tmp_path, "llama3")
    name = "model.layers.0.mlp.up_proj.weight"
    path = _edit_weights(folder, lambda sd: sd.update({name: sd[name].to(dtype)}))
    with pytest.raises(ModelLoadError, match=f"{path}: tensor '{name}' is {dtype}; .*fp32, fp16"):
        load_folder(folder)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp16_and_fp32_weights_load_as_fp32_and_match_transformers(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    from transformers import AutoModelForCausalLM

    _, folder = _folder(tmp_path, "gemma3", dtype)
    model = load_folder(folder)
    assert model.forward.weights.layers[0].wq.dtype == torch.float32
    # the reference: transformers loading the same folder in fp32 (its buffers computed anew)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([5, 17, 3, 99, 42, 7, 250, 1])
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    assert (model.forward.forward(ids).logits - want).abs().max().item() <= 1e-4


def test_a_quantized_checkpoint_is_refused_from_its_config(tmp_path: Path) -> None:
    """A GPTQ / AWQ / fp8 export says so in config.json: refused before any tensor is read."""
    _, folder = _folder(tmp_path, "qwen3")
    cfg = json.loads((folder / "config.json").read_text())
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps({**cfg, "quantization_config": quant}))
    with pytest.raises(ModelLoadError, match=r"config\.json declares a quantization_config .*fp8"):
        load_folder(folder)


def test_a_folder_without_a_tokenizer_is_refused_naming_it(tmp_path: Path) -> None:
    _, folder = _folder(tmp_path, "smollm3")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (folder / f).unlink()
    with pytest.raises(ModelLoadError, match=f"{folder} has no tokenizer"):
        load_folder(folder)


@pytest.mark.parametrize("cut", [0.5, 0.0001], ids=["half", "inside-the-header"])
def test_a_truncated_weights_file_is_refused_naming_it(tmp_path: Path, cut: float) -> None:
    """safetensors raises its own error class for a header or length that does not parse."""
    _, folder = _folder(tmp_path, "qwen3")
    weights = next(folder.glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[: max(9, int(len(data) * cut))])
    with pytest.raises(ModelLoadError) as e:
        load_folder(folder)
    assert str(e.value).startswith(f"{weights} is not a readable safetensors file (")
    assert str(e.value).endswith("is it truncated or corrupted?")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda t: {k: v for k, v in t.items() if k != "model"}, "Model missing"),
        (lambda t: {**t, "added_tokens": [{"id": "x"}]}, "invalid type: string"),
    ],
    ids=["no-model", "bad-added-token"],
)
def test_a_malformed_tokenizer_file_is_refused_naming_the_folder(
    tmp_path: Path, change: Any, needle: str
) -> None:
    """The tokenizers library raises a bare Exception for these: it is a ModelLoadError."""
    _, folder = _folder(tmp_path, "smollm3")
    tok = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps(change(tok)))
    with pytest.raises(ModelLoadError) as e:
        load_folder(folder)
    assert str(e.value).startswith(f"could not load the tokenizer in {folder}: ")
    assert needle in str(e.value)


def test_gemma_chat_markup_names_the_assistant_model() -> None:
    from agentcache.model.tokenizer import GEMMA, chat_format_for

    assert chat_format_for({"<start_of_turn>": 1}) is GEMMA
    assert GEMMA.wrap("user", "hi") == "<start_of_turn>user\nhi<end_of_turn>\n"
    assert GEMMA.wrap("system", "be brief") == "<start_of_turn>user\nbe brief<end_of_turn>\n"
    assert GEMMA.generation_prompt() == "<start_of_turn>model\n"
