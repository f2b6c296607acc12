"""Worker-side tools: ``poolgate inspect``, ``bench-arch`` and the sentence-transformers baseline."""
