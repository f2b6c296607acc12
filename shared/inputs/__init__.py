"""A model's tokenizer and input shaping, torch-free: the gateway runs it in front of its queue, as does the offline API."""
