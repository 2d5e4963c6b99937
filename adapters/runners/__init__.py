"""The CUDA-graph runners: whole-chunk reads, question buckets and single-token decode captured
once and replayed for every session, with their state slots, staged metadata and kernel picks."""
