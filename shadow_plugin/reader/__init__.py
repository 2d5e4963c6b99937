"""The exact paged reader: sessions, feeds, chunk reads that commit state, rewrites and
rollbacks, forks for questions and decoding, and the exactness oracle (a fresh prefill)."""
from shadow_plugin.reader.read_stats import ReadResult
from shadow_plugin.reader.reader import FeedResult, Reader

__all__ = ["FeedResult", "ReadResult", "Reader"]
