"""The options a runtime is started with, from a model's config."""

from __future__ import annotations

from modelyard.config.model_config import BROWNOUT_KEYS, ModelConfig

__all__ = ["runtime_options"]


def runtime_options(cfg: ModelConfig) -> dict[str, str]:
    """The runtime's options: the config's, plus a generative model's ``generation:``
    settings (n_ctx, n_threads, n_gpu_layers, parallel, n_batch) as strings; brownout's
    stay in the server, which applies them."""
    options = dict(cfg.options)
    if cfg.is_generative:
        gen = cfg.generation
        for key, value in gen.model_dump(exclude=BROWNOUT_KEYS).items():
            if value is not None:
                options[key] = str(value)
    return options
