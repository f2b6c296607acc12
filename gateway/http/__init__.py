"""The HTTP layer: the one middleware, app state, the operational routes and the OpenAPI document."""
