"""Typed configuration: the YAML file, environment variables and flags."""

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ConfigError, ServerSettings, load_settings

__all__ = ["ConfigError", "ModelConfig", "ServerSettings", "load_settings"]
