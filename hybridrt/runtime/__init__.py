"""The torch-free runtime: load an exported directory and generate with ONNX Runtime.

Never imports torch, directly or through another hybridrt module.
"""

from .chat_session import ChatSession
from .decode import GenerationStats
from .loader import load, share_thread_pool
from .model import Model
from .providers import select_providers
from .router import LengthRouter
from .sampling import GenerationConfig
from .streaming import TextStream

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
