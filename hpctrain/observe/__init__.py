"""What a run shows while it trains and after: console, metrics.jsonl, W&B, TensorBoard, profiler windows,
stragglers, per-rank logs, and the reports drawn from a run directory."""
