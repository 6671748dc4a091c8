"""Integrations with the trainers people already run; each module imports its own
framework (``twinkle.integrations.trl`` needs transformers), this package imports none."""
