"""Attention of a chunk over a session's KV pages: the pure-torch paged twin, the Triton table
attention with its tilings and split combines, and FlashAttention-4 over pages."""
