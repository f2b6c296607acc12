"""``poolgate bench``: a load generator for any OpenAI-compatible embeddings server."""
