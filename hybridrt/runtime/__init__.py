"""The torch-free runtime: load an exported directory and generate with ONNX Runtime.

Never imports torch, directly or through another hybridrt module.
"""

from .decode import GenerationStats
from .loader import load, share_thread_pool
from .model import ChatSession, Model, TextStream
from .providers import select_providers
from .router import LengthRouter
from .sampling import GenerationConfig

__all__ = [
    "ChatSession",
    "GenerationConfig",
    "GenerationStats",
    "LengthRouter",
    "Model",
    "TextStream",
    "load",
    "select_providers",
    "share_thread_pool",
]
