"""Tokenizers behind the ``TokenizerLike`` contract, and the behavioural fingerprint.

Two implementations exist:

- :class:`ToyTokenizer` is embedded in this file (no vocabulary download, no training), so
  the toy backend, the demo and every CPU test run offline with identical ids everywhere.
- :class:`HFTokenizerAdapter` wraps a ``transformers`` tokenizer for the HF backend.

Same-tokenizer distillation needs a cheap, exact answer to "do these two tokenizers
tokenize identically?". Comparing names or vocab files is neither necessary nor
sufficient, so :func:`compute_fingerprint` hashes what the tokenizer *does*: the ids it
produces on :data:`PROBE_CORPUS`, its special-token ids and its vocabulary size.

This module never imports torch; ``transformers`` is imported only when an HF tokenizer is
loaded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miniverl.errors import BackendError, TokenizerMismatchError
from miniverl.schemas.text import (
    ASSISTANT_HEADER,
    CHATML,
    FINAL_CLOSE,
    FINAL_OPEN,
    IM_END,
    IM_START,
    PROTOCOL_TOKENS,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESULT_CLOSE,
    TOOL_RESULT_OPEN,
    ChatFormat,
    chat_format_from_template,
)
from miniverl.utils.hashing import sha256_json
from miniverl.utils.lazy import require

if TYPE_CHECKING:
    from miniverl.schemas.text import TokenizerLike

FINGERPRINT_VERSION = 1

PROBE_CORPUS: tuple[str, ...] = (
    f"{IM_START}system\nYou are a careful assistant. Use the calculator tool.{IM_END}\n",
    f"{IM_START}user\nCompute 12 * (7 - 3) and report the value.{IM_END}\n{ASSISTANT_HEADER}",
    f'{TOOL_CALL_OPEN}\n{{"name": "calculator", "arguments": {{"expression": "12 * (7 - 3)"}}}}\n'
    f"{TOOL_CALL_CLOSE}",
    f"{IM_END}\n{IM_START}user\n"
    f'{TOOL_RESULT_OPEN}\n{{"ok": true, "result": "48"}}\n{TOOL_RESULT_CLOSE}',
    f"{FINAL_OPEN}\n48\n{FINAL_CLOSE}",
    f"I will call the tool first.\n{TOOL_CALL_OPEN}\n",
    '{"ok": false, "error": "division by zero"}',
    "0 1 2 3 4 5 6 7 8 9 10 42 100 1000 65536 3.14159 -17 +5 1e-3 1,000,000 007",
    "((2 + 3) * 4 - 5) / 6 % 7 ** 2 = 11.5; 9//2 == 4",
    "naïve café — Ωμέγα ∑ 数学 😀 Straße",
    "  two leading spaces\ttab\n\nblank line \r\n trailing  ",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
    "<|endoftext|><eos></s><pad><unk>[PAD]",
    "a",
    "",
)
"""Fixed probe texts: chat markers, protocol tags, JSON, digits, arithmetic, unicode,
whitespace and special-looking strings. Changing it changes every fingerprint, so it is
versioned by :data:`FINGERPRINT_VERSION`."""


def compute_fingerprint(
    encode: Callable[[str], list[int]], special_tokens: Mapping[str, int], vocab_size: int
) -> str:
    """SHA-256 hex digest of the probe ids, the special-token ids and the vocabulary size.

    Two tokenizers share the digest iff they encode every probe text to the same ids and
    declare the same specials, which is exactly the property alignment relies on.
    """
    payload = {
        "version": FINGERPRINT_VERSION,
        "probe_ids": [list(encode(text)) for text in PROBE_CORPUS],
        "special_tokens": sorted((str(k), int(v)) for k, v in special_tokens.items()),
        "vocab_size": int(vocab_size),
    }
    return sha256_json(payload)


# ---------------------------------------------------------------------------- toy tokenizer

_SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", *PROTOCOL_TOKENS, "<eos>")

# Ids 10..88. The order fixes every id from here on (and so the fingerprint); it matches the
# worked example of docs/trajectory-schema.md ("assistant" is 11, "system" 69, "\n" 89).
_WORD_PIECES: tuple[str, ...] = (
    "user", "assistant", "calculator", "expression", "arguments", "name", "result",
    "Compute", "compute", "and", "report", "the", "value", "tool", "call", "final",
    "answer", "error", "true", "false", "ok", "Result", "use", "to", "solve", "task", "with",
    "of", "is", "as", "an", "in", "one", "only", "number", "integer", "inside", "then",
    "when", "Call", "Answer", "Give", "give", "What", "what", "plus", "minus", "times",
    "divided", "by", "Evaluate", "evaluate", "Return", "return", "exact", "JSON", "format",
    "block", "reply", "system", "You", "you", "are", "must", "each", "step", "tools",
    "after", "before", "first", "not", "Calculate", "sum", "product", "difference",
    "quotient", "remainder", "for", "write",
)  # fmt: skip

# After the single-character block (ids 89..185): JSON punctuation and whitespace runs.
_MULTI_CHAR_PIECES: tuple[str, ...] = (
    '": "', '", "', '": {"', '"}', '"}}', '": ', '"},', "\n\n", "  ", "    ", "**", "//",
)  # fmt: skip

_PRINTABLE_ASCII = "".join(chr(c) for c in range(32, 127))
_SINGLE_CHARS: tuple[str, ...] = ("\n", "\t", *_PRINTABLE_ASCII)
_COVERED_BYTES = frozenset(ord(c) for c in _SINGLE_CHARS)
_FALLBACK_BYTES: tuple[int, ...] = tuple(b for b in range(256) if b not in _COVERED_BYTES)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """:func:`compute_fingerprint` of a tokenizer with ``special_token_ids``, eos and pad ids."""
    specials = {
        **tokenizer.special_token_ids,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    return compute_fingerprint(tokenizer.encode, specials, tokenizer.vocab_size)


class ToyTokenizer:
    """A deterministic greedy longest-match tokenizer embedded in the source.

    Vocabulary (ids are fixed by the tables above):

    - ``0..9``: ``<pad>``, ``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``,
      ``</tool_call>``, ``<tool_result>``, ``</tool_result>``, ``<final>``, ``</final>``,
      ``<eos>``; each is one token, also when it appears inside text.
    - ``10..88``: whole words common in calculator prompts and tool calls.
    - ``89..185``: ``\\n``, ``\\t`` and every printable ASCII character, so any ASCII text
      encodes.
    - then JSON punctuation and whitespace runs, and finally one byte piece ``<0xNN>`` for
      every byte not covered by a single character (control characters and all bytes of
      non-ASCII UTF-8). Non-ASCII text is therefore encoded as its UTF-8 bytes and
      ``decode(encode(s)) == s`` holds for every string, not only ASCII.

    ``decode`` accepts any id sequence, including a prefix that ends inside a multi-byte
    character (that character decodes as U+FFFD), which is what ``token_index_at_char``
    needs when it decodes prefixes of sampled ids.
    """

    def __init__(self) -> None:
        pieces: list[str] = [
            *_SPECIAL_TOKENS,
            *_WORD_PIECES,
            *_SINGLE_CHARS,
            *_MULTI_CHAR_PIECES,
        ]
        if len(set(pieces)) != len(pieces):
            raise AssertionError("toy vocabulary pieces must be unique")
        self._text_to_id: dict[str, int] = {piece: i for i, piece in enumerate(pieces)}
        self._byte_offset = len(pieces)
        self._byte_to_id: dict[int, int] = {
            b: self._byte_offset + k for k, b in enumerate(_FALLBACK_BYTES)
        }
        self._id_to_piece: list[str] = pieces + [f"<0x{b:02X}>" for b in _FALLBACK_BYTES]
        self._id_to_byte: dict[int, int] = {i: b for b, i in self._byte_to_id.items()}
        longest_first = sorted(pieces, key=len, reverse=True)
        self._pieces = re.compile(
            "|".join(re.escape(p) for p in longest_first) + "|.", flags=re.DOTALL
        )
        self._fingerprint: str | None = None

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_piece)

    @property
    def eos_token_id(self) -> int:
        return self._text_to_id["<eos>"]

    @property
    def pad_token_id(self) -> int:
        return self._text_to_id["<pad>"]

    @property
    def special_token_ids(self) -> dict[str, int]:
        """The ten special tokens, text -> id."""
        return {tok: self._text_to_id[tok] for tok in _SPECIAL_TOKENS}

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = tokenizer_fingerprint(self)
        return self._fingerprint

    def token_to_id(self, piece: str) -> int:
        """Id of one vocabulary piece (``"<final>"``, ``"assistant"``, ``"<0xC3>"``, ...)."""
        if piece in self._text_to_id:
            return self._text_to_id[piece]
        if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            byte = int(piece[3:5], 16)
            if byte in self._byte_to_id:
                return self._byte_to_id[byte]
        raise KeyError(f"{piece!r} is not a toy-tokenizer piece")

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary piece for ``token_id`` (byte pieces read ``<0xNN>``)."""
        self._check_id(token_id)
        return self._id_to_piece[token_id]

    def encode(self, text: str) -> list[int]:
        """Greedy longest match over the vocabulary; unmatched characters become UTF-8 bytes.

        One pass of ``self._pieces``: its alternation lists every piece longest first, and two
        distinct pieces of one length cannot both start at a position, so the first
        alternative that matches is the longest piece there, which is the greedy longest
        match; the closing ``.`` takes one character no piece starts with.
        """
        ids: list[int] = []
        lookup, to_byte = self._text_to_id, self._byte_to_id
        for piece in self._pieces.findall(text):
            token_id = lookup.get(piece)
            if token_id is None:
                ids.extend(to_byte[b] for b in piece.encode("utf-8"))
            else:
                ids.append(token_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Concatenate pieces; runs of byte pieces are decoded as UTF-8 (invalid -> U+FFFD).

        Ids with no byte piece among them (nearly every rollout turn; the batched decode
        loop decodes each row's ids once per sampled id to look for stop strings) are
        joined in one pass.
        """
        pieces = self._id_to_piece
        if (
            isinstance(ids, list | tuple)
            and ids
            and min(ids) >= 0
            and max(ids) < len(pieces)
            and self._id_to_byte.keys().isdisjoint(ids)
        ):
            return "".join([pieces[i] for i in ids])
        parts: list[str] = []
        pending = bytearray()
        for raw in ids:
            token_id = int(raw)
            self._check_id(token_id)
            byte = self._id_to_byte.get(token_id)
            if byte is not None:
                pending.append(byte)
                continue
            if pending:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            parts.append(self._id_to_piece[token_id])
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._id_to_piece):
            raise ValueError(
                f"token id {token_id} is outside the toy vocabulary [0, {len(self._id_to_piece)})"
            )

    def __repr__(self) -> str:
        return f"ToyTokenizer(vocab_size={self.vocab_size}, fingerprint={self.fingerprint[:12]})"


TOY_VOCAB_SIZE: int = ToyTokenizer().vocab_size
"""Vocabulary size of :class:`ToyTokenizer`; the toy model presets use it."""


# ---------------------------------------------------------------------------- Hugging Face


class HFTokenizerAdapter:
    """``TokenizerLike`` view of a ``transformers`` tokenizer.

    ``encode`` never adds BOS/EOS (segment-wise tokenization concatenates segments, so a
    per-call BOS would corrupt the transcript). ``decode`` keeps special tokens and does not
    clean up spaces, so decoding sampled ids reproduces the exact text the model emitted,
    chat markers included. ``vocab_size`` is ``len(tokenizer)`` (base vocabulary plus added
    tokens); the model's embedding matrix may be larger.
    """

    def __init__(self, hf_tokenizer: Any, *, name_or_path: str | None = None) -> None:
        self.hf_tokenizer = hf_tokenizer
        self.name_or_path = name_or_path or str(getattr(hf_tokenizer, "name_or_path", ""))
        eos = hf_tokenizer.eos_token_id
        if eos is None:
            raise BackendError(
                f"tokenizer {self.name_or_path!r} defines no eos_token",
                hint="set eos_token in the checkpoint's tokenizer_config.json",
            )
        self._eos = int(eos)
        pad = hf_tokenizer.pad_token_id
        self._pad = int(pad) if pad is not None else self._eos
        self._fingerprint: str | None = None
        self._chat_format: ChatFormat | None = None

    @property
    def vocab_size(self) -> int:
        return len(self.hf_tokenizer)

    @property
    def eos_token_id(self) -> int:
        return self._eos

    @property
    def pad_token_id(self) -> int:
        return self._pad

    @property
    def special_token_ids(self) -> dict[str, int]:
        """Every added token (chat markers, protocol tags, ...), text -> id."""
        return {str(k): int(v) for k, v in self.hf_tokenizer.get_added_vocab().items()}

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = tokenizer_fingerprint(self)
        return self._fingerprint

    @property
    def chat_format(self) -> ChatFormat:
        """The message framing of the model's chat template; ChatML when it has none.

        A template that cannot be reproduced message by message (see
        :func:`chat_format_from_template`) is a :class:`BackendError`: rendering turns
        differently from the model's own format would silently change what it sees.
        """
        if self._chat_format is None:
            if not getattr(self.hf_tokenizer, "chat_template", None):
                self._chat_format = CHATML
            else:

                def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
                    return str(
                        self.hf_tokenizer.apply_chat_template(
                            messages, tokenize=False, add_generation_prompt=add_generation_prompt
                        )
                    )

                try:
                    self._chat_format = chat_format_from_template(render)
                except Exception as exc:
                    raise BackendError(
                        f"the chat template of {self.name_or_path!r} cannot be rendered message "
                        f"by message: {exc}",
                        hint="use a checkpoint with a per-message template (ChatML, Llama 3, ...)",
                    ) from exc
        return self._chat_format

    def token_to_id(self, piece: str) -> int:
        token_id = self.hf_tokenizer.convert_tokens_to_ids(piece)
        if token_id is None or (
            token_id == self.hf_tokenizer.unk_token_id and piece != self.hf_tokenizer.unk_token
        ):
            raise KeyError(f"{piece!r} is not a single token of {self.name_or_path!r}")
        return int(token_id)

    def id_to_token(self, token_id: int) -> str:
        return str(self.hf_tokenizer.convert_ids_to_tokens(int(token_id)))

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.hf_tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(
            self.hf_tokenizer.decode(
                [int(i) for i in ids],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
        )

    def __repr__(self) -> str:
        return f"HFTokenizerAdapter({self.name_or_path!r}, vocab_size={self.vocab_size})"


def hub_offline() -> bool:
    """True when the environment asks Hugging Face libraries not to touch the network."""
    truthy = {"1", "true", "yes", "on"}
    return any(
        os.environ.get(var, "").strip().lower() in truthy
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def load_hf_tokenizer(
    model_id_or_path: str | Path, revision: str | None = None
) -> HFTokenizerAdapter:
    """Load a tokenizer from a local directory or a hub id, never executing remote code.

    A hub id is resolved from the local Hugging Face cache first; the network is used only
    when the files are not cached and ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` is unset.
    Failure is a :class:`BackendError` that says how to make the files available.
    """
    transformers = require("transformers", "loading a Hugging Face tokenizer")
    tok = load_pretrained(
        transformers.AutoTokenizer, model_id_or_path, revision=revision, what="tokenizer"
    )
    return HFTokenizerAdapter(tok, name_or_path=str(model_id_or_path))


def cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The local snapshot directory of ``repo_id`` at ``revision``, or None if not cached.

    Looked up with ``local_files_only``, so it never touches the network (unlike some
    ``from_pretrained`` code paths, which probe the hub for optional files even when told
    to stay local).
    """
    hub = require("huggingface_hub", "resolving a cached Hugging Face snapshot")
    try:
        return Path(hub.snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception:  # any failure only means "not usable from the cache"
        return None


def load_pretrained(
    loader: Any, model_id_or_path: str | Path, *, revision: str | None, what: str, **kwargs: Any
) -> Any:
    """``loader.from_pretrained`` from a local directory, the local cache, or the hub.

    Order: an existing directory; the cached snapshot of a hub id; the network (only when
    not offline). ``trust_remote_code`` is always False. Errors become
    :class:`BackendError` with the next step to take.
    """
    source = str(model_id_or_path)
    kwargs = {**kwargs, "trust_remote_code": False}
    local = Path(source).expanduser()
    if local.is_dir():
        return _from_pretrained(loader, str(local), what=what, **kwargs)
    if looks_like_local_path(source):
        raise BackendError(
            f"{what} folder {source!r} does not exist",
            hint=(
                "point the model id at a directory written by save_pretrained, or download "
                "one first, e.g. hf download <org>/<model> --local-dir "
                f"{source}"
            ),
        )
    snapshot = cached_snapshot(source, revision)
    if snapshot is not None:
        try:
            return loader.from_pretrained(str(snapshot), **kwargs)
        except (OSError, ValueError) as exc:
            if hub_offline():
                raise _offline_error(what, source, revision, exc) from exc
    elif hub_offline():
        raise _offline_error(what, source, revision, "not in the local Hugging Face cache")
    return _from_pretrained(loader, source, what=what, revision=revision, **kwargs)


def looks_like_local_path(source: str) -> bool:
    """A model id meant as a folder, not a hub id (hub ids are ``name`` or ``org/name``)."""
    return (
        source.startswith(("/", "./", "../", "~", "."))
        or source.count("/") > 1
        or "\\" in source
        or source.endswith("/")
    )


def _from_pretrained(loader: Any, location: str, *, what: str, **kwargs: Any) -> Any:
    try:
        return loader.from_pretrained(location, **kwargs)
    except (OSError, ValueError) as exc:
        raise BackendError(
            f"could not load {what} {location!r}: {exc}",
            hint=(
                "check the model id and revision and your network, or point it at a local "
                "directory written by save_pretrained"
            ),
        ) from exc


def _offline_error(what: str, source: str, revision: str | None, why: object) -> BackendError:
    return BackendError(
        f"{what} {source!r} (revision {revision or 'default'}) cannot be loaded while the "
        f"Hugging Face hub is offline: {why}",
        hint=(
            f"download it first (hf download {source}) or point the model id at a "
            "local directory written by save_pretrained"
        ),
    )


def check_same_tokenizer(student: TokenizerLike, teacher: TokenizerLike) -> None:
    """Raise :class:`TokenizerMismatchError` unless both tokenizers share a fingerprint."""
    s, t = student.fingerprint, teacher.fingerprint
    if s != t:
        raise TokenizerMismatchError(
            f"student and teacher tokenizers differ ({s[:12]} vs {t[:12]}); "
            "miniVERL currently supports same-tokenizer distillation only"
        )


__all__ = [
    "FINGERPRINT_VERSION",
    "PROBE_CORPUS",
    "TOY_VOCAB_SIZE",
    "HFTokenizerAdapter",
    "ToyTokenizer",
    "cached_snapshot",
    "check_same_tokenizer",
    "compute_fingerprint",
    "hub_offline",
    "load_hf_tokenizer",
    "load_pretrained",
]
