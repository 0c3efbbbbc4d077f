"""rayft: from a seed dataset to a fine-tuned, evaluated, exported LLM on Ray.

The package root stays light: importing it loads neither torch nor ray. Heavy modules are
imported inside the functions that need them.
"""

from rayft.config import RayftConfig, load_config
from rayft.errors import RayftError

__version__ = "0.1.0"

__all__ = ["RayftConfig", "RayftError", "__version__", "load_config"]
