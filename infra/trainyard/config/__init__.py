"""Stack configuration: read once, validated into frozen types; components never read config themselves."""

from trainyard.config.load import ConfigError, Secrets, load_settings
from trainyard.config.model import Settings

__all__ = ["ConfigError", "Secrets", "Settings", "load_settings"]
