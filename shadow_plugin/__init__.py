"""What a host talks to: the exact reader (sessions, feeds, reads, forks, the exactness check),
the scheduler and the in-process host interface, chat rendering and the tokenizer, the HTTP
service. The public Python API:

    from shadow_plugin import Reader, load_model
"""
from adapters import load_model

from .host import Host
from .reader import FeedResult, Reader, ReadResult

__all__ = ["FeedResult", "Host", "ReadResult", "Reader", "load_model"]
