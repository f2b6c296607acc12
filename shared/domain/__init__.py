"""What a pooling call is: tasks, params, limits, errors, scoring, sparse rows, windows, late chunks."""
