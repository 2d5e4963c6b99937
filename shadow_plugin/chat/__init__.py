"""Text: the tokenizer, the chat format (the built-in Qwen3.5/3.6 rendering and a model's own
Jinja template), messages, what a host served for each turn, and questions as ids."""
