"""The worker's engine: inputs and tokenization, the scheduler, packing, the runner and its pipeline."""
