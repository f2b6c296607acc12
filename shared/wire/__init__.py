"""The gateway-worker transport: frames, messages, the tokenized call, connections, their security."""
