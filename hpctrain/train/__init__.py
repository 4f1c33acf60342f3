"""The training loop: build_run → fit → train_step; how a batch meets the model and the loss; the optimizer
and its schedule; throughput and MFU; which config changes a resume can honour."""
