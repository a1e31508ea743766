"""The manager as the front ends see it: one narrow service and typed read-only views.

The front ends (``modelyard.frontends``) import this package and never
``modelyard.manager`` or ``modelyard.workers`` (an import-linter contract in
``pyproject.toml``): :class:`~modelyard.service.model_service.ModelService` is every verb
they may call, :mod:`~modelyard.service.views` every shape they may read.
"""
