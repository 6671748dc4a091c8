"""The main job: a real, tiny GRPO training run on CPU, fully observed by twinkle.

Importing this package does not import torch; :func:`twinkle.demo.runner.run_demo` does.
"""

from twinkle.demo.config import DemoConfig

__all__ = ["DemoConfig"]
