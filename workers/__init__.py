"""A worker process: transport server, scheduler, runner, models, poolers, backends."""
