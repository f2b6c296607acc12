"""The HTTP gateway: dialects, routing, admission, auth, errors, ops routes."""

__version__ = "0.1.0"
