"""Worker pools: members, pools, a model's pools, routing, health, admission, local and remote workers."""
