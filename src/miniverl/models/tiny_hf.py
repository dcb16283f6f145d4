"""Build a tiny, random, *real* Hugging Face checkpoint offline.

Tests and benchmarks of :class:`~miniverl.models.hf.HFBackend` need a checkpoint that goes
through exactly the ``from_pretrained`` path a downloaded Qwen3 or Llama model does
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json), without network
access and in about a second. :func:`build_tiny_hf_checkpoint` trains a byte-level BPE
tokenizer on a small built-in corpus of calculator prompts and tool calls, adds the chat
markers and protocol tags as single tokens, builds a randomly initialised 2-layer model and
``save_pretrained``s both. Same arguments, same files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

from miniverl.errors import ConfigError
from miniverl.schemas.text import (
    ASSISTANT_HEADER,
    CHAT_MARKERS,
    FINAL_CLOSE,
    FINAL_OPEN,
    IM_END,
    IM_START,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESULT_CLOSE,
    TOOL_RESULT_OPEN,
    TOOL_TAGS,
)
from miniverl.utils.lazy import import_torch, require

EOS_TOKEN = "<|endoftext|>"
PROTOCOL_TAGS: tuple[str, ...] = TOOL_TAGS
CHAT_TEMPLATE = (
    "{% for message in messages %}" + IM_START + "{{ message['role'] }}\n"
    "{{ message['content'] }}" + IM_END + "\n{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT_HEADER + "{% endif %}"
)

_OPS = ("+", "-", "*", "/")
_WORDS = (
    "Compute", "Calculate", "Evaluate", "What is", "Use the calculator tool to find",
    "and report the value.", "Give the exact answer.", "then answer with the result.",
)  # fmt: skip


def tiny_corpus(seed: int = 0, size: int = 400) -> list[str]:
    """Calculator-flavoured training text for the tiny tokenizer (deterministic in ``seed``)."""
    rng = random.Random(seed)
    lines = [
        f"{IM_START}system\nYou are a careful assistant. Call the calculator tool, "
        f"then write the answer inside {FINAL_OPEN} and {FINAL_CLOSE}.{IM_END}\n",
    ]
    for _ in range(size):
        a, b, c = rng.randint(0, 999), rng.randint(0, 99), rng.randint(1, 9)
        expr = f"{a} {rng.choice(_OPS)} {b}"
        if rng.random() < 0.3:
            expr = f"({expr}) {rng.choice(_OPS)} {c}"
        verb, tail = rng.choice(_WORDS[:5]), rng.choice(_WORDS[5:])
        value = rng.randint(-500, 5000)
        call = {"name": "calculator", "arguments": {"expression": expr}}
        lines += [
            f"{IM_START}user\n{verb} {expr} {tail}{IM_END}\n{ASSISTANT_HEADER}",
            f"{TOOL_CALL_OPEN}\n{json.dumps(call)}\n{TOOL_CALL_CLOSE}",
            f"{IM_END}\n{IM_START}user\n{TOOL_RESULT_OPEN}\n"
            f'{{"ok": true, "result": "{value}"}}\n{TOOL_RESULT_CLOSE}',
            f"{FINAL_OPEN}\n{value}\n{FINAL_CLOSE}",
        ]
    lines += [
        "0 1 2 3 4 5 6 7 8 9 10 100 1000",
        "naïve café 数学 😀",
        '{"ok": false, "error": "x"}',
    ]
    return lines


def build_tiny_hf_checkpoint(
    path: str | Path,
    *,
    arch: Literal["qwen3", "llama"] = "qwen3",
    num_layers: int = 2,
    hidden_size: int = 64,
    seed: int = 0,
    vocab_size: int = 512,
) -> Path:
    """Write a tiny random ``arch`` model and its BPE tokenizer into ``path``; return ``path``.

    ``vocab_size`` is the tokenizer's total (BPE vocabulary plus the six protocol tags) and
    the model's embedding size. ``seed`` fixes the corpus, hence the BPE merges, and the
    weights; two different seeds give two different tokenizers, which is what the
    tokenizer-mismatch tests use.
    """
    if arch not in ("qwen3", "llama"):
        raise ConfigError(f"unknown tiny architecture {arch!r}", hint="use 'qwen3' or 'llama'")
    if hidden_size % 4 or hidden_size < 16:
        raise ConfigError("tiny hidden_size must be a multiple of 4 and at least 16")
    if vocab_size < 300:
        raise ConfigError("tiny vocab_size must be >= 300 (256 byte symbols plus specials)")
    torch = import_torch("building a tiny Hugging Face checkpoint")
    transformers = require("transformers", "building a tiny Hugging Face checkpoint")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    hf_tokenizer = _train_tokenizer(seed, vocab_size)
    eos_id = hf_tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    num_heads = 4
    common = {
        "vocab_size": len(hf_tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads // 2,
        "head_dim": hidden_size // num_heads,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "bos_token_id": None,
        "initializer_range": 0.2,
    }
    if arch == "qwen3":
        config = transformers.Qwen3Config(tie_word_embeddings=True, **common)
    else:
        config = transformers.LlamaConfig(tie_word_embeddings=False, **common)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None, do_sample=False
    )
    model.save_pretrained(out)
    hf_tokenizer.save_pretrained(out)
    return out


def _train_tokenizer(seed: int, vocab_size: int) -> Any:
    """A byte-level BPE trained on :func:`tiny_corpus`, as a ``PreTrainedTokenizerFast``."""
    tk = require("tokenizers", "training the tiny BPE tokenizer")
    transformers = require("transformers", "training the tiny BPE tokenizer")
    specials = [EOS_TOKEN, *CHAT_MARKERS]
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size - len(PROTOCOL_TAGS),
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tiny_corpus(seed), trainer=trainer)
    tokenizer.add_tokens(
        [tk.AddedToken(tag, special=False, normalized=False) for tag in PROTOCOL_TAGS]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=list(CHAT_MARKERS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


__all__ = ["CHAT_MARKERS", "EOS_TOKEN", "PROTOCOL_TAGS", "build_tiny_hf_checkpoint", "tiny_corpus"]
