"""Configuration at the edge: the TOML file's model, flags over the file, the one GatewayConfig builder."""
