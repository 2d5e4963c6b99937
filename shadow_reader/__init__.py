"""shadow-reader: an exact incremental Qwen3.5 reader beside a serving engine."""
