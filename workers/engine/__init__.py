"""The worker's engine: tokenized calls in, the scheduler, the runner and its pipeline."""
