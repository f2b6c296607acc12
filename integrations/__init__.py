"""poolgate inside other frameworks' pipelines: Ray Data (``poolgate.integrations.ray``)."""
