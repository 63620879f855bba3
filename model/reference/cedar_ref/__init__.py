"""cedar_ref: the PyTorch reference of the DeepSeek-V4.1 architecture (cedar_ref.model) and
its helpers. Kept import-light: `from cedar_ref.model import load_model, QuantFlags`."""
