"""Device memory: state layouts, chained page keys, the block manager (pool), the paged KV
cache (kv_pool) and the GDN table."""
