"""The content-addressed disk tier: file identity and checksums, page and GDN-entry files,
session manifests, the folder's upkeep and the fast page read (`disk.DiskStore`: the tier)."""
from block_store.disk.store import DiskStore

__all__ = ["DiskStore"]
