"""The gateway's gRPC server (``--grpc-port``): TEI's ``tei.v1`` and the Open Inference Protocol beside HTTP.

See ``gateway.grpc.server`` for how a call goes through the same serving path as an HTTP request.
"""
