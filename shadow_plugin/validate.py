"""Checks of caller input; each raises ValueError (or KeyError) naming what was wrong, before any
state is touched."""
from __future__ import annotations

import array
import json
import numbers
import re
from pathlib import Path

import numpy as np
import torch

MAX_SESSION_ID_CHARS = 256
# the session ids the HTTP routes take (in paths and bodies); the library takes any str
HTTP_SESSION_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def session_id(session) -> str:
    """A session id is any non-empty str of at most 256 characters (never used as a path)."""
    if not isinstance(session, str):
        raise ValueError(f"session id must be a str, got {type(session).__name__}")
    if not 1 <= len(session) <= MAX_SESSION_ID_CHARS:
        raise ValueError(f"session id must have 1 to {MAX_SESSION_ID_CHARS} characters, "
                         f"got {len(session)}")
    return session


def token_ids(ids, vocab_size: int, name: str = "ids") -> list[int]:
    """A 1-D sequence of ints in [0, vocab_size) as a list of Python ints.

    Accepts lists, tuples, numpy arrays and torch tensors of integer type. Raises ValueError naming
    the value and its position for a negative, out-of-vocabulary, non-integer or boolean id, and
    naming the shape for input that is not 1-D.
    """
    if isinstance(ids, (torch.Tensor, np.ndarray)):
        if ids.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {list(ids.shape)}")
        is_int = (not ids.dtype.is_floating_point and ids.dtype != torch.bool
                  if isinstance(ids, torch.Tensor) else np.issubdtype(ids.dtype, np.integer))
        if not is_int:
            raise ValueError(f"{name} must be integers, got dtype {ids.dtype}")
        ids = ids.tolist()
    elif not isinstance(ids, (list, tuple, range)):
        raise ValueError(f"{name} must be a 1-D sequence of token ids (list, tuple, numpy "
                         f"array or tensor), got {type(ids).__name__}")
    if _plain_ids_in(ids, vocab_size):
        return list(ids)                 # the common case, at C's speed (_plain_ids_in)
    out = []
    for i, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise ValueError(f"{name}[{i}] = {x!r} is not an integer token id")
        x = int(x)
        if not 0 <= x < vocab_size:
            raise ValueError(f"{name}[{i}] = {x} is outside the vocabulary [0, {vocab_size})")
        out.append(x)
    return out


def _plain_ids_in(ids, vocab_size: int) -> bool:
    """Whether every id is a Python int (not a bool, not numpy's) in [0, vocab_size), at C's
    speed: the types through map and a set, the bounds through a C array of int64 and numpy
    (a turn's prompt is checked under the events thread's hold inside vLLM, which a host step
    may wait for; the apply's time: `python -m evals.apply_bench`, BENCHMARKS.md). False
    sends the caller to its loop, which names the first bad id."""
    if not ids:
        return True
    if set(map(type, ids)) != {int}:
        return False
    try:
        arr = np.frombuffer(array.array("q", ids), dtype=np.int64)
    except OverflowError:                # past int64: outside any vocabulary
        return False
    return 0 <= int(arr.min()) and int(arr.max()) < vocab_size


def items(values, what: str) -> list:
    """The items of a list, tuple or other iterable that is not a str, bytes or mapping (whose
    iteration gives characters or keys), as a list. Raises ValueError "{what}, got {type}"
    otherwise."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{what}, got {type(values).__name__}")
    return list(values)


def choices(values, max_choices: int = 26) -> list[str]:
    """2 to 26 choices, each a non-empty str."""
    if not isinstance(values, (list, tuple)):
        raise ValueError("choices must be a list of strings")
    if not 2 <= len(values) <= max_choices:
        raise ValueError(f"choices must number 2 to {max_choices}, got {len(values)}")
    for i, c in enumerate(values):
        if not isinstance(c, str) or not c.strip():
            raise ValueError(f"choices[{i}] = {c!r} must be a non-empty string")
        if c in values[:i]:
            raise ValueError(f"choices[{i}] = {c!r} repeats an earlier choice")
    return list(values)


def flag(value, name: str) -> bool | None:
    """None or a real bool (not a truthy string)."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None, got {value!r}")
    return value


def count(value, name: str) -> int | None:
    """None or an int >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 or None, got {value!r}")
    return int(value)


def position(at, length: int) -> int:
    """`at` in [0, length], or None for `length`."""
    if at is None:
        return length
    if isinstance(at, bool) or not isinstance(at, numbers.Integral):
        raise ValueError(f"at = {at!r} must be an integer position")
    if not 0 <= at <= length:
        raise ValueError(f"at = {at} is outside the session's ids [0, {length}]")
    return int(at)


def json_file(path) -> object:
    """The decoded content of a UTF-8 JSON file. Raises ValueError naming the file when it is
    not JSON, OSError when it cannot be read."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON file ({e})") from e
