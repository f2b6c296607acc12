"""The HTTP gateway: dialects, routing, admission, auth, errors, ops routes."""
