"""A session's memory, free of model code: state layouts from a small spec, checkpoints and
their keeping, the session table with its resident cap (LRU), and the files on disk with their
identity checks; the paged store's first parts (page keys: keys.py; the block manager:
pool.py), not yet used by the reader. Imports nothing from adapters, shadow_plugin or evals."""
from .files import FileIdentity, RefusedFile
from .layout import ExactnessError, StateSpec, compare, pack, state_names
from .residency import StoreConfig
from .session import Checkpoint, SessionState
from .table import SessionTable

__all__ = ["Checkpoint", "ExactnessError", "FileIdentity", "RefusedFile", "SessionState",
           "SessionTable", "StateSpec", "StoreConfig", "compare", "pack", "state_names"]
