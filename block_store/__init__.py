"""A session's memory, free of model code: state layouts from a small spec; the paged KV
cache (kv_pool: pages of G rows in one pool, pool: the block manager, keys: chained page
keys); the GDN table of states at grid lines keyed like pages (gdn_table); the page store and
the one lookup a prompt resumes through (pages); checkpoints and their keeping; the session
table with its resident cap (LRU); and the files on disk with their identity checks. Imports
nothing from adapters, shadow_plugin or evals."""
from block_store.disk.files import FileIdentity, RefusedFile
from block_store.memory.kv_pool import KvPool, PagedKv, contiguous_kv
from block_store.memory.layout import ExactnessError, StateSpec, compare, pack, state_names
from block_store.pages import PageStore
from block_store.residency import StoreConfig
from block_store.session import Checkpoint, SessionState
from block_store.table import SessionTable

__all__ = ["Checkpoint", "ExactnessError", "FileIdentity", "KvPool", "PageStore", "PagedKv",
           "RefusedFile", "SessionState", "SessionTable", "StateSpec", "StoreConfig", "compare",
           "contiguous_kv", "pack", "state_names"]
