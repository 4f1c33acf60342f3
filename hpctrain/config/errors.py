"""Re-export of :class:`hpctrain.errors.ConfigError` for code that imports it from the config package."""

from hpctrain.errors import ConfigError

__all__ = ["ConfigError"]
