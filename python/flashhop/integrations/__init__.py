"""flashhop inside other libraries' model code, one module per library, each imported on its own:
flashhop.integrations.transformers (Hugging Face transformers)."""
