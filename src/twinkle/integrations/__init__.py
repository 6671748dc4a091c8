"""Integrations with the trainers people already run; each module imports its own
framework (``twinkle.integrations.trl`` needs transformers), this package imports none."""

from pathlib import Path

__all__ = ["swift_plugin_file"]


def swift_plugin_file() -> Path:
    """ms-swift's ``--external_plugins`` file making ``--callbacks twinkle`` observe the
    training (it calls :func:`twinkle.integrations.swift.register`; swift puts its folder
    on ``sys.path``: that folder holds this file only). ``twinkle swift-plugin`` prints it."""
    return Path(__file__).parent / "swift_plugin" / "twinkle_swift.py"
