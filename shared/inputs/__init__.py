"""A model's tokenizer and input shaping, torch-free: the gateway runs it before its queue, as does the offline API."""
