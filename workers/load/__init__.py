"""Loading a model: read its folder and checkpoint, decide what runs, build the runner."""
