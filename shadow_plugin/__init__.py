"""What a host talks to, in rooms: chat (tokenizer, chat format, questions), reader (the exact
paged reader), scheduling (the scheduler and the in-process host interface), server (the HTTP
service), engine (the shadow inside a serving engine) and vllm (its plugins). The public
Python API:

    from shadow_plugin import Reader, load_model, load_tokenizer
"""
from adapters import load_model
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader.read_stats import ReadResult
from shadow_plugin.reader.reader import FeedResult, Reader
from shadow_plugin.scheduling.host import Host

__all__ = ["FeedResult", "Host", "ReadResult", "Reader", "load_model", "load_tokenizer"]
