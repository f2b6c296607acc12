"""Metric and span names, the OTLP exporter, histograms, rate-limited logs."""
