"""One validated config for the three services (imports without torch)."""

from .loader import ConfigError, load_config
from .model import AgrpoConfig

__all__ = ["AgrpoConfig", "ConfigError", "load_config"]
