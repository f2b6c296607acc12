"""A model's tokenizer and input shaping, torch-free: the gateway runs it in front of its queue, and so does the offline API."""
