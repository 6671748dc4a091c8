"""twinkle benchmarks: every figure is a ratio measured side by side in one process run."""
