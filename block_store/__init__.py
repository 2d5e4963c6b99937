"""A session's memory, free of model code: state layouts from a small spec; the paged KV
cache (kv_pool: pages of G rows in one pool, pool: the block manager, keys: chained page
keys); the GDN table of states at grid lines keyed like pages (gdn_table); the page store and
the one lookup a prompt resumes through (pages); checkpoints and their keeping; the session
table with its resident cap (LRU); and the files on disk with their identity checks. Imports
nothing from adapters, shadow_plugin or evals."""
from .files import FileIdentity, RefusedFile
from .kv_pool import KvPool, PagedKv, contiguous_kv
from .layout import ExactnessError, StateSpec, compare, pack, state_names
from .pages import PageStore
from .residency import StoreConfig
from .session import Checkpoint, SessionState
from .table import SessionTable

__all__ = ["Checkpoint", "ExactnessError", "FileIdentity", "KvPool", "PageStore", "PagedKv",
           "RefusedFile", "SessionState", "SessionTable", "StateSpec", "StoreConfig", "compare",
           "contiguous_kv", "pack", "state_names"]
