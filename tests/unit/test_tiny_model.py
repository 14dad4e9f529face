"""The tiny local model builds deterministically into a normal Hugging Face folder."""

import hashlib
from pathlib import Path

from replicas.tiny_model.build import TinyModelSpec, build_tiny_model, is_built

SMALL = TinyModelSpec(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2, num_kv_heads=1)


def _digest(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


def test_same_spec_gives_identical_files(tmp_path: Path) -> None:
    first = build_tiny_model(tmp_path / "a", SMALL)
    second = build_tiny_model(tmp_path / "b", SMALL)
    assert _digest(first) == _digest(second)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(_digest(first))


def test_other_seed_gives_other_weights(tmp_path: Path) -> None:
    first = build_tiny_model(tmp_path / "a", SMALL)
    other = build_tiny_model(tmp_path / "b", TinyModelSpec(**{**SMALL.__dict__, "seed": 1}))
    assert _digest(first)["model.safetensors"] != _digest(other)["model.safetensors"]
    assert _digest(first)["tokenizer.json"] == _digest(other)["tokenizer.json"]


def test_tokenizer_round_trips_and_applies_chat_template(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    folder = build_tiny_model(tmp_path / "m", SMALL)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "Hello, café 東京 🙂!"
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith("<|im_start|>assistant\n")
    assert AutoConfig.from_pretrained(folder).vocab_size == len(tokenizer)
    assert is_built(folder, SMALL) and not is_built(folder, TinyModelSpec())
