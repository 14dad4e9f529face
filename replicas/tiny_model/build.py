"""Deterministic construction of the tiny local model (weights, tokenizer, chat template)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

CORPUS_PATH = Path(__file__).with_name("corpus.txt")

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|im_end|>"
TURN_START_TOKEN = "<|im_start|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN, TURN_START_TOKEN, PAD_TOKEN]

# ChatML-style template: the same shape as many production chat models, so the chat path (template
# rendering, generation prompt, stop token) is exercised for real.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | tojson) + '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

MARKER_FILE = "tiny_model_spec.json"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; every field feeds the deterministic build."""

    seed: int = 0
    vocab_target: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 688
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_context: int = 4096
    template_version: int = 2  # 2: the chat template renders tools (as production templates do)


# The local models by name. "tiny" (a few MB) keeps the tests fast. "bench" is sized so that one decode step
# at batch 16 on one core here costs about what one step of an 8B model costs on a GPU (tens of ms; measured
# by `python -m bench.calibrate --model bench`), so live benchmarks are bound by their engines, not by the
# host's Python. Same tokenizer, template and build.
MODEL_SIZES: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(),
    "bench": TinyModelSpec(hidden_size=768, intermediate_size=2048, num_layers=8, num_heads=12, num_kv_heads=4),
}


def train_tokenizer(spec: TinyModelSpec, out_dir: Path) -> "PreTrainedTokenizerFast":  # noqa: F821
    """Train a byte-level BPE on the repository corpus and save it with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_target,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = CORPUS_PATH.read_text(encoding="utf-8")
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=spec.max_context,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Build the model folder at ``out_dir`` (created if missing) and return its path.

    The same ``spec`` always yields byte-identical weights and tokenizer files.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec, out)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    generation_config = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    (out / MARKER_FILE).write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
    return out


def is_built(out_dir: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> bool:
    """True when ``out_dir`` already holds a model built from ``spec``."""
    marker = Path(out_dir) / MARKER_FILE
    return marker.is_file() and json.loads(marker.read_text()) == asdict(spec)
