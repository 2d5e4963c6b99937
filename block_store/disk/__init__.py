"""The content-addressed disk tier: file identity and checksums, page and GDN-entry files,
session manifests, the folder's upkeep and the fast page read."""
