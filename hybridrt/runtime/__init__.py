"""The torch-free runtime: load an exported directory and generate with ONNX Runtime.

Never imports torch, directly or through another hybridrt module.
"""

from .loader import load
from .model import ChatSession, Model
from .providers import select_providers
from .sampling import GenerationConfig

__all__ = ["ChatSession", "GenerationConfig", "Model", "load", "select_providers"]
